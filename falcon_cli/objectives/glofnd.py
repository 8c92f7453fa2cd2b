"""GloFND: global false-negative discovery for the bimodal ALBEF ITC (methods.md §4).

**Method.** For an anchor ``i`` the false negatives are the negatives whose similarity to
the anchor lies in the top ``alpha`` fraction of *all* its negatives in the dataset, i.e.
above the ``(1 - alpha)``-quantile ``lambda_i`` of its similarity set ``R_i``. That
quantile solves (methods.md §4.1, eq. 2)::

    lambda_i = argmin_{nu in [-1, 1]}  nu * alpha + mean_{r in R_i} (r - nu)_+

whose stochastic subgradient on a mini-batch is
``g_i = alpha - (1 / |B_i^-|) * sum_{j in B_i^-} 1[cos_ij > lambda_i]``. GloFND keeps one
learned ``lambda_i`` per sample of the dataset, initialised to 1 (nothing is a false
negative at first), and takes one projected step on ``g_i`` every time ``i`` is in the
batch (Adam, lr 0.05, betas (0.9, 0.98), §4.3); then the negatives with
``cos_ij > lambda_i`` (the *updated* threshold) are removed from the anchor's contrastive
denominator. Lemma 3.1: at the optimum ``lambda_i`` is the ``k``-th largest value of
``R_i`` or lies between the ``k``-th and ``(k + 1)``-th, ``k = ceil(alpha |R_i|)``.

**Bimodal extension** (§4.4). Each pair ``(x_i, t_i)`` has two thresholds: ``lambda_I[i]``
for the image anchor against texts (rows of ``cos_i2t = v @ t^T``) and ``lambda_T[i]`` for
the text anchor against images (rows of ``cos_t2i = t @ v^T``). Both are updated from the
in-batch rows; texts ``j`` with ``cos(v_i, t_j) > lambda_I[i]`` are dropped from image
``i``'s softmax, images ``j`` with ``cos(t_i, v_j) > lambda_T[i]`` from text ``i``'s.
Here the contrastive loss is ALBEF/GRIT in-batch InfoNCE (no SogCLR moving average ``u``,
no momentum queue): :func:`itc_glofnd` masks the flagged logits to ``-inf``.

**Resolved ambiguities** (§4.6):

* G-1 *sparse Adam*: :class:`GlofndThresholds` keeps a manual per-index Adam state
  (``m``, ``v`` and a per-index step count); entries of pairs outside the batch, thresholds
  and Adam state alike, stay bit-for-bit unchanged (``torch.optim.Adam`` on a dense vector
  would keep moving them).
* *Adam's bias correction* (``adam_step``): the authors' code (``LambdaThreshold.update`` in
  ``bimodal/src/fast_clip/fnd.py``) divides ``m`` and ``v`` by ``1 - beta^t`` with
  ``t = epoch + 1``, the global (0-based) epoch plus one, whatever the number of updates the
  pair has had: ``adam_step="epoch"``, the default, reproduces it. ``adam_step="count"``
  uses each pair's own update count instead (textbook Adam per index; what falcon did
  before this option). They differ whenever the first update comes after epoch 0: with
  updates from epoch ``s``, ``epoch`` mode's first step is ``lr * (1 - b1) / (1 - b1^(s+1))
  / sqrt((1 - b2) / (1 - b2^(s+1)))`` (``0.74 lr`` for ``s = 1``, ``0.46 lr`` for
  ``s = 15``) where ``count`` mode's is ``lr``, and every later step differs too.
* G-2 *views*: ALBEF has one view per modality, so each threshold gets exactly one
  subgradient per step (one anchor row).
* G-3 *empty set*: the positive is never dropped, so the kept set of every anchor holds at
  least its positive and the softmax is always defined.
* G-4 *count term*: ``|S~| * g`` is the sum over the kept negatives of ``exp(s / tau)``;
  the loss per anchor is ``-log softmax`` over {positive} ∪ kept negatives at the
  positive, i.e. ``-s_ii + log(exp(s_ii) + sum_{kept j} exp(s_ij))`` (InfoNCE, which
  includes the positive in the denominator as ALBEF does).
* G-5 *self-exclusion*: the anchor's own pair (the diagonal) is excluded both from the
  threshold subgradient (average over the ``B - 1`` off-diagonal entries) and from the
  false-negative masks.

**Training loop** (the caller owns the start epoch, see :func:`glofnd_active`)::

    cos_i2t, cos_t2i = cosine_matrices(image_feat, text_feat)          # no grad, fp32
    lam_i, lam_t = thresholds.update(pair_ids, cos_i2t, cos_t2i, epoch=epoch)   # updated lambdas
    out, drop_i2t, drop_t2i = itc_glofnd(image_feat, text_feat, temp,
                                         lambda_image=lam_i, lambda_text=lam_t)

Under DDP every rank must apply identical updates to keep the (global) threshold buffers
in sync: pass all-gathered ids and similarities (or run the update on gathered features).
"""

