"""FALCON's scheduler at training time: the policy, its optimizer, the reward and the REINFORCE step.

Algorithm 2 (methods.md §1.6): after the VLP update on batch k,

    Δ_k = L(batch; θ_k) − L(batch; θ_{k+1})        (same pairs, identical MLM mask)
    loss_φ = −(Δ_k − b) · Σ log Beta(q_i; α_φ(Ŝ_i), β_φ(Ŝ_i))   over the q's batch k used

with ``b = 0`` (the paper) or a moving average of Δ (``reward_baseline: ema``).

Which passes give the two losses (A-7), ``reward_mode``:

* ``train`` (default): L_before is the training forward's own loss (train mode, its
  dropout), L_after one extra no-grad forward in train mode after the update. Both carry
  dropout noise of the same kind, so Δ is unbiased; the cost is one forward (the paper's
  0.83C vs 0.65C timing suggests about one extra forward too).
* ``eval``: two no-grad forwards in eval mode, before and after the update: no dropout
  noise, one more forward.

Rewards (``reward``) are a registry: ``mlm`` (default), ``itc+itm``, ``itc+itm+mlm`` (the
paper's ablation); :func:`register_reward` adds e.g. BLIP-2's ``itg``.

The log-probabilities are recomputed with gradient at update time from the Ŝ rows the
composer recorded: φ has not changed since the batch was composed (composition happens
after the previous update), so they are exactly the composing policy's. Under DDP every
rank updates its own copy with gradients averaged across ranks, so the copies stay equal.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from falcon_cli.sampling.policy import RewardBaseline, SchedulerPolicy, beta_log_prob, build_policy_optimizer, reinforce_loss

REWARDS: dict[str, tuple[str, ...]] = {"mlm": ("mlm",), "itc+itm": ("itc", "itm"), "itc+itm+mlm": ("itc", "itm", "mlm")}
"""Reward name -> the losses whose decrease is the reward."""


def register_reward(name: str, parts: tuple[str, ...]) -> None:
    """Add a reward: the decrease of the sum of ``parts`` (names :meth:`VlpObjective.measure` returns)."""
    REWARDS[name] = tuple(parts)


class NegativeScheduler:
    """π_φ with its AdamW, its reward definition and an optional reward baseline.

    Args:
        quantiles, hidden, blocks: policy shape (m = 100, 256, 2 in the paper).
        lr, weight_decay: AdamW (1e-4, 0.01).
        reward: a :data:`REWARDS` name. reward_mode: ``train`` or ``eval`` (see module doc).
        baseline: ``none`` (paper) or ``ema``; baseline_decay: its decay.
        grad_clip: clip the policy's gradient norm (None: no clipping, as the paper states).
    """

    def __init__(self, *, quantiles: int = 100, hidden: int = 256, blocks: int = 2, lr: float = 1e-4,
                 weight_decay: float = 0.01, reward: str = "mlm", reward_mode: str = "train",
                 baseline: str = "none", baseline_decay: float = 0.9, grad_clip: float | None = None,
                 device: torch.device | str = "cpu"):
        if reward not in REWARDS:
            raise ValueError(f"unknown reward {reward!r}; known: {', '.join(REWARDS)}")
        self.policy = SchedulerPolicy(quantiles=quantiles, hidden=hidden, blocks=blocks).to(device)
        if _world() > 1:  # every rank starts from rank 0's φ (ranks seed differently), as DDP does for the model
            for p in self.policy.parameters():
                dist.broadcast(p.data, src=0)
        self.optimizer = build_policy_optimizer(self.policy, lr, weight_decay)
        self.parts = REWARDS[reward]
        self.reward_mode = reward_mode
        self.baseline = RewardBaseline(baseline_decay) if baseline == "ema" else None
        self.grad_clip = grad_clip

    @torch.no_grad()
    def alpha_beta(self, s_hat: Tensor) -> tuple[Tensor, Tensor]:
        """(α, β) of Ŝ rows without gradient: the composer's q source."""
        return self.policy(s_hat)

    def loss_value(self, losses: dict[str, Tensor]) -> Tensor:
        """The reward's loss: the sum of its parts."""
        return sum(losses[name].detach().float() for name in self.parts)

    def update(self, record: dict[str, Tensor], reward: float) -> dict[str, float]:
        """One REINFORCE step from a batch's record ({"s_hat": [k, m], "q": [k]}) and its reward Δ."""
        device = next(self.policy.parameters()).device  # a lagged feed's records come from CPU workers
        used = ~torch.isnan(record["q"])
        s_hat, q = record["s_hat"][used].to(device), record["q"][used].to(device).float()
        baseline = self.baseline.value if self.baseline is not None else 0.0
        alpha, beta = self.policy(s_hat)
        log_prob = beta_log_prob(alpha, beta, q).sum()
        loss = reinforce_loss(reward, log_prob, baseline)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if _world() > 1:  # one φ for all ranks: average the gradients of their batches
            for p in self.policy.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= _world()
        if self.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.grad_clip)
        self.optimizer.step()
        if self.baseline is not None:
            self.baseline.update(float(reward))
        return {"log_prob": float(log_prob.detach()), "advantage": float(reward) - baseline}

    def state_dict(self) -> dict[str, Any]:
        return {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict(),
                "baseline": self.baseline.state_dict() if self.baseline is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.baseline is not None and state["baseline"] is not None:
            self.baseline.load_state_dict(state["baseline"])


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def progressive_q(epoch: int, epochs: int, start: float, end: float) -> float:
    """q of a progressive schedule: linear from ``start`` at epoch 1 to ``end`` at epoch ``epochs - 1``
    (epoch 0 is uniform; with a single scheduled epoch, ``start``)."""
    if epochs <= 2:
        return float(start)
    t = min(max((epoch - 1) / (epochs - 2), 0.0), 1.0)
    return float(start + (end - start) * t)


