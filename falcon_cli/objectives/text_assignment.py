"""ALBEF's text-assignment (TA) task, the NLVR2 pretraining stage (``models/model_pretrain_nlvr.py``).

Each text i of an image-text batch is shown with two images and must say which one it
describes: with probability 1/3 neither (two sampled negatives, label 0), otherwise its true
image i is placed first (label 1) or second (label 2) next to one sampled hard negative.
Negatives are drawn from ``softmax(image_feat @ image_feat.T / temperature)`` with the diagonal
zeroed, so images similar to image i are drawn more often. Feed the indices to
:meth:`falcon_cli.models.nlvr2.AlbefNLVR2.encode_pair` (``images[first]``, ``images[second]``)
and the labels to :func:`text_assignment_loss`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from falcon_cli.objectives.common import fp32_region

__all__ = ["TA_NEITHER", "TA_FIRST", "TA_SECOND", "text_assignment_pairs", "text_assignment_loss"]

TA_NEITHER, TA_FIRST, TA_SECOND = 0, 1, 2
"""Text-assignment labels: neither image matches / the first does / the second does."""


@torch.no_grad()
def text_assignment_pairs(
    image_feat: Tensor, generator: torch.Generator | None = None, temperature: float = 0.07
) -> tuple[Tensor, Tensor, Tensor]:
    """Sample the two images shown with each text, and the label.

    Args:
        image_feat: [B, D] image features (ALBEF: L2-normalised ITC features), B >= 3.
        generator: optional generator on ``image_feat``'s device, for reproducible draws.
        temperature: softmax temperature of the image-image similarities.

    Returns ``(first_index, second_index, labels)``, all int64 [B], indices into the batch:
    label 0 -> both are negatives (distinct, neither is i); 1 -> ``first_index[i] == i``;
    2 -> ``second_index[i] == i`` (the other one a negative).
    """
    b = image_feat.shape[0]
    if image_feat.dim() != 2 or b < 3:
        raise ValueError(
            f"image_feat must be [B, D] with B >= 3 (two distinct negatives per row), got {tuple(image_feat.shape)}"
        )
    feat = image_feat.detach().float()
    with fp32_region(feat.device):
        weights = F.softmax(feat @ feat.T / temperature, dim=1)
    # A floor keeps every other image drawable even if the softmax underflows (unnormalised
    # features), so drawing two distinct negatives never fails; it is far below any real weight.
    weights = weights.clamp_min(1e-30)
    weights.fill_diagonal_(0)
    negatives = torch.multinomial(weights, 2, replacement=False, generator=generator)  # [B, 2], distinct
    # One uniform draw per text: [0, 1/3) neither, [1/3, 2/3) true image first, [2/3, 1) second.
    u = torch.rand(b, generator=generator, device=feat.device)
    labels = (u * 3).long().clamp_max(TA_SECOND)
    own = torch.arange(b, device=feat.device)
    first = torch.where(labels == TA_FIRST, own, negatives[:, 0])
    second = torch.where(labels == TA_NEITHER, negatives[:, 1], torch.where(labels == TA_FIRST, negatives[:, 0], own))
    return first, second, labels


def text_assignment_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Cross-entropy of the TA logits [B, 3] against the labels [B] (float32, mean over the batch)."""
    return F.cross_entropy(logits.float(), labels)
