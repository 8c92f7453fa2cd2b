"""benchmarks/phase_sweep.py on fabricated runs: the plan, paired differences, the gate, the report block."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from benchmarks import phase_sweep as sweep
from tests.conftest import REPO

CONFIG = {
    "data": {"shapes": {"images": 3000, "size": 32, "splits": {"train": 0.3, "test": 0.7}}},
    "pretrain": {
        "epochs": 12,
        "batch_size": 64,
        "optim": {"lr": 3e-4, "min_lr": 1e-5},
        "composer": {"search_space_size": 500},
    },
    "unimodal": {"image_epochs": 12, "extra_images": 20000, "text_epochs": 20},
}
"""The parts of a run's resolved config that the report's budget line reads."""


def _table(grit_minus_uniform: dict, seeds=range(5), dense_grit_minus_q05=(-2.0, -2.5, -1.5, -2.2, -1.8)):
    rows = []
    for s in seeds:
        base = 20.0 + s  # seeds differ a lot; the paired differences do not
        for method, value in (("uniform", base), ("grit", base + grit_minus_uniform[s]), ("q05", base + 0.5)):
            rows.append(
                {
                    "preset": "coco-like",
                    "method": method,
                    "seed": s,
                    "R@1": value,
                    "oracle_R@1": value + 5,
                    "fn_rate_chain": float("nan") if method == "uniform" else 1.0,
                    "q_fn_density_corr": None,
                    "i2t_R@1_lo": value - 2,
                    "i2t_R@1_hi": value + 2,
                }
            )
        for method, value, chain in (
            ("uniform", base, float("nan")),
            ("grit", base + dense_grit_minus_q05[s], 40.0 + s),
            ("q05", base, 20.0),
        ):
            rows.append(
                {
                    "preset": "dense",
                    "method": method,
                    "seed": s,
                    "R@1": value,
                    "oracle_R@1": value + 5,
                    "fn_rate_chain": chain,
                    "q_fn_density_corr": None,
                    "i2t_R@1_lo": value - 2,
                    "i2t_R@1_hi": value + 2,
                }
            )
    return pd.DataFrame(rows)


def test_plan_keeps_a_seeds_methods_together_and_the_budgets_meet_the_noise_target():
    assert sweep.plan(["coco-like"], ["uniform", "grit"], [0, 1]) == [
        ("coco-like", "uniform", 0),
        ("coco-like", "grit", 0),
        ("coco-like", "uniform", 1),
        ("coco-like", "grit", 1),
    ]
    cpu = sweep.BUDGETS["cpu"]
    test_images = round(cpu.images * cpu.splits["test"])
    assert test_images >= 2000 and 5 * test_images >= 10000  # the size for a 0.5-point binomial std
    assert set(sweep.GATE_METHODS) <= set(sweep.METHODS) and set(sweep.GATE_PRESETS) <= set(sweep.PRESETS)


@pytest.mark.parametrize("budget", ["cpu", "gpu", "quick"])
def test_every_regime_trains_on_as_many_pairs_and_tests_on_the_same_split(budget):
    """coco-like and medium keep one caption per training image: their worlds get five times the training images
    and the same val and test images as the budget's world with all five (splits are cut by families of a scene
    and its three near misses, so the dense world, families of one, differs by less than a family)."""
    from falcon_cli.data.shapes.config import SPLITS, ShapesConfig, assign_splits

    def counts(world: ShapesConfig) -> tuple[int, int, int]:
        codes = assign_splits(world)
        train = int((codes == SPLITS.index("train")).sum()) * (
            world.train_captions_per_image or world.captions_per_image
        )
        return (train, *(int((codes == SPLITS.index(split)).sum()) for split in ("val", "test")))

    b = sweep.BUDGETS[budget]
    sized = {
        preset: counts(ShapesConfig(preset=preset, images=images, splits=splits))
        for preset in sweep.PRESETS
        for images, splits in [b.world_size(preset)]
    }
    every_caption = counts(
        ShapesConfig(preset="coco-like", images=b.images, splits=b.splits, train_captions_per_image=None)
    )
    assert sized["coco-like"] == sized["medium"] == every_caption
    assert all(abs(x - y) <= 4 * 5 for x, y in zip(sized["coco-like"], sized["dense"]))
    assert b.world_size("dense") == (b.images, b.splits)
    # train_scale multiplies the training pairs of every regime and keeps val and test.
    import dataclasses

    tripled = dataclasses.replace(b, train_scale=3)
    for preset in sweep.PRESETS:
        images, splits = tripled.world_size(preset)
        train, val, test = counts(ShapesConfig(preset=preset, images=images, splits=splits))
        assert abs(train - 3 * sized[preset][0]) <= 4 * 5 and (val, test) == sized[preset][1:]


def test_paired_differences_against_a_hand_computation():
    table = _table({0: 1.0, 1: 2.0, 2: 1.5, 3: 0.5, 4: 1.0})
    d = sweep.paired(table, "coco-like", "grit", "uniform")
    diffs = [1.0, 2.0, 1.5, 0.5, 1.0]
    mean = sum(diffs) / 5
    std = (sum((x - mean) ** 2 for x in diffs) / 4) ** 0.5
    assert d["mean"] == pytest.approx(mean) and d["std"] == pytest.approx(std) and d["seeds"] == 5
    half = 2.7764451051977987 * std / 5**0.5  # t(0.975, 4): the paired interval, not 2 std
    assert d["positive"] == 5 and d["per_seed"] == diffs and d["verdict"] == "higher"
    assert (d["lo"], d["hi"]) == pytest.approx((mean - half, mean + half))
    assert d["t"] == pytest.approx(mean / (std / 5**0.5)) and d["sign_p"] == pytest.approx(2 / 2**5)
    # A mean within 2 std of the differences but clear of zero by its paired interval: the old criterion missed it.
    wide = sweep.paired(_table({0: 0.2, 1: 2.0, 2: 1.0, 3: 1.6, 4: 1.2}), "coco-like", "grit", "uniform")
    assert wide["mean"] < 2 * wide["std"] and wide["lo"] > 0 and wide["verdict"] == "higher"
    assert sweep.paired(table, "coco-like", "mafa", "uniform") is None


def test_the_sign_test_against_binomial_counts():
    assert sweep.sign_test(9, 0) == pytest.approx(2 / 512)  # all nine seeds one way
    assert sweep.sign_test(6, 3) == pytest.approx(2 * (1 + 9 + 36 + 84) / 512)  # P(at most 3 of 9), both tails
    assert sweep.sign_test(3, 6) == sweep.sign_test(6, 3)
    assert sweep.sign_test(5, 5) == 1.0 and sweep.sign_test(0, 0) == 1.0  # (ties at zero are not counted)


def test_the_gate_passes_only_when_both_halves_clear_zero_by_their_paired_intervals():
    passed, lines = sweep.gate(_table({0: 1.0, 1: 1.2, 2: 0.9, 3: 1.1, 4: 1.0}))
    assert passed is True and all("passes" in line for line in lines if not line.startswith("  "))
    # No re-ranked column and no ITM loss: both halves read the ITC ranking, dense its FN-aware R@1.
    assert "GRIT − uniform, ITC R@1: +1.04 [+0.90, +1.18] over 5 seeds" in lines[0]
    assert "GRIT − q = 0.5: FN-aware ITC R@1 -2.00 [-2.47, -1.53] over 5 seeds" in lines[2]
    # Beside the dense verdict, not part of it: GRIT − q = 0.5 in standard ITC R@1 (here the same numbers).
    assert lines[-1].startswith("  ITC R@1 (beside the verdict)") and lines[-1].endswith("the interval below zero.")
    noisy = {0: 3.0, 1: -1.0, 2: 2.0, 3: -0.5, 4: 1.0}  # GRIT ahead on average, but its interval holds zero
    passed, lines = sweep.gate(_table(noisy))
    assert passed is False and "fails" in lines[0] and "passes" in lines[2]
    passed, lines = sweep.gate(_table({s: 1.0 + 0.1 * s for s in range(5)}, dense_grit_minus_q05=(2, 1, 3, 2, 2)))
    assert passed is False and "fails" in next(line for line in lines if line.startswith("- `dense`"))
    table = _table({s: 1.0 for s in range(5)})
    passed, lines = sweep.gate(table[table["preset"] == "coco-like"])
    assert passed is None and "not both run" in lines[-1]
    clear = _table({s: 1.0 + 0.1 * s for s in range(5)})
    passed, lines = sweep.gate(clear[clear["seed"] < 2])  # clear on two seeds, but two say too little
    assert passed is None and all(
        "no verdict before 5 paired seeds" in line for line in lines if not line.startswith("  ")
    )
    noisy_table = _table(noisy)
    passed, lines = sweep.gate(noisy_table[noisy_table["preset"] == "coco-like"])
    assert passed is False and "fails" in lines[0]  # one failed half decides it, the other still missing


def test_the_gate_reads_albefs_protocol_where_the_itm_head_learns():
    table = _table({0: 1.0, 1: 1.2, 2: 0.9, 3: 1.1, 4: 1.0})
    table["rerank_R@1"] = table["R@1"] + 10 - 3 * (table["method"] == "grit")  # re-ranked, GRIT behind
    table["rerank_oracle_R@1"] = table["rerank_R@1"] + 5
    table["itm_final"] = 0.40  # the head left the prior (0.637)
    passed, lines = sweep.gate(table)
    assert "re-ranked R@1 (ALBEF's protocol): -1.96" in lines[0] and "fails" in lines[0]
    assert any(line.startswith("  ITC R@1 (beside the verdict): +1.04") for line in lines)
    assert "FN-aware re-ranked R@1" in next(line for line in lines if line.startswith("- `dense`"))
    table["itm_final"] = 0.63  # at the prior: the head's ranking says nothing, the gate reads ITC
    passed, lines = sweep.gate(table)
    assert passed is True and "ITC R@1: +1.04" in lines[0]


def test_the_budget_line_names_each_regime_only_when_their_budgets_differ():
    table = pd.DataFrame({"preset": ["dense", "coco-like", "coco-like", "dense"], "budget": ["B", "A", "A", "B"]})
    assert sweep.budget_lines(table) == "`coco-like`: A; `dense`: B"  # sparse to dense, whatever the row order
    table["budget"] = "A"
    assert sweep.budget_lines(table) == "A"


def test_summary_and_report_block(tmp_path):
    table = _table({0: 1.0, 1: 1.2, 2: 0.9, 3: 1.1, 4: 1.0})
    uniform = table["method"] == "uniform"
    table.loc[uniform, "risk_top-1"], table.loc[uniform, "risk_top-10"] = 30.0 + table["seed"], 10.0
    table.loc[uniform, "risk_median"], table.loc[uniform, "risk_random"] = 0.5, 0.3
    out = tmp_path / "sweep"
    (out / "worlds" / "coco-like").mkdir(parents=True)
    (out / "worlds" / "coco-like" / "world.json").write_text(
        json.dumps(
            {
                "statistics": {
                    "false_negative_density": {"train": {"pair_negative_fn_rate": 0.0024, "near_miss_fn_rate": 0.285}}
                },
                "counts": {"images": {"test": 2025}, "captions": {"test": 10125}},
            }
        )
    )
    # Captions 0-2 describe 1, 2 and 4 test images: a perfect model finds its own image (1 + 1/2 + 1/4) / 3 of the time.
    pd.DataFrame({"image_id": [0, 1, 2, 3, 4, 5, 6], "caption_id": [0, 1, 1, 2, 2, 2, 2]}).to_parquet(
        out / "worlds" / "coco-like" / "compatibility_test.parquet"
    )
    table["itm_final"] = 0.6 + 0.01 * (table["method"] == "grit")
    assert "fixed-q frontier" not in "\n".join(sweep.summary_lines(table, out))  # no FALCON run: no frontier line
    q05 = table["method"] == "q05"
    table["frontier_gap"] = None
    table.loc[q05, "frontier_gap"] = -6.0 + table.loc[q05, "seed"].astype(float)  # -6 ... -2 points
    lines = sweep.summary_lines(table, out)
    text = "\n".join(lines)
    assert "issue 35's target: −5 or less on every seed): q05 -4.0 ± 1.6 (2/5 seeds ≤ −5)." in text
    table.loc[q05, "frontier_room"] = 8.0 + table.loc[q05, "seed"].astype(float)  # what a density-aware q could win
    text = "\n".join(sweep.summary_lines(table, out))
    assert "q05 -4.0 ± 1.6 (2/5 seeds ≤ −5; room knowing each anchor's density 10.0 ± 1.6)." in text
    assert "ITM loss over the final epoch: uniform 0.600 ± 0.000, grit 0.610 ± 0.000, q05 0.600 ± 0.000" in text
    assert "learned nothing but the label rate scores 0.637" in text
    assert "a perfect model's t2i R@1: 58.3%" in text
    assert "a random pair is a false negative 0.24% of the time, a near miss 28.5%" in text
    grit = next(line for line in lines if line.startswith("| grit |"))
    assert "**+1.04 [+0.90, +1.18]** (5/5 +)" in grit  # vs uniform: the paired interval excludes zero
    assert "| uniform | 5 | 22.0 ± 1.6 |" in text
    assert "hardest candidate is a true match 32.0 ± 1.6% of the time, the 10th hardest 10.0 ± 0.0%" in text
    manifest = {
        "git": {"sha": "abcdef0123", "dirty": False},
        "host": {"cpus": 16, "gpus": ["NVIDIA H200"]},
        "config": CONFIG,
        "stages": {"pretrain": {"result": {"device": "cuda", "precision": "bf16"}}},
    }
    # (what run_row records from each run's manifest)
    table["commit"], table["machine"], table["budget"] = (
        "abcdef0",
        sweep.machine(manifest),
        sweep.budget_phrase(manifest),
    )
    table.to_csv(out / "results.csv", index=False)
    figure = sweep.figure(table, out)
    report = tmp_path / "docs" / "results.md"
    report.parent.mkdir()
    report.write_text("# Results\n\nbefore\n<!-- phase:begin -->\nold\n<!-- phase:end -->\nafter\n")
    sweep.write_report(report, out, table, "the command", 2, figure)
    page = report.read_text()
    assert "old" not in page and page.startswith("# Results\n\nbefore\n") and page.endswith("after\n")
    assert "**The gate** (the premise the papers start from): passed." in page and "`abcdef0`" in page
    assert "16 CPU cores, NVIDIA H200 (cuda, bf16), 2 runs at a time" in page  # where the runs trained
    assert (
        "worlds of 3,000 images of 32 px (splits train 0.3, test 0.7); albef-tiny from the unimodal encoders (12 "
        "image epochs on 20,000 extra scenes, 20 text epochs), 12 epochs of batch 64 at lr 0.0003 (cosine to 1e-05), "
        "|M| 500"
    ) in page  # the budget the runs' manifests record
    assert (report.parent / "results" / "phase_diagram.png").is_file()


def test_a_table_of_uniform_runs_alone_has_no_chain_column_and_no_verdict_yet(tmp_path):
    """The first pilot: uniform runs only, so no run has a chain false-negative rate (the column is absent)."""
    table = pd.DataFrame(
        [
            {
                "preset": "coco-like",
                "method": "uniform",
                "seed": 0,
                "R@1": 4.0,
                "oracle_R@1": 9.0,
                "q_fn_density_corr": None,
                "i2t_R@1_lo": 3.0,
                "i2t_R@1_hi": 6.0,
            }
        ]
    )
    assert sweep.paired(table, "dense", "grit", "q05", metric="fn_rate_chain") is None
    passed, lines = sweep.gate(table)
    assert passed is None and all("not both run" in line for line in lines)
    assert "| uniform | 1 | 4.0 ± 0.0 | 9.0 ± 0.0 | — |" in "\n".join(sweep.summary_lines(table, tmp_path))
    assert sweep.figure(table, tmp_path).is_file()  # (its chain panel stays empty)


def test_every_seed_of_a_regime_starts_from_one_pair_of_unimodal_encoders(tmp_path):
    """With `unimodal_seed` set, the runs of every seed pass the same `unimodal.seed` (one cache entry, trained
    once); without it, each seed has its own."""
    from dataclasses import replace

    cpu = sweep.BUDGETS["cpu"]
    shared = [o for o in cpu.run_overrides("coco-like", tmp_path, 3) if o.startswith("unimodal.")]
    assert "unimodal.seed=0" in shared and f"unimodal.extra_images={cpu.unimodal_extra_images}" in shared
    assert shared == [o for o in cpu.run_overrides("coco-like", tmp_path, 4) if o.startswith("unimodal.")]
    assert {cpu.unimodal_seed_of(s) for s in range(5)} == {0}
    assert "pretrain.optim.min_lr=1e-05" in cpu.run_overrides("coco-like", tmp_path, 3)  # ALBEF's end of the cosine
    recipes = replace(cpu, min_lr=None).run_overrides("coco-like", tmp_path, 3)
    assert not any(o.startswith("pretrain.optim.min_lr=") for o in recipes)  # None: the recipe's own
    own = replace(cpu, unimodal_seed=None)
    assert "unimodal.seed=null" in own.run_overrides("coco-like", tmp_path, 3)
    assert [own.unimodal_seed_of(s) for s in range(3)] == [0, 1, 2]


def _finished_run(run, method: str, r1: float, reranked: float | None = None) -> None:
    """The files a trained, evaluated and audited run leaves that the sweep's tables read (``reranked``: with an ITM
    re-ranked row at depth 8, every R@1 that value)."""
    (run / "results").mkdir(parents=True)
    (run / "audit").mkdir()
    (run / "manifest.json").write_text(
        json.dumps(
            {
                "git": {"sha": "0123456789", "dirty": False},
                "host": {"cpus": 2, "gpus": []},
                "config": CONFIG,
                "stages": {
                    "pretrain": {
                        "status": "completed",
                        "start": "2026-11-26T00:00:00+00:00",
                        "end": "2026-11-26T00:12:00+00:00",
                        "result": {"device": "cpu", "precision": "fp32"},
                    }
                },
            }
        )
    )
    metrics = ("i2t_R@1", "t2i_R@1", "oracle_i2t_R@1", "oracle_t2i_R@1")
    steps = [{"step": k, "epoch": k // 2, "itm": 0.7 - 0.01 * k} for k in range(4)]  # the last epoch: 0.68, 0.67
    rows = [{"scoring": "itc", **{k: r1 for k in metrics}}]
    rows += [{"scoring": "itc+itm@8", **{k: reranked for k in metrics}}] if reranked is not None else []
    (run / "results" / "retrieval.json").write_text(json.dumps({"rows": rows}))
    overall = [{"kind": "all", "oracle_rate": 0.05}] + (
        [{"kind": "chain", "oracle_rate": 0.1}] if method != "uniform" else []
    )
    (run / "audit" / "summary.json").write_text(json.dumps({"overall": overall}))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))


def test_collect_rebuilds_the_tables_and_report_from_runs_made_elsewhere_and_runs_nothing(tmp_path):
    """`--collect`: runs trained on another machine (copied into OUT) give the tables and the page's block; no world
    is generated and no run is started, even for the (preset, method, seed) that are missing."""
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "sweep"
    for seed in range(2):
        for method, r1, reranked in (("uniform", 20.0 + seed, 25.0 + seed), ("grit", 21.0 + seed, 23.5 + 2 * seed)):
            _finished_run(sweep.run_dir(out, "coco-like", method, seed), method, r1, reranked)
    report = tmp_path / "results.md"
    report.write_text("<!-- phase:begin -->\n<!-- phase:end -->\n")
    repo = Path(sweep.__file__).resolve().parents[1]
    proc = subprocess.run(
        [
            sys.executable,
            str(repo / "benchmarks" / "phase_sweep.py"),
            "--out",
            str(out),
            "--gate",
            "--collect",
            "--report",
            str(report),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg"},
    )
    assert proc.returncode == 0, proc.stderr
    assert not (out / "worlds").exists() and not list((out / "logs").iterdir())  # nothing generated or run
    table = pd.read_csv(out / "results.csv")
    assert sorted(zip(table["method"], table["seed"])) == [("grit", 0), ("grit", 1), ("uniform", 0), ("uniform", 1)]
    assert table["itm_final"].round(4).eq(0.675).all()  # the mean over the last epoch's steps
    page = report.read_text()
    assert "| grit | 2 | 21.5 ± 0.7 |" in page and "**+1.00 [+1.00, +1.00]** (2/2 +)" in page
    assert "2 CPU cores (cpu, fp32); 4 runs" in page  # (no "runs at a time": collected, not run here)
    assert (
        "top 8 ITC candidates re-ranked by the ITM head (ALBEF's evaluation): "
        "uniform 25.5 ± 0.7 (FN-aware 25.5 ± 0.7); "
        "grit 24.5 ± 1.4 (FN-aware 24.5 ± 1.4, -1.00 [-7.35, +5.35] (0/2 +) against uniform)"
    ) in page
    paired = pd.read_csv(out / "paired.csv")
    rerank = paired[(paired["metric"] == "rerank_R@1") & (paired["reference"] == "uniform")]
    assert rerank["per_seed"].tolist() == ["[-1.5, -0.5]"]  # grit - uniform, seed by seed


def test_a_run_ranked_by_itc_alone_is_evaluated_again_when_the_budget_re_ranks(tmp_path):
    run, world = tmp_path / "grit-s0", tmp_path / "world"  # (no world.json: no near-miss families)
    assert not sweep.evaluated(run, 0, world)
    _finished_run(run, "grit", 20.0)
    assert sweep.evaluated(run, 0, world) and not sweep.evaluated(run, 8, world)
    assert sweep.reranked(json.loads((run / "results" / "retrieval.json").read_text())["rows"]) is None
    other = tmp_path / "grit-s1"
    _finished_run(other, "grit", 20.0, reranked=22.0)
    assert sweep.evaluated(other, 8, world) and not sweep.evaluated(other, 16, world)  # re-ranked at another depth
    assert sweep.run_row("coco-like", "grit", 1, other)["rerank_R@1"] == 22.0


def test_on_a_world_with_near_misses_a_run_is_evaluated_again_for_them_while_its_checkpoints_are_there(tmp_path):
    world = tmp_path / "world"
    world.mkdir()
    (world / "world.json").write_text(json.dumps({"config": {"near_misses": 3}}))
    run = tmp_path / "grit-s0"
    _finished_run(run, "grit", 20.0, reranked=22.0)
    assert sweep.evaluated(run, 8, world)  # brought back without checkpoints: nothing to evaluate them with
    (run / "checkpoints" / "00000010").mkdir(parents=True)
    (run / "checkpoints" / "00000010" / "model.safetensors").write_bytes(b"")
    assert not sweep.evaluated(run, 8, world)
    assert sweep.evaluated(run, 8, tmp_path / "plain")  # (a world without families needs none)
    kinds = {"color": 2.0, "shape": 9.0, "size": 8.0, "move": 30.0, "swap": 51.0, "several": 10.0, "all": 14.0}
    rows = [
        {"model": "pretrained", "scoring": scoring, "direction": direction, **kinds}
        for scoring in ("itc", "itc+itm@8")
        for direction in ("i2t", "t2i")
    ]
    (run / "results" / "near_misses.json").write_text(json.dumps({"meta": {}, "rows": rows}))
    assert sweep.evaluated(run, 8, world)
    summary = json.loads((run / "audit" / "summary.json").read_text())
    summary["near_misses_in_batch"] = [{"epoch": 0, "share": 0.1, "rows": 30}, {"epoch": 1, "share": 0.3, "rows": 10}]
    (run / "audit" / "summary.json").write_text(json.dumps(summary))
    row = sweep.run_row("coco-like", "grit", 0, run)
    assert row["nm_itc_t2i_swap"] == 51.0 and row["nm_rerank_i2t_all"] == 14.0
    assert row["near_miss_share"] == pytest.approx(15.0)  # weighted by rows
    # Evaluated again later, elsewhere: the row names the commit and machine that trained the run.
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["stages"]["pretrain"].update(
        git={"sha": "feedbeef00", "dirty": False}, host={"cpus": 16, "gpus": ["H200"]}
    )
    (run / "manifest.json").write_text(json.dumps(manifest))
    row = sweep.run_row("coco-like", "grit", 0, run)
    assert row["commit"] == "feedbee" and row["machine"] == "16 CPU cores, H200 (cpu, fp32)"


def test_near_miss_lines_give_each_methods_confusions_and_its_paired_difference_from_uniform():
    rows = []
    for seed in (0, 1):
        for method, swap in (("uniform", 50.0), ("grit", 48.0 - seed)):
            row = {
                "preset": "coco-like",
                "method": method,
                "seed": seed,
                "R@1": 60.0,
                "near_miss_share": 4.0 if method == "uniform" else 20.0 + seed,
            }
            for scoring, shift in (("itc", 0.0), ("rerank", -10.0)):
                row.update({f"nm_{scoring}_t2i_{k}": 5.0 + shift for k in (*sweep.NEAR_MISS_KINDS, "all")})
                row[f"nm_{scoring}_t2i_swap"] = swap + shift
            rows.append(row)
    rows.append({"preset": "dense", "method": "uniform", "seed": 0, "R@1": 17.0})
    table = pd.DataFrame(rows)
    lines = sweep.near_miss_lines(table, "coco-like")
    assert (
        "| uniform | 2 | 4.0 | 5.0 / -5.0 | 5.0 / -5.0 | 5.0 / -5.0 | 5.0 / -5.0 | 50.0 / 40.0 | "
        "5.0 / -5.0 | 5.0 / -5.0 |" in lines
    )
    assert "| grit | 2 | 20.5 | " in "\n".join(lines) and "47.5 / 37.5" in "\n".join(lines)
    grit = next(line for line in lines if line.startswith("- `grit` − `uniform`"))
    assert "swap ITC -2.50 [-8.85, +3.85] (0/2 +)" in grit and "swap re-ranked -2.50 [-8.85, +3.85] (0/2 +)" in grit
    assert "color ITC +0.00 [+0.00, +0.00] (0/2 +)" in grit
    assert sweep.near_miss_lines(table, "dense") == []


def test_each_method_keeps_its_colour_in_every_panel(tmp_path, monkeypatch):
    """Uniform has no chain false-negative rate, so the chain panel draws one line fewer: the colours must still
    follow the method, not the order of drawing (a first figure showed GRIT in uniform's colour there)."""
    from matplotlib.axes import Axes

    drawn, errorbar = [], Axes.errorbar

    def recording(self, *args, **kwargs):
        drawn.append((kwargs["label"], kwargs.get("color")))
        return errorbar(self, *args, **kwargs)

    monkeypatch.setattr(Axes, "errorbar", recording)
    sweep.figure(_table({s: 1.0 for s in range(5)}), tmp_path)
    colours = {}
    for method, colour in drawn:
        colours.setdefault(method, set()).add(colour)
    assert [m for m, _ in drawn].count("uniform") == 2 and [m for m, _ in drawn].count("grit") == 3
    assert (
        all(len(c) == 1 and None not in c for c in colours.values()) and len({*map(frozenset, colours.values())}) == 3
    )


def test_set_changes_budget_fields_with_their_types_and_names_a_bad_one():
    cpu = sweep.BUDGETS["cpu"]
    pilot = sweep.changed_budget(cpu, ["epochs=36", "min_lr=2e-5", "unimodal_seed=none", "lr=1e-4"])
    assert (pilot.epochs, pilot.min_lr, pilot.unimodal_seed, pilot.lr) == (36, 2e-5, None, 1e-4)
    assert (pilot.images, pilot.splits) == (cpu.images, cpu.splits) and sweep.changed_budget(cpu, []) == cpu
    for bad, says in (
        (["epochs=x"], "'x' is not a int"),
        (["nope=1"], "FIELD one of images, epochs"),
        (["splits=1"], "FIELD one of"),
        (["epochs"], "expected FIELD=VALUE"),
        (["epochs=none"], "'none' is not a int"),
        (["precision=fp16"], "precision 'fp16': one of auto, fp32, bf16"),
    ):
        with pytest.raises(SystemExit, match=says):
            sweep.changed_budget(cpu, bad)


def test_a_budgets_precision_reaches_every_run_and_auto_adds_nothing(tmp_path):
    cpu = sweep.BUDGETS["cpu"]
    assert not any(o.startswith("pretrain.runtime.precision") for o in cpu.run_overrides("dense", tmp_path, 0))
    bf16 = sweep.changed_budget(cpu, ["precision=bf16"])
    assert bf16.run_overrides("dense", tmp_path, 3)[-1] == "pretrain.runtime.precision=bf16"


def test_encoders_that_train_alone_get_every_core():
    """One encoder pair before two jobs' runs: both cores (the runs wait for it); as many encoders as jobs: a share."""
    assert sweep.threads_per_encoder(cores=2, jobs=2, encoders=1) == 2
    assert sweep.threads_per_encoder(cores=16, jobs=8, encoders=3) == 5
    assert sweep.threads_per_encoder(cores=16, jobs=8, encoders=9) == 2
    assert sweep.threads_per_encoder(cores=2, jobs=4, encoders=4) == 1


def test_the_budgets_keep_every_word_of_a_coco_like_caption(tmp_path):
    """A whole-scene caption of four objects is ~40 tokens; cut at ALBEF's 25 it would name fewer objects than
    the oracle judges it by. Tokens counted as BERT's pre-tokenizer splits words and punctuation (a world-trained
    vocabulary holds every word whole), plus [CLS] and [SEP]."""
    import re

    from falcon_cli.data.shapes import ShapesConfig, generate_world

    world = generate_world(
        ShapesConfig(preset="coco-like", images=240, size=24, paraphrase_prob=0.5), tmp_path / "w"
    ).out_dir
    captions = [c for entry in json.loads((world / "retrieval_test.json").read_text()) for c in entry["caption"]]
    longest = max(len(re.findall(r"\w+|[^\w\s]", c)) + 2 for c in captions)
    assert longest > 25  # (the check means something: the default limit would cut)
    for name in ("cpu", "gpu"):
        assert f"pretrain.encoders.max_text_length={sweep.BUDGETS[name].max_text_length}" in sweep.BUDGETS[
            name
        ].run_overrides("coco-like", tmp_path, 0)
        assert longest <= sweep.BUDGETS[name].max_text_length


def _collect(out, report, *extra, cwd):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(sweep.__file__).resolve().parents[1]
    return subprocess.run(
        [
            sys.executable,
            str(repo / "benchmarks" / "phase_sweep.py"),
            "--out",
            str(out),
            "--gate",
            "--collect",
            "--report",
            str(report),
            *extra,
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg"},
    )


def test_rows_of_runs_whose_directories_are_gone_join_the_tables(tmp_path):
    """A session that trained seeds 0 and 1 and kept only its results.csv, then one that trains seed 2: `--rows`
    gives the report all three seeds, paired as if every run were in OUT; a run in OUT wins over its ledger row."""
    earlier, now = tmp_path / "earlier", tmp_path / "now"
    for seed in range(2):
        for method, r1 in (("uniform", 20.0 + seed), ("grit", 21.0 + seed)):
            _finished_run(sweep.run_dir(earlier, "coco-like", method, seed), method, r1, 25.0)
    report = tmp_path / "results.md"
    report.write_text("<!-- phase:begin -->\n<!-- phase:end -->\n")
    assert _collect(earlier, report, cwd=tmp_path).returncode == 0
    ledger = tmp_path / "ledger.csv"
    ledger.write_bytes((earlier / "results.csv").read_bytes())
    table = pd.read_csv(ledger, dtype={"commit": str})
    assert set(table["world"]) == {"unknown"} and table["budget"].str.contains("albef-tiny").all()
    assert set(table["commit"]) == {"0123456"}
    for method, r1 in (("uniform", 22.0), ("grit", 24.0)):
        _finished_run(sweep.run_dir(now, "coco-like", method, 2), method, r1, 25.0)
    _finished_run(sweep.run_dir(now, "coco-like", "grit", 1), "grit", 30.0, 25.0)  # retrained here: this one counts
    proc = _collect(now, report, "--rows", "ledger.csv", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    merged = pd.read_csv(now / "results.csv").set_index(["method", "seed"])["R@1"]
    assert merged[("uniform", 0)] == 20.0 and merged[("grit", 1)] == 30.0 and merged[("grit", 2)] == 24.0
    page = report.read_text()
    assert "| grit | 3 |" in page and "6 runs (seeds 0, 1, 2)" in page


def test_rows_from_another_world_or_budget_or_an_old_file_are_refused_in_one_line(tmp_path):
    row = {"preset": "coco-like", "method": "uniform", "seed": 0, "R@1": 20.0, "world": "aaaaaaaaaaaa", "budget": "B"}
    mine = [{**row, "method": "grit", "R@1": 21.0}]
    good = tmp_path / "good.csv"
    pd.DataFrame([row]).to_csv(good, index=False)
    assert len(sweep.merge_ledgers(mine, [good])) == 2
    stale = tmp_path / "stale.csv"
    pd.DataFrame([{**row, "world": "bbbbbbbbbbbb"}]).to_csv(stale, index=False)
    with pytest.raises(
        SystemExit,
        match=r"coco-like uniform seed 0 ran on another world than grit seed 0 "
        r"\(bbbbbbbbbbbb vs aaaaaaaaaaaa\)",
    ):
        sweep.merge_ledgers(mine, [stale])
    other_budget = tmp_path / "budget.csv"
    pd.DataFrame([{**row, "budget": "C"}]).to_csv(other_budget, index=False)
    with pytest.raises(SystemExit, match="ran on another budget"):
        sweep.merge_ledgers(mine, [other_budget])
    old = tmp_path / "old.csv"
    pd.DataFrame([{k: v for k, v in row.items() if k != "world"}]).to_csv(old, index=False)
    with pytest.raises(SystemExit, match=r"old.csv: no column 'world'"):
        sweep.merge_ledgers([], [old])
    with pytest.raises(SystemExit, match=r"nowhere.csv: no such file"):
        sweep.merge_ledgers([], [tmp_path / "nowhere.csv"])
    # The command line checks the files before it trains anything.
    proc = _collect(tmp_path / "out", tmp_path / "r.md", "--rows", "old.csv", cwd=tmp_path)
    assert proc.returncode != 0 and proc.stderr.strip().splitlines()[-1].startswith("--rows old.csv: no column 'world'")


def test_the_budget_names_the_unimodal_clip_so_rows_from_unclipped_encoders_do_not_pair_with_clipped_ones(tmp_path):
    """Runs from before `unimodal.grad_clip` existed (or with it off) keep their phrase; clipped ones differ, and
    a ledger mixing them is refused."""

    def phrase(**unimodal):
        config = {**CONFIG, "unimodal": {**CONFIG["unimodal"], **unimodal}}
        return sweep.budget_phrase({"config": config})

    assert phrase() == phrase(grad_clip=None) and "clipped" not in phrase()
    assert "20 text epochs, gradient norm clipped to 1)" in phrase(grad_clip=1.0)
    row = {
        "preset": "coco-like",
        "method": "uniform",
        "seed": 1,
        "R@1": 20.0,
        "world": "aaaaaaaaaaaa",
        "budget": phrase(),
    }
    ledger = tmp_path / "unclipped.csv"
    pd.DataFrame([row]).to_csv(ledger, index=False)
    clipped = [{**row, "seed": 0, "budget": phrase(grad_clip=1.0)}]
    with pytest.raises(SystemExit, match="ran on another budget"):
        sweep.merge_ledgers(clipped, [ledger])


def test_the_world_fingerprint_tells_a_changed_preset_apart(tmp_path):
    """Two worlds of one preset name but other knobs (coco-like before and after issue 34 changed it) differ; the
    same world read twice does not; a world that is gone is `unknown`."""
    from falcon_cli.data.shapes import ShapesConfig, generate_world

    now = generate_world(ShapesConfig(preset="coco-like", images=40, size=24), tmp_path / "now").out_dir
    before = generate_world(
        ShapesConfig(
            preset="coco-like",
            images=40,
            size=24,
            scene_captions=0,
            train_captions_per_image=None,
            caption_mix={"position": 1, "relation": 3, "full": 1},
        ),
        tmp_path / "before",
    ).out_dir
    prints = [sweep.world_fingerprint({"config": {"data": {"dataset": str(w)}}}) for w in (now, before, now)]
    assert prints[0] == prints[2] != prints[1] and len(prints[0]) == 12
    assert sweep.world_fingerprint({"config": {"data": {"dataset": str(tmp_path / "gone")}}}) == "unknown"
    # The same world written before a knob existed (no key in world.json) and after (the knob at its no-op None).
    older = tmp_path / "older"
    older.mkdir()
    world = json.loads((before / "world.json").read_text())
    assert world["config"].pop("train_captions_per_image", "missing") is None
    (older / "world.json").write_text(json.dumps(world))
    assert sweep.world_fingerprint({"config": {"data": {"dataset": str(older)}}}) == prints[1]


def test_the_diagnostic_arm_runs_only_when_named():
    """The diagnostic arms (`grit-mask`: same-image pairs masked; `grit-oracle`: every true match masked) run only
    when named: they are not part of the phase diagram or the gate."""
    assert "grit-mask" not in sweep.selected_methods(False, None)
    diagnostics = ("grit-mask", "grit-oracle", "uniform-oracle", "falcon-oracle", "falcon-oracle-top")
    pilots = ("falcon-paper-rate", "falcon-start-top", "falcon-rank-oracle", "falcon-rank-itm", "falcon-itm-progress")
    pilots += ("falcon-rank-oracle-w0.75", "falcon-rank-oracle-quadratic", "falcon-rank-oracle-quadratic-w1")
    pilots += ("falcon-rank-itm-quadratic-w1",)
    assert sweep.selected_methods(False, None) == [m for m in sweep.METHODS if m not in diagnostics + pilots]
    assert sweep.METHODS["falcon-paper-rate"] == ("shapes-falcon", ["pretrain.scheduler.lr=1.144e-3"])
    assert sweep.METHODS["falcon-oracle-top"] == ("shapes-falcon-oracle", ["pretrain.composer.quantile_scale=log_rank"])
    assert sweep.selected_methods(False, ["uniform-oracle", "grit-oracle"]) == ["grit-oracle", "uniform-oracle"]
    assert sweep.METHODS["uniform-oracle"] == ("shapes-uniform", ["pretrain.false_negatives.oracle=mask"])
    assert sweep.METHODS["grit-oracle"] == ("shapes-grit", ["pretrain.false_negatives.oracle=mask"])
    assert sweep.selected_methods(True, None) == list(sweep.GATE_METHODS)
    assert sweep.selected_methods(False, ["grit-mask", "uniform"]) == ["uniform", "grit-mask"]
    assert sweep.METHODS["grit-mask"] == ("shapes-grit", ["pretrain.false_negatives.same_image=mask"])
    assert sweep.METHODS["falcon-oracle"] == ("shapes-falcon-oracle", [])


def _zero_shot(epoch: int, i2t: float, t2i: float) -> dict:
    return {
        "step": 10 * (epoch + 1),
        "epoch": epoch,
        "kind": "zero_shot",
        "i2t_R@1": i2t,
        "i2t_R@1_lo": i2t - 2,
        "i2t_R@1_hi": i2t + 2,
        "t2i_R@1": t2i,
        "t2i_R@1_lo": t2i - 1,
        "t2i_R@1_hi": t2i + 1,
    }


def test_a_runs_curve_counts_epochs_from_one_and_a_resumed_runs_repeated_record_once(tmp_path):
    records = [
        {"step": 1, "epoch": 0, "itm": 0.6},
        {"step": 2, "epoch": 0, "itm": 0.4},
        _zero_shot(0, 30.0, 20.0),
        {"step": 3, "epoch": 1, "itm": 0.5},
        _zero_shot(1, 40.0, 30.0),
        _zero_shot(1, 44.0, 32.0),
        {"step": 3, "epoch": 1, "itm": 0.3},
    ]  # (epoch 1 again, after a resume)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"torn')
    rows = sweep.curve_rows("coco-like", "grit", 3, tmp_path)
    assert [r["epoch"] for r in rows] == [1, 2]
    assert rows[0]["R@1"] == 25.0 and rows[0]["itm"] == pytest.approx(0.5) and rows[0]["t2i_R@1_hi"] == 21.0
    assert rows[1]["R@1"] == 38.0 and rows[1]["i2t_R@1"] == 44.0 and rows[1]["itm"] == pytest.approx(0.4)
    assert rows[1]["method"] == "grit" and rows[1]["seed"] == 3
    assert rows[0]["FN-aware R@1"] is None  # (a run from before the curve recorded it)


def test_a_curve_carries_the_fn_aware_r1_where_the_run_recorded_it(tmp_path):
    point = {**_zero_shot(0, 30.0, 20.0), "oracle_i2t_R@1": 50.0, "oracle_t2i_R@1": 70.0}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(point) + "\n")
    (row,) = sweep.curve_rows("dense", "grit-oracle", 0, tmp_path)
    assert row["FN-aware R@1"] == 60.0 and row["R@1"] == 25.0


def test_the_convergence_line_compares_the_last_quarter_of_epochs_with_the_one_before():
    rows = []
    for seed, slope in ((0, 1.0), (1, 2.0)):
        for epoch in range(1, 9):  # 8 epochs: windows 5-6 and 7-8
            rows.append(
                {"preset": "coco-like", "method": "uniform", "seed": seed, "epoch": epoch, "R@1": slope * epoch}
            )
            rows.append(
                {
                    "preset": "coco-like",
                    "method": "grit",
                    "seed": seed,
                    "epoch": epoch,
                    "R@1": slope * epoch + (1.0 if seed == 0 else -0.5),
                }
            )
    (line,) = sweep.convergence_lines(pd.DataFrame(rows))
    # uniform rises by 2 (seed 0) and 4 (seed 1) points between the windows: mean 3, std 1.41
    assert line.startswith("`coco-like`: uniform's R@1 changed by +3.00 [-9.71, +15.71] points from epochs 5–6 to 7–8")
    assert (
        "after epoch 8: 12.0" in line
        and "GRIT − uniform over those last 2 epochs: +0.25 [-9.28, +9.78] (positive on 1 of 2 seeds)" in line
    )
    assert sweep.convergence_lines(pd.DataFrame(rows[:6])) == []  # (3 epochs: no quarter to compare)


def test_collect_writes_the_learning_curves_and_the_report_shows_them_only_for_runs_it_holds(tmp_path):
    out = tmp_path / "sweep"
    for seed in range(2):
        for method, r1 in (("uniform", 20.0 + seed), ("grit", 21.0 + seed)):
            run = sweep.run_dir(out, "coco-like", method, seed)
            _finished_run(run, method, r1)
            with (run / "metrics.jsonl").open("a") as f:
                for epoch in range(4):
                    f.write(json.dumps(_zero_shot(epoch, r1 + epoch, r1 + epoch)) + "\n")
    report = tmp_path / "results.md"
    report.write_text("<!-- phase:begin -->\n<!-- phase:end -->\n")
    proc = _collect(out, report, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    curves = pd.read_csv(out / "curves.csv")
    assert len(curves) == 16 and sorted(curves["epoch"].unique()) == [1, 2, 3, 4]
    assert (out / "phase_curves.png").stat().st_size > 0 and (tmp_path / "results" / "phase_curves.png").exists()
    page = report.read_text()
    assert "**Learning curves** (zero-shot test R@1 after every epoch, 4 of the 4 runs" in page
    assert "uniform's R@1 changed by +1.00 [+1.00, +1.00] points from epochs 3 to 4" in page
    assert "![the learning curves](results/phase_curves.png)" in page

    # A regime whose runs hold no uniform has no paired difference to draw: the panel says so, with no warning.
    import warnings

    curves = pd.read_csv(out / "curves.csv")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sweep.curve_figure(curves[curves["method"] == "grit"], tmp_path).stat().st_size > 0

    # Rows whose runs are gone (--rows) bring the curves their report kept beside them (phase_curves.csv), and a
    # run held in OUT keeps its own: a report regenerated from a ledger loses no learning curve.
    import shutil

    ledger = tmp_path / "ledger"
    shutil.copytree(tmp_path / "results", ledger)
    kept = sweep.run_dir(tmp_path / "partly", "coco-like", "grit", 1)
    _finished_run(kept, "grit", 22.0)
    with (kept / "metrics.jsonl").open("a") as f:
        f.write(json.dumps(_zero_shot(0, 50.0, 50.0)) + "\n")
    proc = _collect(tmp_path / "partly", report, "--rows", str(ledger / "phase_results.csv"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "**Learning curves** (zero-shot test R@1 after every epoch, 4 of the 4 runs" in report.read_text()
    merged = pd.read_csv(tmp_path / "results" / "phase_curves.csv")
    assert len(merged) == 13 and merged.query("method == 'grit' and seed == 1")["R@1"].tolist() == [50.0]

    # Rows whose runs are gone (--rows) and no curves beside them: the page and docs/results/ then show none, not
    # stale ones.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "curves.csv").unlink()  # (a sweep's results.csv keeps its curves beside it, as curves.csv)
    proc = _collect(elsewhere, report, "--rows", str(out / "results.csv"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Learning curves" not in report.read_text() and not (tmp_path / "results" / "phase_curves.png").exists()


def test_the_oracle_arms_say_what_the_false_negatives_cost_and_what_hardness_gives_without_them(tmp_path):
    """`grit-oracle` − `grit`, `uniform-oracle` − `uniform` and `grit-oracle` − `uniform-oracle`, seed by seed, in the
    regime's block; a regime without the arms gets no such line."""
    rows = []
    for seed in (0, 1):
        for method, fn_aware in (
            ("uniform", 60.0),
            ("grit", 61.0),
            ("uniform-oracle", 70.0 + seed),
            ("grit-oracle", 73.0),
        ):
            rows.append(
                {
                    "preset": "dense",
                    "method": method,
                    "seed": seed,
                    "R@1": 17.0 - 7 * ("oracle" in method),
                    "oracle_R@1": fn_aware,
                    "rerank_oracle_R@1": fn_aware + 10,
                    "i2t_R@1_lo": 1.0,
                    "i2t_R@1_hi": 3.0,
                }
            )
    rows.append(
        {
            "preset": "coco-like",
            "method": "uniform",
            "seed": 0,
            "R@1": 60.0,
            "oracle_R@1": 62.0,
            "i2t_R@1_lo": 1.0,
            "i2t_R@1_hi": 3.0,
        }
    )
    table = pd.DataFrame(rows)
    lines = sweep.oracle_lines(table, "dense")
    assert lines[2] == (
        "- `grit-oracle` − `grit` (every false negative kept out of ITC and ITM): FN-aware R@1 **+12.00 "
        "[+12.00, +12.00]** (2/2 +); R@1 **-7.00 [-7.00, -7.00]** (0/2 +); re-ranked FN-aware R@1 **+12.00 "
        "[+12.00, +12.00]** (2/2 +)."
    )
    assert lines[3].startswith(
        "- `uniform-oracle` − `uniform` (every false negative kept out of ITC and ITM): "
        "FN-aware R@1 **+10.50 [+4.15, +16.85]** (2/2 +)"
    )
    assert lines[4].startswith(
        "- `grit-oracle` − `uniform-oracle` (hardness, once no negative is false): "
        "FN-aware R@1 +2.50 [-3.85, +8.85] (2/2 +)"
    )
    assert sweep.oracle_lines(table, "coco-like") == []
    page = "\n".join(sweep.summary_lines(table, tmp_path))
    assert page.count("What the false negatives cost") == 1 and "| grit-oracle | 2 |" in page


def test_curves_side_by_side_include_runs_still_training(tmp_path):
    out = tmp_path / "sweep"

    def write(method: str, epochs: int, fn_aware: bool) -> None:
        run = sweep.run_dir(out, "medium", method, 0)
        run.mkdir(parents=True)
        records = []
        for epoch in range(epochs):
            records.append({"step": 2 * epoch, "epoch": epoch, "itm": 0.6})
            evaluation = {"kind": "zero_shot", "epoch": epoch, "i2t_R@1": 10.0 + epoch, "t2i_R@1": 20.0 + epoch}
            if fn_aware:
                evaluation.update({"oracle_i2t_R@1": 30.0, "oracle_t2i_R@1": 40.0})
            records.append(evaluation)
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    write("grit", 3, True)
    write("grit-oracle", 1, False)  # paused after its first epoch, and from before the FN-aware curve
    lines = sweep.side_by_side(out, "medium", 0, ["grit", "q05", "grit-oracle"])
    assert lines[2] == "| epoch | grit | grit-oracle |"  # (q05 has no run)
    assert lines[4] == "| 1 | 15.0 / 35.0 / 0.600 | 15.0 / — / 0.600 |"
    assert lines[6] == "| 3 | 17.0 / 35.0 / 0.600 |  |"
    assert sweep.side_by_side(out, "dense", 0, ["grit"]) == [f"no runs of grit on dense, seed 0, in {out}"]


def test_the_epoch_table_sets_each_epochs_composition_beside_the_r1_scored_after_that_same_epoch(tmp_path):
    """``--curves … --epochs-csv``: a FALCON run's epoch summary (0-based; epoch 0 has none, its batches are uniform)
    beside the zero-shot scores written at the end of the same epoch; runs stopped mid-budget count."""
    out = tmp_path / "sweep"
    run = sweep.run_dir(out, "dense", "falcon-itm-expected", 0)
    run.mkdir(parents=True)
    records = [
        {"step": 1, "epoch": 0, "itm": 0.6},
        {**_zero_shot(0, 2.0, 4.0), "oracle_i2t_R@1": 20.0, "oracle_t2i_R@1": 30.0},
    ]
    for epoch in (1, 2):
        records += [
            {"step": 10 * epoch + 1, "epoch": epoch, "itm": 0.5},
            {
                "step": 10 * epoch + 5,
                "epoch": epoch,
                "kind": "epoch_summary",
                "q_mean": 0.1 * epoch,
                "reward_fn_corr": -0.3,
                "frontier_gap": -0.05 * epoch,
            },
            {**_zero_shot(epoch, 10.0 * epoch, 20.0 * epoch), "oracle_i2t_R@1": 40.0, "oracle_t2i_R@1": 50.0 + epoch},
        ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    rows = sweep.epoch_table(out, "dense", 0, ["falcon-itm", "falcon-itm-expected"])  # (falcon-itm has no run)
    assert [(r["method"], r["epoch"], r["q_mean"], r["R@1"], r["FN-aware R@1"]) for r in rows] == [
        ("falcon-itm-expected", 1, 0.1, 15.0, 45.5),
        ("falcon-itm-expected", 2, 0.2, 30.0, 46.0),
    ]
    assert rows[1]["frontier_gap"] == -0.1 and rows[0]["itm_fn_auc"] is None  # (absent keys: blank)
    assert rows[0]["hardness_fn_auc"] is None  # (no batch log to recompute it from)
    # a key the run did not record, recomputed from its batch log; one it recorded kept as recorded
    from falcon_cli.artifacts.tables import BATCHES, write_table

    similarity, fn = [0.9, 0.1, 0.8, 0.7], [1.0, 0.0, 0.0, 1.0]  # one true pick above one false one: AUC 3 / 4
    log = pd.DataFrame({name: [None] * 8 for name in BATCHES.names})
    log = log.assign(
        epoch=[1] * 4 + [2] * 4,
        step=[0, 0, 1, 1] * 2,
        rank=0,
        slot=[0, 1] * 4,
        pair_id=range(8),
        anchor_pair_id=range(8),
        q=0.3,
        similarity_to_anchor=similarity * 2,
        sampler="falcon",
        anchor_fn_density=0.2,
        chosen_is_fn=fn * 2,
        quantile_rank=[1.0, 0.5, 0.995, 0.2] + [1.0, 1.0, 0.98, 1.0],
    )[BATCHES.names]
    write_table(run / "batches.parquet", log, BATCHES)
    rows = sweep.epoch_table(out, "dense", 0, ["falcon-itm-expected"])
    assert [r["hardness_fn_auc"] for r in rows] == [pytest.approx(0.75)] * 2
    # how often a pick was the most similar candidate left, and among the top 1%
    assert [(r["top1_share"], r["top1pct_share"]) for r in rows] == [(0.25, 0.5), (0.75, 0.75)]
    assert rows[1]["frontier_gap"] == -0.1 and rows[1]["q_mean"] == 0.2
    csv = tmp_path / "epochs.csv"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "phase_sweep.py"),
            "--out",
            str(out),
            "--presets",
            "dense",
            "--seeds",
            "0",
            "--curves",
            "falcon-itm-expected",
            "--epochs-csv",
            str(csv),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr
    assert list(pd.read_csv(csv)["R@1"]) == [15.0, 30.0]


def test_a_run_scores_its_training_pairs_while_its_checkpoints_exist_and_the_report_sets_them_beside_a_perfect_model(
    tmp_path, monkeypatch
):
    import dataclasses

    out = tmp_path / "sweep"
    run = sweep.run_dir(out, "coco-like", "grit", 0)
    _finished_run(run, "grit", 20.0)
    calls = []
    monkeypatch.setattr(sweep, "falcon", lambda *args, **kw: calls.append(args))
    monkeypatch.setattr(sweep, "completed", lambda *args: True)
    monkeypatch.setattr(sweep, "evaluated", lambda *args: True)
    budget = dataclasses.replace(sweep.BUDGETS["quick"], memorisation_images=300)
    row = sweep.run_one("coco-like", "grit", 0, out, budget, threads=1)
    assert calls == [] and "train_t2i_R@1" not in row  # brought back without checkpoints: nothing to score them with
    (run / "checkpoints" / "00000010").mkdir(parents=True)
    (run / "checkpoints" / "00000010" / "model.safetensors").write_bytes(b"")
    sweep.run_one("coco-like", "grit", 0, out, dataclasses.replace(budget, memorisation_images=0), threads=1)
    assert calls == []  # the budget does not ask for it
    sweep.run_one("coco-like", "grit", 0, out, budget, threads=1)
    assert calls == [
        (
            "evaluate",
            "retrieval",
            str(run),
            "--split",
            "pretrain",
            "--itc-only",
            "--set",
            "evaluate.retrieval.pretrain_images=300",
        )
    ]
    (run / "results" / "retrieval_pretrain.json").write_text(
        json.dumps(
            {
                "meta": {"split": "pretrain", "images": 300, "perfect_t2i_R@1": 27.5},
                "rows": [{"scoring": "itc", "t2i_R@1": 61.0, "oracle_t2i_R@1": 74.0}],
            }
        )
    )
    calls.clear()
    row = sweep.run_one("coco-like", "grit", 0, out, budget, threads=1)
    assert calls == []  # scored once
    assert (row["train_t2i_R@1"], row["train_perfect_t2i_R@1"], row["train_images"]) == (61.0, 27.5, 300)
    table = pd.DataFrame([{**row, "method": "grit", "seed": 0}])
    (line,) = [text for text in sweep.memorisation_lines(table, "coco-like") if text]
    assert (
        "300 training images" in line
        and "scores 27.5 there" in line
        and "grit 61.0 ± 0.0 on them, 20.0 ± 0.0 on test" in line
    )
    assert sweep.memorisation_lines(table, "dense") == []
    older = table.assign(**{"train_perfect_t2i_R@1": None})  # scored before the results carried the perfect model's
    (line,) = [text for text in sweep.memorisation_lines(older, "coco-like") if text]
    assert "perfect" not in line and "grit 61.0 ± 0.0 on them" in line


def test_srcl_embeds_the_pairs_with_the_same_seeds_uniform_run_first(tmp_path, monkeypatch):
    """SRCL's frozen auxiliary model is the same (regime, seed)'s uniform run: its run gets the embed stage with that
    run as the encoder, and is refused (one message naming it) while that run has no checkpoint."""
    calls = []
    monkeypatch.setattr(sweep, "train", lambda run, recipe, *overrides, log, threads: calls.append((recipe, overrides)))
    monkeypatch.setattr(sweep, "completed", lambda run, stage: False)
    with pytest.raises(RuntimeError, match="auxiliary model .*uniform-s3 has no checkpoint.*--only uniform srcl"):
        sweep.run_one("dense", "srcl", 3, tmp_path, sweep.BUDGETS["quick"], threads=1)
    checkpoint = sweep.run_dir(tmp_path, "dense", "uniform", 3) / "checkpoints" / "12"
    checkpoint.mkdir(parents=True)
    (checkpoint / sweep.WEIGHTS).write_bytes(b"weights")

    class Trained(Exception):
        pass

    def stop(*args):
        raise Trained  # (evaluation and audit are not this test's)

    monkeypatch.setattr(sweep, "evaluated", stop)
    with pytest.raises(Trained):
        sweep.run_one("dense", "srcl", 3, tmp_path, sweep.BUDGETS["quick"], threads=1)
    recipe, overrides = calls[-1]
    assert recipe == "shapes-srcl" and overrides[0] == "stages=[data, embed, pretrain]"
    assert f"embed.encoder=falcon:{sweep.run_dir(tmp_path, 'dense', 'uniform', 3)}" in overrides
    with pytest.raises(Trained):
        sweep.run_one("dense", "diht", 3, tmp_path, sweep.BUDGETS["quick"], threads=1)
    assert calls[-1][0] == "shapes-diht" and calls[-1][1][0] == "stages=[data, pretrain]"


def test_to_train_skips_what_a_ledger_records_unless_a_run_left_reads_it():
    runs = sweep.plan(["dense"], ["uniform", "grit", "srcl"], [0, 1])
    reads = lambda r: ("dense", "uniform", r[2]) if r[1] == "srcl" else None  # noqa: E731
    assert sweep.to_train(runs, set(), reads) == runs
    recorded = {("dense", m, s) for m in ("uniform", "grit") for s in (0, 1)} | {("dense", "srcl", 0)}
    # seed 1's SRCL is left and reads seed 1's uniform: that one trains again, beside it; seed 0's does not
    assert sweep.to_train(runs, recorded, reads) == [("dense", "uniform", 1), ("dense", "srcl", 1)]
    assert sweep.to_train(runs, set(runs), reads) == []
    assert sweep.curves_beside(sweep.Path("docs/results/phase_results.csv")).name == "phase_curves.csv"
    assert sweep.curves_beside(sweep.Path("x/five_bf16_results.csv")).name == "five_bf16_curves.csv"
    assert sweep.curves_beside(sweep.Path("x/results.csv")).name == "curves.csv"
    assert sweep.curves_beside(sweep.Path("x/ledger.csv")).name == "ledger_curves.csv"


def test_a_ledger_keeps_every_finished_run_across_machines_and_its_runs_are_not_trained_again(tmp_path):
    """`--ledger`: one machine's finished runs are written into it; the next machine (a new OUT) adds its own, and a
    sweep asking for nothing the ledger lacks trains nothing (no world is generated)."""
    report = tmp_path / "results.md"
    report.write_text("<!-- phase:begin -->\n<!-- phase:end -->\n")
    first, second = tmp_path / "first", tmp_path / "second"
    for out, seed in ((first, 0), (second, 1)):
        for method in sweep.GATE_METHODS:
            run = sweep.run_dir(out, "dense", method, seed)
            _finished_run(run, method, 20.0 + seed, 25.0)
            with (run / "metrics.jsonl").open("a") as f:
                f.write("".join(json.dumps(_zero_shot(e, 10.0 + seed, 10.0 + seed)) + "\n" for e in range(2)))
    assert _collect(first, report, "--ledger", "kept.csv", cwd=tmp_path).returncode == 0
    kept = pd.read_csv(tmp_path / "kept.csv")
    assert sorted(zip(kept["method"], kept["seed"])) == sorted((m, 0) for m in sweep.GATE_METHODS)
    assert len(pd.read_csv(tmp_path / "kept_curves.csv")) == 6  # (each run's two epochs, beside it)
    proc = _collect(second, report, "--ledger", "kept.csv", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    kept = pd.read_csv(tmp_path / "kept.csv")
    assert sorted(zip(kept["method"], kept["seed"])) == sorted((m, s) for m in sweep.GATE_METHODS for s in (0, 1))
    assert sorted(set(kept["R@1"])) == [20.0, 21.0]
    curves = pd.read_csv(tmp_path / "kept_curves.csv")
    assert len(curves) == 12 and sorted(set(curves["R@1"])) == [10.0, 11.0]  # (the first machine's curves kept)
    assert "| grit | 2 |" in report.read_text()  # (the page counts both machines' runs)

    repo = sweep.Path(sweep.__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, str(repo / "benchmarks" / "phase_sweep.py"), "--out", str(tmp_path / "third"), "--gate"]
        + ["--presets", "dense", "--seeds", "0", "1", "--budget", "quick", "--ledger", "kept.csv"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(repo), "PATH": os.environ["PATH"], "MPLBACKEND": "Agg"},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "every run asked for is recorded in" in proc.stdout
    assert not (tmp_path / "third" / "worlds").exists()


def test_another_campaigns_block_reports_beside_the_phase_sweeps_never_over_it(tmp_path):
    """`--block five_bf16`: its own markers and its own files in docs/results/; the phase block and phase_results.csv
    are left as they were. A page without the block's markers, or a bad name, is refused in one line, nothing
    written."""
    out = tmp_path / "five"
    for method in sweep.GATE_METHODS:
        _finished_run(sweep.run_dir(out, "dense", method, 0), method, 20.0, 25.0)
    report = tmp_path / "results.md"
    phase = "<!-- phase:begin -->\nthe phase sweep's\n<!-- phase:end -->\n"
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "phase_results.csv").write_text("the phase ledger\n")
    report.write_text(phase)
    proc = _collect(out, report, "--block", "five_bf16", cwd=tmp_path)
    assert proc.returncode != 0 and proc.stderr.strip().splitlines()[-1] == (
        f"--report {report}: no <!-- five_bf16:begin --> ... <!-- five_bf16:end --> block; add the two markers where "
        "the tables go"
    )
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["phase_results.csv"]
    proc = _collect(out, report, "--block", "Five bf16", cwd=tmp_path)
    assert proc.returncode != 0 and "--block Five bf16: lower-case letters, digits and _ only" in proc.stderr

    report.write_text(phase + "<!-- five_bf16:begin -->\n<!-- five_bf16:end -->\n")
    proc = _collect(out, report, "--block", "five_bf16", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    page = report.read_text()
    assert page.startswith(phase) and "![the phase diagram](results/five_bf16_diagram.png)" in page
    assert (tmp_path / "results" / "phase_results.csv").read_text() == "the phase ledger\n"
    assert len(pd.read_csv(tmp_path / "results" / "five_bf16_results.csv")) == 3
    assert (tmp_path / "results" / "five_bf16_diagram.png").stat().st_size > 0


def test_the_ledger_is_written_as_each_run_finishes_not_only_when_the_sweep_ends(tmp_path, monkeypatch):
    """A session may end while a sweep still trains: each finished run is in the ledger by then (training faked)."""
    out, ledger = tmp_path / "out", tmp_path / "kept.csv"
    written = []

    def run_one(preset, method, seed, out, budget, threads, **_):
        # (made whole elsewhere, then moved in: the ledger is read while the pool makes the next run, and a run the
        # fake had half written looked finished without its metrics, which a real run logs before it is evaluated)
        run, staged = sweep.run_dir(out, preset, method, seed), tmp_path / "staging" / f"{method}-s{seed}"
        _finished_run(staged, method, 20.0, 25.0)
        run.parent.mkdir(parents=True, exist_ok=True)
        staged.rename(run)
        return sweep.run_row(preset, method, seed, run)

    def keep_ledger(out, ledger):
        written.append(len(sweep.finished_rows(out)))
        real_keep(out, ledger)

    real_keep = sweep.keep_ledger
    monkeypatch.setattr(sweep, "generate_world", lambda *a, **k: None)
    monkeypatch.setattr(sweep, "prepare", lambda *a, **k: None)
    monkeypatch.setattr(sweep, "run_one", run_one)
    monkeypatch.setattr(sweep, "keep_ledger", keep_ledger)
    argv = ["phase_sweep.py", "--out", str(out), "--gate", "--presets", "dense", "--seeds", "0", "--jobs", "1"]
    monkeypatch.setattr(sweep.sys, "argv", [*argv, "--ledger", str(ledger)])
    monkeypatch.setenv("MPLBACKEND", "Agg")
    sweep.main()
    # once as each of the three runs finishes (the pool may finish the next before it is written), once at the end
    assert len(written) == 4 and written[0] >= 1 and written == sorted(written) and written[-1] == 3
    assert sorted(pd.read_csv(ledger)["method"]) == sorted(sweep.GATE_METHODS)


def _recorded(tmp_path, **changes):
    row = {
        "preset": "dense",
        "method": "uniform-cpu",
        "seed": 0,
        "R@1": 17.23456,
        "oracle_R@1": 59.5,
        "itm_final": 0.633,
        "pretrain_seconds": 4000.0,
        "commit": "aaaaaaa",
        "machine": "m1",
        "world": "w",
        "budget": "b",
    }
    ledger = tmp_path / "ledger.csv"
    pd.DataFrame([row]).to_csv(ledger, index=False, float_format="%.4f")  # as a ledger is written: four decimals
    return ledger, {**row, **changes}


def test_retrained_runs_compare_every_measurement_at_the_ledgers_decimals(tmp_path):
    ledger, same = _recorded(tmp_path, pretrain_seconds=5123.7, commit="bbbbbbb", machine="m2")
    (found,) = sweep.retrained_runs([same], [ledger])
    # R@1, oracle_R@1 and itm_final (seed and the times are not measurements; 17.23456 is recorded as 17.2346)
    assert (found["measurements"], found["differing"], found["largest"]) == (3, 0, 0.0)
    assert (found["commit"], found["ledger_commit"], found["ledger_machine"]) == ("bbbbbbb", "aaaaaaa", "m1")
    moved = {**same, "oracle_R@1": 59.62, "itm_final": 0.6331}
    (found,) = sweep.retrained_runs([moved], [ledger])
    assert found["differing"] == 2 and found["largest"] == pytest.approx(0.12)
    assert found["changes"] == "oracle_R@1 59.5000 → 59.6200; itm_final 0.6330 → 0.6331"
    # the recorded run itself, collected again (its time is the recorded one): no re-run; another seed: not recorded
    _, itself = _recorded(tmp_path)
    assert sweep.retrained_runs([itself, {**same, "seed": 1}], [ledger]) == []
    # two runs trained again, under a key of the caller's (the key is not lost to the first run's comparison)
    twice = sweep.retrained_runs([moved, same], [ledger], key=lambda r: (r["method"], int(r["seed"])))
    assert [r["differing"] for r in twice] == [2, 0]
    assert sweep.measurement_changes(moved, same)[0] == 3


def test_a_half_trained_run_from_another_kind_of_cpu_is_set_aside_not_resumed(tmp_path, monkeypatch):
    """A disk that outlives its CPU: the run's epochs so far came from an AMD EPYC, this machine is an Intel Xeon, so
    it trains afresh (resumed, one row would mix two kinds' numbers); the same kind, or a manifest naming no CPU,
    resumes."""
    from falcon_cli.artifacts import provenance

    def half_trained(name: str, cpu: str | None) -> sweep.Path:
        run = tmp_path / name
        run.mkdir()
        host = {"cpus": 2, "gpus": [], **({"cpu": cpu} if cpu else {})}
        (run / "manifest.json").write_text(json.dumps({"host": host, "stages": {"pretrain": {"host": host}}}))
        return run

    monkeypatch.setattr(provenance, "cpu_model", lambda: "Intel(R) Xeon(R) Platinum 8488C")
    run = half_trained("uniform-cpu-s2", "AMD EPYC 9R14 96-Core Processor")
    aside = sweep.set_aside_if_started_elsewhere(run)
    assert aside == tmp_path / "uniform-cpu-s2.started-on-AMD" and (aside / "manifest.json").exists()
    assert not run.exists()
    for name, cpu in (("same-s0", "Intel(R) Xeon(R) Gold 6455B"), ("before-s0", None)):
        assert sweep.set_aside_if_started_elsewhere(half_trained(name, cpu)) is None and (tmp_path / name).exists()
    assert sweep.set_aside_if_started_elsewhere(tmp_path / "never-started") is None
