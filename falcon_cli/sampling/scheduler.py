"""FALCON's scheduler at training time: the policy, its optimizer, the reward and the REINFORCE step.

Algorithm 2 (methods.md §1.6): after the VLP update on batch k,

    Δ_k = L(batch; θ_k) − L(batch; θ_{k+1})        (same pairs, identical MLM mask)
    loss_φ = −(Δ_k − b) · Σ log Beta(q_i; α_φ(Ŝ_i), β_φ(Ŝ_i))   over the q's batch k used

with ``b = 0`` (the paper) or a moving average of Δ (``scheduler.update.baseline: ema``).

Which passes give the two losses (A-7), ``scheduler.reward.mode``:

* ``train`` (default): L_before is the training forward's own loss (train mode, its
  dropout), L_after one extra no-grad forward in train mode after the update. Both carry
  dropout noise of the same kind, so Δ is unbiased; the cost is one forward (the paper's
  0.83C vs 0.65C timing suggests about one extra forward too).
* ``eval``: two no-grad forwards in eval mode, before and after the update: no dropout
  noise, one more forward.

Rewards (``reward``) are found by name in :data:`falcon_cli.registry.REWARDS`: ``mlm`` (default), ``itc+itm``,
``itc+itm+mlm`` (the paper's ablation), BLIP-2's ``itg`` (image-grounded text generation: the paper's Table 3),
``itc+itm+itg``, ours (``falcon_cli/methods/``); a plugin adds more (docs/extending.md).

The log-probabilities are recomputed with gradient at update time from the Ŝ rows the
composer recorded: φ has not changed since the batch was composed (composition happens
after the previous update), so they are exactly the composing policy's. Under DDP every
rank updates its own copy with gradients averaged across ranks, so the copies stay equal.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from falcon_cli.registry import REWARDS
from falcon_cli.sampling.policy import (
    RewardBaseline,
    SchedulerPolicy,
    beta_log_prob,
    build_policy_optimizer,
    reinforce_loss,
)

CREDITS = ("batch", "anchor", "chosen", "pair", "levels")
"""Which q's log-probability a reward multiplies (see :func:`step_rewards`); ``levels``: not the drawn q's, but a
grid of q's whose picks were all scored for the same anchor (:func:`level_loss`)."""


def level_grid(count: int) -> np.ndarray:
    """The q's ``scheduler.update.credit: levels`` scores for every anchor: the centres of ``count`` equal bins of [0,
    1], (k + 1/2) / count (float64), inside (0, 1) so that every Beta density is finite there."""
    if count < 2:
        raise ValueError(f"a level grid needs at least 2 levels, got {count}")
    return (np.arange(count, dtype=np.float64) + 0.5) / count


def level_weights(alpha: Tensor, beta: Tensor, grid: Tensor) -> Tensor:
    """``[k, L]``: how much of each anchor's Beta(α, β) (``[k]``) falls at each level of ``grid`` (``[L]``), as the
    densities at the levels normalised over them (a quadrature of the Beta on the grid's bins; differentiable)."""
    return beta_log_prob(alpha[:, None], beta[:, None], grid[None, :]).softmax(-1)


def level_loss(alpha: Tensor, beta: Tensor, grid: Tensor, advantage: Tensor) -> Tensor:
    """``scheduler.update.credit: levels``' loss: minus the expected advantage over the grid, −Σ_steps Σ_l w_l·A_l with
    w = :func:`level_weights`. Where REINFORCE learns from the one q each anchor drew (whose reward mixes the
    anchor's level with everything else the step did), this compares, for the same anchor, every q of the grid:
    its gradient moves each Beta's mass toward the levels that scored above the anchor's mean, and vanishes when
    all of it sits on the best one."""
    return -(level_weights(alpha, beta, grid) * advantage.to(alpha.dtype)).sum()


BASELINES = ("none", "ema", "batch_mean")
"""What is subtracted from a reward before it multiplies a log-probability."""


