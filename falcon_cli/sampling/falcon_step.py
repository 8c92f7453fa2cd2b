"""FALCON's part of a training step: the reward of the batch just trained, and the scheduler's update.

Algorithm 2: after the model's update on batch k, the reward (``scheduler.reward.name``, a
:data:`~falcon_cli.registry.REWARDS` entry): a loss decrease Δ = L(θ_k) − L(θ_{k+1}) on that batch (the identical MLM
mask), or a pick score read from the step's own forward (``positive_margin`` and its judged kin,
``falcon_cli/methods/positive_margin.py``); then one REINFORCE update of the scheduler with the q's batch k was
composed with. Per-step credit (``scheduler.update.credit``) scores each caption apart, each q credited with the Δ
of the pair it chose; ``levels`` scores, per anchor, the pick of every q of a grid (the reward's ``score_levels`` of
the composer's record) and updates the scheduler with those instead of the drawn q's.

The model's side is reached only through the objective (duck-typed: the framework's): ``measure`` (the
reward's losses without gradient), ``model.encode_image`` and ``image_state`` (the training forward's image
tokens and features, for ``scheduler.reward.images: reuse``), ``match_probability`` (the ITM head's judgement of pairs).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.profiler import record_function

from falcon_cli.registry import REWARDS, PickScoring, Reward
from falcon_cli.runtime.precision import autocast
from falcon_cli.sampling.composers import Batch
from falcon_cli.sampling.scheduler import NegativeScheduler, step_rewards


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
        self.settings = settings.reward
        self.reward: Reward = REWARDS.get(settings.reward.name)
        self.eval_mode, self.reuse = settings.reward.mode == "eval", settings.reward.images == "reuse"
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
        self._prepared: Any = None

    @property
    def from_forward(self) -> bool:
        """The reward scores each pick from the training forward itself (a pick score, e.g. ``positive_margin``):
        no reward passes of the losses."""
        return self.reward.score is not None

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
        self._before = self._image = self._prepared = None
        if self.reward.prepare is not None:  # a pick score measured before the update as well (θ_k)
            with record_function("falcon/reward"):
                self._prepared = self.reward.prepare(
                    PickScoring(objective, None, inputs, None, self.settings, self.precision, self.device)
                )
        if not self.from_forward and (self.eval_mode or self.per_pair or not self.reward.from_training_loss):
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
        if self.from_forward:  # each pick scored from θ_k's forward (and its judge's record)
            delta, judged = self.reward.score(
                PickScoring(
                    objective, out, inputs, composed, self.settings, self.precision, self.device, self._prepared
                )
            )
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
                self.reward.score_levels(record, self.settings, self.scheduler.grid)
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


__all__ = ["FalconStep", "measure_reward_loss"]
