"""Small shared helpers for the objectives: float32 islands, soft cross-entropy, masks.

Everything here is model-agnostic and device-agnostic. Losses are always evaluated in
float32, even under ``torch.autocast`` (bf16/fp16): the helpers cast their inputs with
``.float()`` and :func:`fp32_region` switches autocast off for the few matmuls whose
outputs are divided by a small temperature.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["alignment_loss", "fp32_region", "image_text_similarity", "paired_image_feature", "soft_cross_entropy", "positive_mask_from_ids", "row_normalised_targets"]


@contextlib.contextmanager
def fp32_region(device: torch.device) -> Iterator[None]:
    """Disable autocast on ``device`` inside the block (no-op where autocast is unsupported)."""
    try:
        ctx = torch.autocast(device_type=device.type, enabled=False)
    except (RuntimeError, ValueError):  # a device type autocast does not know
        ctx = contextlib.nullcontext()
    with ctx:
        yield


def image_text_similarity(image_feat: Tensor, text_feat: Tensor) -> Tensor:
    """``[N_images, N_texts]`` similarities of image and text features.

    ``image_feat`` ``[N_i, D]`` (one vector per image: ALBEF, dual encoders) gives ``image_feat @ text_feat.T``;
    ``[N_i, Q, D]`` (one vector per learned query: BLIP-2's Q-Former) gives, as BLIP-2 defines its ITC, the
    largest of an image's Q query similarities to each text. Gradients flow as through the matmul (to the
    maximising query only, for BLIP-2). Every ITC variant, false-negative method and retrieval score goes
    through this one function, so each works with either kind of image feature.
    """
    if image_feat.dim() == 2:
        return image_feat @ text_feat.t()
    if image_feat.dim() != 3:
        raise ValueError(f"image features of shape {tuple(image_feat.shape)}: expected [N, D] or [N, queries, D]")
    return torch.einsum("iqd,td->itq", image_feat, text_feat).amax(dim=-1)


def paired_image_feature(image_feat: Tensor, text_feat: Tensor) -> Tensor:
    """One image vector ``[B, D]`` per pair: ``image_feat`` itself when it is ``[B, D]``; for BLIP-2's
    ``[B, Q, D]`` query features, the query most similar to the pair's own text ``text_feat`` ``[B, D]``
    (MAFA's choice for GRIT search spaces over BLIP-2, appendix G.7). This is what the embedding cache,
    the search spaces and ``falcon embed`` hold, so the composers work on one vector per pair."""
    if image_feat.dim() == 2:
        return image_feat
    best = torch.einsum("bqd,bd->bq", image_feat, text_feat.to(image_feat.dtype)).argmax(dim=1)
    return image_feat[torch.arange(image_feat.shape[0], device=image_feat.device), best]


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


def row_normalised_targets(positive_mask: Tensor | None, n: int, device: torch.device,
                           label_smoothing: float = 0.0) -> Tensor:
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