from __future__ import annotations

import numbers
from typing import Any

import torch
from torch import Tensor, nn

from falcon_cli.errors import FalconError
from falcon_cli.objectives.common import fp32_region, image_text_similarity
from falcon_cli.objectives.itc import ItcOutput, _check_pair, itc_grit
from falcon_cli.sampling.cache import as_id_tensor

ADAM_STEPS = ("epoch", "count")
"""How the threshold Adam counts steps for its bias correction: ``epoch`` (``t = epoch + 1``, the
authors' code) or ``count`` (``t`` = the pair's own number of updates)."""

__all__ = [
    "ADAM_STEPS",
    "GlofndThresholds",
    "cosine_matrices",
    "glofnd_active",
    "glofnd_drop_masks",
    "itc_glofnd",
]


def glofnd_active(epoch: int, start_epoch: int) -> bool:
    """True from ``start_epoch`` on (0-based epochs): GloFND updates and filters only then."""
    return int(epoch) >= int(start_epoch)


@torch.no_grad()
def cosine_matrices(image_feat: Tensor, text_feat: Tensor) -> tuple[Tensor, Tensor]:
    """Detached float32 cosine similarities ``(cos_i2t, cos_t2i)``, both [B, B].

    ``image_feat`` / ``text_feat`` are the normalised [B, D] embeddings (normalisation is the
    model's business). ``cos_i2t = v @ t^T`` (rows images), ``cos_t2i = cos_i2t^T`` (rows
    texts), computed with autocast off. :func:`itc_glofnd` uses this same function, so the
    thresholds are updated and applied on identical numbers.
    """
    _check_pair(image_feat, text_feat)
    with fp32_region(image_feat.device):
        cos_i2t = image_text_similarity(image_feat.detach().float(), text_feat.detach().float())
    return cos_i2t, cos_i2t.t()


def _off_diagonal(n: int, device: torch.device) -> Tensor:
    return ~torch.eye(n, dtype=torch.bool, device=device)


def glofnd_drop_masks(
    cos_i2t: Tensor, cos_t2i: Tensor, lambda_image: Tensor, lambda_text: Tensor
) -> tuple[Tensor, Tensor]:
    """Boolean [B, B] masks of the flagged false negatives ``(drop_i2t, drop_t2i)``.

    ``drop_i2t[i, j] = cos_i2t[i, j] > lambda_image[i]`` and ``drop_t2i[i, j] =
    cos_t2i[i, j] > lambda_text[i]`` for ``j != i``; the diagonal (the positive) is never set.
    """
    n = cos_i2t.shape[0]
    if cos_i2t.shape != (n, n) or cos_t2i.shape != (n, n):
        raise ValueError(f"cosine matrices must both be [B, B], got {tuple(cos_i2t.shape)} and {tuple(cos_t2i.shape)}")
    if lambda_image.shape != (n,) or lambda_text.shape != (n,):
        raise ValueError(
            f"lambda_image / lambda_text must be [{n}], got {tuple(lambda_image.shape)} and {tuple(lambda_text.shape)}"
        )
    off = _off_diagonal(n, cos_i2t.device)
    lam_i = lambda_image.detach().to(device=cos_i2t.device, dtype=cos_i2t.dtype).reshape(n, 1)
    lam_t = lambda_text.detach().to(device=cos_t2i.device, dtype=cos_t2i.dtype).reshape(n, 1)
    return (cos_i2t.detach() > lam_i) & off, (cos_t2i.detach() > lam_t) & off


