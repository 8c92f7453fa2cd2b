"""`pretrain.eval_every`: zero-shot retrieval after every N-th epoch, the learning curve in metrics.jsonl."""

from __future__ import annotations

import json

import pytest

from falcon_cli.runtime.metrics import read_metrics
from tests.conftest import run_cli


def test_the_learning_curve_has_a_point_per_epoch_and_ends_at_the_final_result(tmp_path):
    run = tmp_path / "run"
    proc = run_cli("pretrain", "--recipe", "shapes-uniform", "--run-dir", run, f"data.dataset={tmp_path / 'world'}",
                   "data.shapes.images=40", "data.shapes.size=24", "pretrain.image_size=24", "data.tokenizer_vocab_size=200",
                   "data.verify_images=false", "pretrain.epochs=3", "pretrain.batch_size=8", "pretrain.max_steps_per_epoch=2",
                   "pretrain.num_workers=0", "pretrain.warmup_steps=1", "pretrain.eval_every=1", "pretrain.device=cpu")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    curve = [r for r in read_metrics(run / "metrics.jsonl") if r.get("kind") == "zero_shot"]
    assert [r["epoch"] for r in curve] == [0, 1, 2]
    final = next(r for r in json.loads((run / "results" / "retrieval_zeroshot.json").read_text())["rows"] if r["model"] == "trained")
    for key in ("i2t_R@1", "t2i_R@5", "mean_R", "i2t_R@1_lo"):
        assert curve[-1][key] == pytest.approx(final[key])
