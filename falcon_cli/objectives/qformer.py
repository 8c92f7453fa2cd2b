"""BLIP-2 stage 1 (Q-Former pretraining) as one module: L = ITC + ITM + ITG, as LAVIS's ``blip2_qformer.py``.

* ITC: each image's Q query outputs against the text's [CLS]; an image-text similarity is the best
  query's (:func:`~falcon_cli.objectives.common.image_text_similarity`); symmetric InfoNCE with targets
  smoothed by 0.1 and a learnable, clamped temperature. The false-negative methods (MAFA, SRCL, DiHT,
  GloFND) replace it with their own ITC on the same [B, B] logits, as on the ALBEF path.
* ITM: the B positives plus one negative text per image and one negative image per text, mined from the
  ITC similarities (the hardest, as our ALBEF path and FALCON do, or LAVIS's multinomial ``sample``),
  scored by the ITM head averaged over the query positions (queries and text attend to each other).
* ITG: the caption generated from the image through the queries (queries attend to queries, text to all
  queries and causally to earlier text; one pass with a 4-D mask), next-token cross-entropy, label
  smoothing 0.1.

The reward losses FALCON may use are ``itg`` (the paper's Table 3: BLIP-2 has no MLM), ``itc``, ``itm`` and
sums. ITG draws nothing at random, so the before/after passes of a reward see identical inputs (the rule
the MLM reward keeps by reusing its mask).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from falcon_cli.method_weights import BLIP2_ITC_LABEL_SMOOTHING
from falcon_cli.objectives.captioning import caption_loss
from falcon_cli.objectives.common import alignment_loss, paired_image_feature
from falcon_cli.objectives.contract import PretrainObjective
from falcon_cli.objectives.false_negatives import FalseNegatives, PlainItc, StepContext
from falcon_cli.objectives.itc import itc_grit
from falcon_cli.objectives.itm import mined_itm_loss

ITC_LABEL_SMOOTHING = BLIP2_ITC_LABEL_SMOOTHING
"""LAVIS's BLIP-2 ITC label smoothing (:data:`~falcon_cli.method_weights.BLIP2_ITC_LABEL_SMOOTHING`)."""


def itg_loss(
    logits: Tensor, input_ids: Tensor, attention_mask: Tensor, *, label_smoothing: float = 0.1, per_sample: bool = False
) -> Tensor:
    """Image-grounded text generation loss: :func:`~falcon_cli.objectives.captioning.caption_loss` with LAVIS's
    label smoothing of 0.1 (the caption starts with ``[DEC]``)."""
    return caption_loss(logits, input_ids, attention_mask, label_smoothing=label_smoothing, per_sample=per_sample)


class Blip2Losses(NamedTuple):
    """What one forward returns (a tuple, so DDP handles it). Features are detached, float32."""

    loss: Tensor
    itc: Tensor
    itm: Tensor
    itg: Tensor
    image_feat: Tensor
    """[B, embed_dim] one unit vector per pair: the query feature most similar to the pair's own caption
    (:func:`~falcon_cli.objectives.common.paired_image_feature`), what the embedding cache and the composers
    read."""
    text_feat: Tensor
    temperature: Tensor
    image_tokens: Tensor
    """[B, N, vision_width] the frozen image encoder's tokens after ``ln_vision``."""
    image_queries: Tensor
    """[B, Q, embed_dim] the query features ITC scores with."""


