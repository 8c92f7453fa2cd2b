"""Preemption (falcon_cli/runtime/preemption.py): the signal becomes a stop after the step, a second signal or the
end of the grace period an exit at once, with the previous checkpoint whole; SLURM time-limit notices requeue.

The end-to-end runs are beside the tests they compare with: a preempted FALCON run in tests/stages/test_pretrain.py,
a preempted fine-tuning in tests/stages/test_finetune_evaluate.py, two torchrun processes in
tests/runtime/test_multinode.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from falcon_cli.errors import REQUEUE_EXIT, Preempted
from falcon_cli.runtime.checkpoint import resume_point, save_checkpoint
from falcon_cli.runtime.preemption import Preemption, requeue_slurm_job
from tests.conftest import REPO

ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "COLUMNS": "400"}

# A process that installs the handlers, saves checkpoint 1, gets SIGTERM, then (by its argument) a second SIGTERM
# while checkpoint 2 is being written, the same notice twice, or nothing more (the grace period runs out).
SCRIPT = """
import os, signal, sys, threading, time
from pathlib import Path
import torch
import falcon_cli.runtime.checkpoint as checkpoint
from falcon_cli.runtime.preemption import Preemption

directory, grace, mode = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
model = torch.nn.Linear(2, 2)
checkpoint.save_checkpoint(directory, 1, {"model": model}, {"step": 1}, {"epoch": 0})
preemption = Preemption(grace, key="pretrain.runtime.preempt_grace_s", checkpoints=directory).install()
print("ready", flush=True)
os.kill(os.getpid(), signal.SIGTERM)
if mode == "same-notice":
    os.kill(os.getpid(), signal.SIGTERM)  # what torchrun's agent forwards right after SLURM's own
if mode == "second-while-saving":
    def slow_weights(module, path):
        path.write_bytes(b"half")  # a checkpoint half written ...
        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM)).start()  # ... when the second signal comes
        time.sleep(30)
    checkpoint.save_weights = slow_weights
    time.sleep(1.5)
    checkpoint.save_checkpoint(directory, 2, {"model": model}, {"step": 2}, {"epoch": 0})
time.sleep(30)
print("still running", flush=True)
"""


def preempt(tmp_path: Path, grace: float, mode: str) -> tuple[int, str, float]:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "checkpoints"), str(grace), mode],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start


def test_the_grace_period_ends_the_process_before_the_kill_with_one_line(tmp_path):
    code, out, seconds = preempt(tmp_path, 4, "grace")
    assert code == REQUEUE_EXIT and "still running" not in out
    assert 3.2 < seconds < 15, seconds  # 4 s less the margin (a tenth of it), plus the interpreter's start
    line = [line for line in out.splitlines() if line.startswith("preempted:")]
    assert len(line) == 1, out
    assert "did not finish within pretrain.runtime.preempt_grace_s=4 s of SIGTERM" in line[0]
    assert f"--resume continues from checkpoint {tmp_path / 'checkpoints' / '00000001'}, which is whole" in line[0]


def test_the_same_notice_twice_is_one_notice(tmp_path):
    """SLURM signals every process of the step and torchrun's agent forwards the signal again: not a second one."""
    code, out, seconds = preempt(tmp_path, 4, "same-notice")
    assert code == REQUEUE_EXIT and "a second SIGTERM" not in out and "did not finish within" in out
    assert seconds > 3.2


def test_a_second_signal_while_a_checkpoint_is_written_exits_at_once_and_the_previous_one_stays_whole(tmp_path):
    code, out, seconds = preempt(tmp_path, 30, "second-while-saving")
    assert code == REQUEUE_EXIT and "still running" not in out and seconds < 20
    assert "a second SIGTERM" in out and "stopped at once, without a new checkpoint" in out
    directory = tmp_path / "checkpoints"
    assert (directory / "latest").read_text().strip() == "00000001", "latest never names a half-written checkpoint"
    assert not (directory / "00000002").exists()
    found = resume_point(directory, {"model": torch.nn.Linear(2, 2)})
    assert found is not None and found[0].name == "00000001" and found[2] == [], "the previous one is whole"


