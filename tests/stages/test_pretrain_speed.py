"""benchmarks/pretrain_speed.py: one real (smoke) run through the stage, and the report's target lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import pretrain_speed  # noqa: E402


@pytest.mark.slow  # (a benchmark's smoke run: `make test-all`)
def test_a_smoke_run_measures_the_stage_and_writes_the_report(tmp_path):
    out = tmp_path / "speed"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "pretrain_speed.py"),
            "--out",
            str(out),
            "--smoke",
            "--images",
            "24",
            "--only",
            "ceiling",
            "base-grit",
            "base-grit-jpeg",
            "blip2-grit",
            "compose-ops",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "FALCON_PROGRESS": "0"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((out / "speed.json").read_text())
    assert results["device"] == "cpu" and results["ceiling_flops"] > 0
    for name in ("base-grit", "base-grit-jpeg"):
        run = results["runs"][name]
        assert run["pairs_per_s"] > 0 and run["flops_per_pair"] > 1e8 and run["epoch"] == 1 and "mfu" not in run
        assert run["flops_method"] == "analytic"
    blip2 = results["runs"]["blip2-grit"]  # BLIP-2's FLOPs counted on one real step (FlopCounterMode)
    assert blip2["flops_method"] == "counted" and blip2["flops_per_pair"] > 1e7 and blip2["pairs_per_s"] > 0
    assert blip2["vocab_size"] == results["runs"]["base-grit"]["vocab_size"] + 1  # the run tokenizer + [DEC]
    manifest = json.loads((out / "runs" / "base-grit-jpeg" / "manifest.json").read_text())
    assert (
        manifest["config"]["pretrain"]["loader"]["augment"] == "pretrain"
    )  # the JPEG run decodes and augments every step
    assert all(p.suffix == ".jpg" for p in (out / "world-jpeg" / "images").iterdir())
    report = (out / "speed.md").read_text()
    assert "JPEG data through the stage / preloaded" in report
    assert "on-demand FALCON batch: aten operators" in report and "host reads" in report


def test_the_report_states_each_target_as_a_ratio_of_one_run():
    rates = {
        "base-grit": 1000.0,
        "base-grit-compile": 1200.0,
        "base-falcon-recompute": 1000.0,
        "base-falcon-reuse": 1150.0,
        "base-grit-jpeg": 1100.0,
        "tiny-falcon-preload": 6000.0,
        "tiny-falcon-decode": 900.0,
    }
    runs = {
        name: {
            "pairs_per_s": rate,
            "flops_per_pair": 2.3e11,
            "text_tokens": 20.0,
            "peak_memory_mib": None,
            "mfu": rate * 2.3e11 / 9e14,
        }
        for name, rate in rates.items()
    }
    text = pretrain_speed.report({"device": "H100", "ceiling_flops": 9e14, "runs": runs})
    assert "FALCON (recompute) time per step / GRIT (compiled): 1.200 (target ≤ 1.26)" in text
    assert "FALCON (reuse) time per step / GRIT (compiled): 1.043 (target ≤ 1.06)" in text
    assert "JPEG data through the stage / preloaded: 91.7% (target ≥ 90%)" in text
    assert "| base-grit-compile | 1,200 | 230.0 | 30.7% |" in text
    runs["blip2-grit"] = {**runs["base-grit"], "flops_method": "counted", "vocab_size": 1001}
    runs["base-grit-jpeg-eager"] = {**runs["base-grit"], "pairs_per_s": 950.0}
    text = pretrain_speed.report({"device": "H100", "ceiling_flops": 9e14, "runs": runs})
    assert "| blip2-grit | 1,000 | 230.0 | 25.6% | 20.0 | — | counted | 1,001 | — |" in text
    assert "| base-grit | 1,000 | 230.0 | 25.6% | 20.0 | — | — | — | — |" in text  # results from before these keys
    assert "JPEG data through the stage / preloaded, both eager: 95.0% (target ≥ 90%)" in text
    runs["base-grit-graphs"] = {**runs["base-grit"], "pairs_per_s": 2000.0}
    runs["base-falcon-reuse-graphs"] = {**runs["base-grit"], "pairs_per_s": 1600.0}
    text = pretrain_speed.report({"device": "H100", "ceiling_flops": 9e14, "runs": runs})
    assert "FALCON (reuse) time per step / GRIT (CUDA graphs): 1.250 (target ≤ 1.06)" in text
    runs["base-falcon-itm-eager"] = {**runs["base-grit"], "pairs_per_s": 925.0}
    text = pretrain_speed.report({"device": "H100", "ceiling_flops": 9e14, "runs": runs})
    assert "FALCON (positive margin + ITM) time per step / GRIT (eager): 1.081 (target ≤ 1.06)" in text
    assert "FALCON (positive margin) time per step" not in text  # (a run not measured: no line)
    runs["base-grit-step"] = {**runs["base-grit"], "pairs_per_s": 1500.0, "mfu": 0.383}
    runs["base-falcon-recompute-step"] = {**runs["base-grit"], "pairs_per_s": 1250.0}
    runs["tiny-falcon-step"] = {**runs["base-grit"], "pairs_per_s": 5200.0}
    text = pretrain_speed.report({"device": "H100", "ceiling_flops": 9e14, "runs": runs})
    assert "FALCON (recompute) time per step / GRIT (step captured): 1.200 (target ≤ 1.06)" in text
    assert "- base-grit-step MFU: 38.3% (target ≥ 35%)" in text
    assert "shapes-falcon with the step captured: 5,200 pairs/s (target ≥ 5,000)" in text
    assert "FALCON (reuse) time per step / GRIT (step captured)" not in text


def test_the_reward_runs_are_valid_configs_of_the_rewards_they_name():
    """The GPU parts for issue 35's rewards resolve to valid pretrain configs (a bad override would only show on
    the lent machine, after minutes of its time)."""
    from falcon_cli.config.schema import PretrainConfig

    for name, reward, charge in (
        ("base-falcon-margin-eager", "positive_margin", "absolute"),
        ("base-falcon-itm-eager", "positive_margin+itm", "excess"),
    ):
        settings = dict(
            o.removeprefix("pretrain.").split("=", 1)
            for o in pretrain_speed.runs(False, 4)[name]
            if o.startswith("pretrain.")
        )
        nested: dict = {}
        for key, value in settings.items():  # (dotted keys below pretrain, as the command line gives them)
            *sections, name = key.split(".")
            node = nested
            for section in sections:
                node = node.setdefault(section, {})
            node[name] = yaml.safe_load(value)
        config = PretrainConfig(**nested)
        assert (config.composer.name, config.scheduler.reward.name, config.scheduler.reward.itm_charge) == (
            "falcon",
            reward,
            charge,
        )
        assert config.model == "albef-base" and config.runtime.precision == "bf16"
        assert config.scheduler.update.credit == "chosen"


def test_the_captured_step_runs_are_valid_configs():
    """Issue 62's GPU runs resolve to valid pretrain configs with the step captured (and, where named, the
    scheduler's overlapped update), on the GPU settings and on the smoke ones."""
    from falcon_cli.config.recipes import load_recipe

    for smoke in (False, True):
        names = [name for name in pretrain_speed.runs(smoke, 4) if "-step" in name]
        assert len(names) == 8
        for name in names:
            overrides = pretrain_speed.runs(smoke, 4)[name]
            recipe = "shapes-demo"  # (as main() runs them: a --recipe of the run's own, else shapes-demo)
            if overrides[:1] == ["--recipe"]:
                recipe, overrides = overrides[1], overrides[2:]
            config = load_recipe(recipe, overrides)[0].pretrain
            assert config.runtime.graph_step and config.runtime.compile is False
            assert config.scheduler.overlap == name.endswith("-overlap")
            assert (config.runtime.graph_backend == "eager") == smoke


