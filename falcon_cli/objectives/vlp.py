"""The whole ALBEF / GRIT-VLP pretraining objective as one module: L = ITC + ITM + MLM.

:class:`VlpObjective` wraps the model so that the entire loss computation happens inside
one ``forward``. That is what DistributedDataParallel needs (it synchronises gradients
only for work done inside the wrapped module's forward), and it keeps the training loop
a few lines long. The MLM mask is sampled outside and passed in, because FALCON scores
the same batch with the identical mask before and after an update.
"""

from __future__ import annotations

import copy
from typing import NamedTuple

import torch
from torch import Tensor, nn

from falcon_cli.method_weights import ITC_CONSISTENCY_WEIGHT
from falcon_cli.models.albef import pooled_features
from falcon_cli.objectives.common import alignment_loss
from falcon_cli.objectives.contract import PretrainObjective
from falcon_cli.objectives.false_negatives import FalseNegatives, PlainItc, StepContext
from falcon_cli.objectives.itc import (
    MomentumQueue,
    copy_to_momentum,
    itc_grit,
    itc_momentum_distillation,
    momentum_update,
)
from falcon_cli.objectives.itm import mined_itm_loss
from falcon_cli.objectives.mlm import MlmMask, mlm_loss
from falcon_cli.registry import FALSE_NEGATIVE_METHODS
from falcon_cli.runtime.distributed import all_gather_cat


class VlpLosses(NamedTuple):
    """What one forward returns (a tuple, so DDP handles it). Features are detached, float32."""

    loss: Tensor
    itc: Tensor
    itm: Tensor
    mlm: Tensor
    image_feat: Tensor
    text_feat: Tensor
    temperature: Tensor
    image_tokens: Tensor


