"""A dual encoder's pretraining objective as one module: L = contrastive + caption_weight · caption.

* contrastive (logged as ``itc``): SigLIP's sigmoid loss (a learnable scale and bias; under DDP every
  rank's texts are negatives, passed around the ring of ranks) or CLIP's symmetric InfoNCE (a learnable
  temperature, in-batch), whichever the model config's ``contrastive`` says. The false-negative methods
  (MAFA, SRCL, DiHT, GloFND) act on the same [B, B] logits: through their ITC for InfoNCE, through
  :meth:`~falcon_cli.objectives.false_negatives.FalseNegatives.sigmoid` for the sigmoid loss.
* caption: the decoder's next-token loss of each caption given its image's tokens (SigLIP 2's
  captioning objective; it reaches the image tower only, except in a CoCa, whose decoder reads the text
  tower's outputs). 0 without a decoder.

The reward losses FALCON may use are ``caption`` (SigLIP 2's setting in the later FALCON paper), ``itc``
(the contrastive loss, sigmoid or softmax), ``itc+caption``, ``alignment`` and ``positive_margin``.
Neither loss draws anything at random, so a reward's before/after passes see identical inputs.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from falcon_cli.objectives.captioning import caption_loss
from falcon_cli.objectives.common import alignment_loss
from falcon_cli.objectives.contract import PretrainObjective
from falcon_cli.objectives.false_negatives import FalseNegatives, PlainItc, StepContext
from falcon_cli.objectives.itc import itc_grit
from falcon_cli.objectives.sigmoid import sigmoid_loss


class DualLosses(NamedTuple):
    """What one forward returns (a tuple, so DDP handles it). Features are detached, float32."""

    loss: Tensor
    itc: Tensor
    """The contrastive loss (sigmoid or InfoNCE)."""
    caption: Tensor
    image_feat: Tensor
    text_feat: Tensor
    temperature: Tensor
    image_tokens: Tensor
    """[B, N, width] the image tower's last-layer tokens (what the decoder reads)."""


class DualObjective(PretrainObjective):
    """A :class:`~falcon_cli.models.dual.DualEncoder` and its pretraining losses.

    Args:
        model: the dual encoder.
        caption_weight: weight of the caption loss (SigLIP 2 and our recipes: 1; CoCa: 2). 0 leaves the
            decoder untrained (a reward may still read it).
        false_negatives: how the contrastive loss treats likely false negatives; default plain
            (InfoNCE without GRIT's stop-gradient and consistency term, or the plain sigmoid loss).
    """

    generative = "caption"

    def __init__(self, model: nn.Module, *, caption_weight: float = 1.0, false_negatives: FalseNegatives | None = None):
        super().__init__()
        if false_negatives is None:
            false_negatives = PlainItc(label_smoothing=0.0, stop_gradient=False)
        object.__setattr__(self, "false_negatives", false_negatives)
        self.model = model
        self.caption_weight = float(caption_weight)
        self.sigmoid = model.config.contrastive == "sigmoid"

    def forward(
        self,
        images: Tensor,
        input_ids: Tensor,
        attention_mask: Tensor,
        mask=None,
        distill_alpha: float = 0.0,
        itm_generator: torch.Generator | None = None,
        context: StepContext | None = None,
    ) -> DualLosses:
        """Losses of one batch (``mask``, ``losses.distill_alpha`` and ``itm_generator`` are ALBEF's and ignored
        here)."""
        model = self.model
        image_tokens, image_feat = model.encode_image(images)
        text_tokens, text_feat = model.encode_text(input_ids, attention_mask)
        if self.sigmoid:
            contrastive = self.false_negatives.sigmoid(
                image_feat, text_feat, model.logit_scale(), model.logit_bias(), context
            )
        else:
            contrastive = self.false_negatives.itc(image_feat, text_feat, model.temperature(), 0.0, context).loss
        loss = contrastive
        caption = torch.zeros((), device=contrastive.device)
        if model.has_decoder:
            caption = caption_loss(model.caption_logits(image_tokens, text_tokens), input_ids, attention_mask)
            loss = loss + self.caption_weight * caption  # (also at weight 0: DDP expects every parameter used)
        return DualLosses(
            loss,
            contrastive.detach(),
            caption.detach(),
            image_feat.detach().float(),
            text_feat.detach().float(),
            model.temperature().detach(),
            image_tokens.detach(),
        )

    def contrastive_loss(self, image_feat: Tensor, text_feat: Tensor, same_image: Tensor | None = None) -> Tensor:
        """The plain contrastive loss of a batch (no false-negative method), pairs in ``same_image`` removed."""
        model = self.model
        if self.sigmoid:
            return sigmoid_loss(image_feat, text_feat, model.logit_scale(), model.logit_bias(), exclude=same_image)
        return itc_grit(
            image_feat, text_feat, model.temperature(), consistency_weight=0.0, stop_gradient=False, exclude=same_image
        ).loss

    @torch.no_grad()
    def measure_parts(
        self,
        image_tokens: Tensor,
        image_feat: Tensor,
        input_ids: Tensor,
        attention_mask: Tensor,
        mask: Any,
        parts: tuple[str, ...],
        same_image: Tensor | None,
        per_pair: bool,
    ) -> dict[str, Tensor]:
        """A dual encoder's ``itc``, ``caption`` and ``alignment`` (:meth:`PretrainObjective.measure`). ``itc`` is the
        plain contrastive loss on this rank's batch (the false-negative method's own is not re-run).
        ``per_pair``: each caption's ``caption`` loss."""
        model = self.model
        out: dict[str, Tensor] = {}
        text_tokens = None
        if "itc" in parts or "alignment" in parts:
            text_tokens, text_feat = model.encode_text(input_ids, attention_mask)
            if "itc" in parts:
                out["itc"] = self.contrastive_loss(image_feat, text_feat, same_image)
            if "alignment" in parts:
                out["alignment"] = alignment_loss(image_feat, text_feat, per_pair)
        if "caption" in parts:
            if text_tokens is None:
                text_tokens = model.caption_text(input_ids, attention_mask)
            out["caption"] = caption_loss(
                model.caption_logits(image_tokens, text_tokens), input_ids, attention_mask, per_sample=per_pair
            )
        return out


__all__ = ["DualLosses", "DualObjective"]
