"""FALCON's part of a training step: the reward of the batch just trained, and the scheduler's update.

Algorithm 2: after the model's update on batch k, the reward Δ = L(θ_k) − L(θ_{k+1}) on that batch (the
identical MLM mask), or, with ``reward: positive_margin``, each pick's hardness charged past its anchor's own
pair, read from the step's own forward (no extra pass; ``positive_margin+itm`` also charges the model's own
ITM match probability of each pick with its anchor, one no-grad pass of the fusion layers, and
``positive_margin+oracle`` the shapes world's ground truth of it, a diagnostic); then one
REINFORCE update of the scheduler with the q's batch k was composed with. Per-step credit
(``scheduler.update.credit``) scores each caption apart, each q credited with the Δ of the pair it chose; ``levels``
scores, per anchor, the pick of every q of a grid (the composer's record: :func:`level_rewards`) and updates the
scheduler with those instead of the drawn q's.

The model's side is reached only through the objective (duck-typed: the framework's): ``measure`` (the
reward's losses without gradient), ``model.encode_image`` and ``image_state`` (the training forward's image
tokens and features, for ``scheduler.reward.images: reuse``), ``match_probability`` (the ITM head's judgement of pairs).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.profiler import record_function

from falcon_cli.errors import FalconError
from falcon_cli.runtime.precision import autocast
from falcon_cli.sampling.composers import Batch
from falcon_cli.sampling.scheduler import (
    NegativeScheduler,
    chain_hardness,
    chain_pairs,
    charged_margin,
    excess_over_hardness,
    expected_worth,
    judged_worth,
    margin_worth,
    pick_match,
    step_rewards,
)

JUDGED_REWARDS = ("positive_margin+itm", "positive_margin+oracle")
"""The rewards that charge each pick a judge's belief that it matches its anchor (``scheduler.reward.itm_charge``)."""


def oracle_match(composed: Batch, device: torch.device) -> torch.Tensor:
    """Per slot ``[b]`` on ``device``, ``reward: positive_margin+oracle``: 1.0 where the shapes world's oracle says the
    pick truly matches its anchor (``Batch.chosen_is_fn``), else 0.0; slot 0 (no pick) 0. A chained slot the oracle
    did not judge is an error (the composer was built without the world's truth)."""
    truth = composed.chosen_is_fn.float()
    if len(truth) > 1 and torch.isnan(truth[1:]).any():
        raise FalconError(
            "reward=positive_margin+oracle: the batch's picks carry no oracle verdict (the dataset is not "
            "a shapes world, or the composer was built without its truth); use reward=positive_margin+itm"
        )
    out = torch.zeros(len(truth), dtype=torch.float32)
    out[1:] = truth[1:]
    return out.to(device)


def level_rewards(
    record: dict[str, torch.Tensor],
    reward: str,
    overshoot: float,
    margin: float,
    weight: float,
    charge: str,
    hardness: str = "margin",
    grid: torch.Tensor | None = None,
) -> torch.Tensor:
    """``scheduler.update.credit: levels``: the reward ``[k, L]`` of every level's pick for each step's anchor, from the
    composer's record (``level_hardness``, ``level_own``: the epoch's cached features; ``level_fn``: the oracle's
    verdict), as the training forward's own picks are scored: the positive margin (:func:`margin_worth`), and with
    ``positive_margin+oracle`` the judge's charge (``expected``: (1 − p)·margin − w·p; ``absolute``: margin − w·p).
    ``hardness: rank``: each level's pick is worth its level's q (``grid``, ``[L]``) instead of the margin.
    Steps not taken stay NaN (the scheduler leaves them out); a taken step whose level the oracle did not judge is
    an error."""
    level_hardness = record["level_hardness"].float()
    if hardness == "rank":  # the level itself, where a step was taken
        worth = grid.to(level_hardness.device).float().expand_as(level_hardness)
        worth = worth.masked_fill(torch.isnan(level_hardness), float("nan"))
    else:
        worth = margin_worth(level_hardness, record["level_own"].float()[..., None], overshoot, margin)
    if reward == "positive_margin+oracle":
        verdict = record["level_fn"].to(worth.device)
        if torch.isnan(verdict).logical_and(~torch.isnan(worth)).any():
            raise FalconError(
                "reward=positive_margin+oracle: the composer's level picks carry no oracle verdict (the "
                "dataset is not a shapes world); use reward=positive_margin"
            )
        p = verdict.nan_to_num(0.0)
        worth = judged_worth(worth, p, weight) if charge == "expected" else worth - weight * p
        worth = worth.masked_fill(torch.isnan(verdict), float("nan"))
    return worth