def positive_margin_rewards(
    image_feat: Tensor, text_feat: Tensor, overshoot: float = 1.0, margin: float = 0.0
) -> Tensor:
    """Per-slot rewards ``[b]`` of ``reward: positive_margin`` from a composed batch's features
    (``[b, D]``, L2-normalised, in slot order): how hard each chained pick is, as long as it stays
    below its anchor's own pair.

    The pick in slot k was chosen for the anchor in slot k − 1. Its hardness is the composer's
    similarity S = I₍ₖ₋₁₎·Tₖ + T₍ₖ₋₁₎·Iₖ (:func:`~falcon_cli.sampling.quantile.unified_similarity`), and
    the anchor's own pair sits on the same scale at S_own = 2 I₍ₖ₋₁₎·T₍ₖ₋₁₎. The reward is
    S − (1 + ``overshoot``)·max(0, S − (S_own − ``margin``)): it rises with hardness up to ``margin``
    below the anchor's own pair and falls past it, because a candidate the model finds about as close
    to the anchor as the anchor's own caption and image is a likely false negative (on the shapes
    world picks above it are false negatives 40 % of the time, the others 27 %; dense anchors cross
    their own pair at lower q). Its optimum is each anchor's own crossing point, so what the
    scheduler can learn depends on the anchor; ``margin`` moves every crossing point down.
    Slot 0 (no pick) gets 0.
    """
    return charged_margin(*chain_hardness(image_feat, text_feat), overshoot, margin)


def charged_margin(hardness: Tensor, own: Tensor, overshoot: float = 1.0, margin: float = 0.0) -> Tensor:
    """:func:`positive_margin_rewards` from the chain's :func:`chain_hardness` (for a caller that also needs the
    hardness itself, e.g. ``scheduler.reward.itm_charge: excess``): :func:`margin_worth` per slot, slot 0 (no pick)
    0."""
    out = torch.zeros_like(hardness)
    out[1:] = margin_worth(hardness[1:], own[1:], overshoot, margin)
    return out


def margin_worth(hardness: Tensor, own: Tensor, overshoot: float = 1.0, margin: float = 0.0) -> Tensor:
    """The positive margin's worth of picks of ``hardness`` S for anchors whose own pair sits at ``own`` (elementwise,
    broadcast): S − (1 + ``overshoot``)·max(0, S − (S_own − ``margin``))."""
    return hardness - (1 + overshoot) * (hardness - (own - margin)).clamp(min=0)


def chain_hardness(image_feat: Tensor, text_feat: Tensor) -> tuple[Tensor, Tensor]:
    """Per slot of a chained batch (features ``[b, D]``, L2-normalised, slot order): the hardness of the pick in
    slot k for its anchor in slot k − 1, S = I₍ₖ₋₁₎·Tₖ + T₍ₖ₋₁₎·Iₖ (the composer's similarity), and the anchor's own
    pair on the same scale, 2 I₍ₖ₋₁₎·T₍ₖ₋₁₎; float32 ``[b]`` each, slot 0 (no pick) 0."""
    image, text = image_feat.detach().float(), text_feat.detach().float()
    hardness = torch.zeros(len(image), dtype=torch.float32, device=image.device)
    own = torch.zeros_like(hardness)
    if len(image) >= 2:
        anchor_i, anchor_t, pick_i, pick_t = image[:-1], text[:-1], image[1:], text[1:]
        hardness[1:] = (anchor_i * pick_t).sum(-1) + (anchor_t * pick_i).sum(-1)
        own[1:] = 2 * (anchor_i * anchor_t).sum(-1)
    return hardness, own


def excess_over_hardness(match: Tensor, hardness: Tensor) -> Tensor:
    """Per slot ``[b]``: how much more the judge believes each pick matches its anchor than the batch's picks of the
    same hardness do: ``match`` less the least-squares line of ``match`` on ``hardness`` over slots 1…b − 1 (slot 0,
    no pick: 0). Orthogonal to hardness within the batch, so a charge of it does not push every anchor to easier
    picks (the margin decides how hard) but only away from the picks the judge finds matchier than their hardness
    explains: FALCON's claim that the right q depends on the anchor, as a signal."""
    out = torch.zeros(len(match), dtype=torch.float32, device=match.device)
    if len(match) < 2:
        return out
    y, x = match[1:].detach().float(), hardness[1:].detach().float()
    x_c, y_c = x - x.mean(), y - y.mean()
    slope = (x_c * y_c).sum() / (x_c * x_c).sum().clamp(min=1e-12)  # (one hardness for all: x_c = 0, no slope)
    out[1:] = y_c - slope * x_c
    return out


