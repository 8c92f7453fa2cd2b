"""Two 'nodes' on this machine: two torchrun launches (one gloo process each) meeting through a c10d rendezvous on
localhost. A FALCON pretraining killed on one node resumes exactly and makes what a one-node two-process run makes
(the same batches, search spaces, φ and scheduler state); a node launched with another config is refused with one
line, before anything in the run directory changes. docs/cluster.md."""

from __future__ import annotations

import signal
import time

import pytest
import torch

from falcon_cli.runtime.metrics import read_metrics
from tests.torchrun_nodes import finish, free_port, kill_node, launch_nodes, one_node_reference, pretrain_args

pytestmark = pytest.mark.slow  # (torchrun jobs: `make test-all`)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return tmp_path_factory.mktemp("multinode") / "world"


@pytest.fixture(scope="module")
def one_node_run(world, tmp_path_factory):
    """The reference: one node, two processes (``--standalone --nproc_per_node 2``), never killed."""
    return one_node_reference(tmp_path_factory.mktemp("one-node") / "run", world)


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
    from falcon_cli.runtime.checkpoint import load_rank_state

    scales = [
        [load_rank_state(d / "checkpoints" / "00000012", r)["falcon"]["scheduler_running"]["scale"] for r in (0, 1)]
        for d in (one_node_run, run_dir)
    ]
    for ref, new in zip(*scales):  # each rank's running advantage scale, restored per rank on resume
        assert new["count"] == ref["count"] == 6 and new["value"] == pytest.approx(ref["value"], rel=1e-5)
    assert scales[0][0]["value"] != scales[0][1]["value"], "the ranks' scales differ (their own rewards)"
    from falcon_cli.artifacts.embeddings import read_embeddings

    ref_cache, new_cache = (read_embeddings(d / "embeddings" / "epoch_001.h5") for d in (one_node_run, run_dir))
    assert new_cache.image.shape == ref_cache.image.shape, "the cache holds both nodes' features"
    assert abs(ref_cache.image - new_cache.image).max() < 1e-4 and abs(ref_cache.text - new_cache.text).max() < 1e-4
    # Inside the FALCON epoch (step 8) each rank's cache held its shard of this epoch and of the next (160 pairs / 2
    # ranks: 80 rows each), in its own rank-<r>.pt (nothing gathered: training_state.pt holds no cache)
    for d in (one_node_run, run_dir):
        assert "cache" not in torch.load(d / "checkpoints" / "00000008" / "training_state.pt", weights_only=True)
        caches = [load_rank_state(d / "checkpoints" / "00000008", r)["cache"] for r in (0, 1)]
        for which in ("reading", "filling"):
            ids = [set(c[which]["pair_ids"].tolist()) for c in caches]
            assert [len(i) for i in ids] == [80, 80] and ids[0] | ids[1] == set(range(160)), which


def test_a_node_with_another_config_is_refused_and_nothing_changes(world, one_node_run):
    """Two launches that differ in one override: every rank stops before the run directory is touched, with one line
    naming the node that differs and the key."""
    before = {p: p.read_bytes() for p in one_node_run.rglob("*") if p.is_file()}
    nodes = launch_nodes(
        [
            pretrain_args(one_node_run, world, "--resume"),
            pretrain_args(one_node_run, world, "--resume", "pretrain.optim.lr=1e-3"),
        ],
        free_port(),
    )
    outputs = finish(nodes, timeout=120)
    assert all(code != 0 for code, _ in outputs)
    text = "".join(out for _, out in outputs)
    line = (
        r"error: node [01] \(.+, rank 1\) was launched with another config than rank 0 on node [01] \(.+, rank 0\): "
        r"pretrain\.optim\.lr is [0-9.e-]+ there and [0-9.e-]+ on rank 0; "
        r"launch every node with the same recipe and overrides"
    )
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
    assert (
        first_difference(
            {"pretrain": {"lr": 1e-3, "epochs": 2}, "--resume": True},
            {"pretrain": {"lr": 3e-4, "epochs": 2}, "--resume": True},
        )
        == "pretrain.lr is 0.001 there and 0.0003 on rank 0"
    )


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


def test_a_signal_to_one_rank_stops_every_rank_after_the_same_step_and_resumes_exactly(world, one_node_run, tmp_path):
    """SIGUSR1 reaches only rank 1 (torchrun, two processes) inside the FALCON epoch: both ranks finish the same step,
    the checkpoint holds that exact point (every rank's state), both exit with the requeue status; --resume makes what
    the uninterrupted two-process run made (losses, rewards, q, the batch log of both ranks, the final weights)."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    from safetensors.torch import load_file

    from tests.torchrun_nodes import ENV, REPO, _read, children

    run_dir = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        *pretrain_args(run_dir, world),
    ]
    agent = subprocess.Popen(
        command, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    metrics, deadline, rank1 = run_dir / "metrics.jsonl", time.time() + 300, None
    while time.time() < deadline and agent.poll() is None:
        rank1 = rank1 or next(
            (pid for pid in children(agent.pid) if "RANK=1" in _read(Path(f"/proc/{pid}/environ")).split("\0")), None
        )
        if rank1 and metrics.exists() and any(r.get("step", 0) >= 7 for r in read_metrics(metrics)):  # FALCON: 7-12
            os.kill(rank1, signal.SIGUSR1)
            break
        time.sleep(0.05)
    out = agent.communicate(timeout=300)[0]
    assert agent.returncode != 0, out[-3000:]
    stops = re.findall(
        r"preempted: (SIGUSR1|a signal on another rank) at epoch 1, step (\d+) \(\d+ batches of the "
        r"epoch done\): (saved \S+|checkpoint saved by rank 0)",
        out,
    )
    assert sorted(s[0] for s in stops) == ["SIGUSR1", "a signal on another rank"], out[-3000:]
    assert len({s[1] for s in stops}) == 1, "every rank stopped after the same step"
    step = int(stops[0][1])
    assert 7 <= step < 12 and (run_dir / "checkpoints" / "latest").read_text().strip() == f"{step:08d}"
    assert re.search(r"exitcode\s*:\s*75", out), out[-3000:]

    resumed = subprocess.run([*command, "--resume"], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    expected, got = read_metrics(one_node_run / "metrics.jsonl"), read_metrics(metrics)
    assert [r.get("step") for r in got] == [r.get("step") for r in expected]
    for a, b in zip(expected, got):
        for key in ("loss", "itc", "itm", "mlm", "reward", "advantage", "q_mean", "lr"):
            if a.get(key) is not None:
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), (a.get("step"), key, a[key], b[key])
    from falcon_cli.sampling.batch_log import read_batch_log

    ref_log, new_log = read_batch_log(one_node_run / "batches.parquet"), read_batch_log(run_dir / "batches.parquet")
    columns = ["epoch", "step", "rank", "slot", "pair_id", "anchor_pair_id", "sampler"]
    assert ref_log[columns].equals(new_log[columns])
    assert (ref_log["q"].fillna(-1) - new_log["q"].fillna(-1)).abs().max() < 1e-5
    ref, new = (load_file(d / "checkpoints" / "00000012" / "model.safetensors") for d in (one_node_run, run_dir))
    assert all(torch.allclose(ref[k], new[k], rtol=1e-5, atol=1e-7) for k in ref)
