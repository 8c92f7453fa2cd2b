"""Negative-reweighted in-batch ITC losses: DiHT's HN-NCE and SRCL (drop-in replacements for :func:`itc_grit`).

Both losses keep the in-batch ITC of GRIT/ALBEF (methods.md §0) and only change the
denominator of InfoNCE: for an anchor i with logits ``l_ij`` (similarity / tau) the loss is::

    -log[ exp(l_ii) / (alpha * exp(l_ii) + sum_{j != i} w_ij * exp(l_ij)) ]

with per-anchor negative weights ``w_ij`` whose mean over the N - 1 negatives is 1
(``w_ij = (N - 1) * softmax_{j != i}(score_ij)``). It is evaluated in log space,
``-l_ii + logsumexp_j(l_ij + log w_ij)`` with ``log w_ii = log alpha``, so it is stable
for tau down to 0.001.

* :func:`itc_hn_nce` — DiHT HN-NCE (methods.md §5): ``score_ij = beta * l_ij``. Hard
  negatives (high similarity) are *up*-weighted (importance weights of the
  hardness-tilted distribution of Robinson et al. 2021). ``alpha < 1`` shrinks the
  positive's share of the denominator. Neutral setting: ``alpha = 1, beta = 0`` is InfoNCE.
* :func:`itc_srcl` — SRCL (methods.md §3.2-3.3): ``score_ij = -delta * cos_mix_ij``, with
  ``cos_mix = mix * cos(aux) + (1 - mix) * cos(current)``, the cosine similarities of a
  frozen auxiliary model mixed with the current model's (no temperature, no gradient).
  Negatives that look like the anchor (likely false negatives) are *down*-weighted.
  Neutral setting: ``delta = 0`` is InfoNCE. :func:`srcl_mix` is the ``mix`` (SRCL's alpha)
  schedule.

Conventions follow :mod:`falcon_cli.objectives.itc`:

* features are L2-normalised ``[B, D]``; logits are float32 with autocast disabled;
* each direction sends gradient to its anchor modality only (plus tau):
  ``sim_i2t = v @ sg[t]^T / tau`` (rows images), ``sim_t2i = t @ sg[v]^T / tau`` (rows texts);
* each direction is the mean over its anchors and the two directions are **averaged**
  (``/ 2``, ALBEF/GRIT scale). DiHT writes ``L_I2T + L_T2I`` (a sum); use twice the loss
  (or twice the learning rate weight) to match that scale exactly;
* the optional GRIT consistency term is the one of :func:`itc_grit`
  (``soft = 1/2 mean[CE(sg[p_t2i], p_i2t) + CE(sg[p_i2t], p_t2i)]`` with plain softmaxes of
  the unweighted logits), ``loss = hard + consistency_weight * soft``; ``hard`` is the
  reweighted loss. ``soft`` is always computed (it is cheap), so it can be logged.
* the returned ``sim_i2t`` / ``sim_t2i`` are the plain (unweighted) [B, B] logits, to mine
  ITM negatives from, exactly as with :func:`itc_grit`.

Resolved ambiguities (documented reconstructions, not statements of the papers):

* **SRCL S-1 (delta).** The paper's ``Norm(delta / s)`` with mean normalisation makes delta
  cancel. We use the recommended reconstruction ``w = (N - 1) * softmax_{j != i}(-delta *
  cos_mix_ij)``: delta acts as an inverse temperature on the mixed cosine. The mixture is
  taken over the cosines (the paper mixes ``exp(cos)`` values).
* **SRCL S-2 (alpha schedule).** :func:`srcl_mix`: linear from 1 to 0 over ``until`` of
  training, then 0.
* **SRCL S-3.** In-batch negatives only, no momentum queue / distillation, no gradient
  through ``w``.
* **HN-NCE detach.** ``detach_weights=True`` (default) treats ``w`` as a constant
  (Robinson-style importance weights). The public third-party HN-NCE implementation does
  *not* detach; ``detach_weights=False`` reproduces that (gradient also flows through ``w``
  into the anchor features and tau).
* **Scale.** Directions averaged (``/ 2``) rather than summed as in DiHT, see above.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from falcon_cli.objectives.common import as_temperature, fp32_region, image_text_similarity, soft_cross_entropy
from falcon_cli.objectives.itc import ItcOutput, _check_pair, directional_logits

__all__ = ["itc_hn_nce", "itc_srcl", "srcl_mix", "srcl_weights", "srcl_log_weights", "negative_log_weights"]


def negative_log_weights(scores: Tensor) -> Tensor:
    """``log w`` for ``w_ij = (N - 1) * softmax_{j != i}(scores_ij)``, [B, B] float32; diagonal ``-inf``.

    The weights of each row average to 1 over its N - 1 off-diagonal entries. Gradient
    flows through ``scores`` unless the caller detaches them.
    """
    n = scores.shape[0]
    eye = torch.eye(n, dtype=torch.bool, device=scores.device)
    return F.log_softmax(scores.float().masked_fill(eye, float("-inf")), dim=1) + math.log(n - 1)


def _reweighted_nce(logits: Tensor, log_w: Tensor, log_alpha: float) -> Tensor:
    """Per-anchor ``-l_ii + logsumexp_j(l_ij + log w_ij)`` with ``log w_ii := log_alpha``; returns [B]."""
    eye = torch.eye(logits.shape[0], dtype=torch.bool, device=logits.device)
    log_w = torch.where(eye, torch.full_like(log_w, log_alpha), log_w)
    return torch.logsumexp(logits + log_w, dim=1) - logits.diagonal()


def _consistency(sim_i2t: Tensor, sim_t2i: Tensor) -> Tensor:
    """GRIT's consistency term, as in :func:`itc_grit`: 1/2 mean[CE(sg[p_t2i], p_i2t) + CE(sg[p_i2t], p_t2i)]."""
    p_i2t = F.softmax(sim_i2t.detach(), dim=1)
    p_t2i = F.softmax(sim_t2i.detach(), dim=1)
    return (soft_cross_entropy(sim_i2t, p_t2i).mean() + soft_cross_entropy(sim_t2i, p_i2t).mean()) / 2