def expected_worth(margin: Tensor, match: Tensor, worth_of_match: float) -> Tensor:
    """Per slot ``[b]``, ``scheduler.reward.itm_charge: expected``: what a pick is worth if the judge is right about it.
    With probability ``match`` it matches its anchor (a false negative, worth ``-worth_of_match``), otherwise it is a
    true negative worth its ``margin`` reward (:func:`charged_margin`): (1 − p)·margin − w·p. Unlike a charge
    added to the margin, the hardness stops paying where the judge starts charging: a pick the head is sure of
    is worth −w however hard it is. Slot 0 (no pick) 0."""
    out = judged_worth(margin, match, worth_of_match)
    out[:1] = 0
    return out


def judged_worth(margin: Tensor, match: Tensor, worth_of_match: float) -> Tensor:
    """:func:`expected_worth` elementwise (every entry a pick): (1 − p)·margin − w·p."""
    p = match.detach().float().clamp(0, 1)
    return (1 - p) * margin.float() - worth_of_match * p


def chain_pairs(b: int, device: torch.device | None = None) -> tuple[Tensor, Tensor]:
    """The (image, text) pairs of a chained batch of ``b`` slots whose match a model judges for FALCON's reward:
    ``(image_index, text_index)``, int64 ``[2(b - 1)]``. The first b - 1 pair each anchor's image (slot k - 1)
    with its pick's caption (slot k), the last b - 1 each pick's image with its anchor's caption: the two
    directions of the composer's similarity S. :func:`pick_match` folds the judgements back to slots."""
    anchor = torch.arange(max(b - 1, 0), device=device)
    return torch.cat([anchor, anchor + 1]), torch.cat([anchor + 1, anchor])


def pick_match(pair_probability: Tensor, b: int) -> Tensor:
    """Per-slot match probabilities ``[b]`` from those of :func:`chain_pairs`' pairs (``[2(b - 1)]``): slot k > 0
    gets the mean of its two directions with its anchor, slot 0 (no pick) 0."""
    out = torch.zeros(b, dtype=torch.float32, device=pair_probability.device)
    if b > 1:
        p = pair_probability.detach().float()
        out[1:] = (p[: b - 1] + p[b - 1 :]) / 2
    return out


def step_rewards(per_slot: Tensor, steps: int, credit: str) -> Tensor:
    """Per-step rewards ``[steps]`` from per-slot rewards ``[b]`` (a batch's Δᵢ, in slot order).

    FALCON's chain: step t's q, drawn from the Beta of the pair in slot t (its anchor), chose the
    pair in slot t + 1. ``credit`` says whose Δ step t gets: ``anchor`` Δ_t (how much the anchor's
    own loss fell, with the negative its q picked in the batch), ``chosen`` Δ_{t+1} (the pair its q
    brought into the batch), ``pair`` their mean, ``batch`` the mean over every slot (the paper's
    one reward, given to every q alike). Steps a short batch did not take (slots ≥ b) get 0.
    """
    per_slot = per_slot.detach().double().flatten()
    out = torch.zeros(steps, dtype=torch.float64, device=per_slot.device)
    taken = min(steps, len(per_slot) - 1)
    if credit == "batch":
        out[:taken] = per_slot.mean()
    elif credit == "anchor":
        out[:taken] = per_slot[:taken]
    elif credit == "chosen":
        out[:taken] = per_slot[1 : taken + 1]
    elif credit == "pair":
        out[:taken] = (per_slot[:taken] + per_slot[1 : taken + 1]) / 2
    else:
        raise ValueError(f"unknown credit {credit!r}; known: {', '.join(CREDITS)}")
    return out