class FakeState:
    """What Preemption needs of a TrainState: its directory, step, and a save."""

    def __init__(self, directory: Path):
        self.directory, self.step, self.saves = directory, 0, []

    def save(self, epoch: int, batch_index: int) -> Path:
        self.saves.append((self.step, epoch, batch_index))
        return save_checkpoint(self.directory, self.step, {"model": torch.nn.Linear(2, 2)}, {}, {"epoch": epoch})


def test_the_loop_stops_after_the_step_and_checkpoints_it_once(tmp_path):
    state = FakeState(tmp_path / "checkpoints")
    preemption = Preemption(30, key="pretrain.runtime.preempt_grace_s", checkpoints=state.directory).install()
    try:
        state.step = 7
        assert not preemption.requested()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert preemption.requested() and preemption.signal == signal.SIGUSR2
        stop = preemption.stop_after_step(state, 1, 3)
        assert isinstance(stop, Preempted) and stop.exit_code == REQUEUE_EXIT == 75
        assert state.saves == [(7, 1, 3)]
        assert str(stop).startswith(
            f"SIGUSR2 at epoch 1, step 7 (3 batches of the epoch done): saved {state.directory / '00000007'} in "
        )
        # a signal during the checkpoint of the step itself: that checkpoint is the one, not saved twice
        state.step = 9
        preemption.save(state, 2, 0)
        stop = preemption.stop_after_step(state, 2, 0)
        assert state.saves[-1] == (9, 2, 0) and len(state.saves) == 2
        assert str(stop).startswith(f"SIGUSR2 at the end of epoch 1 (step 9): saved {state.directory / '00000009'};")
    finally:
        preemption.uninstall()
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_checkpoint_slower_than_the_grace_period_is_warned_once(tmp_path):
    said = []
    state = FakeState(tmp_path / "checkpoints")
    state.save = lambda epoch, batch_index: time.sleep(0.3)
    preemption = Preemption(0.2, key="finetune.preempt_grace_s", checkpoints=state.directory, say=said.append)
    preemption.save(state, 0, 1)
    preemption.save(state, 0, 2)
    assert len(said) == 1 and "a checkpoint took 0 s, finetune.preempt_grace_s=0.2 s" in said[0]


def test_handlers_of_a_loop_that_raised_are_replaced_by_the_next(tmp_path):
    first = Preemption(30, key="k", checkpoints=tmp_path).install()
    second = Preemption(30, key="k", checkpoints=tmp_path).install()  # (the first never uninstalled: it raised)
    os.kill(os.getpid(), signal.SIGTERM)
    assert second.signal == signal.SIGTERM and first.signal is None
    second.uninstall()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_forked_dataloader_worker_leaves_the_signal_to_its_parent(tmp_path):
    preemption = Preemption(30, key="k", checkpoints=tmp_path).install()
    try:
        pid = os.fork()
        if pid == 0:  # the child: the inherited handler ignores the signal (exit 0), never the grace timer (75)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            os._exit(0 if preemption.signal is None else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert preemption.signal is None
    finally:
        preemption.uninstall()


@pytest.mark.parametrize(
    "signum,expected",
    [
        (signal.SIGUSR1, "SLURM job 4242 requeued"),
        (signal.SIGTERM, None),  # preempted: SLURM requeues a --requeue job itself (or the user cancelled it)
    ],
)
def test_a_slurm_time_limit_notice_requeues_the_job(tmp_path, monkeypatch, signum, expected):
    calls = tmp_path / "calls"
    scontrol = tmp_path / "bin" / "scontrol"
    scontrol.parent.mkdir()
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{scontrol.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert requeue_slurm_job(signum) == expected
    assert (calls.read_text() if calls.exists() else "") == ("requeue 4242\n" if expected else "")


def test_a_requeue_that_cannot_run_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert (
        requeue_slurm_job(signal.SIGUSR1) == "SLURM job 7 not requeued: scontrol is not on PATH (requeue it yourself)"
    )
    monkeypatch.delenv("SLURM_JOB_ID")
    assert requeue_slurm_job(signal.SIGUSR1) is None
