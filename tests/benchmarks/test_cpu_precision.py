"""benchmarks/cpu_precision.py: how its losses and learning curve are read, its refusal and its smoke run."""

from __future__ import annotations

import json
import sys

import pytest

from benchmarks import cpu_precision as bench
from falcon_cli.runtime.precision import cpu_has_bf16
from tests.benchmarks.test_cpu_allocator import smoke_run


def test_each_epochs_last_losses_and_the_learning_curve(tmp_path):
    records = [
        {"step": 0, "epoch": 0, "loss": 5.0, "itc": 3.0, "itm": 0.7, "mlm": 1.3, "elapsed_s": 1.0},
        {"step": 10, "epoch": 0, "loss": 4.0, "itc": 2.5, "itm": 0.6, "mlm": 0.9, "elapsed_s": 40.5},
        {"step": 10, "epoch": 0, "kind": "zero_shot", "i2t_R@1": 3.5},
        {"step": 10, "epoch": 0, "kind": "false_negatives", "loss": 9.9},  # (not a step: skipped)
        {"step": 20, "epoch": 1, "loss": 3.5, "itc": 2.0, "itm": 0.6, "mlm": 0.9, "elapsed_s": 38.25},
        {"step": 20, "epoch": 1, "kind": "zero_shot", "i2t_R@1": 7.25},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert bench.epoch_losses(tmp_path) == [
        {"loss": 4.0, "itc": 2.5, "itm": 0.6, "mlm": 0.9},
        {"loss": 3.5, "itc": 2.0, "itm": 0.6, "mlm": 0.9},
    ]
    assert bench.zero_shot_r1(tmp_path) == [3.5, 7.25]


def test_a_cpu_without_native_bf16_is_told_so_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "cpu_has_bf16", lambda: False)
    monkeypatch.setattr(sys, "argv", ["cpu_precision.py", "--out", str(tmp_path / "out"), "--smoke"])
    with pytest.raises(SystemExit) as info:
        bench.main()
    assert info.value.code == 2 and not (tmp_path / "out").exists()


@pytest.mark.slow  # (a pair of tiny runs: about a minute on 2 cores)
@pytest.mark.skipif(not cpu_has_bf16(), reason="this CPU has no native bf16")
def test_the_smoke_run_trains_both_precisions_side_by_side(tmp_path):
    done = smoke_run("cpu_precision.py", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "precision.json").read_text())
    assert result["ran_in"] == {"fp32": "fp32", "bf16": "bf16"}
    assert len(result["epoch_ratio"]) == 2 and all(r > 0 for r in result["epoch_ratio"])
    assert len(result["losses"]["bf16"]) == 2 and result["losses"]["bf16"] != result["losses"]["fp32"]
    assert "bf16 against fp32, side by side" in done.stdout
