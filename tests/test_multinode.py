"""Two 'nodes' on this machine: two torchrun launches (one gloo process each) meeting through a c10d rendezvous on
localhost. A FALCON pretraining killed on one node resumes exactly and makes what a one-node two-process run makes
(the same batches, search spaces, φ and scheduler state); a node launched with another config is refused with one
line, before anything in the run directory changes. docs/cluster.md."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from falcon_cli.runtime.metrics import read_metrics
from tests.conftest import REPO
from tests.test_pretrain import TINY

# FALCON on the tiny world, world size 2 (batch 8 per rank): epoch 0 uniform, epoch 1 FALCON, 6 steps each; the
# scheduler options with running state (the advantage scale) and checkpoints every 4 steps (4, 6: epoch end, 8, 12).
FALCON = [*TINY, "pretrain.batch_size=8", "pretrain.max_steps_per_epoch=6", "pretrain.checkpoint_every=4",
          "pretrain.composer=falcon", "pretrain.search_space_size=40", "pretrain.quantile_levels=20",
          "pretrain.scheduler_lr=1e-2", "pretrain.scheduler_features=[positive,spread]", "pretrain.scheduler_credit=chosen",
          "pretrain.reward_baseline=batch_mean", "pretrain.scheduler_advantage_norm=true", "pretrain.device=cpu"]
ENV = {**os.environ, "FALCON_PROGRESS": "0", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def pretrain_args(run_dir: Path, world: Path, *extra) -> list[str]:
    return ["-m", "falcon_cli", "pretrain", "--recipe", "shapes-demo", "--run-dir", str(run_dir), f"data.dataset={world}",
            *FALCON, *extra]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def launch_nodes(args_per_node: list[list[str]], port: int) -> list[subprocess.Popen]:
    """One ``torchrun --nnodes 2 --nproc-per-node 1`` per node, all meeting at a c10d rendezvous on localhost:port
    (node ranks assigned by the rendezvous), each in its own session so a node can be killed whole."""
    procs = []
    for i, args in enumerate(args_per_node):
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(args_per_node)), "--nproc-per-node",
                   "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", f"falcon-{port}",
                   *args]
        procs.append(subprocess.Popen(command, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, start_new_session=True))
    return procs


def finish(procs: list[subprocess.Popen], timeout: float = 300) -> list[tuple[int, str]]:
    outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    return [(p.returncode, out) for p, out in zip(procs, outputs)]


def kill_node(proc: subprocess.Popen) -> None:
    """SIGKILL a node: torchrun's agent and its workers (torchrun starts each worker in a session of its own)."""
    stats = (_read(path) for path in Path("/proc").glob("[0-9]*/stat"))
    children = [int(stat.split()[0]) for stat in stats if stat and int(stat.rsplit(")", 1)[1].split()[1]) == proc.pid]
    for pid in [*children, proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return tmp_path_factory.mktemp("multinode") / "world"


@pytest.fixture(scope="module")
def one_node_run(world, tmp_path_factory):
    """The reference: one node, two processes (``--standalone --nproc_per_node 2``), never killed."""
    run_dir = tmp_path_factory.mktemp("one-node") / "run"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               *pretrain_args(run_dir, world)]
    proc = subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run_dir