class GlofndThresholds(nn.Module):
    """Per-pair learned GloFND thresholds ``lambda_I`` / ``lambda_T`` with a per-index Adam state.

    Args:
        pair_ids: the dataset's pair ids (tensor, array or sequence of ints, unique, any
            int64 values, not necessarily contiguous).
        alpha: the false-negative fraction: ``lambda`` tracks the ``(1 - alpha)``-quantile
            of each anchor's negative similarities (methods.md §4.5: 5e-4 / 1e-3 bimodal).
        lr, betas, eps: Adam hyperparameters of the threshold update (GloFND: 0.05, (0.9, 0.98)).
        dtype: floating dtype of the thresholds and their Adam state (default float32).
        adam_step: the step count ``t`` of Adam's bias correction: ``epoch`` (the default,
            the authors' code: ``t = epoch + 1`` for every pair, so :meth:`update` needs the
            epoch) or ``count`` (``t`` = the pair's own number of updates).

    Buffers (move with ``.to()``, saved in ``state_dict``, so a resume is exact), all indexed
    by the position of the id in the sorted ``ids``: ``ids`` [N] int64 (sorted),
    ``lambda_image`` / ``lambda_text`` [N] (init 1.0), ``m_image`` / ``v_image`` /
    ``m_text`` / ``v_text`` [N] (init 0), ``step_image`` / ``step_text`` [N] int64 (init 0,
    the pair's update count in both modes), and ``adam_step_by_epoch`` (0-d bool: the mode,
    so that thresholds learned in one mode are never continued in the other). Loading a
    state dict whose ``ids`` differ from this module's is an error; one learned in the other
    ``adam_step`` mode is a :class:`~falcon_cli.errors.FalconError` (a state dict without the
    mode was written before ``adam_step`` existed, in ``count`` mode).
    """

    STATE = ("lambda_image", "m_image", "v_image", "step_image", "lambda_text", "m_text", "v_text", "step_text")
    """The per-pair buffers (thresholds and Adam state), for callers that copy rows (DDP sharing)."""

    def __init__(
        self,
        pair_ids: Any,
        alpha: float,
        *,
        lr: float = 0.05,
        betas: tuple[float, float] = (0.9, 0.98),
        eps: float = 1e-8,
        dtype: torch.dtype = torch.float32,
        adam_step: str = "epoch",
    ):
        super().__init__()
        ids = as_id_tensor(pair_ids)
        if len(ids) == 0:
            raise ValueError("GloFND thresholds need at least one pair id")
        sorted_ids = torch.sort(ids).values
        dup = sorted_ids[1:][sorted_ids[1:] == sorted_ids[:-1]]
        if len(dup):
            raise ValueError(f"GloFND thresholds: pair id {int(dup[0])} occurs more than once; pair ids must be unique")
        if not 0.0 <= float(alpha) <= 1.0:
            raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
        if not lr > 0.0:
            raise ValueError(f"lr must be positive, got {lr}")
        b1, b2 = (float(b) for b in betas)
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
            raise ValueError(f"betas must lie in [0, 1), got {betas}")
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating dtype, got {dtype}")
        if adam_step not in ADAM_STEPS:
            raise ValueError(f"adam_step must be one of {', '.join(ADAM_STEPS)}, got {adam_step!r}")
        self.adam_step = adam_step
        self.alpha = float(alpha)
        self.lr = float(lr)
        self.betas = (b1, b2)
        self.eps = float(eps)
        n = len(sorted_ids)
        self.register_buffer("ids", sorted_ids.contiguous())
        for side in ("image", "text"):
            self.register_buffer(f"lambda_{side}", torch.ones(n, dtype=dtype))
            self.register_buffer(f"m_{side}", torch.zeros(n, dtype=dtype))
            self.register_buffer(f"v_{side}", torch.zeros(n, dtype=dtype))
            self.register_buffer(f"step_{side}", torch.zeros(n, dtype=torch.int64))
        self.register_buffer("adam_step_by_epoch", torch.tensor(adam_step == "epoch"))

    def __len__(self) -> int:
        return len(self.ids)

    def extra_repr(self) -> str:
        return (
            f"n={len(self)}, alpha={self.alpha}, lr={self.lr}, betas={self.betas}, eps={self.eps}, "
            f"adam_step={self.adam_step}"
        )

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        incoming = state_dict.get(prefix + "ids")
        if incoming is not None and (
            incoming.shape != self.ids.shape or not torch.equal(incoming.to(self.ids.device), self.ids)
        ):
            error_msgs.append(
                f"GloFND thresholds: the state dict holds thresholds for other pair ids "
                f"({incoming.numel()} ids) than this module ({len(self)} ids)"
            )
            return
        key = prefix + "adam_step_by_epoch"
        mode = state_dict.get(key)
        saved = "count" if mode is None else ("epoch" if bool(mode) else "count")  # no key: saved before the option
        if saved != self.adam_step:
            raise FalconError(
                f"GloFND thresholds were learned with adam_step={saved}, this run uses "
                f"adam_step={self.adam_step}; continue them with pretrain.false_negatives.glofnd.adam_step={saved}"
            )
        if mode is None:
            state_dict = {**state_dict, key: self.adam_step_by_epoch}
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    # --- lookup -------------------------------------------------------------------------
    def rows(self, pair_ids: Any) -> Tensor:
        """Buffer index (int64, on the buffers' device) of each id; ValueError names an unknown id."""
        ids = as_id_tensor(pair_ids, device=self.ids.device)
        pos = torch.searchsorted(self.ids, ids).clamp_(max=len(self.ids) - 1)
        if (
            torch.compiler.is_compiling()
        ):  # (pretrain.runtime.graph_step: the checks read the device; ids are the dataset's)
            return pos
        bad = self.ids[pos] != ids
        if bool(bad.any()):
            raise ValueError(
                f"GloFND thresholds: pair id {int(ids[bad][0])} is not in the dataset "
                f"({int(bad.sum())} unknown id(s) of {len(ids)})"
            )
        return pos

    @torch.no_grad()
    def thresholds(self, pair_ids: Any) -> tuple[Tensor, Tensor]:
        """Current ``(lambda_I, lambda_T)`` of ``pair_ids`` [b] (copies, on the buffers' device), without updating."""
        rows = self.rows(pair_ids)
        return self.lambda_image[rows].clone(), self.lambda_text[rows].clone()

    # --- update -------------------------------------------------------------------------
    def _adam_step(self, side: str, rows: Tensor, grad: Tensor, epoch: int | None) -> Tensor:
        lam, m, v, step = (getattr(self, f"{name}_{side}") for name in ("lambda", "m", "v", "step"))
        b1, b2 = self.betas
        grad = grad.to(lam.dtype)
        count = step[rows] + 1
        m_new = b1 * m[rows] + (1.0 - b1) * grad
        v_new = b2 * v[rows] + (1.0 - b2) * grad * grad
        # Adam's bias correction 1 - beta^t: t = the global epoch + 1 (the authors' code; one number for
        # the whole batch) or t = each pair's own update count.
        if self.adam_step == "epoch":
            bc1, bc2 = 1.0 - b1 ** (epoch + 1), 1.0 - b2 ** (epoch + 1)
        else:
            tf = count.to(torch.float64)
            bc1 = (1.0 - torch.pow(torch.full_like(tf, b1), tf)).to(lam.dtype)
            bc2 = (1.0 - torch.pow(torch.full_like(tf, b2), tf)).to(lam.dtype)
        # lambda - lr * m_hat / (sqrt(v_hat) + eps), m_hat = m / (1 - b1^t), v_hat = v / (1 - b2^t)
        m_hat, v_hat = m_new / bc1, v_new / bc2
        lam_new = (lam[rows] - self.lr * m_hat / (v_hat.sqrt() + self.eps)).clamp_(-1.0, 1.0)
        m[rows] = m_new
        v[rows] = v_new
        step[rows] = count
        lam[rows] = lam_new
        return lam_new

    @torch.no_grad()
    def update(
        self, pair_ids: Any, cos_i2t: Tensor, cos_t2i: Tensor, *, epoch: int | None = None
    ) -> tuple[Tensor, Tensor]:
        """One projected Adam step on the thresholds of the batch's pairs; returns the updated ``(lambda_I, lambda_T)``.

        Args:
            pair_ids: [B] ids of the batch's pairs (unique within the batch, all in the dataset).
            cos_i2t: [B, B] cosine similarities, rows image anchors, columns texts
                (no temperature); the diagonal holds the positives.
            cos_t2i: [B, B] the same with text anchors (rows) vs images (columns).
            epoch: the 0-based training epoch; required with ``adam_step="epoch"`` (its bias
                correction uses ``t = epoch + 1``), ignored with ``count``.

        For each anchor ``i``: ``g_i = alpha - (1 / (B - 1)) * sum_{j != i} 1[cos_ij > lambda_i]``
        (with the current ``lambda_i``), then a bias-corrected Adam step on the index's own
        ``m``, ``v`` and a projection to ``[-1, 1]``. Only the batch's entries (thresholds and
        Adam state) change. Returns the updated thresholds of the batch rows, [B] each, on the
        buffers' device: the algorithm filters with them (:func:`itc_glofnd`).
        """
        if self.adam_step == "epoch" and (
            isinstance(epoch, bool) or not isinstance(epoch, numbers.Integral) or epoch < 0
        ):
            raise ValueError(f"adam_step=epoch needs the 0-based training epoch (an int >= 0), got {epoch!r}")
        rows = self.rows(pair_ids)
        n = len(rows)
        if n < 2:
            raise ValueError(f"a GloFND update needs a batch of at least 2 pairs, got {n}")
        sorted_rows = torch.sort(rows).values
        dup = sorted_rows[1:][sorted_rows[1:] == sorted_rows[:-1]] if not torch.compiler.is_compiling() else ()
        if len(dup):
            raise ValueError(f"GloFND update: pair id {int(self.ids[dup[0]])} occurs more than once in the batch")
        if cos_i2t.shape != (n, n) or cos_t2i.shape != (n, n):
            raise ValueError(
                f"cos_i2t / cos_t2i must be [{n}, {n}] for {n} pair ids, got "
                f"{tuple(cos_i2t.shape)} and {tuple(cos_t2i.shape)}"
            )
        off = _off_diagonal(n, self.ids.device)
        out = []
        for side, cos in (("image", cos_i2t), ("text", cos_t2i)):
            lam = getattr(self, f"lambda_{side}")
            cos = cos.detach().to(device=lam.device, dtype=lam.dtype)
            above = ((cos > lam[rows].reshape(n, 1)) & off).sum(dim=1).to(lam.dtype)
            grad = self.alpha - above / (n - 1)
            out.append(self._adam_step(side, rows, grad, epoch))
        return out[0].clone(), out[1].clone()