def measure_reward_loss(
    objective,
    scheduler: NegativeScheduler,
    precision: str,
    device: torch.device,
    *,
    eval_mode: bool,
    inputs: tuple,
    image: tuple | None = None,
    same_image: torch.Tensor | None = None,
    per_pair: bool = False,
) -> tuple[torch.Tensor, tuple]:
    """The reward's loss on ``inputs`` (no gradient; per caption ``[B]`` with ``per_pair``), in eval mode or
    the current train mode, and the image (tokens, features) it used: ``image`` if given
    (``scheduler.reward.images: reuse``), else encoded now. ``same_image``: the pairs removed from ITC/ITM in
    training (``same_image: mask``), removed here too."""
    if eval_mode:
        objective.eval()
    try:
        with autocast(precision, device), torch.no_grad():
            if image is None:
                image = objective.model.encode_image(inputs[0])
            return scheduler.loss_value(
                objective.measure(*inputs, parts=scheduler.parts, image=image, same_image=same_image, per_pair=per_pair)
            ), image
    finally:
        objective.train()


class FalconStep:
    """The reward and scheduler update of each FALCON step, and the epoch's record of them.

    Args:
        scheduler: FALCON's :class:`~falcon_cli.sampling.scheduler.NegativeScheduler`.
        settings: the scheduler's settings (``pretrain.scheduler``: its ``reward`` section and ``overlap``).
        precision, device: the training step's.

    ``settings.overlap``: the update of step k waits until step k + 1 has been launched (:meth:`settle`), so the
    device runs step k + 1 while the host reads step k's reward, updates the scheduler and composes the next batch;
    on CUDA that host work runs on a stream of its own, so its reads wait for step k's reward, not for step k + 1.
    """

    def __init__(self, scheduler: NegativeScheduler, settings: Any, precision: str, device: torch.device):
        self.scheduler, self.precision, self.device = scheduler, precision, device
        self.overlap = settings.overlap
        self.pending: dict[str, Any] | None = None
        """(``overlap``) the last step's reward, whose update waits for the next step's launch."""
        self.side = torch.cuda.Stream(device) if self.overlap and device.type == "cuda" else None
        self.reward, self.eval_mode, self.reuse = (
            settings.reward.name,
            settings.reward.mode == "eval",
            settings.reward.images == "reuse",
        )
        self.overshoot, self.margin, self.itm_weight = (
            settings.reward.overshoot,
            settings.reward.margin,
            settings.reward.itm_weight,
        )
        self.itm_charge, self.hardness = settings.reward.itm_charge, settings.reward.hardness
        self.per_pair = scheduler.per_step
        self.rewards: list[float] = []
        """This epoch's mean reward per step (kept in checkpoints for the epoch summary)."""
        self.credited: list[list[float]] = []
        """Per used step: [its credited reward, whether its pick was a false negative (NaN without an oracle)]."""
        self.judged: list[list[float]] = []
        """``positive_margin+itm`` (``+oracle``), per pick: [the judge's match probability of it with its anchor,
        whether it was a false negative (NaN without an oracle), the charge per unit of weight (the probability, its
        excess over the batch's picks of the same hardness, or what ``expected`` took from the margin over the
        weight)]: does the judge see the false picks, apart from the margin?"""
        self._before: torch.Tensor | None = None
        self._image: tuple | None = None

    @property
    def from_forward(self) -> bool:
        """The reward is read from the training forward itself (``positive_margin``, ``+itm``, ``+oracle``):
        no reward passes of the losses."""
        return self.reward.startswith("positive_margin")

    def pick_match(self, objective, out, inputs: tuple) -> torch.Tensor:
        """Per-slot ITM match probability ``[b]`` of each pick with its anchor (slot 0: 0), in eval mode (the
        head's judgement without dropout noise), under the training step's precision."""
        b = len(inputs[1])
        image_index, text_index = chain_pairs(b, inputs[1].device)
        objective.eval()
        try:
            with record_function("falcon/reward"), autocast(self.precision, self.device):
                pairs = objective.match_probability(out, inputs[1], inputs[2], image_index, text_index)
        finally:
            objective.train()
        return pick_match(pairs, b)

    def _measure(self, objective, inputs: tuple, same_image, image=None) -> tuple[torch.Tensor, tuple]:
        with record_function("falcon/reward"):
            return measure_reward_loss(
                objective,
                self.scheduler,
                self.precision,
                self.device,
                eval_mode=self.eval_mode,
                per_pair=self.per_pair,
                inputs=inputs,
                image=image,
                same_image=same_image,
            )

    def before(self, objective, inputs: tuple, same_image: torch.Tensor | None) -> None:
        """Before the update: L(θ_k) from a no-grad pass where the training forward cannot give it (eval mode,
        per-caption credit, the alignment reward). ``inputs``: (images, input_ids, attention_mask, mlm mask)."""
        self._before = self._image = None
        if not self.from_forward and (self.eval_mode or self.per_pair or self.reward == "alignment"):
            self._before, self._image = self._measure(objective, inputs, same_image)

    def after(
        self,
        objective,
        out,
        losses: dict[str, torch.Tensor],
        inputs: tuple,
        same_image: torch.Tensor | None,
        composed: Batch,
        record: dict[str, torch.Tensor],
        halted: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        """After the update: the reward (:meth:`step_reward`), then the scheduler's update with the batch's ``record``
        (:meth:`settle`: at once, or with ``overlap`` the previous step's); returns that update's ``reward`` (its
        step's mean), ``advantage`` and ``concentration`` (empty when no update was made). ``halted``: the
        non-finite guard's verdict after this step (:class:`~falcon_cli.runtime.finite.NonFiniteGuard`), read with
        the reward: a step after a non-finite one updates no scheduler, and the update returns ``{"halted": True}``
        instead (the caller stops the run)."""
        return self.settle(self.step_reward(objective, out, losses, inputs, same_image, composed, record, halted))

    def settle(self, pending: dict[str, Any]) -> dict[str, Any]:
        """The scheduler's update from ``pending`` (:meth:`step_reward`'s), or with ``overlap`` from the one before it,
        keeping this one for the next step (or :meth:`flush`)."""
        if not self.overlap:
            return self.update(pending)
        previous, self.pending = self.pending, pending
        return self.update(previous) if previous is not None else {}

    def flush(self) -> dict[str, Any]:
        """The update still waiting at the end of an epoch (``overlap``), if any."""
        previous, self.pending = self.pending, None
        return self.update(previous) if previous is not None else {}

    @torch.no_grad()
    def step_reward(
        self,
        objective,
        out,
        losses: dict[str, torch.Tensor],
        inputs: tuple,
        same_image: torch.Tensor | None,
        composed: Batch,
        record: dict[str, torch.Tensor],
        halted: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        """The step's reward, computed on the device and not read: ``{"delta"}`` (per slot, or the batch's), the
        batch's scheduler ``record`` and what the update's bookkeeping needs (whether each pick was a false
        negative; the judge's match and charge). Enqueued right after the step, before the next one."""
        judged = None
        if self.from_forward:  # each pick's hardness, charged past its anchor's own pair (θ_k's features)
            hardness, own = chain_hardness(out.image_feat, out.text_feat)
            if self.hardness == "rank":  # each pick's rank among its anchor's candidates (slot 0, no pick: 0)
                delta = composed.quantile_rank.float().nan_to_num(0.0).to(hardness.device)
                delta[:1] = 0
            else:
                delta = charged_margin(hardness, own, self.overshoot, self.margin)
            if self.reward in JUDGED_REWARDS:  # a pick its judge (the ITM head, or the oracle) calls a match pays
                match = (
                    self.pick_match(objective, out, inputs)
                    if self.reward == "positive_margin+itm"
                    else oracle_match(composed, delta.device)
                )
                if self.itm_charge == "expected":  # the margin only as far as the judge calls the pick a true negative
                    worth = expected_worth(delta, match, self.itm_weight)
                    charge, delta = (delta - worth) / (self.itm_weight or 1.0), worth
                else:
                    charge = match
                    if self.itm_charge == "excess":  # only what its hardness does not explain (the margin prices that)
                        charge = excess_over_hardness(match, hardness)
                    delta = delta - self.itm_weight * charge
                judged = torch.stack([match[1:].double(), charge[1:].double()], 1)
        else:
            before, image = self._before, self._image
            if before is None:  # L(θ_k) is the training forward's own loss, and its image
                before, image = self.scheduler.loss_value(losses), objective.image_state(out)
            after, _ = self._measure(objective, inputs, same_image, image=image if self.reuse else None)
            delta = before - after
        pending = {
            "delta": delta.detach(),
            "record": record,
            "chosen_is_fn": composed.chosen_is_fn,
            "judged": judged,
            "halted": None if halted is None else halted.detach().clone(),
        }
        if self.side is not None:  # (the side stream's reads wait for this event, not for the next step)
            pending["ready"] = torch.cuda.Event()
            pending["ready"].record()
        return pending

    def update(self, pending: dict[str, Any]) -> dict[str, Any]:
        """Read ``pending``'s reward and update the scheduler with it (on the side stream under ``overlap`` on CUDA)."""
        with self.host_work():
            if pending.get("ready") is not None:
                torch.cuda.current_stream().wait_event(pending["ready"])
            if pending.get("halted") is not None and bool(pending["halted"]):  # (read after the event: step k's)
                return {"halted": True}
            return self._update(pending["delta"], pending["record"], pending["chosen_is_fn"], pending["judged"])

    def compose_within(self, loader):
        """``loader``'s batches, each asked for inside :meth:`host_work` (FALCON composes it then)."""
        iterator = iter(loader)
        while True:
            with self.host_work():
                batch = next(iterator, None)
            if batch is None:
                return
            yield batch

    def host_work(self):
        """The context the host's FALCON work runs in: the side stream under ``overlap`` on CUDA (composition too)."""
        return torch.cuda.stream(self.side) if self.side is not None else contextlib.nullcontext()

    def _update(
        self,
        delta: torch.Tensor,
        record: dict[str, torch.Tensor],
        chosen_is_fn: torch.Tensor,
        judged: torch.Tensor | None,
    ) -> dict[str, Any]:
        if judged is not None:
            self.judged += torch.cat(
                [judged[:, :1].cpu(), chosen_is_fn[1:].double()[:, None], judged[:, 1:].cpu()], 1
            ).tolist()
        self.rewards.append(float((delta[1:] if self.from_forward else delta).mean()))  # (slot 0 has no pick)
        levels = self.scheduler.grid is not None
        with record_function("falcon/update"):
            target = (
                level_rewards(
                    record,
                    self.reward,
                    self.overshoot,
                    self.margin,
                    self.itm_weight,
                    self.itm_charge,
                    self.hardness,
                    self.scheduler.grid,
                )
                if levels
                else delta
                if self.per_pair
                else self.rewards[-1]
            )
            update = self.scheduler.update(record, target)
        # what each used step's own pick earned (under levels, the update learned from the grid instead)
        credited = (
            step_rewards(delta.cpu(), len(record["q"]), "chosen")[~torch.isnan(record["q"]).cpu()]
            if levels
            else update["rewards"]
        )
        picked = chosen_is_fn[1:][: len(credited)].double()
        self.credited += torch.stack([credited.cpu(), picked], 1).tolist()
        return {"reward": self.rewards[-1], "advantage": update["advantage"], "concentration": update["concentration"]}

    def reset(self) -> None:
        """A new epoch: its record starts empty."""
        self.rewards, self.credited, self.judged = [], [], []
        self.pending = None

    def state_dict(self) -> dict[str, Any]:
        pending = None
        if self.pending is not None:  # (overlap: the update the next step makes; a resumed run makes it there too)
            pending = {key: _to_cpu(value) for key, value in self.pending.items() if key != "ready"}
        return {
            "rewards": list(self.rewards),
            "credited": [list(c) for c in self.credited],
            "judged": [list(j) for j in self.judged],
            "scheduler_running": self.scheduler.running_state(),
            "pending": pending,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pending = state.get("pending")  # (absent from older checkpoints)
        self.pending = (
            None if pending is None else {key: _to_device(value, self.device) for key, value in pending.items()}
        )
        self.rewards, self.credited = list(state["rewards"]), [list(c) for c in state["credited"]]
        self.judged = [list(j) for j in state.get("judged", [])]  # (absent from older checkpoints)
        # this rank's reward baseline and advantage scale (the shared scheduler state holds rank 0's; absent from
        # checkpoints saved before they were kept per rank)
        if state.get("scheduler_running") is not None:
            self.scheduler.load_running_state(state["scheduler_running"])


def _to_cpu(value: Any) -> Any:
    """A pending reward's tensors for a checkpoint: on the CPU, each with the device it goes back to."""
    if isinstance(value, torch.Tensor):
        return {"tensor": value.detach().cpu(), "device": "cuda" if value.is_cuda else "cpu"}
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value


def _to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, dict) and set(value) == {"tensor", "device"}:
        return value["tensor"].to(device if value["device"] != "cpu" else "cpu")
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    return value


__all__ = ["JUDGED_REWARDS", "FalconStep", "level_rewards", "measure_reward_loss", "oracle_match"]