class MomentumEncoders(nn.Module):
    """Frozen EMA copies of the unimodal encoders and projections (``itc: momentum``)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.visual_encoder = copy.deepcopy(model.visual_encoder)
        self.vision_proj = copy.deepcopy(model.vision_proj)
        self.text_encoder = copy.deepcopy(model.text_encoder)
        self.text_proj = copy.deepcopy(model.text_proj)
        self.pooling = model.config.pooling
        copy_to_momentum(self.online_parts(model), self)

    @staticmethod
    def online_parts(model: nn.Module) -> nn.ModuleList:
        """The online modules, in the same order as this module's children."""
        return nn.ModuleList([model.visual_encoder, model.vision_proj, model.text_encoder, model.text_proj])

    @torch.no_grad()
    def features(self, images: Tensor, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        image_tokens = self.visual_encoder.forward_features(images)
        text_tokens = self.text_encoder(input_ids, attention_mask)
        image = pooled_features(image_tokens, self.vision_proj, self.pooling)
        text = pooled_features(text_tokens, self.text_proj, self.pooling, attention_mask)
        return image, text


class VlpObjective(PretrainObjective):
    """ALBEF model + its pretraining losses.

    Args:
        model: an :class:`~falcon_cli.models.albef.ALBEF`.
        itc: ``grit`` (in-batch, soft pseudo targets; the default, as FALCON) or ``momentum``
            (ALBEF's momentum encoders, feature queue and distillation for ITC).
        consistency_weight: weight of GRIT-VLP's ITC consistency term; None = the false-negative
            method's own (:data:`~falcon_cli.objectives.false_negatives.ITC_CONSISTENCY_WEIGHT`: 0.2 for plain
            GRIT ITC, 0 for MAFA, SRCL, DiHT and GloFND).
        itm_negatives: ``hardest`` in-batch negative per anchor, or ALBEF's ``sample``.
        momentum, queue_size: for ``itc: momentum``.
        false_negatives: how the in-batch ITC (and, for MAFA, ITM and MLM) treat likely false
            negatives (:mod:`falcon_cli.objectives.false_negatives`); default plain GRIT ITC. It is
            deliberately not a registered submodule: its state (GloFND's per-pair thresholds) is
            rank-synchronised and checkpointed by the caller, not broadcast by DDP every step.
    """

    generative = "mlm"

    def __init__(
        self,
        model: nn.Module,
        *,
        itc: str = "grit",
        consistency_weight: float | None = None,
        itm_negatives: str = "hardest",
        momentum: float = 0.995,
        queue_size: int = 65536,
        false_negatives: FalseNegatives | None = None,
    ):
        super().__init__()
        if false_negatives is not None and false_negatives.name != "none" and itc != "grit":
            raise ValueError(
                f"false_negatives={false_negatives.name} works on the in-batch ITC (itc='grit'), not {itc!r}"
            )
        object.__setattr__(self, "false_negatives", false_negatives if false_negatives is not None else PlainItc())
        self.model = model
        self.itc_kind = itc
        if consistency_weight is None:  # (the method's paper's: GRIT-VLP's 0.2 for the plain ITC)
            name = self.false_negatives.name
            consistency_weight = (
                ITC_CONSISTENCY_WEIGHT["none"]
                if name == "none"
                else FALSE_NEGATIVE_METHODS.get(name).consistency_weight
            )
        self.consistency_weight = float(consistency_weight)
        self.itm_negatives = itm_negatives
        self.momentum = momentum
        if itc == "momentum":
            self.momentum_encoders = MomentumEncoders(model)
            self.queue = MomentumQueue(model.config.embed_dim, queue_size)

    def forward(
        self,
        images: Tensor,
        input_ids: Tensor,
        attention_mask: Tensor,
        mask: MlmMask,
        distill_alpha: float = 0.0,
        itm_generator: torch.Generator | None = None,
        context: StepContext | None = None,
    ) -> VlpLosses:
        """Losses of one batch. ``mask`` comes from :meth:`MlmMask.sample` on ``input_ids``; ``context``
        (the batch's pair ids, epoch, progress) is what the false-negative methods need."""
        model = self.model
        enc = model(images, input_ids, attention_mask)

        # ITC: in-batch with GRIT's consistency targets, or against the momentum queue.
        if self.itc_kind == "momentum":
            momentum_update(MomentumEncoders.online_parts(model), self.momentum_encoders, self.momentum)
            image_m, text_m = self.momentum_encoders.features(images, input_ids, attention_mask)
            itc = itc_momentum_distillation(
                enc.image_feat, enc.text_feat, image_m, text_m, self.queue, enc.temperature, distill_alpha
            )

            self.queue.enqueue(all_gather_cat(image_m), all_gather_cat(text_m))
        else:  # in-batch, through the false-negative method (plain GRIT ITC by default)
            itc = self.false_negatives.itc(
                enc.image_feat, enc.text_feat, enc.temperature, self.consistency_weight, context
            )
        mining = self.false_negatives.mining  # MAFA: ITM partners and labels, extra MLM pairs

        itm = self._itm_loss(
            enc.text_tokens,
            attention_mask,
            enc.image_tokens,
            itc,
            sample=self.itm_negatives == "sample",
            generator=itm_generator,
            mining=mining,
            same_image=None if context is None else context.itm_excluded,
        )

        # MLM: the masked caption through the text encoder, fused with its own image (MAFA: and with
        # the images it was found to match as well).
        extra = None if mining is None else (mining.mlm_image_index, mining.mlm_text_index)
        mlm = self.mlm_loss(enc.image_tokens, attention_mask, mask, extra=extra)

        loss = itc.loss + itm + mlm
        return VlpLosses(
            loss,
            itc.loss.detach(),
            itm.detach(),
            mlm.detach(),
            enc.image_feat.detach(),
            enc.text_feat.detach(),
            enc.temperature.detach(),
            enc.image_tokens.detach(),
        )

    def _itm_loss(
        self,
        text_tokens: Tensor,
        attention_mask: Tensor,
        image_tokens: Tensor,
        itc,
        *,
        sample: bool,
        generator: torch.Generator | None = None,
        mining=None,
        same_image: Tensor | None = None,
    ) -> Tensor:
        """ITM on the batch's positives plus one negative text per image and one negative image per
        text, mined from the ITC similarities (hardest, or ALBEF's multinomial ``sample``), never a
        pair of ``same_image`` (bool [B, B]) where given; with MAFA's ``mining``, its partners and
        labels (converted pairs count as matches)."""

        def pair_logits(pairs) -> Tensor:
            return self.model.itm_logits(
                self.model.fuse(
                    text_tokens[pairs.text_index], attention_mask[pairs.text_index], image_tokens[pairs.image_index]
                )
            )

        return mined_itm_loss(
            itc, pair_logits, sample=sample, generator=generator, mining=mining, same_image=same_image
        )

    @torch.no_grad()
    def checkpoint_parts(self) -> dict[str, nn.Module]:
        """The momentum encoders and queue (``itc: momentum``): a resumed run continues their averages exactly."""
        if self.itc_kind != "momentum":
            return {}
        return {"momentum": nn.ModuleDict({"encoders": self.momentum_encoders, "queue": self.queue})}

    @torch.no_grad()
    def match_probability(
        self, out: VlpLosses, input_ids: Tensor, attention_mask: Tensor, image_index: Tensor, text_index: Tensor
    ) -> Tensor:
        """ITM match probabilities of chosen pairs (:meth:`PretrainObjective.match_probability`): the captions
        through the text encoder once, then the fusion layers and ITM head on each pair."""
        text_tokens, _ = self.model.encode_text(input_ids, attention_mask)
        logits = self.model.pair_itm_logits(
            out.image_tokens[image_index], text_tokens[text_index], None, attention_mask[text_index]
        )
        return logits.float().softmax(-1)[:, 1]

    def measure_parts(
        self,
        image_tokens: Tensor,
        image_feat: Tensor,
        input_ids: Tensor,
        attention_mask: Tensor,
        mask: MlmMask,
        parts: tuple[str, ...],
        same_image: Tensor | None,
        per_pair: bool,
    ) -> dict[str, Tensor]:
        """ALBEF's ``itc``, ``itm``, ``mlm`` and ``alignment`` (:meth:`PretrainObjective.measure`). ITM negatives are
        mined again from this pass's ITC similarities; the temperature is not clamped (no parameter changes).
        ``per_pair``: each caption's MLM loss (the mean over its masked tokens)."""
        model = self.model
        out: dict[str, Tensor] = {}
        if "alignment" in parts:
            out["alignment"] = alignment_loss(image_feat, model.encode_text(input_ids, attention_mask)[1], per_pair)
        if "itc" in parts or "itm" in parts:
            text_tokens, text_feat = model.encode_text(input_ids, attention_mask)
            itc = itc_grit(
                image_feat,
                text_feat,
                model.temperature(),
                consistency_weight=self.consistency_weight,
                exclude=same_image,
            )
            out["itc"] = itc.loss
            if "itm" in parts:
                out["itm"] = self._itm_loss(
                    text_tokens, attention_mask, image_tokens, itc, sample=False, same_image=same_image
                )
        if "mlm" in parts:
            out["mlm"] = self.mlm_loss(image_tokens, attention_mask, mask, per_sample=per_pair)
        return out

    def mlm_loss(
        self,
        image_tokens: Tensor,
        attention_mask: Tensor,
        mask: MlmMask,
        per_sample: bool = False,
        extra: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """MLM loss of ``mask`` given image tokens (FALCON's reward re-evaluates exactly this).
        ``extra`` = (image index, text index) [K]: more (image, masked caption) pairs of the batch in
        the same mean (MAFA's converted positives)."""
        model = self.model
        masked_tokens, _ = model.encode_text(mask.masked_ids, attention_mask)
        fused = model.fuse(masked_tokens, attention_mask, image_tokens)
        if per_sample:
            return mlm_loss(model.mlm_logits(fused), mask.labels, per_sample=True)
        if self.fixed_shapes and extra is None:  # (graph_step: every position through the head, weighted)
            return mlm_loss(model.mlm_logits(fused), mask.labels, fixed_shape=True)
        selected, labels = mask.selected, mask.labels
        if extra is not None and len(extra[0]):
            image_index, text_index = (i.to(image_tokens.device) for i in extra)
            fused = torch.cat(
                [fused, model.fuse(masked_tokens[text_index], attention_mask[text_index], image_tokens[image_index])]
            )
            selected, labels = torch.cat([selected, selected[text_index]]), torch.cat([labels, labels[text_index]])
        return mlm_loss(model.mlm_logits(fused[selected]), labels[selected])