def _check_batch(image_feat: Tensor, text_feat: Tensor) -> int:
    _check_pair(image_feat, text_feat)
    n = image_feat.shape[0]
    if n < 2:
        raise ValueError(f"batch size B must be >= 2 (the loss needs in-batch negatives), got {n}")
    return n


def _check_finite(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def itc_hn_nce(
    image_feat: Tensor,
    text_feat: Tensor,
    temperature: float | Tensor,
    *,
    beta_i2t: float = 0.5,
    beta_t2i: float = 0.5,
    alpha: float = 1.0,
    detach_weights: bool = True,
    consistency_weight: float = 0.0,
) -> ItcOutput:
    """DiHT's HN-NCE in-batch ITC (methods.md §5), a replacement for :func:`itc_grit`.

    Args:
        image_feat: [B, D] normalised image embeddings ``v`` (B >= 2).
        text_feat: [B, D] normalised text embeddings ``t``.
        temperature: float or scalar tensor ``tau`` (learnable).
        beta_i2t: hardness ``beta1 >= 0`` of the image-anchor weights (0 = uniform).
        beta_t2i: hardness ``beta2 >= 0`` of the text-anchor weights.
        alpha: weight of the positive in the denominator, in ``(0, 1]`` (1 = standard).
        detach_weights: True (default, Robinson-style) computes the weights from detached
            logits, so they are constants for back-propagation. The public third-party
            HN-NCE implementation does not detach: pass False to let gradient flow through
            ``w`` too.
        consistency_weight: weight of GRIT's consistency term (0 = off; GRIT uses 0.2).

    With ``l = sim_i2t`` (rows images) resp. ``sim_t2i`` (rows texts)::

        w_ij   = (N - 1) * softmax_{j != i}(beta * l_ij)
        L_dir  = mean_i -log[ exp(l_ii) / (alpha exp(l_ii) + sum_{j != i} w_ij exp(l_ij)) ]
        hard   = (L_i2t + L_t2i) / 2          # DiHT sums; ALBEF scale here
        loss   = hard + consistency_weight * soft

    ``alpha = 1, beta = 0`` is plain InfoNCE. Returns :class:`ItcOutput` (``sim_*`` are the
    plain [B, B] float32 logits).
    """
    _check_batch(image_feat, text_feat)
    for name, beta in (("beta_i2t", beta_i2t), ("beta_t2i", beta_t2i)):
        if _check_finite(name, beta) < 0:
            raise ValueError(f"{name} must be >= 0, got {beta}")
    alpha = _check_finite("alpha", alpha)
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"alpha must lie in (0, 1], got {alpha}")
    tau = as_temperature(temperature)
    with fp32_region(image_feat.device):
        sim_i2t, sim_t2i = directional_logits(image_feat.float(), text_feat.float(), tau)
        losses = []
        for sim, beta in ((sim_i2t, float(beta_i2t)), (sim_t2i, float(beta_t2i))):
            logits_w = sim.detach() if detach_weights else sim
            log_w = negative_log_weights(beta * logits_w)
            losses.append(_reweighted_nce(sim, log_w, math.log(alpha)).mean())
        hard = (losses[0] + losses[1]) / 2
        soft = _consistency(sim_i2t, sim_t2i)
        loss = hard + consistency_weight * soft
    return ItcOutput(loss=loss, hard=hard, soft=soft, sim_i2t=sim_i2t, sim_t2i=sim_t2i)


