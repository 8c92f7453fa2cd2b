"""Retrieval fine-tuning losses (ALBEF's ``model_retrieval``): ITC + ITM where captions of one image agree.

* ITC against a momentum queue of image and text features that also keeps each feature's image
  index, so every caption of the same image, in the batch or in the queue, is a positive
  (targets ``pos / pos.sum()``), with optional momentum distillation (ALBEF α = 0.4; GRIT-VLP and
  MAFA fine-tune with α = 0);
* ITM on the positives plus one negative text per image and one negative image per text, drawn
  by ``softmax(sim)`` over the batch with same-image pairs excluded.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from falcon_cli.objectives.itc import MomentumQueue, itc_momentum_distillation, momentum_update
from falcon_cli.objectives.itm import itm_loss, itm_pair_indices, sample_negatives
from falcon_cli.objectives.vlp import MomentumEncoders
from falcon_cli.runtime.distributed import all_gather_cat


class RetrievalLosses(NamedTuple):
    """One step's losses (``loss`` has the graph; the parts are detached)."""

    loss: Tensor
    itc: Tensor
    itm: Tensor


class RetrievalObjective(nn.Module):
    """An :class:`~falcon_cli.models.albef.ALBEF` with its momentum encoders and id-keeping queue."""

    def __init__(self, model: nn.Module, *, queue_size: int = 65536, momentum: float = 0.995):
        super().__init__()
        self.model = model
        self.momentum = momentum
        self.momentum_encoders = MomentumEncoders(model)
        self.queue = MomentumQueue(model.config.embed_dim, queue_size, with_idx=True)

    def forward(
        self,
        images: Tensor,
        input_ids: Tensor,
        attention_mask: Tensor,
        image_idx: Tensor,
        distill_alpha: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> RetrievalLosses:
        """Losses of one batch; ``image_idx`` [B] says which image each caption belongs to (equal = same image)."""
        model = self.model
        enc = model(images, input_ids, attention_mask)
        momentum_update(MomentumEncoders.online_parts(model), self.momentum_encoders, self.momentum)
        image_m, text_m = self.momentum_encoders.features(images, input_ids, attention_mask)
        itc = itc_momentum_distillation(
            enc.image_feat, enc.text_feat, image_m, text_m, self.queue, enc.temperature, distill_alpha, idx=image_idx
        )
        self.queue.enqueue(all_gather_cat(image_m), all_gather_cat(text_m), all_gather_cat(image_idx))

        b = images.shape[0]
        same_image = image_idx[:, None] == image_idx[None, :]
        negatives = sample_negatives(itc.sim_i2t[:, :b], itc.sim_t2i[:, :b], generator, positive_mask=same_image)
        pairs = itm_pair_indices(*negatives)
        fused = model.fuse(
            enc.text_tokens[pairs.text_index], attention_mask[pairs.text_index], enc.image_tokens[pairs.image_index]
        )
        logits = model.itm_logits(fused)
        itm = itm_loss(logits[:b], logits[b:])
        return RetrievalLosses(itc.loss + itm, itc.loss.detach(), itm.detach())


__all__ = ["RetrievalLosses", "RetrievalObjective"]
