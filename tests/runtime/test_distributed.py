"""Two gloo processes on CPU under torchrun: the same command, sharded search spaces, one set of artifacts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from falcon_cli.runtime.metrics import read_metrics
from tests.conftest import REPO
from tests.stages.test_pretrain import TINY

pytestmark = pytest.mark.slow  # (torchrun jobs: `make test-all`)


def test_two_process_ddp_run(tmp_path):
    run_dir, world = tmp_path / "run", tmp_path / "world"
    env = {**os.environ, "FALCON_PROGRESS": "0", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    args = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "falcon_cli",
        "pretrain",
        "--recipe",
        "shapes-demo",
        "--run-dir",
        str(run_dir),
        f"data.dataset={world}",
        *TINY,
        "pretrain.batch_size=8",
        "pretrain.runtime.device=cpu",
    ]
    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "global batch 16" in proc.stderr

    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "completed" and manifest["world_size"] == 2
    assert manifest["stages"]["pretrain"]["result"]["world_size"] == 2
    assert sorted(p.name for p in run_dir.glob("*.json")) == ["manifest.json"], "one set of artifacts"

    from falcon_cli.sampling.batch_log import read_batch_log

    log = read_batch_log(run_dir / "batches.parquet")
    assert set(log["rank"]) == {0, 1}
    for epoch, rows in log.groupby("epoch"):
        # Each rank composed from its own shard; together they cover every pair exactly once.
        assert sorted(rows["pair_id"]) == list(range(160)), epoch
        shards = [set(rows[rows["rank"] == r]["pair_id"]) for r in (0, 1)]
        assert not shards[0] & shards[1]
        assert len(rows[rows["rank"] == 0].groupby("step")) == len(rows[rows["rank"] == 1].groupby("step"))
    grit = log[log["sampler"] == "grit"]
    for (_, rank), rows in grit.groupby(["epoch", "rank"]):
        anchors = rows["anchor_pair_id"][rows["anchor_pair_id"] >= 0]
        assert set(anchors) <= set(rows["pair_id"]), "chains stay inside the rank's own search spaces"

    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 21)), "160 pairs / 2 ranks / batch 8 = 10 steps per epoch"
    assert np.isfinite([r["loss"] for r in records]).all()
    from falcon_cli.artifacts.embeddings import read_embeddings

    emb = read_embeddings(run_dir / "embeddings" / "epoch_001.h5")
    assert emb.image.shape[0] == 160, "the cache holds both ranks' features"
    assert sorted(emb.pair_id) == list(range(160)), "each pair once"
    # Each rank's cache holds its own shard only (N / world rows; between epochs: next epoch's), checkpointed in its
    # own rank-<r>.pt, not gathered into training_state.pt
    import torch

    from falcon_cli.runtime.checkpoint import latest_checkpoint, load_rank_state, load_training_state

    latest = latest_checkpoint(run_dir / "checkpoints")
    assert "cache" not in load_training_state(latest) and "ranks" not in load_training_state(latest)
    caches = [load_rank_state(latest, r)["cache"] for r in (0, 1)]
    assert all(c["reading"] is None for c in caches), "between epochs: one cache per rank"
    shards = [set(c["filling"]["pair_ids"].tolist()) for c in caches]
    assert [len(s) for s in shards] == [80, 80] and shards[0] | shards[1] == set(range(160))
    assert all(torch.equal(c["filling"]["written"], torch.ones(80, dtype=torch.bool)) for c in caches)


def test_more_ranks_than_gpus_is_one_clear_error(monkeypatch):
    """torchrun --nproc_per_node 2 on a one-GPU node stops before NCCL with a line that says what to do."""
    import pytest
    import torch

    from falcon_cli.errors import FalconError
    from falcon_cli.runtime.distributed import init_distributed

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(FalconError, match=r"local rank 1 but this node has 1 CUDA device.*--nproc_per_node <= 1"):
        init_distributed("cuda")