def test_two_nodes_killed_and_resumed_make_the_one_node_run(world, one_node_run, tmp_path):
    run_dir = tmp_path / "run"
    nodes = launch_nodes([pretrain_args(run_dir, world)] * 2, free_port())
    metrics, deadline = run_dir / "metrics.jsonl", time.time() + 300
    while time.time() < deadline and all(p.poll() is None for p in nodes):
        # past the step-8 checkpoint, inside the FALCON epoch (steps 7-12)
        if metrics.exists() and any(r.get("step", 0) >= 10 for r in read_metrics(metrics)):
            kill_node(nodes[1])  # one node dies ...
            break
        time.sleep(0.05)
    kill_node(nodes[0])  # ... and the job with it (the scheduler ends the other node; waiting for it costs time)
    outputs = finish(nodes)
    assert [code for code, _ in outputs] == [-signal.SIGKILL] * 2, outputs[0][1][-3000:]
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "00000008", "inside the FALCON epoch"

    resumed = finish(launch_nodes([pretrain_args(run_dir, world, "--resume")] * 2, free_port()))
    assert [code for code, _ in resumed] == [0, 0], resumed[0][1][-3000:] + resumed[1][1][-3000:]
    assert "resumed from" in "".join(out for _, out in resumed)

    # The same run as one node with two processes (gloo, world size 2 either way), step for step, exactly:
    # losses, rewards, q; the batches (so the search spaces each rank chained from); φ and every rank's scheduler state.
    expected, got = read_metrics(one_node_run / "metrics.jsonl"), read_metrics(metrics)
    assert [r.get("step") for r in got] == [r.get("step") for r in expected]
    assert [r["sampler"] for r in got if "loss" in r] == ["uniform"] * 6 + ["falcon"] * 6
    for a, b in zip(expected, got):
        for key in ("loss", "itc", "itm", "mlm", "reward", "advantage", "q_mean", "lr"):
            if a.get(key) is not None:
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), (a.get("step"), key, a[key], b[key])
    from falcon_cli.sampling.batch_log import read_batch_log

    ref_log, new_log = read_batch_log(one_node_run / "batches.parquet"), read_batch_log(run_dir / "batches.parquet")
    assert set(new_log["rank"]) == {0, 1}
    columns = ["epoch", "step", "rank", "slot", "pair_id", "anchor_pair_id", "sampler"]
    assert ref_log[columns].equals(new_log[columns])
    assert (ref_log["q"].fillna(-1) - new_log["q"].fillna(-1)).abs().max() < 1e-5

    ref_state = torch.load(one_node_run / "checkpoints" / "00000012" / "training_state.pt", weights_only=True)
    new_state = torch.load(run_dir / "checkpoints" / "00000012" / "training_state.pt", weights_only=True)
    for name, tensor in ref_state["scheduler"]["policy"].items():  # one φ
        torch.testing.assert_close(new_state["scheduler"]["policy"][name], tensor, rtol=1e-5, atol=1e-7)
    scales = [[state["ranks"][r]["falcon"]["scheduler_running"]["scale"] for r in (0, 1)] for state in (ref_state, new_state)]
    for ref, new in zip(*scales):  # each rank's running advantage scale, restored per rank on resume
        assert new["count"] == ref["count"] == 6 and new["value"] == pytest.approx(ref["value"], rel=1e-5)
    assert scales[0][0]["value"] != scales[0][1]["value"], "the ranks' scales differ (their own rewards)"
    from falcon_cli.artifacts.embeddings import read_embeddings

    ref_cache, new_cache = (read_embeddings(d / "embeddings" / "epoch_001.h5") for d in (one_node_run, run_dir))
    assert new_cache.image.shape == ref_cache.image.shape, "the cache holds both nodes' features"
    assert abs(ref_cache.image - new_cache.image).max() < 1e-4 and abs(ref_cache.text - new_cache.text).max() < 1e-4


def test_a_node_with_another_config_is_refused_and_nothing_changes(world, one_node_run):
    """Two launches that differ in one override: every rank stops before the run directory is touched, with one line
    naming the node that differs and the key."""
    before = {p: p.read_bytes() for p in one_node_run.rglob("*") if p.is_file()}
    nodes = launch_nodes([pretrain_args(one_node_run, world, "--resume"),
                          pretrain_args(one_node_run, world, "--resume", "pretrain.lr=1e-3")], free_port())
    outputs = finish(nodes, timeout=120)
    assert all(code != 0 for code, _ in outputs)
    text = "".join(out for _, out in outputs)
    line = r"error: node [01] \(.+, rank 1\) was launched with another config than rank 0 on node [01] \(.+, rank 0\): " \
           r"pretrain\.lr is [0-9.e-]+ there and [0-9.e-]+ on rank 0; launch every node with the same recipe and overrides"
    import re

    assert re.search(line, text), text[-3000:]
    assert {p: p.read_bytes() for p in one_node_run.rglob("*") if p.is_file()} == before, "nothing written is lost"


def test_a_rank_that_cannot_see_rank_zeros_files_says_so(tmp_path):
    """The shared-filesystem check's verdict for one rank (the collective around it runs in the tests above)."""
    from falcon_cli.runtime.distributed import _file_digest, _sees, first_difference

    path = tmp_path / "manifest.json"
    assert _sees(path, "0" * 64, wait_s=0) == "does not exist here"
    path.write_text("{}")
    assert _sees(path, "0" * 64, wait_s=0) == "holds other contents here"
    assert _sees(path, _file_digest(path), wait_s=0) is None
    assert first_difference({"pretrain": {"lr": 1e-3, "epochs": 2}, "--resume": True},
                            {"pretrain": {"lr": 3e-4, "epochs": 2}, "--resume": True}) == \
        "pretrain.lr is 0.001 there and 0.0003 on rank 0"


def test_a_run_directory_on_a_filesystem_without_locks_is_one_line(tmp_path, monkeypatch):
    """A shared filesystem mounted without POSIX locks (NFS ``nolock``): one line, not an OSError."""
    import errno
    import fcntl

    from falcon_cli.errors import FalconError
    from falcon_cli.runtime.run_dir import acquire_lock

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "lockf", no_locks)
    with pytest.raises(FalconError, match=r"does not support POSIX locks \(ENOLCK\).*docs/cluster.md"):
        acquire_lock(tmp_path)
