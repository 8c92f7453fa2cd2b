"""Everything a training loop checkpoints, saved and restored in one place.

A :class:`TrainState` holds the loop's position (epoch, the next batch of that epoch, optimizer steps), a
few plain values the loop keeps across a resume (results so far, the best epoch, ...), the weight files
(``<name>.safetensors``), and the stateful parts of the run, each an object with ``state_dict`` /
``load_state_dict``:

* ``shared`` parts are the same on every rank (optimizer, scaler, composer, scheduler): rank 0's copy is
  saved and every rank restores it;
* ``per_rank`` parts differ between ranks (RNG states, generators, the rank's embedding cache shards, where
  its epoch stands): each rank writes its own ``rank-<r>.pt`` into the checkpoint rank 0 is writing (nothing
  is gathered: the cache shards are gigabytes per rank) and restores it on resume. Checkpoints from before
  held them in ``training_state.pt``'s ``ranks[r]``, and are still read; a part that was shared then and is
  per rank now (the embedding cache) restores from its shared copy.

:meth:`TrainState.begin` is the one place that decides between starting fresh, refusing to train over
checkpoints the user did not ask to continue or replace, and resuming (passing over damaged checkpoints);
:meth:`TrainState.save` is the one place that writes a checkpoint. Save and restore read the same two
dictionaries, so a part added to the loop is saved and restored by naming it once.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Any, Callable

import torch

from falcon_cli.errors import FalconError, Refused
from falcon_cli.runtime import distributed as D
from falcon_cli.runtime.checkpoint import (
    RANK_STATE,
    checkpoint_path,
    checkpoint_staging,
    resume_point,
    save_checkpoint,
    save_rank_state,
    write_checkpoint,
)
from falcon_cli.runtime.seeding import rng_state, set_rng_state


class GlobalRng:
    """Python's, numpy's and torch's global RNGs as one stateful part."""

    def state_dict(self) -> dict:
        return rng_state()

    def load_state_dict(self, state: dict) -> None:
        set_rng_state(state)


class Generators(dict):
    """Named ``torch.Generator``\\ s as one stateful part (``{name: generator}``)."""

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: generator.get_state() for name, generator in self.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for name, generator in self.items():
            generator.set_state(state[name])


def refuse_training_over(directory: Path, what: str, *, resume: bool, overwrite: bool) -> None:
    """Raise :class:`Refused` when ``directory`` (a ``checkpoints/``) holds checkpoints and neither ``resume``
    nor ``overwrite`` says what to do with them: checkpoints are never trained over by accident."""
    directory = Path(directory)
    kept = sorted(d.name for d in directory.iterdir() if d.name.isdigit()) if directory.is_dir() else []
    if kept and not resume and not overwrite:
        raise Refused(
            f"{directory.parent} already holds {what} checkpoints (the newest after step {int(kept[-1])}): "
            "pass --resume to continue it, or --overwrite to train it again from scratch"
        )