class NegativeScheduler:
    """π_φ with its AdamW, its reward definition and how rewards become a policy gradient.

    Args:
        quantiles: the policy's input width (m = 100 for the paper's Ŝ). hidden, blocks: its
            MLP (256, 2 in the paper).
        lr, weight_decay: AdamW (1e-4, 0.01).
        reward: a :data:`~falcon_cli.registry.REWARDS` name (an unknown one is a FalconError).
        reward_mode: ``train`` or ``eval`` (see module doc).
        credit: ``batch`` (the paper: one reward for every q of the batch), a per-step credit
            of :func:`step_rewards` (rewards passed per slot), or ``levels`` (rewards passed per step and level of
            the grid, :func:`level_loss`).
        levels: ``credit: levels``: the grid's size (:func:`level_grid`).
        baseline: ``none`` (paper), ``ema`` (a moving average of the mean reward) or ``batch_mean``
            (per-step credit only: each step's baseline is the mean of the batch's *other* steps'
            rewards, which removes what every pair's loss shares, e.g. the step's overall decrease).
        baseline_decay: the ``ema`` decay.
        normalize: divide advantages by their running root-mean-square (scale-free learning rate).
        entropy: weight of the Beta's mean entropy in the loss (keeps the policy from sharpening early).
        max_concentration: cap on α + β (:class:`SchedulerPolicy`); None: no cap.
        grad_clip: clip the policy's gradient norm (None: no clipping, as the paper states).
        init_q: every anchor's initial mean q (:class:`SchedulerPolicy`; None: 0.5, the paper's Beta(0.97, 0.97)).
    """

    def __init__(
        self,
        *,
        quantiles: int = 100,
        hidden: int = 256,
        blocks: int = 2,
        lr: float = 1e-4,
        weight_decay: float = 0.01,
        reward: str = "mlm",
        reward_mode: str = "train",
        credit: str = "batch",
        baseline: str = "none",
        baseline_decay: float = 0.9,
        normalize: bool = False,
        entropy: float = 0.0,
        max_concentration: float | None = None,
        grad_clip: float | None = None,
        levels: int = 10,
        init_q: float | None = None,
        device: torch.device | str = "cpu",
    ):
        if credit not in CREDITS or baseline not in BASELINES:
            raise ValueError(
                f"credit must be one of {CREDITS} and baseline one of {BASELINES}; got {credit!r}, {baseline!r}"
            )
        if baseline == "batch_mean" and credit == "batch":
            raise ValueError(
                "baseline 'batch_mean' needs a per-step credit (anchor, chosen or pair): with one reward "
                "per batch every advantage would be 0"
            )
        if credit == "levels" and baseline != "none":
            raise ValueError(
                f"credit 'levels' is its own baseline (each step's mean over the grid); got baseline {baseline!r}"
            )
        self.policy = SchedulerPolicy(
            quantiles=quantiles, hidden=hidden, blocks=blocks, max_concentration=max_concentration, init_q=init_q
        ).to(device)
        if _world() > 1:  # every rank starts from rank 0's φ (ranks seed differently), as DDP does for the model
            for p in self.policy.parameters():
                dist.broadcast(p.data, src=0)
        self.optimizer = build_policy_optimizer(self.policy, lr, weight_decay)
        self.parts = REWARDS.get(reward).parts  # (a pick score measures no loss: none)
        self.reward_mode = reward_mode
        self.credit = credit
        self.baseline_kind = baseline
        self.baseline = RewardBaseline(baseline_decay) if baseline == "ema" else None
        self.scale = RewardBaseline(0.99) if normalize else None  # running mean of advantage²
        self.entropy = float(entropy)
        self.grad_clip = grad_clip
        self.grid = torch.from_numpy(level_grid(levels)).float().to(device) if credit == "levels" else None

    @property
    def per_step(self) -> bool:
        """Whether rewards are credited per step (the caller passes per-slot rewards)."""
        return self.credit != "batch"

    @torch.no_grad()
    def alpha_beta(self, s_hat: Tensor) -> tuple[Tensor, Tensor]:
        """(α, β) of Ŝ rows without gradient: the composer's q source."""
        return self.policy(s_hat)

    def loss_value(self, losses: dict[str, Tensor]) -> Tensor:
        """The reward's loss: the sum of its parts (per pair when they are per pair)."""
        return sum(losses[name].detach().float() for name in self.parts)

    def advantages(self, rewards: Tensor) -> Tensor:
        """Per-step advantages from per-step rewards ``[k]`` (all equal under ``batch`` credit)."""
        rewards = rewards.double()
        if self.baseline_kind == "batch_mean":
            k = len(rewards)
            baseline = (rewards.sum() - rewards) / max(k - 1, 1) if k > 1 else torch.zeros_like(rewards)
        elif self.baseline is not None:
            baseline = torch.full_like(rewards, self.baseline.value)
        else:
            baseline = torch.zeros_like(rewards)
        advantage = rewards - baseline
        if self.scale is not None:
            self.scale.update(float((advantage**2).mean()))
            advantage = advantage / max(self.scale.value, 1e-12) ** 0.5
        return advantage

    def update(self, record: dict[str, Tensor], reward: float | Tensor) -> dict[str, float]:
        """One REINFORCE step from a batch's record ({"s_hat": [k, d], "q": [k]}) and its reward.

        ``reward``: Δ of the batch (a number), or the batch's per-slot Δᵢ ``[b]`` (slot order), which
        ``credit`` maps to steps (:func:`step_rewards`; under ``batch`` credit their mean is the reward);
        under ``levels`` credit, the reward of every level's pick per step of the record ``[k, L]``.
        Returns the summed log-probability, the mean advantage, the mean concentration α + β, and
        ``rewards``: the reward each used step was credited with ([k] CPU float64, before any baseline;
        ``levels``: the policy's expected reward over the grid).
        """
        device = next(self.policy.parameters()).device  # a lagged feed's records come from CPU workers
        used = ~torch.isnan(record["q"])
        # (q in float64: a draw near 0 or 1 keeps its distance from the edge, so its score is right: policy.Q_CLAMP)
        s_hat, q = record["s_hat"][used].to(device), record["q"][used].to(device).double()
        k = int(used.sum())
        alpha, beta = self.policy(s_hat)
        log_prob = beta_log_prob(alpha, beta, q)
        if self.grid is not None:  # every level's pick scored for the same anchor: no sampled q in the gradient
            level = reward.detach().to(device).double()[used.to(device)]
            if level.shape != (k, len(self.grid)) or not torch.isfinite(level).all():
                raise ValueError(
                    f"credit 'levels' needs a finite reward per used step and level, [{k}, {len(self.grid)}]; "
                    f"got shape {tuple(level.shape)}"
                )
            advantage = level - level.mean(-1, keepdim=True)
            if self.scale is not None:
                self.scale.update(float((advantage**2).mean()) if k else 0.0)
                advantage = advantage / max(self.scale.value, 1e-12) ** 0.5
            loss = level_loss(alpha, beta, self.grid, advantage)
            with torch.no_grad():
                weights = level_weights(alpha, beta, self.grid).double()
                rewards = (weights * level).sum(-1).cpu()
                advantage = (weights * advantage).sum(-1)
            batch_reward = float(rewards.mean()) if k else 0.0
        else:
            if isinstance(reward, Tensor) and reward.numel() > 1:
                per_slot = reward.detach().double().cpu()
                rewards = step_rewards(per_slot, len(used), self.credit)[used.cpu()]
                batch_reward = float(per_slot.mean())
            else:
                batch_reward = float(reward)
                rewards = torch.full((k,), batch_reward, dtype=torch.float64)
            advantage = self.advantages(rewards).to(device)
            loss = reinforce_loss(advantage, log_prob)
        if self.entropy:
            loss = loss - self.entropy * torch.distributions.Beta(alpha, beta).entropy().sum()
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
            self.baseline.update(batch_reward)
        with torch.no_grad():
            concentration = float((alpha + beta).mean()) if k else float("nan")
        return {
            "log_prob": float(log_prob.detach().sum()),
            "advantage": float(advantage.mean()) if k else 0.0,
            "concentration": concentration,
            "rewards": rewards.cpu(),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "baseline": self.baseline.state_dict() if self.baseline is not None else None,
            "scale": self.scale.state_dict() if self.scale is not None else None,
        }

    def running_state(self) -> dict[str, Any]:
        """The reward baseline's and the advantage scale's running values. Under torchrun they follow this rank's own
        rewards, so they differ between ranks (φ and its optimizer do not): checkpoints keep one per rank
        (:class:`~falcon_cli.sampling.falcon_step.FalconStep` saves them), or a resume would give every
        rank rank 0's."""
        return {
            "baseline": self.baseline.state_dict() if self.baseline is not None else None,
            "scale": self.scale.state_dict() if self.scale is not None else None,
        }

    def load_running_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`running_state` (after :meth:`load_state_dict`, which restored rank 0's)."""
        if self.baseline is not None and state.get("baseline") is not None:
            self.baseline.load_state_dict(state["baseline"])
        if self.scale is not None and state.get("scale") is not None:
            self.scale.load_state_dict(state["scale"])

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.baseline is not None and state["baseline"] is not None:
            self.baseline.load_state_dict(state["baseline"])
        if self.scale is not None and state.get("scale") is not None:
            self.scale.load_state_dict(state["scale"])


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def progressive_q(epoch: int, epochs: int, start: float, end: float) -> float:
    """q of a progressive schedule: linear from ``start`` at epoch 1 to ``end`` at epoch ``epochs - 1``
    (epoch 0 is uniform; with a single scheduled epoch, ``start``)."""
    if epochs <= 2:
        return float(start)
    t = min(max((epoch - 1) / (epochs - 2), 0.0), 1.0)
    return float(start + (end - start) * t)