def srcl_weights(
    image_feat: Tensor,
    text_feat: Tensor,
    *,
    aux_image_feat: Tensor,
    aux_text_feat: Tensor,
    mix: float,
    delta: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """SRCL negative weights ``(w_i2t, w_t2i)``, each [B, B] float32, no gradient, diagonal 0.

    ``cos_mix = mix * cos(aux) + (1 - mix) * cos(current)`` with rows the anchors
    (``w_i2t``: image i vs text j; ``w_t2i``: text i vs image j), and
    ``w_ij = (N - 1) * softmax_{j != i}(-delta * cos_mix_ij)``: each row averages to 1 over
    its negatives, and negatives similar to the anchor get weights below 1. This is the
    S-1 reconstruction of methods.md §3.5 (see the module docstring). Arguments as in
    :func:`itc_srcl`.
    """
    log_i2t, log_t2i = srcl_log_weights(image_feat, text_feat, aux_image_feat, aux_text_feat, mix, delta)
    return log_i2t.exp(), log_t2i.exp()


def srcl_log_weights(
    image_feat: Tensor, text_feat: Tensor, aux_image_feat: Tensor, aux_text_feat: Tensor, mix: float, delta: float
) -> tuple[Tensor, Tensor]:
    """The logs of :func:`srcl_weights` (``log_w_i2t``, ``log_w_t2i``), what :func:`itc_srcl` weighs with."""
    n = _check_batch(image_feat, text_feat)
    _check_pair(aux_image_feat, aux_text_feat, "auxiliary features")
    if aux_image_feat.shape[0] != n:
        raise ValueError(f"auxiliary features have batch size {aux_image_feat.shape[0]}, expected {n}")
    if not isinstance(
        mix, Tensor
    ):  # (a 0-d tensor: pretrain.runtime.graph_step's, computed on the device from the step)
        mix = _check_finite("mix", mix)
        if not 0.0 <= mix <= 1.0:
            raise ValueError(f"mix must lie in [0, 1], got {mix}")
    delta = _check_finite("delta", delta)
    if delta < 0:
        raise ValueError(f"delta must be >= 0, got {delta}")
    with torch.no_grad(), fp32_region(image_feat.device):
        cos_aux = aux_image_feat.detach().float() @ aux_text_feat.detach().float().t()
        cos_cur = image_text_similarity(image_feat.detach().float(), text_feat.detach().float())
        cos_mix_i2t = mix * cos_aux.to(cos_cur.device) + (1.0 - mix) * cos_cur
        log_w_i2t = negative_log_weights(-delta * cos_mix_i2t)
        log_w_t2i = negative_log_weights(-delta * cos_mix_i2t.t())
    return log_w_i2t, log_w_t2i


def itc_srcl(
    image_feat: Tensor,
    text_feat: Tensor,
    temperature: float | Tensor,
    *,
    aux_image_feat: Tensor,
    aux_text_feat: Tensor,
    mix: float,
    delta: float = 1.0,
    consistency_weight: float = 0.0,
    log_weights: tuple[Tensor, Tensor] | None = None,
) -> ItcOutput:
    """SRCL similarity-regulated in-batch ITC (methods.md §3.2-3.3), a replacement for :func:`itc_grit`.

    Args:
        image_feat: [B, D] normalised image embeddings ``v`` of the model being trained (B >= 2).
        text_feat: [B, D] normalised text embeddings ``t``.
        temperature: float or scalar tensor ``tau`` (learnable).
        aux_image_feat: [B, D'] normalised image embeddings of the frozen auxiliary model
            ``H_beta`` (D' may differ from D); treated as constants.
        aux_text_feat: [B, D'] normalised text embeddings of ``H_beta``.
        mix: SRCL's alpha in ``[0, 1]``: share of the auxiliary cosine in the mixture
            (1 = auxiliary only, 0 = current model only); schedule it with :func:`srcl_mix`.
        delta: scale ``>= 0`` of the weights (S-1 reconstruction: inverse temperature on
            the mixed cosine); 0 = uniform weights = InfoNCE.
        consistency_weight: weight of GRIT's consistency term (0 = off).
        log_weights: the logs of :func:`srcl_weights` of these arguments, where the caller computed them already
            (to keep the weights too); None computes them here.

    With no gradient, ``cos_mix = mix * cos(aux) + (1 - mix) * cos(current)`` (rows = anchors)
    and ``w_ij = (N - 1) * softmax_{j != i}(-delta * cos_mix_ij)`` (:func:`srcl_weights`); then
    with ``l = sim_i2t`` resp. ``sim_t2i``::

        L_dir = mean_i -log[ exp(l_ii) / (exp(l_ii) + sum_{j != i} w_ij exp(l_ij)) ]
        hard  = (L_i2t + L_t2i) / 2
        loss  = hard + consistency_weight * soft

    Returns :class:`ItcOutput` (``sim_*`` are the plain [B, B] float32 logits).
    """
    log_w_i2t, log_w_t2i = log_weights or srcl_log_weights(
        image_feat, text_feat, aux_image_feat, aux_text_feat, mix, delta
    )
    tau = as_temperature(temperature)
    with fp32_region(image_feat.device):
        sim_i2t, sim_t2i = directional_logits(image_feat.float(), text_feat.float(), tau)
        hard = (_reweighted_nce(sim_i2t, log_w_i2t, 0.0).mean() + _reweighted_nce(sim_t2i, log_w_t2i, 0.0).mean()) / 2
        soft = _consistency(sim_i2t, sim_t2i)
        loss = hard + consistency_weight * soft
    return ItcOutput(loss=loss, hard=hard, soft=soft, sim_i2t=sim_i2t, sim_t2i=sim_t2i)


def srcl_mix(step: int, total_steps: int, *, until: float = 1.0) -> float:
    """SRCL's alpha schedule (methods.md S-2): ``max(0, 1 - step / (until * total_steps))``.

    Linear from 1 at step 0 (auxiliary model only) to 0 at ``until * total_steps`` (current
    model only), then 0. ``until`` is the fraction of training the ramp spans (1.0 = all
    of it, 0.5 = the first half); ``step`` is the 0-based global optimiser step.
    """
    if isinstance(step, bool) or int(step) != step or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step}")
    if isinstance(total_steps, bool) or int(total_steps) != total_steps or total_steps <= 0:
        raise ValueError(f"total_steps must be a positive integer, got {total_steps}")
    until = _check_finite("until", until)
    if until <= 0:
        raise ValueError(f"until must be > 0, got {until}")
    return max(0.0, 1.0 - float(step) / (until * float(total_steps)))