class TrainState:
    """A training loop's checkpointed state (see the module docstring).

    Args:
        directory: the ``checkpoints/`` directory.
        weights: ``{file stem: module}`` written as safetensors (``model`` is what later stages load).
        shared: ``{name: part}``, identical on every rank (None entries are skipped).
        per_rank: ``{name: part}``, one per rank (None entries are skipped).
        what: what the checkpoints are of, for the refusal (e.g. ``pretraining``).
        keep_last: how many checkpoints to keep.
        meta: ``meta.json`` fields every checkpoint carries besides step, epoch and batch index.
        name: what the "resumed ... from" line names (e.g. a fine-tuning task); empty for none.
        say: prints a line on rank 0 (resumed from ..., damaged checkpoints passed over).
    """

    def __init__(
        self,
        directory: Path,
        weights: dict[str, torch.nn.Module],
        *,
        shared: dict[str, Any],
        per_rank: dict[str, Any],
        what: str,
        keep_last: int,
        meta: dict[str, Any] | None = None,
        name: str = "",
        say: Callable[[str], None] = print,
    ):
        self.directory, self.weights, self.what, self.keep_last = Path(directory), weights, what, keep_last
        self.shared = {k: v for k, v in shared.items() if v is not None}
        self.per_rank = {k: v for k, v in per_rank.items() if v is not None}
        self.meta, self.name, self.say = dict(meta or {}), name, say
        self.epoch = 0
        """The epoch the loop is in (after a finished epoch: the next one)."""
        self.batch_index = 0
        """The next batch of :attr:`epoch` to train."""
        self.step = 0
        """Optimizer steps taken so far."""
        self.values: dict[str, Any] = {}
        """Plain values the loop keeps across a resume (tensors, numbers, strings, lists, dicts)."""
        self.checkpoint: Path | None = None
        """The checkpoint resumed from (None: started fresh)."""

    def begin(self, *, resume: bool, overwrite: bool) -> Path | None:
        """Start fresh, refuse, or resume; returns the checkpoint resumed from (None: fresh).

        Checkpoints already in :attr:`directory` are never trained over by accident: without ``resume`` or
        ``overwrite`` this raises :class:`Refused`; with ``overwrite`` (and no ``resume``) they go. With
        ``resume`` the newest checkpoint intact on every rank is loaded into every part (nothing to resume:
        fresh); under DDP the ranks agree on it, so a rank file damaged on one rank sends all of them back to the
        same earlier checkpoint."""
        refuse_training_over(self.directory, self.what, resume=resume, overwrite=overwrite)
        main, world = D.is_main_process(), D.world_size()
        found = (
            resume_point(
                self.directory, self.weights, rank=D.rank(), world=world, agree=D.gather_objects if world > 1 else None
            )
            if resume
            else None
        )
        checkpoint, state, damaged = found if found is not None else (None, None, [])
        if damaged and main:
            self.say(f"[yellow]damaged checkpoints passed over[/]: {'; '.join(damaged)}")
        if checkpoint is None:
            if main:  # from scratch: what an earlier attempt saved goes
                shutil.rmtree(self.directory, ignore_errors=True)
                if resume:
                    self.say(f"nothing to resume in {self.directory}: starting from scratch")
            return None
        for name, part in self.shared.items():
            part.load_state_dict(state[name])
        mine = state.pop(RANK_STATE)
        for name, part in self.per_rank.items():
            part.load_state_dict(mine[name] if name in mine else state[name])  # (else: shared in older checkpoints)
        del mine
        self.epoch, self.batch_index, self.step = state["epoch"], state["batch_index"], state["global_step"]
        self.values = dict(state["values"])
        self.checkpoint = checkpoint
        if main:
            self.say(
                f"resumed {self.name + ' ' if self.name else ''}from {checkpoint} "
                f"(epoch {self.epoch}, step {self.step})"
            )
        return checkpoint

    def save(self, epoch: int, batch_index: int) -> Path | None:
        """Checkpoint everything needed to continue at (``epoch``, ``batch_index``) after :attr:`step` steps.
        Every rank calls it: each writes its own parts (``rank-<r>.pt``) into the checkpoint rank 0 opens, rank 0
        writes the rest and puts the checkpoint in place once every rank's file is written; returns the directory
        on rank 0, None elsewhere. A rank that fails to write makes every rank raise, the previous checkpoint
        intact."""
        mine = {name: part.state_dict() for name, part in self.per_rank.items()}
        world, rank, main = D.world_size(), D.rank(), D.is_main_process()
        state = (
            {
                "world_size": world,
                "epoch": epoch,
                "batch_index": batch_index,
                "global_step": self.step,
                "values": self.values,
                **{name: part.state_dict() for name, part in self.shared.items()},
            }
            if main
            else None
        )
        meta = {"epoch": epoch, "batch_index": batch_index, **self.meta}
        if world == 1:
            return save_checkpoint(
                self.directory, self.step, self.weights, state, meta, keep_last=self.keep_last, ranks={0: mine}
            )
        with contextlib.ExitStack() as stack:
            staging = None
            if main:
                try:
                    staging = stack.enter_context(checkpoint_staging(self.directory, self.step, self.keep_last))
                finally:  # (also when it failed: the other ranks wait for where to write)
                    D.broadcast_object(None if staging is None else str(staging), 0)
            else:
                staging = D.broadcast_object(None, 0)
                if staging is None:
                    raise FalconError(
                        f"checkpoint {self.step}: rank 0 could not open it in {self.directory}; the "
                        "previous checkpoint is intact"
                    )
            problem = None
            try:
                save_rank_state(Path(staging), rank, mine, world=world, step=self.step)
                del mine
                if main:
                    write_checkpoint(Path(staging), self.step, self.weights, state, meta)
            except Exception as exc:  # (a full disk, a lost mount: every rank must hear of it)
                problem = str(exc) or type(exc).__name__
            failed = [(r, p) for r, p in enumerate(D.gather_objects(problem)) if p is not None]
            if failed:  # (rank 0 leaves the staging block with it: the half-written checkpoint goes)
                r, why = failed[0]
                raise FalconError(
                    f"checkpoint {self.step}: rank {r} could not write its part ({why}); the previous "
                    "checkpoint is intact"
                )
        return checkpoint_path(self.directory, self.step) if main else None


__all__ = ["Generators", "GlobalRng", "TrainState", "refuse_training_over"]
