"""What a composer does around each training step, behind one interface, so the training loop names no composer.

:class:`StepHooks` does nothing: uniform, GRIT and the fixed or progressive quantiles compose an epoch up front and
need nothing per step. :class:`FalconHooks` is FALCON's Algorithm 2 around the step: batch k + 1 composed from the
scheduler after update k (the loader asks it), L(θ_k) before the step where the reward needs a pass, the reward and
the scheduler's REINFORCE update after it (:class:`~falcon_cli.sampling.falcon_step.FalconStep`), and the epoch's
record of what the scheduler did.
"""

from __future__ import annotations

from typing import Any

from falcon_cli.sampling.oracle_view import composition_summary

STEP_LOGGED = ("reward", "advantage", "concentration")
"""The keys a step's hooks add to its ``metrics.jsonl`` record (None where a composer has none)."""


class StepHooks:
    """Around each step, nothing: the hooks of a composer that composes every epoch up front."""

    def epoch_composed(self) -> None:
        """The epoch's batches were composed anew (not resumed inside it)."""

    def begin_epoch(self, epoch: int) -> None:
        """The epoch starts (or resumes)."""

    @property
    def lag(self) -> int:
        """Batches composed ahead of the step training (a composer that composes one batch at a time)."""
        return 0

    def loader(self, loader):
        """The epoch's batches as the loop reads them."""
        return loader

    @property
    def syncs(self) -> bool:
        """Whether each step reads a number on the host anyway (so the non-finite verdict costs nothing more)."""
        return False

    def before_step(self, objective, inputs: tuple, same_image) -> None:
        """Before the step's forward."""

    def after_step(self, objective, out, losses: dict, inputs: tuple, same_image, pair_ids, halted) -> dict:
        """After the model's update: what to log (:data:`STEP_LOGGED`) and ``halted`` when a non-finite step stopped
        an update that was still waiting."""
        return {}

    def end_epoch(self, epoch: int) -> tuple[bool, dict | None]:
        """The epoch is over: (an update still waiting found a non-finite step, the epoch's summary record)."""
        return False, None


class FalconHooks(StepHooks):
    """FALCON's scheduler around each step of the epochs it composes one batch at a time (``on_demand``)."""

    def __init__(self, falcon: Any, epochs: Any, batch_log: Any, *, lag: int, overlap: bool):
        self.falcon, self.epochs, self.batch_log = falcon, epochs, batch_log
        self.composed_ahead, self.overlap = lag, overlap
        self.active = False

    @property
    def lag(
        self,
    ) -> int:  # (scheduler.overlap: one step of the lag is the scheduler's own, the loader composes the rest)
        return self.composed_ahead - self.overlap

    def epoch_composed(self) -> None:
        self.falcon.reset()

    def begin_epoch(self, epoch: int) -> None:
        self.active = self.epochs.on_demand(epoch)

    def loader(self, loader):
        # (composition is FALCON's host work: on its own stream under scheduler.overlap)
        return self.falcon.compose_within(loader) if self.active else loader

    @property
    def syncs(self) -> bool:  # (the reward is read every step, except under overlap, whose update reads the verdict)
        return self.active and not self.overlap

    def before_step(self, objective, inputs: tuple, same_image) -> None:
        if self.active:  # L(θ_k) from a no-grad pass, where the reward needs one
            self.falcon.before(objective, inputs, same_image)

    def after_step(self, objective, out, losses: dict, inputs: tuple, same_image, pair_ids, halted) -> dict:
        if not self.active:
            return {}
        return self.falcon.after(  # the reward of this batch, and the scheduler's REINFORCE update
            objective,
            out,
            losses,
            inputs,
            same_image,
            *self.epochs.take(pair_ids),
            halted=halted if self.overlap else None,
        )

    def end_epoch(self, epoch: int) -> tuple[bool, dict | None]:
        if not self.active:
            return False, None
        halted = bool(self.falcon.flush().get("halted"))  # (overlap: the epoch's last update, still waiting)
        record = composition_summary(
            self.batch_log.rows(epoch), self.falcon.rewards, self.falcon.credited, self.falcon.judged
        )
        return halted, record


def step_hooks(falcon: Any, epochs: Any, batch_log: Any, *, lag: int = 0, overlap: bool = False) -> StepHooks:
    """FALCON's hooks where a scheduler composes (``lag``, ``overlap``: ``pretrain.scheduler``'s), else the empty
    ones."""
    if falcon is None:
        return StepHooks()
    return FalconHooks(falcon, epochs, batch_log, lag=lag, overlap=overlap)


__all__ = ["STEP_LOGGED", "FalconHooks", "StepHooks", "step_hooks"]
