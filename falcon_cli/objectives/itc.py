"""Image-text contrastive (ITC) losses: GRIT-VLP soft pseudo targets and ALBEF momentum distillation.

Conventions (B = batch size, D = embedding dim, usually 256, K = queue length):

* Features are the projected, L2-normalised [CLS] embeddings, ``[B, D]``. Normalisation
  and the temperature clamp to ``[0.001, 0.5]`` are the model's business.
* Similarities and all softmax / log-softmax / cross-entropy are computed in float32 with
  autocast disabled (safe under bf16 autocast; ``/ temperature`` amplifies bf16 error).
* Every loss is a mean over the anchors of the batch; the two directions are averaged.
* ``positive_mask`` is pair level: ``mask[i, j]`` is True when image i and text j match
  (rows images, columns texts). The i2t targets use it as is, the t2i targets use its
  transpose unless ``positive_mask_t2i`` (rows texts, columns images) is given (MAFA marks
  false negatives per direction, without symmetrising).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from falcon_cli.errors import FalconError
from falcon_cli.objectives.common import (
    as_temperature,
    fp32_region,
    image_text_similarity,
    row_normalised_targets,
    soft_cross_entropy,
)

__all__ = [
    "ItcOutput",
    "itc_grit",
    "MomentumQueue",
    "momentum_update",
    "copy_to_momentum",
    "itc_momentum_distillation",
    "alpha_ramp",
]


@dataclass(eq=False)
class ItcOutput:
    """Result of an ITC loss.

    * ``loss``: scalar, the loss to back-propagate.
    * ``hard``: scalar, the CE against the (possibly multi-positive / smoothed) targets,
      averaged over both directions.
    * ``soft``: scalar, the soft-target CE averaged over both directions: GRIT's
      consistency term (:func:`itc_grit`, ``loss = hard + w * soft``) or ALBEF's
      distillation term (:func:`itc_momentum_distillation`,
      ``loss = (1 - alpha) * hard + alpha * soft``).
    * ``sim_i2t`` [B, N] / ``sim_t2i`` [B, N]: float32 logits (similarity / temperature),
      rows are the anchors (images resp. texts), N = B in-batch or B + K with a queue;
      the first B columns are the batch. They carry gradient: detach (or use under
      ``torch.no_grad``) when mining ITM negatives from them.
    """

    loss: Tensor
    hard: Tensor
    soft: Tensor
    sim_i2t: Tensor
    sim_t2i: Tensor

    @property
    def consistency(self) -> Tensor:
        """Alias of ``soft`` (GRIT's name for it)."""
        return self.soft


def _check_pair(image_feat: Tensor, text_feat: Tensor, what: str = "features") -> None:
    """Image features ``[B, D]`` (or ``[B, Q, D]``: one per query, BLIP-2) and text features ``[B, D]``."""
    if (
        image_feat.dim() not in (2, 3)
        or text_feat.dim() != 2
        or image_feat.shape[0] != text_feat.shape[0]
        or image_feat.shape[-1] != text_feat.shape[-1]
    ):
        raise ValueError(
            f"image and text {what} must be [B, D] (images may be [B, queries, D]) with equal B and D, "
            f"got {tuple(image_feat.shape)} and {tuple(text_feat.shape)}"
        )


def itc_grit(
    image_feat: Tensor,
    text_feat: Tensor,
    temperature: float | Tensor,
    *,
    consistency_weight: float = 0.2,
    positive_mask: Tensor | None = None,
    positive_mask_t2i: Tensor | None = None,
    label_smoothing: float = 0.0,
    exclude: Tensor | None = None,
    exclude_t2i: Tensor | None = None,
    stop_gradient: bool = True,
) -> ItcOutput:
    """GRIT-VLP in-batch ITC with soft pseudo (consistency) targets (methods.md §0).

    Args:
        image_feat: [B, D] normalised image embeddings ``v``.
        text_feat: [B, D] normalised text embeddings ``t``.
        temperature: float or scalar tensor ``tau`` (learnable; gets gradient from both directions).
        consistency_weight: weight of the consistency term (GRIT hard-codes 0.2; MAFA uses 0).
        positive_mask: optional bool [B, B], rows images, columns texts; True marks extra
            positives (e.g. false negatives turned into positives). The diagonal is always
            positive. Targets are row-normalised. None = identity (plain one-hot).
        positive_mask_t2i: optional bool [B, B], rows texts, columns images; default
            ``positive_mask.T``.
        label_smoothing: eps in ``(1 - eps) * targets + eps / B`` (MAFA S-ITC: 0.5 after epoch 0).
        exclude: optional bool [B, B], rows images, columns texts; True removes the entry from
            the image anchor's softmax (its logit becomes ``-inf``): GloFND's dropped false
            negatives, pairs that share an image (``pretrain.false_negatives.same_image: mask``). The diagonal
            is never removed. Targets (hard and consistency) are restricted to the kept
            entries and renormalised, so no target mass sits on a removed entry.
        exclude_t2i: optional bool [B, B], rows texts, columns images; default ``exclude.T``.
        stop_gradient: GRIT-VLP's ``sg`` below (True); False sends each direction's gradient to both
            modalities, as plain InfoNCE (CLIP, ALBEF without momentum, BLIP-2) does.

    Image features may be ``[B, Q, D]`` (BLIP-2's query outputs): every ``v @ t^T`` below is then
    :func:`~falcon_cli.objectives.common.image_text_similarity`, the best query's similarity.

    Computes ``s_i2t = v @ sg[t]^T / tau`` and ``s_t2i = t @ sg[v]^T / tau`` (each direction
    sends gradient to its anchor modality only, plus tau), then::

        hard = 1/2 mean_i [CE(y_i2t[i], p_i2t[i]) + CE(y_t2i[i], p_t2i[i])]
        soft = 1/2 mean_i [CE(sg[p_t2i[i]], p_i2t[i]) + CE(sg[p_i2t[i]], p_t2i[i])]
        loss = hard + consistency_weight * soft

    With ``exclude``, ``p`` are the softmaxes over each anchor's kept entries and every CE runs
    over the kept entries only; with nothing excluded the result is the same.

    Returns :class:`ItcOutput` with ``sim_i2t`` / ``sim_t2i`` [B, B] (float32, unmasked).
    """
    _check_pair(image_feat, text_feat)
    n = image_feat.shape[0]
    tau = as_temperature(temperature)
    with fp32_region(image_feat.device):
        v, t = image_feat.float(), text_feat.float()
        sim_i2t, sim_t2i = directional_logits(v, t, tau, stop_gradient)
        targets_i2t = row_normalised_targets(positive_mask, n, v.device, label_smoothing)
        if positive_mask_t2i is None and positive_mask is not None:
            positive_mask_t2i = positive_mask.t()
        targets_t2i = row_normalised_targets(positive_mask_t2i, n, v.device, label_smoothing)
        if exclude is None and exclude_t2i is None:
            hard = (
                soft_cross_entropy(sim_i2t, targets_i2t).mean() + soft_cross_entropy(sim_t2i, targets_t2i).mean()
            ) / 2
            p_i2t = F.softmax(sim_i2t.detach(), dim=1)
            p_t2i = F.softmax(sim_t2i.detach(), dim=1)
            soft = (soft_cross_entropy(sim_i2t, p_t2i).mean() + soft_cross_entropy(sim_t2i, p_i2t).mean()) / 2
        else:
            eye = torch.eye(n, dtype=torch.bool, device=v.device)
            ex_i2t = (exclude if exclude is not None else exclude_t2i.t()).to(v.device).bool() & ~eye
            ex_t2i = (exclude_t2i if exclude_t2i is not None else exclude.t()).to(v.device).bool() & ~eye
            logp_i2t = F.log_softmax(sim_i2t.masked_fill(ex_i2t, float("-inf")), dim=1)
            logp_t2i = F.log_softmax(sim_t2i.masked_fill(ex_t2i, float("-inf")), dim=1)
            p_i2t, p_t2i = logp_i2t.detach().exp(), logp_t2i.detach().exp()  # 0 on removed entries
            # Removed log-probs are -inf: zero them so that 0 * (-inf) never appears.
            kept_i2t, kept_t2i = logp_i2t.masked_fill(ex_i2t, 0.0), logp_t2i.masked_fill(ex_t2i, 0.0)
            hard = (
                _kept_cross_entropy(kept_i2t, _restrict(targets_i2t, ex_i2t))
                + _kept_cross_entropy(kept_t2i, _restrict(targets_t2i, ex_t2i))
            ) / 2
            soft = (
                _kept_cross_entropy(kept_i2t, _restrict(p_t2i, ex_i2t))
                + _kept_cross_entropy(kept_t2i, _restrict(p_i2t, ex_t2i))
            ) / 2
        loss = hard + consistency_weight * soft
    return ItcOutput(loss=loss, hard=hard, soft=soft, sim_i2t=sim_i2t, sim_t2i=sim_t2i)


def directional_logits(
    image_feat: Tensor, text_feat: Tensor, tau: float | Tensor, stop_gradient: bool = True
) -> tuple[Tensor, Tensor]:
    """``(sim_i2t, sim_t2i)`` [B, B]: rows image anchors resp. text anchors, divided by ``tau``. With
    ``stop_gradient`` (GRIT-VLP) each direction sends gradient to its anchor modality only (``v @ sg[t]^T``,
    ``t @ sg[v]^T``); without it, both directions are the one similarity matrix and its transpose."""
    if not stop_gradient:
        sim = image_text_similarity(image_feat, text_feat) / tau
        return sim, sim.t()
    if image_feat.dim() == 2:  # (the text-anchor rows as their own product: bitwise what GRIT's code computes)
        return image_feat @ text_feat.detach().t() / tau, text_feat @ image_feat.detach().t() / tau
    return (
        image_text_similarity(image_feat, text_feat.detach()) / tau,
        image_text_similarity(image_feat.detach(), text_feat).t() / tau,
    )


def _restrict(probs: Tensor, removed: Tensor) -> Tensor:
    """``probs`` with the removed entries zeroed and those rows renormalised (rows with nothing removed are
    returned exactly as they were; no host synchronisation)."""
    kept = probs.masked_fill(removed, 0.0)
    renormalised = kept / kept.sum(dim=1, keepdim=True).clamp_min(torch.finfo(kept.dtype).tiny)
    return torch.where(removed.any(dim=1, keepdim=True), renormalised, probs)


def _kept_cross_entropy(log_probs: Tensor, targets: Tensor) -> Tensor:
    """Mean over rows of ``-sum_c targets * log_probs`` (log-probs already finite: removed entries zeroed)."""
    return -(targets * log_probs).sum(dim=1).mean()


class MomentumQueue(nn.Module):
    """ALBEF feature queues of momentum features, as buffers (move with ``.to``, saved in ``state_dict``).

    Buffers: ``image_queue`` [D, K], ``text_queue`` [D, K] (columns are features,
    initialised to random unit vectors like ALBEF), optional ``idx_queue`` [1, K] int64
    (sample / image ids, initialised to -100, for id-based positives), ``ptr`` [1] int64.

    Gathering over processes is the caller's business: pass already all-gathered features
    to :meth:`enqueue`. Use the queue in the loss *before* enqueueing the current batch.
    """

    def __init__(
        self, dim: int = 256, size: int = 65536, *, with_idx: bool = False, generator: torch.Generator | None = None
    ):
        super().__init__()
        self.dim, self.size = int(dim), int(size)
        self.register_buffer("image_queue", F.normalize(torch.randn(dim, size, generator=generator), dim=0))
        self.register_buffer("text_queue", F.normalize(torch.randn(dim, size, generator=generator), dim=0))
        self.register_buffer("idx_queue", torch.full((1, size), -100, dtype=torch.long) if with_idx else None)
        self.register_buffer("ptr", torch.zeros(1, dtype=torch.long))

    @property
    def has_idx(self) -> bool:
        """Whether an ``idx_queue`` is kept."""
        return self.idx_queue is not None

    @torch.no_grad()
    def enqueue(self, image_feat: Tensor, text_feat: Tensor, idx: Tensor | None = None) -> None:
        """Write ``image_feat`` [B, D], ``text_feat`` [B, D] (and ``idx`` [B]) at ``ptr``; advance ``ptr`` mod K.

        Raises :class:`FalconError` unless K is a multiple of B (use ``drop_last`` and a
        queue size divisible by the global batch size).
        """
        _check_pair(image_feat, text_feat)
        b = image_feat.shape[0]
        if image_feat.shape[1] != self.dim:
            raise ValueError(f"queue dim is {self.dim}, got features of dim {image_feat.shape[1]}")
        if self.size % b != 0:
            raise FalconError(
                f"momentum queue size {self.size} is not a multiple of the (global) batch size {b}; "
                "choose queue_size divisible by the batch size and drop the last incomplete batch"
            )
        if self.has_idx and idx is None:
            raise ValueError("this queue keeps ids: pass idx [B] to enqueue")
        # The columns from the pointer on, as an index tensor: the pointer is never read on the host (no sync, and
        # pretrain.runtime.graph_step's captured step holds the write).
        columns = (self.ptr + torch.arange(b, device=self.ptr.device)) % self.size
        self.image_queue.index_copy_(1, columns, image_feat.detach().t().to(self.image_queue.dtype))
        self.text_queue.index_copy_(1, columns, text_feat.detach().t().to(self.text_queue.dtype))
        if self.has_idx:
            self.idx_queue.index_copy_(1, columns, idx.detach().reshape(1, -1).to(torch.long))
        self.ptr.copy_((self.ptr + b) % self.size)


@torch.no_grad()
def momentum_update(online: nn.Module, momentum: nn.Module, m: float) -> None:
    """EMA ``p_m <- m * p_m + (1 - m) * p`` over the parameters (not buffers), in place.

    ``online`` and ``momentum`` must have the same parameter list (same architecture).
    ALBEF uses m = 0.995 and calls this every forward.
    """
    online_p, momentum_p = list(online.parameters()), list(momentum.parameters())
    if len(online_p) != len(momentum_p):
        raise ValueError(f"online has {len(online_p)} parameters but momentum has {len(momentum_p)}")
    if not online_p:
        return
    torch._foreach_mul_(momentum_p, m)
    torch._foreach_add_(momentum_p, [p.detach() for p in online_p], alpha=1.0 - m)


@torch.no_grad()
def copy_to_momentum(online: nn.Module, momentum: nn.Module) -> None:
    """Initialise ``momentum`` from ``online`` (parameter copy) and freeze it (``requires_grad=False``)."""
    online_p, momentum_p = list(online.parameters()), list(momentum.parameters())
    if len(online_p) != len(momentum_p):
        raise ValueError(f"online has {len(online_p)} parameters but momentum has {len(momentum_p)}")
    for p, p_m in zip(online_p, momentum_p):
        p_m.copy_(p)
        p_m.requires_grad_(False)


def itc_momentum_distillation(
    image_feat: Tensor,
    text_feat: Tensor,
    image_feat_m: Tensor,
    text_feat_m: Tensor,
    queue: MomentumQueue | None,
    temperature: float | Tensor,
    alpha: float,
    *,
    idx: Tensor | None = None,
) -> ItcOutput:
    """ALBEF ITC with a momentum queue and momentum distillation (reference-code.md §4).

    Args:
        image_feat, text_feat: [B, D] online normalised features (get gradient).
        image_feat_m, text_feat_m: [B, D] momentum features (treated as constants).
        queue: :class:`MomentumQueue` with [D, K] queues (read, not updated: call
            ``queue.enqueue(gathered image_feat_m, gathered text_feat_m)`` afterwards), or
            None for in-batch only (K = 0).
        temperature: float or scalar tensor.
        alpha: distillation weight (0.4 in ALBEF; ramp it with :func:`alpha_ramp`).
        idx: optional [B] sample ids; positives are then all columns with the same id
            (the batch's ``idx`` followed by ``queue.idx_queue``), row-normalised,
            as in ALBEF retrieval fine-tuning. Default: one-hot on the first B columns.

    With ``feat_all = [feat_m ; queue]`` ([D, B + K]): ``sim_i2t = v @ text_all / tau``,
    ``sim_t2i = t @ image_all / tau``, the same with momentum features for ``sim_*_m``;
    targets ``alpha * softmax(sim_m) + (1 - alpha) * onehot``; loss = mean CE, averaged
    over the two directions (= ``(1 - alpha) * hard + alpha * soft``).
    Returns :class:`ItcOutput` with ``sim_i2t`` / ``sim_t2i`` [B, B + K].
    """
    _check_pair(image_feat, text_feat)
    _check_pair(image_feat_m, text_feat_m, "momentum features")
    if image_feat.shape != image_feat_m.shape:
        raise ValueError(f"online {tuple(image_feat.shape)} and momentum {tuple(image_feat_m.shape)} features differ")
    n = image_feat.shape[0]
    tau = as_temperature(temperature)
    dev = image_feat.device
    with fp32_region(dev):
        with torch.no_grad():
            v_m, t_m = image_feat_m.detach().float(), text_feat_m.detach().float()
            tau_m = tau.detach() if isinstance(tau, Tensor) else tau
            if queue is not None:
                image_all = torch.cat([v_m.t(), queue.image_queue.detach().float()], dim=1)
                text_all = torch.cat([t_m.t(), queue.text_queue.detach().float()], dim=1)
            else:
                image_all, text_all = v_m.t(), t_m.t()
            sim_i2t_m = v_m @ text_all / tau_m
            sim_t2i_m = t_m @ image_all / tau_m
            if idx is not None:
                idx = idx.reshape(-1, 1).to(device=dev, dtype=torch.long)
                if queue is not None:
                    if not queue.has_idx:
                        raise ValueError("idx given but the queue keeps no ids (MomentumQueue(with_idx=True))")
                    idx_all = torch.cat([idx.t(), queue.idx_queue.detach()], dim=1)
                else:
                    idx_all = idx.t()
                pos = (idx == idx_all).float()
                hard_targets = pos / pos.sum(dim=1, keepdim=True)
            else:
                hard_targets = torch.zeros_like(sim_i2t_m)
                hard_targets[:, :n] = torch.eye(n, device=dev)
            soft_i2t = F.softmax(sim_i2t_m, dim=1)
            soft_t2i = F.softmax(sim_t2i_m, dim=1)
        sim_i2t = image_feat.float() @ text_all / tau
        sim_t2i = text_feat.float() @ image_all / tau
        hard = (soft_cross_entropy(sim_i2t, hard_targets).mean() + soft_cross_entropy(sim_t2i, hard_targets).mean()) / 2
        soft = (soft_cross_entropy(sim_i2t, soft_i2t).mean() + soft_cross_entropy(sim_t2i, soft_t2i).mean()) / 2
        loss = (1.0 - alpha) * hard + alpha * soft
    return ItcOutput(loss=loss, hard=hard, soft=soft, sim_i2t=sim_i2t, sim_t2i=sim_t2i)


def alpha_ramp(alpha: float, step: int, steps_in_epoch0: int, epoch: int) -> float:
    """ALBEF's distillation-weight warm-up: ``alpha * min(1, step / steps_in_epoch0)`` in epoch 0, ``alpha`` after.

    ``step`` is the iteration index within the epoch (0-based, as ALBEF's ``i``) and
    ``steps_in_epoch0`` the number of iterations of epoch 0 (``len(data_loader)``).
    """
    if epoch > 0:
        return float(alpha)
    if steps_in_epoch0 <= 0:
        raise ValueError(f"steps_in_epoch0 must be positive, got {steps_in_epoch0}")
    return float(alpha) * min(1.0, step / steps_in_epoch0)
