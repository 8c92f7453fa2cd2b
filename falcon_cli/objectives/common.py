"""Small shared helpers for the objectives: float32 islands, soft cross-entropy, masks.

Everything here is model-agnostic and device-agnostic. Losses are always evaluated in
float32, even under ``torch.autocast`` (bf16/fp16): the helpers cast their inputs with
``.float()`` and :func:`fp32_region` switches autocast off for the few matmuls whose
outputs are divided by a small temperature.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from falcon_cli.models.similarity import image_text_similarity, paired_image_feature  # noqa: F401 (re-exported)
from falcon_cli.runtime.precision import fp32_region  # noqa: F401 (re-exported)

__all__ = [
    "alignment_loss",
    "fp32_region",
    "image_text_similarity",
    "paired_image_feature",
    "soft_cross_entropy",
    "positive_mask_from_ids",
    "row_normalised_targets",
]


def alignment_loss(image_feat: Tensor, text_feat: Tensor, per_pair: bool = False) -> Tensor:
    """Minus each pair's own image-text cosine (float32; the best query's for BLIP-2), ``[B]`` with ``per_pair``,
    else its mean: FALCON's ``alignment`` reward is its decrease, the rise of the pairs' own alignment."""
    text = text_feat.float()
    cosine = -(paired_image_feature(image_feat.float(), text) * text).sum(-1)
    return cosine if per_pair else cosine.mean()


def as_temperature(temperature: float | Tensor) -> float | Tensor:
    """A Python float, or a 0-d float32 tensor (gradient preserved) for a learnable temperature."""
    if isinstance(temperature, Tensor):
        if temperature.numel() != 1:
            raise ValueError(f"temperature must be a scalar, got shape {tuple(temperature.shape)}")
        return temperature.float().reshape(())
    return float(temperature)


def soft_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Row-wise cross-entropy against soft targets, in float32.

    ``logits`` [N, C], ``targets`` [N, C] (rows are distributions; they are NOT detached
    here, detach them yourself if they must carry no gradient). Returns [N]:
    ``-sum_c targets[n, c] * log_softmax(logits[n])[c]``.
    """
    if logits.shape != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} differ in shape")
    return -(targets.float() * F.log_softmax(logits.float(), dim=-1)).sum(dim=-1)


def positive_mask_from_ids(image_ids: Tensor, text_ids: Tensor | None = None) -> Tensor:
    """Pair-level positive mask from sample / image ids.

    ``image_ids`` [B] and ``text_ids`` [B'] (default: ``image_ids``) -> bool [B, B'] with
    ``mask[i, j] = image_ids[i] == text_ids[j]``. Rows are images, columns texts. Use it
    when a batch can hold duplicates of a pair (or several captions of one image): every
    same-id entry is then a positive, never a negative.
    """
    if text_ids is None:
        text_ids = image_ids
    return image_ids.reshape(-1, 1) == text_ids.reshape(1, -1)


def row_normalised_targets(
    positive_mask: Tensor | None, n: int, device: torch.device, label_smoothing: float = 0.0
) -> Tensor:
    """Float32 targets [n, n] from a positive mask [n, n] (None: identity).

    The diagonal is always a positive (OR-ed in), so no row is ever empty. Each row is
    divided by its number of positives, then ``(1 - eps) * t + eps / n`` is applied for
    ``label_smoothing = eps`` (MAFA's S-ITC uses eps = 0.5 from epoch 1 on).
    """
    eye = torch.eye(n, device=device, dtype=torch.bool)
    if positive_mask is None:
        targets = eye.float()
    else:
        if positive_mask.shape != (n, n):
            raise ValueError(f"positive_mask must have shape ({n}, {n}), got {tuple(positive_mask.shape)}")
        pos = positive_mask.to(device=device).bool() | eye
        targets = pos.float()
        targets = targets / targets.sum(dim=1, keepdim=True)
    if label_smoothing:
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"label_smoothing must lie in [0, 1], got {label_smoothing}")
        targets = (1.0 - label_smoothing) * targets + label_smoothing / n
    return targets