def itc_glofnd(
    image_feat: Tensor,
    text_feat: Tensor,
    temperature: float | Tensor,
    *,
    lambda_image: Tensor,
    lambda_text: Tensor,
    consistency_weight: float = 0.0,
    exclude: Tensor | None = None,
) -> tuple[ItcOutput, Tensor, Tensor]:
    """In-batch ITC with GloFND false negatives removed from each anchor's softmax.

    Args:
        image_feat, text_feat: [B, D] normalised embeddings ``v`` / ``t``.
        temperature: float or scalar tensor ``tau`` (learnable; gets gradient).
        lambda_image: [B] thresholds of the image anchors (``lambda_I``, normally the updated
            values returned by :meth:`GlofndThresholds.update`).
        lambda_text: [B] thresholds of the text anchors (``lambda_T``).
        consistency_weight: weight of GRIT's consistency term (0 = plain filtered InfoNCE).
        exclude: optional bool [B, B] (rows images, columns texts) of further entries to remove
            in both directions (pairs sharing an image, ``pretrain.false_negatives.same_image: mask``).

    With ``cos = v @ t^T`` (:func:`cosine_matrices`): image anchor ``i`` drops the texts
    ``j != i`` with ``cos[i, j] > lambda_I[i]``, text anchor ``i`` drops the images
    ``j != i`` with ``cos[j, i] > lambda_T[i]``; the positive is never dropped. The loss is
    :func:`~falcon_cli.objectives.itc.itc_grit` with those entries excluded: their logits are
    ``-inf``, so with ``s_i2t = v @ sg[t]^T / tau`` and ``s_t2i = t @ sg[v]^T / tau``::

        hard = 1/2 mean_i [-log_softmax(s~_i2t[i])[i] - log_softmax(s~_t2i[i])[i]]
        soft = 1/2 mean_i [CE(q_I[i], p~_i2t[i]) + CE(q_T[i], p~_t2i[i])]
        loss = hard + consistency_weight * soft

    where ``p~`` are the masked softmaxes and the consistency targets are GRIT's
    ``sg[p~]`` of the other direction restricted to the anchor row's kept set and
    renormalised: ``q_I[i] = sg[p~_t2i[i]]`` with ``drop_i2t[i]`` zeroed, ``q_T[i] =
    sg[p~_i2t[i]]`` with ``drop_t2i[i]`` zeroed (no target mass sits on a removed entry). With nothing dropped this is
    exactly :func:`~falcon_cli.objectives.itc.itc_grit` (same ``consistency_weight``).

    Returns ``(out, drop_i2t, drop_t2i)``: :class:`ItcOutput` whose ``sim_i2t`` / ``sim_t2i``
    are the UNMASKED float32 [B, B] logits (with gradient; detach for ITM mining), and the
    bool [B, B] masks of the dropped (flagged false-negative) entries, rows anchors (``exclude``
    is not among them).
    """
    _check_pair(image_feat, text_feat)
    cos_i2t, cos_t2i = cosine_matrices(image_feat, text_feat)
    drop_i2t, drop_t2i = glofnd_drop_masks(cos_i2t, cos_t2i, lambda_image.reshape(-1), lambda_text.reshape(-1))
    removed_i2t, removed_t2i = drop_i2t, drop_t2i
    if exclude is not None:
        exclude = exclude.to(drop_i2t.device).bool()
        removed_i2t, removed_t2i = drop_i2t | exclude, drop_t2i | exclude.t()
    out = itc_grit(
        image_feat,
        text_feat,
        temperature,
        consistency_weight=consistency_weight,
        exclude=removed_i2t,
        exclude_t2i=removed_t2i,
    )
    return out, drop_i2t, drop_t2i
