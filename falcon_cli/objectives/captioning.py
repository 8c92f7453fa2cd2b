"""Next-token captioning loss: BLIP-2's ITG and a dual encoder's decoder (SigLIP 2's captioning) share it."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from falcon_cli.objectives.common import fp32_region


def caption_loss(
    logits: Tensor, input_ids: Tensor, attention_mask: Tensor, *, label_smoothing: float = 0.0, per_sample: bool = False
) -> Tensor:
    """Next-token cross-entropy, float32: position t of ``logits`` [B, L, V] predicts token t + 1 of ``input_ids``
    [B, L]; padding (``attention_mask`` 0) is not predicted; targets smoothed by ``label_smoothing``. The mean
    over every predicted token of the batch (as a ``CrossEntropyLoss`` over the flattened tokens), or with
    ``per_sample`` each caption's mean ``[B]`` (FALCON's per-caption credit)."""
    keep = attention_mask[:, 1:].bool()
    labels = input_ids[:, 1:].masked_fill(~keep, -100)
    with fp32_region(logits.device):
        token = F.cross_entropy(
            logits[:, :-1].float().transpose(1, 2),
            labels,
            ignore_index=-100,
            label_smoothing=label_smoothing,
            reduction="none",
        )  # [B, L - 1], 0 where ignored
    if per_sample:
        return token.sum(dim=1) / keep.sum(dim=1).clamp_min(1)
    return token.sum() / keep.sum().clamp_min(1)


__all__ = ["caption_loss"]
