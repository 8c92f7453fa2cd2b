"""Two 'nodes' on this machine, for the multi-node tests (tests/runtime/test_multinode.py,
tests/runtime/test_cluster_faults.py): each node is its own ``torchrun`` (one gloo process each,
``pretrain.runtime.device=cpu``) meeting the other at a c10d rendezvous on localhost, in its own session so that a node,
or only its worker, can be killed."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import REPO
from tests.stages.test_pretrain import TINY

# FALCON on the tiny world, world size 2 (batch 8 per rank): epoch 0 uniform, epoch 1 FALCON, 6 steps each; the
# scheduler options with running state (the advantage scale) and checkpoints every 4 steps (4, 6: epoch end, 8, 12).
FALCON = [
    *TINY,
    "pretrain.batch_size=8",
    "pretrain.max_steps_per_epoch=6",
    "pretrain.checkpoints.every=4",
    "pretrain.composer.name=falcon",
    "pretrain.composer.search_space_size=40",
    "pretrain.scheduler.quantile_levels=20",
    "pretrain.scheduler.lr=1e-2",
    "pretrain.scheduler.features=[positive,spread]",
    "pretrain.scheduler.update.credit=chosen",
    "pretrain.scheduler.update.baseline=batch_mean",
    "pretrain.scheduler.update.advantage_norm=true",
    "pretrain.runtime.device=cpu",
]
ENV = {**os.environ, "FALCON_PROGRESS": "0", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def pretrain_args(run_dir: Path, world: Path, *extra) -> list[str]:
    """``-m falcon_cli pretrain`` of the FALCON recipe above on ``world`` into ``run_dir``."""
    return [
        "-m",
        "falcon_cli",
        "pretrain",
        "--recipe",
        "shapes-demo",
        "--run-dir",
        str(run_dir),
        f"data.dataset={world}",
        *FALCON,
        *extra,
    ]


def one_node_reference(run_dir: Path, world: Path) -> Path:
    """The uninterrupted reference: the FALCON run on one node with two processes (``--standalone --nproc_per_node
    2``; two nodes make the same run, tests/runtime/test_multinode.py)."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        *pretrain_args(run_dir, world),
    ]
    proc = subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run_dir


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def launch_nodes(
    args_per_node: list[list[str]], port: int, torchrun: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> list[subprocess.Popen]:
    """One ``torchrun --nnodes 2 --nproc-per-node 1`` per node (``torchrun``: more of its options, e.g.
    ``--max-restarts``; ``env``: more environment), all meeting at a c10d rendezvous on localhost:port (node ranks
    assigned by the rendezvous), each in its own session so a node can be killed whole; stdout and stderr together
    in ``proc.stdout``."""
    procs = []
    for args in args_per_node:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            str(len(args_per_node)),
            "--nproc-per-node",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"localhost:{port}",
            "--rdzv-id",
            f"falcon-{port}",
            *torchrun,
            *args,
        ]
        procs.append(
            subprocess.Popen(
                command,
                cwd=REPO,
                env={**ENV, **(env or {})},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        )
    return procs


def finish(procs: list[subprocess.Popen], timeout: float = 300) -> list[tuple[int, str]]:
    """Each node's exit status and output, once all have ended."""
    outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    return [(p.returncode, out) for p, out in zip(procs, outputs)]


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (torchrun's workers: it starts each in a session of its own)."""
    stats = (_read(path) for path in Path("/proc").glob("[0-9]*/stat"))
    return [int(stat.split()[0]) for stat in stats if stat and int(stat.rsplit(")", 1)[1].split()[1]) == pid]


def kill_node(proc: subprocess.Popen) -> None:
    """SIGKILL a node: torchrun's agent and its workers."""
    for pid in [*children(proc.pid), proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def worker(proc: subprocess.Popen) -> tuple[int, int] | None:
    """``(pid, global rank)`` of the node's worker now running (None between two of them)."""
    for pid in children(proc.pid):
        env = _read(Path(f"/proc/{pid}/environ")).split("\0")
        ranks = [item.removeprefix("RANK=") for item in env if item.startswith("RANK=")]
        if ranks:
            return pid, int(ranks[0])
    return None


def wait_for_step(metrics: Path, step: int, procs: list[subprocess.Popen], timeout: float = 300) -> None:
    """Wait until ``metrics`` (rank 0's ``metrics.jsonl``) logs ``step`` (every node still running)."""
    from falcon_cli.runtime.metrics import read_metrics

    deadline = time.time() + timeout
    while time.time() < deadline and all(p.poll() is None for p in procs):
        if metrics.exists() and any(r.get("step", 0) >= step for r in read_metrics(metrics)):
            return
        time.sleep(0.05)
    raise AssertionError(f"{metrics} never reached step {step}: {[p.poll() for p in procs]}")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return ""
