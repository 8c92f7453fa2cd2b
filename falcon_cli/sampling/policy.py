"""FALCON's negative-mining scheduler π_φ: a small MLP that maps a similarity profile to Beta(α, β).

For each anchor the composer summarises its similarity row as ``m`` (default 100)
softmax-normalised sorted quantiles Ŝ (sorted ascending, so the policy does not depend on
candidate order). The policy turns Ŝ into the parameters of a Beta distribution; the
quantile ``q ~ Beta(α, β)`` then picks how hard the next negative is (high q: harder).

Pieces:

* :class:`SchedulerPolicy` — the lightweight 4-layer residual MLP (``m → 256``, two
  residual ``256 → 256`` blocks, ``256 → 2``) with a softplus head. The head starts at zero
  weights and bias 0.5, so α = β ≈ 0.974 at initialisation (q almost uniform).
* :func:`sample_q` — Beta sampling driven by an explicit generator, so batch composition is
  reproducible and resumable (``torch.distributions.Beta.sample`` takes no generator).
* :func:`beta_log_prob`, :func:`reinforce_loss`, :class:`RewardBaseline` — the REINFORCE
  update of the policy from the reward of the batches it composed.
* :func:`build_policy_optimizer` — AdamW(lr 1e-4, weight decay 0.01) as in the paper.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from falcon_cli.runtime.precision import fp32_region

__all__ = [
    "Q_CLAMP",
    "SchedulerPolicy",
    "beta_log_prob",
    "sample_q",
    "numpy_generator",
    "reinforce_loss",
    "RewardBaseline",
    "build_policy_optimizer",
]

#: q is kept in ``[Q_CLAMP, 1 - Q_CLAMP]``: Beta samples can land on the float boundary, where the log density is
#: infinite. The clamp must be far out in the tails: every clamped sample's score is wrong, and a Beta with β < 1
#: (mean near 1, where hardness helps) puts real mass there. At 1e-6, Beta(1.75, 0.195) (mean q 0.9) clamped 7.9% of
#: its draws and E[∂ log p / ∂β] was +0.40 instead of 0, so a positive reward pushed β up and q down with no signal
#: at all (issue 70). q is float64 from the draw to the log density, so 1e-15 (a few float64 steps from 1) is
#: representable, and a draw at the clamp is scored as the event q beyond it (:func:`beta_log_prob`), so no bias is
#: left even for a Beta(3, 0.1), which puts 3.7% of its draws there (tests/sampling/test_policy.py).
Q_CLAMP = 1e-15


class SchedulerPolicy(nn.Module):
    """π_φ: Ŝ ``[..., m]`` → (α, β) ``[...]``, a residual MLP with a softplus head.

    Layers: ``Linear(m, hidden)`` + ReLU, ``blocks`` residual blocks
    ``h + relu(Linear(hidden, hidden)(h))``, then ``Linear(hidden, 2)``; α and β are
    ``softplus(raw) + eps`` so they stay strictly positive. With the default ``blocks=2``
    that is the paper's 4-layer network. Every row is processed independently.

    ``quantiles`` is the input width: m for the paper's Ŝ, more with other
    ``scheduler.features``. ``max_concentration`` (None: the paper, no cap) caps α + β: larger
    pairs are scaled down to it, keeping the mean α / (α + β), so the Beta cannot sharpen past
    that before it has learned where its mean should be. ``init_q`` (None: the paper's Beta(0.97, 0.97), mean 0.5)
    starts every anchor's Beta at that mean with the same α + β (``scheduler.init_q``).
    """

    def __init__(
        self,
        quantiles: int = 100,
        hidden: int = 256,
        blocks: int = 2,
        eps: float = 1e-5,
        init_bias: float = 0.5,
        max_concentration: float | None = None,
        init_q: float | None = None,
    ):
        super().__init__()
        if quantiles < 1 or hidden < 1 or blocks < 0:
            raise ValueError(f"quantiles and hidden must be >= 1 and blocks >= 0, got {quantiles}, {hidden}, {blocks}")
        if eps <= 0:
            raise ValueError(f"eps must be > 0, got {eps}")
        if max_concentration is not None and max_concentration <= 0:
            raise ValueError(f"max_concentration must be > 0, got {max_concentration}")
        self.max_concentration = None if max_concentration is None else float(max_concentration)
        self.quantiles = int(quantiles)
        self.hidden = int(hidden)
        self.eps = float(eps)
        self.input = nn.Linear(self.quantiles, self.hidden)
        self.blocks = nn.ModuleList(nn.Linear(self.hidden, self.hidden) for _ in range(blocks))
        self.head = nn.Linear(self.hidden, 2)
        # Zero head: α = β = softplus(init_bias) + eps for every input, i.e. q ≈ uniform at
        # the start, so early training is not biased towards easy or hard negatives.
        nn.init.zeros_(self.head.weight)
        nn.init.constant_(self.head.bias, init_bias)
        if init_q is not None:  # the same concentration α + β, its mean moved to init_q (scheduler.init_q)
            if not 0 < init_q < 1:
                raise ValueError(f"init_q must be in (0, 1), got {init_q}")
            total = 2 * (F.softplus(torch.tensor(float(init_bias), dtype=torch.float64)) + self.eps)
            target = torch.tensor([init_q, 1 - init_q], dtype=torch.float64) * total - self.eps
            with torch.no_grad():  # softplus⁻¹(y) = y + log(1 − e^(−y))
                self.head.bias.copy_((target + torch.log(-torch.expm1(-target))).float())

    def forward(self, s_hat: Tensor) -> tuple[Tensor, Tensor]:
        """Return (α, β), each of shape ``s_hat.shape[:-1]``, in float32 even under autocast."""
        if s_hat.shape[-1] != self.quantiles:
            raise ValueError(
                f"expected the last dimension of s_hat to be {self.quantiles}, got shape {tuple(s_hat.shape)}"
            )
        x = s_hat.to(self.input.weight.dtype)
        h = F.relu(self.input(x))
        for block in self.blocks:
            h = h + F.relu(block(h))
        # The head and softplus run in float32: α, β feed lgamma in the log density.
        with fp32_region(h.device):
            raw = F.linear(h.float(), self.head.weight.float(), self.head.bias.float())
            params = F.softplus(raw) + self.eps
            if self.max_concentration is not None:  # scale (α, β) down to α + β = cap, the mean unchanged
                total = params.sum(-1, keepdim=True)
                params = params * (self.max_concentration / total).clamp(max=1.0)
        return params[..., 0], params[..., 1]

    def distribution(self, s_hat: Tensor) -> torch.distributions.Beta:
        """The policy's Beta(α, β) for each row of ``s_hat`` (batch shape ``s_hat.shape[:-1]``)."""
        alpha, beta = self(s_hat)
        return torch.distributions.Beta(alpha, beta)


def beta_log_prob(alpha: Tensor, beta: Tensor, q: Tensor) -> Tensor:
    """Log density of Beta(α, β) at ``q`` (broadcast), float64, with q clamped to ``[Q_CLAMP, 1 - Q_CLAMP]`` (see
    :data:`Q_CLAMP`: in float32 the clamp would round to 1).

    Differentiable in α and β (the REINFORCE gradient). The clamp keeps the value finite
    for samples that hit 0 or 1 in floating point.
    """
    alpha, beta = alpha.to(torch.float64), beta.to(torch.float64)
    q = q.to(device=alpha.device, dtype=torch.float64).clamp(Q_CLAMP, 1.0 - Q_CLAMP)
    with fp32_region(alpha.device):
        density = torch.distributions.Beta(alpha, beta, validate_args=False).log_prob(q)
        # A draw at the clamp stands for every q past it: its log-probability is that of the event, P(1 − q < ε) ≈
        # ε^β / (β B(α, β)) (and P(q < ε) ≈ ε^α / (α B(α, β))), up to a factor 1 + O(ε), so its score is right too.
        log_beta = torch.lgamma(alpha) + torch.lgamma(beta) - torch.lgamma(alpha + beta)
        log_eps = math.log(Q_CLAMP)
        top = beta * log_eps - torch.log(beta) - log_beta
        bottom = alpha * log_eps - torch.log(alpha) - log_beta
        return torch.where(q >= 1.0 - Q_CLAMP, top, torch.where(q <= Q_CLAMP, bottom, density))


def numpy_generator(generator: torch.Generator) -> np.random.Generator:
    """A numpy generator seeded by one 63-bit draw from ``generator`` (which stays the one
    source of randomness: saving its state saves everything drawn after)."""
    seed = int(torch.randint(0, 2**63 - 1, (1,), generator=generator, device=generator.device))
    return np.random.default_rng(seed)


def check_beta_parameters(alpha: np.ndarray, beta: np.ndarray) -> None:
    """Raise ``ValueError`` unless every α and β is finite and > 0 (NaN included)."""
    if not (np.all((alpha > 0) & (alpha < np.inf)) and np.all((beta > 0) & (beta < np.inf))):
        raise ValueError("Beta parameters must be finite and > 0")


def draw_q(alpha: np.ndarray, beta: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """q ~ Beta(α, β) for checked float64 arrays, clamped to ``[Q_CLAMP, 1 - Q_CLAMP]`` (numpy's exact sampler)."""
    return np.clip(rng.beta(alpha, beta), Q_CLAMP, 1.0 - Q_CLAMP)


def sample_q(alpha: Tensor, beta: Tensor, generator: torch.Generator | np.random.Generator) -> Tensor:
    """Draw q ~ Beta(α, β) elementwise from an explicit generator (reproducible, resumable).

    The draw is numpy's exact Beta sampler (:func:`draw_q`), a few microseconds for the
    handful of anchors of a composition step (a vectorised rejection sampler in torch costs
    ~50 small kernels). ``generator``: a torch generator (one seed is drawn from it per
    call, see :func:`numpy_generator`) or a numpy generator derived from one (composition
    derives one per batch round). α and β broadcast; the result has their broadcast shape,
    α's dtype and device (float64 keeps the clamp: in float32, 1 − 1e-15 rounds to 1; composition draws float64 with
    :func:`draw_q`), no gradient, clamped to ``[Q_CLAMP, 1 - Q_CLAMP]``.
    """
    alpha, beta = torch.broadcast_tensors(alpha.detach(), beta.detach())
    a, b = alpha.double().cpu().numpy(), beta.double().cpu().numpy()
    check_beta_parameters(a, b)
    rng = generator if isinstance(generator, np.random.Generator) else numpy_generator(generator)
    out_dtype = alpha.dtype if alpha.dtype.is_floating_point else torch.get_default_dtype()
    return torch.from_numpy(draw_q(a, b, rng)).to(device=alpha.device, dtype=out_dtype)


def reinforce_loss(reward: Tensor | float, log_prob: Tensor, baseline: Tensor | float = 0.0) -> Tensor:
    """REINFORCE loss ``-Σ (reward - baseline) * log_prob``, with reward and baseline detached.

    ``reward`` and ``baseline`` are one number for every q (the paper: the batch's Δ times the
    summed log-probability) or one per q (per-step advantages, ``log_prob [k]``). Minimising it
    raises the log-probability of the q's actually used where the reward beat the baseline and
    lowers it where it fell short; at reward == baseline the gradient is exactly zero.
    """

    def detached(value: Tensor | float) -> Tensor | float:
        return value.detach().to(device=log_prob.device) if isinstance(value, Tensor) else value

    advantage = detached(reward) - detached(baseline)  # (in the reward's own precision: equal is exactly 0)
    if isinstance(advantage, Tensor):
        advantage = advantage.to(log_prob.dtype)
    return -(advantage * log_prob).sum()


class RewardBaseline:
    """Exponential moving average of the reward, subtracted in :func:`reinforce_loss` to cut variance.

    ``value`` is 0.0 before the first update; the first update sets it to that reward, later
    ones to ``decay * value + (1 - decay) * reward``.
    """

    def __init__(self, decay: float = 0.9):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.decay = float(decay)
        self.value = 0.0
        self.count = 0

    def update(self, reward: float) -> float:
        """Fold ``reward`` into the average and return the new value."""
        reward = float(reward)
        if not math.isfinite(reward):
            raise ValueError(f"reward must be finite, got {reward}")
        self.value = reward if self.count == 0 else self.decay * self.value + (1.0 - self.decay) * reward
        self.count += 1
        return self.value

    def state_dict(self) -> dict[str, Any]:
        """Plain-Python state for a checkpoint."""
        return {"decay": self.decay, "value": self.value, "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state written by :meth:`state_dict`."""
        self.decay = float(state["decay"])
        self.value = float(state["value"])
        self.count = int(state["count"])


def build_policy_optimizer(policy: nn.Module, lr: float = 1e-4, weight_decay: float = 0.01) -> torch.optim.AdamW:
    """AdamW over the policy's parameters with the paper's settings (lr 1e-4, wd 0.01, betas 0.9/0.999), fused: it
    runs after every FALCON step, so its operator count is host time on a GPU (608 operators per update unfused, 418
    fused, counted on the CPU); the update is AdamW's within float rounding."""
    return torch.optim.AdamW(policy.parameters(), lr=lr, betas=(0.9, 0.999), weight_decay=weight_decay, fused=True)