class Blip2Objective(PretrainObjective):
    """A :class:`~falcon_cli.models.qformer.Blip2QFormer` and its stage-1 losses.

    Args:
        model: the BLIP-2 model (frozen image encoder, Q-Former, heads).
        consistency_weight: GRIT's ITC consistency term on top (None: the false-negative method's own
            weight; 0 for LAVIS's ITC).
        itm_negatives: ``hardest`` in-batch negative per anchor, or ``sample`` (LAVIS: multinomial over
            the softmaxed ITC similarities).
        false_negatives: how the ITC (and, for MAFA, ITM) treat likely false negatives; default LAVIS's ITC.
            MAFA's extra MLM pairs have no counterpart here (BLIP-2 has no MLM) and are not used.
    """

    generative = "itg"

    def __init__(
        self,
        model: nn.Module,
        *,
        consistency_weight: float | None = None,
        itm_negatives: str = "hardest",
        false_negatives: FalseNegatives | None = None,
    ):
        super().__init__()
        if false_negatives is None:
            false_negatives = PlainItc(label_smoothing=ITC_LABEL_SMOOTHING, stop_gradient=False)
        object.__setattr__(self, "false_negatives", false_negatives)
        self.model = model
        self.consistency_weight = 0.0 if consistency_weight is None else float(consistency_weight)
        self.itm_negatives = itm_negatives

    def forward(
        self,
        images: Tensor,
        input_ids: Tensor,
        attention_mask: Tensor,
        mask=None,
        distill_alpha: float = 0.0,
        itm_generator: torch.Generator | None = None,
        context: StepContext | None = None,
    ) -> Blip2Losses:
        """Losses of one batch (``mask`` and ``losses.distill_alpha`` are ALBEF's and ignored here); ``context`` (the
        batch's pair ids, epoch, progress) is what the false-negative methods need."""
        model = self.model
        enc = model(images, input_ids, attention_mask)
        itc = self.false_negatives.itc(enc.image_feat, enc.text_feat, enc.temperature, self.consistency_weight, context)
        itm = self._itm_loss(
            enc.image_embeds,
            input_ids,
            attention_mask,
            itc,
            sample=self.itm_negatives == "sample",
            generator=itm_generator,
            mining=self.false_negatives.mining,
            same_image=None if context is None else context.itm_excluded,
        )
        itg = itg_loss(model.itg_logits(enc.image_embeds, input_ids, attention_mask), input_ids, attention_mask)
        loss = itc.loss + itm + itg
        return Blip2Losses(
            loss,
            itc.loss.detach(),
            itm.detach(),
            itg.detach(),
            paired_image_feature(enc.image_feat.detach(), enc.text_feat.detach()),
            enc.text_feat.detach(),
            enc.temperature.detach(),
            enc.image_embeds.detach(),
            enc.image_feat.detach(),
        )

    @staticmethod
    def image_state(out: Blip2Losses) -> tuple[Tensor, Tensor]:
        """(image tokens, query features) of a forward's output: what :meth:`measure` takes as ``image``."""
        return out.image_tokens, out.image_queries

    def _itm_loss(
        self,
        image_embeds: Tensor,
        input_ids: Tensor,
        attention_mask: Tensor,
        itc,
        *,
        sample: bool,
        generator=None,
        mining=None,
        same_image: Tensor | None = None,
    ) -> Tensor:
        def pair_logits(pairs) -> Tensor:
            return self.model.itm_logits(
                image_embeds[pairs.image_index], input_ids[pairs.text_index], attention_mask[pairs.text_index]
            )

        return mined_itm_loss(
            itc, pair_logits, sample=sample, generator=generator, mining=mining, same_image=same_image
        )

    @torch.no_grad()
    def match_probability(
        self, out: Blip2Losses, input_ids: Tensor, attention_mask: Tensor, image_index: Tensor, text_index: Tensor
    ) -> Tensor:
        """ITM match probabilities of chosen pairs (:meth:`PretrainObjective.match_probability`): queries and
        caption through the Q-Former's joint pass over the forward's image embeddings, then the ITM head."""
        logits = self.model.itm_logits(out.image_tokens[image_index], input_ids[text_index], attention_mask[text_index])
        return logits.float().softmax(-1)[:, 1]

    @torch.no_grad()
    def measure_parts(
        self,
        image_embeds: Tensor,
        queries: Tensor,
        input_ids: Tensor,
        attention_mask: Tensor,
        mask: Any,
        parts: tuple[str, ...],
        same_image: Tensor | None,
        per_pair: bool,
    ) -> dict[str, Tensor]:
        """BLIP-2's ``itc``, ``itm``, ``itg`` and ``alignment`` (:meth:`PretrainObjective.measure`) from the image
        tokens and query features (reused: exact for the frozen encoder, approximate for ``ln_vision``). ITM
        negatives are mined again from this pass's ITC (the hardest); the ITC is LAVIS's (the false-negative
        method's own ITC is not re-run). ``per_pair``: each caption's ``itg`` loss (the mean over its predicted
        tokens)."""
        model = self.model
        out: dict[str, Tensor] = {}
        if "alignment" in parts:
            out["alignment"] = alignment_loss(queries, model.encode_text(input_ids, attention_mask)[1], per_pair)
        if "itc" in parts or "itm" in parts:
            _, text_feat = model.encode_text(input_ids, attention_mask)
            itc = itc_grit(
                queries,
                text_feat,
                model.temperature(),
                consistency_weight=self.consistency_weight,
                label_smoothing=ITC_LABEL_SMOOTHING,
                stop_gradient=False,
                exclude=same_image,
            )
            out["itc"] = itc.loss
            if "itm" in parts:
                out["itm"] = self._itm_loss(
                    image_embeds, input_ids, attention_mask, itc, sample=False, same_image=same_image
                )
        if "itg" in parts:
            out["itg"] = itg_loss(
                model.itg_logits(image_embeds, input_ids, attention_mask),
                input_ids,
                attention_mask,
                per_sample=per_pair,
            )
        return out


__all__ = ["Blip2Losses", "Blip2Objective", "ITC_LABEL_SMOOTHING", "itg_loss"]
