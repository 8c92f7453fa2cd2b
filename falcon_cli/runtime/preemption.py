"""Preemption: a signal before the kill becomes a checkpoint of the exact step, then a requeue exit.

A cluster that takes a job's nodes back warns it first: SLURM sends SIGTERM on preemption (or, with
``#SBATCH --signal=USR1@120``, the signal of the user's choice that many seconds before the time limit), then
SIGKILL after a grace period (``GraceTime`` / ``KillWait``: 30 s unless the cluster says otherwise). Without a
handler the run loses everything since its last checkpoint.

:class:`Preemption` catches SIGTERM, SIGUSR1 and SIGUSR2 while a training loop runs. The handler only notes the
signal; the loop asks :meth:`Preemption.requested` after each step (under ``torchrun`` a small all-reduce on the
host, so every rank stops after the *same* step even when the signal reached only some of them), checkpoints
that exact point (mid-epoch: the composer's, the scheduler's and every RNG's state, as ``--resume`` needs) and
raises :class:`Preempted`: one line, exit status :data:`REQUEUE_EXIT` (75, ``EX_TEMPFAIL``: "try again").

* A step and its checkpoint that are still running when the grace period is nearly over end the process with
  one line: the checkpoint being written is a temporary directory, ``latest`` still names the previous one.
* A second signal more than :data:`DUPLICATE_S` after the first ends the process at once, with the same
  guarantee. (Within that second it is the same notice delivered twice: SLURM signals every process of the
  step, and torchrun's agent forwards the signal to its workers again.)
* Under SLURM, a USR1/USR2 notice (the time limit is near: SLURM will not requeue the job by itself) makes
  rank 0 run ``scontrol requeue $SLURM_JOB_ID`` once the checkpoint is saved, as PyTorch Lightning does;
  a SIGTERM (preemption: SLURM requeues a ``--requeue`` job itself; or ``scancel``) does not.
* Forked DataLoader workers inherit the handler and ignore the signal: their parent decides.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from falcon_cli.artifacts.checkpoints import LATEST, latest_checkpoint
from falcon_cli.errors import REQUEUE_EXIT, Preempted
from falcon_cli.runtime import distributed as D
from falcon_cli.runtime.console import make_console

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
"""The signals that mean "you are about to be killed: save and go"."""

DUPLICATE_S = 1.0
"""A signal this soon after the first is the same notice delivered twice, not a second one."""

MARGIN_S = 2.0
"""The process ends itself this long before the grace period is over (at most a tenth of it), so that its
line is written before the kill."""


class Preemption:
    """The preemption signals while a training loop runs (a context manager; see the module docstring).

    Args:
        grace_s: seconds from the first signal to the kill that follows it (``pretrain.runtime.preempt_grace_s``).
        key: the config key that sets ``grace_s``, for messages.
        checkpoints: the loop's ``checkpoints/`` directory (the lines that exit without a new checkpoint name
            the one ``--resume`` will continue from).
        say: prints a line on this rank (default: the console on standard error).
    """

    def __init__(self, grace_s: float, *, key: str, checkpoints: Path, say: Callable[[str], None] | None = None):
        self.grace_s, self.key, self.checkpoints = float(grace_s), key, Path(checkpoints)
        self.say = say or make_console(stderr=True).print
        self.signal: int | None = None
        """The first signal received (None: none yet)."""
        self.received_at: float | None = None
        self._pid = os.getpid()
        self._previous: dict[int, object] = {}
        self._timer: threading.Timer | None = None
        self._group = None
        self._warned = False
        self.saved_step: int | None = None
        """The step of the last checkpoint :meth:`save` wrote."""

    # --- installing ------------------------------------------------------------------------------
    def install(self) -> "Preemption":
        """Catch the signals from now on (every rank, at the same point: under torchrun this may create the
        host-side process group). An earlier loop's handlers still installed (it raised) go first."""
        global _INSTALLED
        if _INSTALLED is not None:
            _INSTALLED.uninstall()
        if threading.current_thread() is threading.main_thread():  # (signal handlers can only be set there)
            for number in SIGNALS:
                self._previous[number] = signal.signal(number, self._handle)
            _INSTALLED = self
        if D.world_size() > 1:
            self._group = _host_group()
        return self

    def uninstall(self) -> None:
        """Put the handlers back as they were before :meth:`install`."""
        global _INSTALLED
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous = {}
        if _INSTALLED is self:
            _INSTALLED = None
        if self._timer is not None:
            self._timer.cancel()

    def __enter__(self) -> "Preemption":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()

    def _handle(self, number: int, frame) -> None:
        if os.getpid() != self._pid:  # a forked DataLoader worker: the training process decides
            return
        now = time.monotonic()
        if self.signal is None:
            self.signal, self.received_at = number, now
            deadline = max(self.grace_s - min(MARGIN_S, self.grace_s / 10), 0.0)
            self._timer = threading.Timer(deadline, self._out_of_time)
            self._timer.daemon = True
            self._timer.start()
        elif now - self.received_at > DUPLICATE_S:
            self._exit(
                f"a second {signal.Signals(number).name} {now - self.received_at:.0f} s after the first: "
                f"stopped at once, without a new checkpoint"
            )

    def _out_of_time(self) -> None:
        self._exit(
            f"the step and its checkpoint did not finish within {self.key}={self.grace_s:g} s of "
            f"{signal.Signals(self.signal).name}; stopped before the kill, without a new checkpoint"
        )

    def _exit(self, what: str) -> None:
        """End the process now (from the handler or the timer): the run's checkpoints are written atomically,
        so the one ``latest`` names is whole whatever this interrupts."""
        pointer = self.checkpoints / LATEST
        latest = pointer.read_text().strip() if pointer.exists() else None
        resume = (
            f"--resume continues from checkpoint {self.checkpoints / latest}, which is whole"
            if latest
            else "no checkpoint was saved yet: --resume starts from scratch"
        )
        where = f"{D.where()}: " if D.world_size() > 1 else ""
        try:
            self.say(f"[bold red]preempted:[/] {where}{what}; {resume}")
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(REQUEUE_EXIT)

    # --- the loop's side ----------------------------------------------------------------------------
    def requested(self) -> bool:
        """Whether the run must stop after this step: a signal reached this rank or, under torchrun, any rank
        (a collective: every rank calls it after every step)."""
        local = self.signal is not None
        if self._group is None:
            return local
        import torch
        import torch.distributed as dist

        flag = torch.tensor([int(local)], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
        return bool(flag.item())

    def save(self, state, epoch: int, batch_index: int) -> Path | None:
        """``state.save(epoch, batch_index)`` (a :class:`~falcon_cli.runtime.train_state.TrainState`), timed: the
        first checkpoint that takes more than 80% of the grace period gets a warning line (a preempted run could
        not save in time)."""
        tick = time.perf_counter()
        path = state.save(epoch, batch_index)
        self.saved_step, seconds = state.step, time.perf_counter() - tick
        if seconds > 0.8 * self.grace_s and not self._warned and D.is_main_process():
            self._warned = True
            self.say(
                f"[yellow]warning:[/] a checkpoint took {seconds:.0f} s, {self.key}={self.grace_s:g} s: a preempted "
                f"run could not save the step it stopped at; raise {self.key} (and the notice the cluster gives: "
                f"SLURM --signal=USR1@<seconds>)"
            )
        return path

    def stop_after_step(self, state, epoch: int, batch_index: int) -> Preempted:
        """Checkpoint ``state`` at (``epoch``, ``batch_index``) unless this step was just checkpointed, and return
        the :class:`Preempted` to raise (every rank calls it, after :meth:`requested` said so)."""
        if self.saved_step == state.step:  # (a signal during the checkpoint of this very step)
            path, seconds = latest_checkpoint(state.directory) if D.is_main_process() else None, None
        else:
            tick = time.perf_counter()
            path = self.save(state, epoch, batch_index)
            seconds = time.perf_counter() - tick
        where = (
            f"the end of epoch {epoch - 1} (step {state.step:,})"
            if batch_index == 0
            else f"epoch {epoch}, step {state.step:,} ({batch_index} batches of the epoch done)"
        )
        return self.stop(where=where, checkpoint=path, seconds=seconds)

    def stop(self, *, where: str, checkpoint: object, seconds: float | None = None) -> Preempted:
        """The :class:`Preempted` a loop raises after checkpointing ``where`` (e.g. ``epoch 3, step 1,204``) in
        ``checkpoint`` (the directory rank 0 wrote; None on the other ranks); requeues a SLURM job on a
        time-limit notice (rank 0)."""
        if self._timer is not None:
            self._timer.cancel()
        name = signal.Signals(self.signal).name if self.signal is not None else "a signal on another rank"
        saved = (
            f"saved {checkpoint}" + (f" in {seconds:.1f} s" if seconds is not None else "")
            if checkpoint is not None
            else "checkpoint saved by rank 0"
        )
        requeued = requeue_slurm_job(self.signal) if D.is_main_process() else None
        after = f"; {requeued}" if requeued else ""
        return Preempted(
            f"{name} at {where}: {saved}{after}; the same command with --resume continues exactly "
            f"from there (exit status {REQUEUE_EXIT})"
        )


def requeue_slurm_job(number: int | None) -> str | None:
    """Under SLURM, after a USR1/USR2 notice, ``scontrol requeue`` this job and say so (or why not); None when
    there is nothing to do (not SLURM, or SIGTERM: SLURM requeues a preempted ``--requeue`` job itself)."""
    job = os.environ.get("SLURM_JOB_ID")
    if job is None or number not in (signal.SIGUSR1, signal.SIGUSR2):
        return None
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return f"SLURM job {job} not requeued: scontrol is not on PATH (requeue it yourself)"
    done = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True)
    if done.returncode != 0:
        problem = (done.stderr or done.stdout).strip().splitlines()
        return f"`scontrol requeue {job}` failed ({problem[0] if problem else f'status {done.returncode}'})"
    return f"SLURM job {job} requeued"


_INSTALLED: Preemption | None = None
"""The Preemption whose handlers are installed (one at a time)."""


def _host_group():
    """A process group whose collectives run on the host (gloo): the per-step stop flag must not wait for the
    GPU. The default group when it is gloo already; otherwise a gloo group over every rank (created once, by
    every rank at the same point: :meth:`Preemption.__enter__`)."""
    from datetime import timedelta

    import torch.distributed as dist

    if dist.get_backend() == "gloo":
        return dist.group.WORLD
    return dist.new_group(backend="gloo", timeout=timedelta(seconds=D.collective_timeout_s()))


__all__ = ["DUPLICATE_S", "Preempted", "Preemption", "REQUEUE_EXIT", "SIGNALS", "requeue_slurm_job"]