def test_the_steady_rate_is_the_median_step_and_a_one_off_stall_does_not_set_it(tmp_path):
    # two epochs of 40 steps of 96 pairs logged every 5: 100 ms a step, the last (smaller) batch 2 s, and one
    # 3 s stall in epoch 1 (a CUDA-graph re-record on the H100); the old window counts the stall, the median not
    rows = []
    for epoch in range(2):
        elapsed = 0.0
        for step in range(5, 45, 5):
            elapsed += 0.5 + (3.0 if (epoch, step) == (1, 35) else 0.0) + (2.0 if step == 40 else 0.0)
            rows.append(
                {
                    "step": epoch * 40 + step,
                    "epoch": epoch,
                    "loss": 1.0,
                    "elapsed_s": elapsed,
                    "pairs_per_s": 0.0,
                    "text_tokens": 25,
                    "peak_memory_mib": 100.0 + step,
                }
            )
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rate = pretrain_speed.steady_rate(tmp_path, 96)
    assert rate["pairs_per_s"] == pytest.approx(960.0) and rate["intervals"] == 12  # 6 intervals an epoch
    assert rate["window_pairs_per_s"] == pytest.approx(15 * 96 / (0.5 + 3.5 + 2.5))  # steps 65 -> 80, stall counted
    assert rate["epoch"] == 1 and rate["text_tokens"] == 25 and rate["peak_memory_mib"] == 140.0
