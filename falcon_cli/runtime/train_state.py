"""Everything a training loop checkpoints, saved and restored in one place.

A :class:`TrainState` holds the loop's position (epoch, the next batch of that epoch, optimizer steps), a
few plain values the loop keeps across a resume (results so far, the best epoch, ...), the weight files
(``<name>.safetensors``), and the stateful parts of the run, each an object with ``state_dict`` /
``load_state_dict``:

* ``shared`` parts are the same on every rank (optimizer, scaler, composer, embedding cache, scheduler):
  rank 0's copy is saved and every rank restores it;
* ``per_rank`` parts differ between ranks (RNG states, generators, where the rank's epoch stands): each
  rank's copy is gathered to rank 0, saved in ``ranks[r]``, and restored on rank r.

:meth:`TrainState.begin` is the one place that decides between starting fresh, refusing to train over
checkpoints the user did not ask to continue or replace, and resuming (passing over damaged checkpoints);
:meth:`TrainState.save` is the one place that writes a checkpoint. Save and restore read the same two
dictionaries, so a part added to the loop is saved and restored by naming it once.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from falcon_cli.errors import Refused
from falcon_cli.runtime import distributed as D
from falcon_cli.runtime.checkpoint import resume_point, save_checkpoint
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
        raise Refused(f"{directory.parent} already holds {what} checkpoints (the newest after step {int(kept[-1])}): "
                      "pass --resume to continue it, or --overwrite to train it again from scratch")


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

    def __init__(self, directory: Path, weights: dict[str, torch.nn.Module], *, shared: dict[str, Any],
                 per_rank: dict[str, Any], what: str, keep_last: int, meta: dict[str, Any] | None = None,
                 name: str = "", say: Callable[[str], None] = print):
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
        ``resume`` the newest intact checkpoint is loaded into every part (nothing to resume: fresh)."""
        refuse_training_over(self.directory, self.what, resume=resume, overwrite=overwrite)
        main = D.is_main_process()
        found = resume_point(self.directory, self.weights) if resume else None
        checkpoint, state, damaged = found if found is not None else (None, None, [])
        if damaged and main:
            self.say(f"[yellow]damaged checkpoints passed over[/]: {'; '.join(damaged)}")
        if checkpoint is None:
            if main:  # from scratch: what an earlier attempt saved goes
                shutil.rmtree(self.directory, ignore_errors=True)
                if resume:
                    self.say(f"nothing to resume in {self.directory}: starting from scratch")
            return None
        world = D.world_size()
        if state["world_size"] != world:
            raise Refused(f"{checkpoint}: saved with {state['world_size']} processes, resuming with {world}; "
                          f"resume with the same number (nothing was changed)")
        for name, part in self.shared.items():
            part.load_state_dict(state[name])
        mine = state["ranks"][D.rank()]
        for name, part in self.per_rank.items():
            part.load_state_dict(mine[name])
        self.epoch, self.batch_index, self.step = state["epoch"], state["batch_index"], state["global_step"]
        self.values = dict(state["values"])
        self.checkpoint = checkpoint
        if main:
            self.say(f"resumed {self.name + ' ' if self.name else ''}from {checkpoint} (epoch {self.epoch}, step {self.step})")
        return checkpoint

    def save(self, epoch: int, batch_index: int) -> Path | None:
        """Checkpoint everything needed to continue at (``epoch``, ``batch_index``) after :attr:`step` steps.
        Every rank calls it (the per-rank parts are gathered); rank 0 writes and returns the directory."""
        mine = {name: part.state_dict() for name, part in self.per_rank.items()}
        world = D.world_size()
        if world > 1:
            ranks = [None] * world if D.is_main_process() else None
            dist.gather_object(mine, ranks, dst=0)
        else:
            ranks = [mine]
        if not D.is_main_process():
            return None
        state = {"world_size": world, "epoch": epoch, "batch_index": batch_index, "global_step": self.step,
                 "ranks": ranks, "values": self.values,
                 **{name: part.state_dict() for name, part in self.shared.items()}}
        return save_checkpoint(self.directory, self.step, self.weights, state,
                               {"epoch": epoch, "batch_index": batch_index, **self.meta}, keep_last=self.keep_last)


__all__ = ["Generators", "GlobalRng", "TrainState", "refuse_training_over"]
