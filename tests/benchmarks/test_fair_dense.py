"""benchmarks/fair_dense.py: the order and dependencies of its runs, and its report's arithmetic on a table whose
differences are known (the runs themselves are the sweep's; tests/config/test_method_rules.py checks the arms'
settings)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from benchmarks import fair_dense as fair
from falcon_cli import method_rules as rules


def test_tuning_plan_gives_every_method_its_two_candidates_once():
    plan = fair.tuning_plan()
    assert [(m, v) for _, m, v in plan] == [
        (m, v) for m in ("glofnd", "mafa", "srcl", "diht") for v in rules.candidates(m)
    ]
    assert len({arm for arm, _, _ in plan}) == len(plan) == 8  # the budget: two per method
    assert fair.tuning_arm("srcl", 5.0) == "srcl-tune-5" and fair.tuning_arm("glofnd", 15) == "glofnd-tune-15"
    assert fair.needs("mafa") == fair.needs("srcl") == fair.BASE
    assert fair.needs("glofnd") is None and fair.needs(None) is None


def test_tuning_is_chosen_on_the_tuning_world_and_waits_for_every_candidate(tmp_path, monkeypatch):

    monkeypatch.delitem(rules.TUNED, "diht")  # (as before DiHT's choice was recorded)
    none = tmp_path / "no-ledger.csv"

    def evaluated(method, value, i2t, t2i):
        run = fair.run_dir(tmp_path, fair.PRESET, fair.tuning_arm(method, value), rules.TUNING_SEED)
        (run / "results").mkdir(parents=True)
        (run / "results" / "retrieval.json").write_text(
            json.dumps({"rows": [{"oracle_i2t_R@1": i2t, "oracle_t2i_R@1": t2i}]})
        )

    evaluated("diht", 0.25, 60.0, 70.0)
    assert "diht" not in fair.tuning_results(tmp_path, ledger=none)  # (one of two)
    assert fair.tuned_value("diht", tmp_path, ledger=none) is None
    evaluated("diht", 0.5, 61.0, 70.0)
    found = fair.tuning_results(tmp_path, ledger=none)["diht"]
    assert (
        found["value"] == 0.5
        and found["runs"] == {0.25: 65.0, 0.5: 65.5}
        and found["key"] == "pretrain.false_negatives.diht.beta"
    )
    assert fair.tuned_value("diht", tmp_path, ledger=none) == 0.5


def test_a_recorded_tuning_run_is_not_run_again_and_stands_for_its_directory(tmp_path):

    ledger = tmp_path / "dense_tuning.csv"
    assert fair.tuning_to_run(ledger=ledger) == fair.tuning_plan()  # (no ledger: every run)
    pd.DataFrame(
        [
            dict(method="glofnd", key="k", value=15.0, metric=63.5, chosen=True, world_seed=1, seed=0),
            dict(method="glofnd", key="k", value=19.0, metric=62.9, chosen=False, world_seed=1, seed=0),
            dict(method="diht", key="k", value=0.25, metric=61.0, chosen=False, world_seed=1, seed=0),
        ]
    ).to_csv(ledger, index=False)
    left = fair.tuning_to_run(ledger=ledger)
    assert [(m, v) for _, m, v in left] == [(m, v) for m in ("mafa", "srcl") for v in rules.candidates(m)] + [
        ("diht", 0.5)
    ]
    assert fair.tuning_results(tmp_path / "none", ledger=ledger)["glofnd"] == {
        "key": "pretrain.false_negatives.glofnd.start_epoch",
        "value": 15,
        "runs": {15: 63.5, 19: 62.9},
    }
    assert "diht" not in fair.tuning_results(tmp_path / "none", ledger=ledger)  # (0.5 has not run)
    run = fair.run_dir(tmp_path, fair.PRESET, fair.tuning_arm("diht", 0.5), rules.TUNING_SEED)
    (run / "results").mkdir(parents=True)
    (run / "results" / "retrieval.json").write_text(
        json.dumps({"rows": [{"oracle_i2t_R@1": 60, "oracle_t2i_R@1": 61}]})
    )
    assert fair.tuning_results(tmp_path, ledger=ledger)["diht"]["runs"] == {0.25: 61.0, 0.5: 60.5}
    assert fair.tuning_results(tmp_path, ledger=ledger)["diht"]["value"] == 0.25


def _table():
    """Rows of three seeds: the control 1 point above uniform, GloFND 2 above the control on FN-aware R@1 (with a
    per-seed wobble), the ITC-only oracle 8 above uniform, the H200 uniform 0.1 below the CPU one."""
    rows = []
    for seed, wobble in enumerate((-0.5, 0.0, 0.5)):
        base = 60.0 + seed
        for method, shift in (
            ("uniform-cpu", 0.0),
            ("uniform-c0", 1.0),
            ("glofnd-rule", 3.0 + wobble),
            ("uniform-oracle-itc", 8.0),
            ("uniform", -0.1),
        ):
            rows.append(
                {
                    "method": method,
                    "seed": seed,
                    "preset": "dense",
                    "R@1": 17.0 + shift / 10,
                    "oracle_R@1": base + shift,
                    "rerank_oracle_R@1": 48.0 + shift,
                    "itm_final": 0.63,
                    "commit": "abc1234",
                    "machine": "2 CPU cores (cpu, fp32)",
                    "flags_flagged": 100.0,
                    "flags_precision": 0.4,
                    "flags_recall": 0.3,
                }
            )
    return pd.DataFrame(rows)


def test_report_states_the_noise_the_control_and_each_methods_share_of_its_ceiling():
    lines = fair.report_lines(
        _table(),
        {"glofnd": {"key": "pretrain.false_negatives.glofnd.start_epoch", "value": 15, "runs": {15: 60.1, 19: 59.0}}},
        "cmd",
    )
    text = "\n".join(lines)
    device = next(line for line in lines if line.startswith("*The device's own effect*"))
    assert "+0.10 [+0.10, +0.10]" in device and "Within ±0.5" in device  # CPU − H200: the ledger's arms stand in
    control = next(line for line in lines if line.startswith("*The control*"))
    assert "FN-aware ITC R@1 **+1.00 [+1.00, +1.00]** (3/3 +)" in control
    glofnd = next(line for line in lines if line.startswith("| `glofnd-rule`"))
    t2 = 4.302652729749464  # t(0.975, 2): the per-seed differences from the control are 1.5, 2, 2.5
    half = t2 * 0.5 / math.sqrt(3)
    assert f"**+2.00 [{2 - half:+.2f}, {2 + half:+.2f}]** (3/3 +)" in glofnd
    # its 2 points of the ITC-only ceiling's 8; that ceiling's gain has no spread, so Fieller's interval is the
    # gain's own t interval over 8
    assert f"25% [{100 * (2 - half) / 8:.0f}%, {100 * (2 + half) / 8:.0f}%] of +8.00" in glofnd
    assert "| `glofnd-rule` | 100 ± 0 | 0.400 ± 0.000 | 0.300 ± 0.000 |" in text
    assert "glofnd: start_epoch = 15: 60.10, start_epoch = 19: 59.00; kept 15." in text


def test_report_gives_each_arm_its_base_and_no_share_of_a_ceiling_that_gained_nothing():
    table = _table()
    ceiling = table["method"] == "uniform-oracle-itc"
    table.loc[ceiling, "rerank_oracle_R@1"] = 48.0 + pd.Series([-1.0, 0.5, 0.8], index=table.index[ceiling])
    lines = fair.report_lines(table, {}, "cmd")
    main = [line.split(" | ") for line in lines if line.startswith("| `") and line.count(" | ") == 11]
    rows = {cells[0].strip("| `"): cells for cells in main}
    assert rows["glofnd-rule"][1] == "`uniform-c0`" and rows["uniform-c0"][1] == "`uniform-cpu`"
    assert rows["uniform-oracle-itc"][1] == "`uniform-cpu`" and rows["uniform-cpu"][1] == ""
    # the ceiling's own gain over uniform, with its interval, in the same columns
    assert rows["uniform-oracle-itc"][7] == "**+8.00 [+8.00, +8.00]** (3/3 +)"
    assert rows["uniform-c0"][7] == "**+1.00 [+1.00, +1.00]** (3/3 +)"
    # FN-aware ITC: 2 of the ceiling's 8; re-ranked: the ceiling's gain (-1, +0.5, +0.8) is not above zero
    assert rows["glofnd-rule"][6] == "0.630 ± 0.000 (at the prior)"  # 0.63 against 0.637: nothing learned
    assert fair._head(pd.DataFrame({"itm_final": [0.30, 0.32]})) == " (left the prior)"
    assert rows["glofnd-rule"][10] == "25% [9%, 41%] of +8.00"  # (2 ± 1.24) / 8
    assert rows["glofnd-rule"][11].startswith("— (its ceiling's gain +0.10 [")


def test_report_says_where_each_arms_top1_went():
    lines = fair.report_lines(_table(), {}, "cmd")
    start = lines.index(next(line for line in lines if line.startswith("*Where each arm's top-1 went*")))
    rows = {}
    for line in lines[start + 4 :]:
        if not line.startswith("| `"):
            break
        cells = line.removesuffix(" |").split(" | ")
        rows[cells[0].strip("| `")] = cells
    # uniform-cpu, seeds 0-2: plain R@1 17.0, FN-aware 60, 61, 62 -> another true match 43, 44, 45; wrong 40, 39, 38
    assert rows["uniform-cpu"][1:4] == ["17.0 ± 0.0", "44.0 ± 1.0", "39.0 ± 1.0"]
    # GloFND over the control: shifts of 2 + wobble in FN-aware R@1, a tenth of that in plain R@1
    t2 = 4.302652729749464
    half = 0.9 * t2 * 0.5 / math.sqrt(3)
    assert rows["glofnd-rule"][4] == f"**+1.80 [{1.8 - half:+.2f}, {1.8 + half:+.2f}]** (3/3 +)"
    assert rows["glofnd-rule"][3] == "36.0 ± 1.5"  # wrong: 100 − (60 + seed + 3 + wobble): 37.5, 36, 34.5
    assert rows["uniform-cpu"][4] == "" and len(rows["glofnd-rule"]) == 5


def test_a_ceiling_of_one_seed_gives_no_share_yet():
    table = _table()
    table = table[(table["method"] != "uniform-oracle-itc") | (table["seed"] == 0)]
    lines = fair.report_lines(table, {}, "cmd")
    glofnd = next(line for line in lines if line.startswith("| `glofnd-rule`")).removesuffix(" |").split(" | ")
    assert glofnd[10] == glofnd[11] == "— (its ceiling has 1 seed: no interval yet)"


def test_a_share_over_too_few_seeds_in_common_says_it_has_no_bound_yet():
    """The ceiling's gain is above zero over its three seeds (7, 9, 8), but over the two it shares with the arm
    (7, 9) it is not away from zero by its own interval: Fieller's set is the whole line, said in words."""
    table = _table()
    oracle = table["method"] == "uniform-oracle-itc"
    table.loc[oracle, "oracle_R@1"] = table.loc[oracle, "seed"].map({0: 67.0, 1: 70.0, 2: 70.0})  # gains 7, 9, 8
    table = table[(table["method"] != "glofnd-rule") | (table["seed"] < 2)]
    lines = fair.report_lines(table, {}, "cmd")
    glofnd = next(line for line in lines if line.startswith("| `glofnd-rule`")).removesuffix(" |").split(" | ")
    ratio = 100 * ((1.5 + 2.0) / 2) / ((7 + 9) / 2)  # GloFND's gains over the control: 1.5 and 2.0
    assert glofnd[10] == f"{ratio:.0f}% (no bound yet over the 2 seeds in common) of +8.00"


def test_mafas_replayed_decisions_are_read_per_seed_and_summarised_in_the_block(tmp_path):
    def decisions(swapped: int, hits: int) -> dict:
        part = {
            "candidates": 1000,
            "false_negative_rate": 0.45,
            "converted": {"count": 0, "share": 0.0, "precision": None, "recall": 0.0},
            "swapped": {"count": swapped, "share": swapped / 1000, "precision": hits / swapped, "recall": hits / 450},
            "auc": 0.33,
            "max_p": 0.8,
        }
        return {"logged_steps_checked": 9, "steps_replayed": 80, "both": part, "i2t": part, "t2i": part}

    for seed, (swapped, hits) in enumerate([(10, 8), (20, 18)]):
        (tmp_path / "mafa-decisions" / f"s{seed}").mkdir(parents=True)
        (tmp_path / "mafa-decisions" / f"s{seed}" / "decisions.json").write_text(json.dumps(decisions(swapped, hits)))
    rows = pd.DataFrame(fair.decision_rows(tmp_path))
    assert rows["seed"].tolist() == [0, 1] and rows["swapped"].tolist() == [10, 20]
    assert rows["swapped_precision"].tolist() == [0.8, 0.9] and rows["converted_precision"].isna().all()
    lines = fair.report_lines(_table(), {}, "cmd", decisions=rows)
    at = next(i for i, line in enumerate(lines) if line.startswith("*MAFA's decisions, replayed*"))
    cells = lines[at + 4].strip("| ").split(" | ")
    assert cells[0] == "0, 1" and cells[1] == "80 ± 0 / 9 ± 0" and cells[3] == "0 ± 0" and cells[5] == "0.0150 ± 0.0071"
    assert cells[6] == "0.850 ± 0.071" and cells[8] == f"{(8 / 450 + 18 / 450) / 2:.3f} ± 0.016"
    assert not any(line.startswith("*MAFA's decisions") for line in fair.report_lines(_table(), {}, "cmd"))


def test_a_collect_from_the_ledgers_alone_writes_what_one_from_the_directories_wrote(tmp_path):
    # From the directories: full-precision numbers, rows in the order the runs were found, a column of None and
    # numbers (a method that acted in some epochs only). From the ledger: those rows as "%.4f" wrote them. A new
    # machine collects from the ledger alone, and must write the same page and files, not a reordered or
    # re-rounded one.
    rng = __import__("random").Random(0)
    rows = [
        {
            "method": method,
            "seed": seed,
            "preset": "dense",
            "R@1": 17.0 + rng.random() / 3,
            "oracle_R@1": 60.0 + seed + shift + rng.random() / 7,
            "rerank_oracle_R@1": 48.0 + shift + rng.random() / 9,
            "itm_final": 0.63 + rng.random() / 1000,
            "flags_precision": None if method != "glofnd-rule" else 0.4 + rng.random() / 11,
            "commit": "abc1234",
            "machine": "2 CPU cores (cpu, fp32)",
        }
        for method, shift in (("uniform", -0.1), ("glofnd-rule", 3.0), ("uniform-cpu", 0.0), ("uniform-c0", 1.0))
        for seed in (2, 0, 1)
    ]
    from_runs = fair.as_recorded(pd.DataFrame(rows))
    pd.DataFrame(rows).to_csv(tmp_path / "ledger.csv", index=False, float_format="%.4f")
    from_ledger = fair.as_recorded(pd.read_csv(tmp_path / "ledger.csv"))
    pd.testing.assert_frame_equal(from_runs, from_ledger)
    assert from_runs["method"].tolist()[::3] == ["uniform-cpu", "uniform-c0", "glofnd-rule", "uniform"]
    assert from_runs["seed"].tolist()[:3] == [0, 1, 2]
    assert fair.report_lines(from_runs, {}, "cmd") == fair.report_lines(from_ledger, {}, "cmd")
    # the columns in the ledger's order, whichever ledger's row came first (a column it lacks last)
    header = ["seed", "method", "R@1"]
    shuffled = fair.as_recorded(
        pd.read_csv(tmp_path / "ledger.csv")[["itm_final", "R@1", "method", "seed"]], header=header
    )
    assert list(shuffled.columns) == [*header, "itm_final"]
    # the per-epoch flags and the replays are kept the same way, in the arms' order, by seed and epoch
    flags = fair.as_recorded(
        pd.DataFrame(
            [
                {"arm": "glofnd-rule", "seed": 1, "epoch": 2, "precision": 1 / 3},
                {"arm": "glofnd-rule", "seed": 1, "epoch": 1, "precision": None},
                {"arm": "uniform-c0", "seed": 0, "epoch": 1, "precision": None},
            ]
        ),
        "arm",
    )
    assert flags[["arm", "epoch"]].values.tolist() == [["uniform-c0", 1], ["glofnd-rule", 1], ["glofnd-rule", 2]]
    assert flags["precision"].iloc[2] == 0.3333


def test_report_without_the_device_check_subtracts_no_h200_ceiling():
    table = _table()
    table.loc[table["method"] == "uniform", "oracle_R@1"] += [2.0, -1.5, 3.0]  # the device moves uniform a lot
    table = pd.concat(
        [table, table[table["method"] == "uniform"].assign(**{"method": "uniform-oracle", "oracle_R@1": 70.0})]
    )
    mafa = table[table["method"] == "glofnd-rule"].assign(method="mafa-rule")
    lines = fair.report_lines(pd.concat([table, mafa]), {}, "cmd")
    assert any("Not within ±0.5" in line for line in lines)
    row = next(line for line in lines if line.startswith("| `mafa-rule`"))
    assert row.rstrip(" |").endswith("—")  # MAFA's ceiling is the H200 full oracle: not subtracted


@pytest.mark.parametrize("arm", fair.ARMS)
def test_every_arm_is_a_shipped_recipe(arm, tmp_path):
    from falcon_cli.config.recipes import load_recipe

    method = fair.RULE_ARMS.get(arm)
    value = rules.candidates(method)[0] if method else None
    recipe, overrides, _ = fair.arm_spec(arm, method, value, tmp_path, 0)
    p = load_recipe(recipe, [*overrides, "pretrain.epochs=36"])[0].pretrain
    assert p.composer.name == "uniform"
    assert p.losses.itc_consistency_weight == (0.2 if arm in (fair.BASE, fair.ITC_CEILING) else 0.0)
    assert p.false_negatives.oracle == ("mask_itc" if arm == fair.ITC_CEILING else "keep")


def test_same_numbers_finds_a_moved_loss_and_ignores_timing_paths_and_curve_spacing(tmp_path):

    from benchmarks.same_numbers import differences

    def run(name, loss, curve_epochs, seconds):
        path = tmp_path / name
        (path / "results").mkdir(parents=True)
        records = [
            {"step": 25, "epoch": 0, "loss": 5.0, "pairs_per_s": seconds},
            {"step": 50, "epoch": 1, "loss": loss},
        ]
        records += [{"kind": "zero_shot", "epoch": e, "step": 25 * (e + 1), "i2t_R@1": 10.0 + e} for e in curve_epochs]
        (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        (path / "results" / "retrieval.json").write_text(
            json.dumps(
                {"meta": {"checkpoint": str(path / "checkpoints")}, "rows": [{"R@1": 3.0, "checkpoint": str(path)}]}
            )
        )
        return path

    every, third = run("every", 4.5, [0, 1], 40.0), run("third", 4.5, [1], 35.0)
    assert differences(every, third) == []
    moved = run("moved", 4.5000001, [1], 35.0)
    assert differences(every, moved) == ["metrics.jsonl (None, 1, 50): loss 4.5 vs 4.5000001"]


def test_eval_plan_trains_what_the_ledger_lacks_and_a_read_base_run_beside_its_readers(tmp_path):
    seeds = [0, 1, 2, 3, 4]
    everything = fair.eval_plan(fair.ARMS, seeds)  # (an empty ledger: every run, the base's first)
    assert everything[:5] == [(fair.BASE, s) for s in seeds] and len(everything) == len(fair.ARMS) * 5
    assert len(set(everything)) == len(everything)

    ledger = tmp_path / "fair_dense_results.csv"
    assert fair.recorded_runs(ledger) == set()
    pd.DataFrame(
        [dict(method=fair.BASE, seed=s, preset="dense") for s in seeds]
        + [dict(method=fair.CONTROL, seed=s, preset="dense") for s in (0, 1)]
        + [dict(method="mafa-rule", seed=0, preset="dense")]
    ).to_csv(ledger, index=False)
    recorded = fair.recorded_runs(ledger)  # (a ledger without machines: rows from Intel Xeons, cpu_family)
    assert (fair.CONTROL, 1, "Intel") in recorded and (fair.CONTROL, 2, "Intel") not in recorded

    plan = fair.eval_plan(fair.ARMS, seeds, recorded)
    # (nothing recorded trains again...)
    assert not set(plan) & ({(a, s) for a, s, _ in recorded} - {(fair.BASE, s) for s in seeds})
    # ...but the base runs MAFA and SRCL read, and those only, each beside its readers, two seeds at a time
    assert plan[:3] == [(fair.CONTROL, s) for s in (2, 3, 4)]
    readers = plan[-14:]
    assert readers == [
        (fair.BASE, 0), (fair.BASE, 1), ("srcl-rule", 0), ("mafa-rule", 1), ("srcl-rule", 1),
        (fair.BASE, 2), (fair.BASE, 3), ("mafa-rule", 2), ("srcl-rule", 2), ("mafa-rule", 3), ("srcl-rule", 3),
        (fair.BASE, 4), ("mafa-rule", 4), ("srcl-rule", 4),
    ]  # fmt: skip
    assert plan.index((fair.BASE, 0)) > plan.index(("diht-rule", 4))  # (the arms that read nothing go first)
    # an arm that reads nothing never brings the base back; all recorded: nothing to train
    assert fair.eval_plan(["glofnd-rule"], [0, 1], recorded) == [("glofnd-rule", 0), ("glofnd-rule", 1)]
    assert fair.eval_plan([fair.BASE, fair.CONTROL], [0, 1], recorded) == []


def test_a_campaign_on_a_new_machine_trains_nothing_its_ledger_records(tmp_path):
    """`--ledger` (main's, read from a pinned clone): every run asked for is recorded there, so nothing is trained
    and no world is made; the block is collected from the ledger's rows."""
    import os
    import subprocess
    import sys

    repo = fair.Path(fair.__file__).resolve().parents[1]
    ledger = tmp_path / "main" / "fair_dense_results.csv"
    ledger.parent.mkdir()
    (tmp_path / "main" / "fair_dense_flags.csv").write_text("arm,seed,epoch,flagged\n")
    table = _table()
    table["world"], table["budget"] = "w", "b"
    table[table["method"] == "uniform-c0"].to_csv(ledger, index=False)
    proc = subprocess.run(
        [sys.executable, str(repo / "benchmarks" / "fair_dense.py"), "--out", str(tmp_path / "out")]
        + ["--only", "uniform-c0", "--seeds", "0", "1", "2", "--budget", "quick", "--ledger", str(ledger)]
        + ["--rows", str(ledger)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(repo), "PATH": os.environ["PATH"], "MPLBACKEND": "Agg"},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"every run of uniform-c0 is recorded in {ledger}" in proc.stdout
    assert not (tmp_path / "out" / "worlds").exists() and not (tmp_path / "out" / "runs").exists()


def test_report_says_whether_each_run_trained_again_reproduced_its_recorded_row():
    run = dict(method="uniform-cpu", commit="d17c622", machine="m2", ledger_commit="e3dd650", ledger_machine="m1")
    changes = "oracle_R@1 59.5000 → 59.6200; itm_final 0.6330 → 0.6331"
    retrained = pd.DataFrame(
        [
            {**run, "seed": 1, "measurements": 60, "differing": 2, "largest": 0.12, "changes": changes},
            {**run, "seed": 0, "measurements": 60, "differing": 0, "largest": 0.0, "changes": ""},
        ]
    )
    lines = fair.report_lines(_table(), {}, "cmd", retrained)
    start = lines.index(next(line for line in lines if line.startswith("*Runs trained again*")))
    assert lines[start + 2 : start + 4] == [
        "- `uniform-cpu` seed 0 (d17c622, m2; recorded from e3dd650, m1): all 60 measurements equal the recorded ones.",
        "- `uniform-cpu` seed 1 (d17c622, m2; recorded from e3dd650, m1): 2 of 60 measurements differ, by at most "
        "0.1200 (oracle_R@1 59.5000 → 59.6200; itm_final 0.6330 → 0.6331); the recorded row stands.",
    ]
    # the one that differs does not replace its recorded row (the seed's other arms trained beside that run)
    assert fair.apart_from_their_rows(retrained) == {("uniform-cpu", 1, "m2")}
    assert fair.apart_from_their_rows(retrained[retrained["seed"] == 0]) == set()
    assert fair.apart_from_their_rows(pd.DataFrame()) == set() and fair.apart_from_their_rows(None) == set()
    assert not any(line.startswith("*Runs trained again*") for line in fair.report_lines(_table(), {}, "cmd"))


AMD = "2 CPU cores, AMD EPYC 9R14 96-Core Processor (cpu, fp32)"


def test_the_kind_of_machine_a_row_trained_on_is_read_from_its_machine():
    assert fair.numerics("2 CPU cores (cpu, fp32)") == "Intel"  # (before runs recorded their CPU: Intel Xeons)
    assert fair.numerics(AMD) == fair.cpu_family("AMD EPYC 9R14 96-Core Processor") == "AMD"
    assert fair.numerics("2 CPU cores, Intel(R) Xeon(R) Platinum 8488C (cpu, bf16)") == "Intel"
    assert fair.numerics("8 CPU cores, Apple M3 (cpu, fp32)") == "Apple M3"
    assert fair.numerics("16 CPU cores, NVIDIA H200 (cuda, bf16)") == "16 CPU cores, NVIDIA H200 (cuda, bf16)"
    assert fair.cpu_family(None) == "Intel"


def test_on_another_kind_of_cpu_a_new_run_brings_its_bases_there_and_nothing_else(tmp_path):
    """MAFA and SRCL lack seeds 2-4, everything else is recorded on Intel: on an AMD EPYC, those seeds' uniform (MAFA's
    Con-D, SRCL's model, the control's base) and control (the methods' base) train there again first, the readers
    beside their uniform runs; on an Intel Xeon only the read uniform runs come back (a new machine's checkpoints)."""
    seeds = [0, 1, 2, 3, 4]
    ledger = tmp_path / "fair_dense_results.csv"
    pd.DataFrame(
        [
            dict(method=a, seed=s, preset="dense", machine="2 CPU cores (cpu, fp32)")
            for a in fair.ARMS
            for s in seeds
            if a not in ("mafa-rule", "srcl-rule") or s < 2
        ]
        + [dict(method=fair.BASE, seed=2, preset="dense", machine=AMD)]  # (one already trained there)
    ).to_csv(ledger, index=False)
    recorded = fair.recorded_runs(ledger)
    assert (fair.BASE, 2, "AMD") in recorded and (fair.CONTROL, 2, "AMD") not in recorded
    plan = fair.eval_plan(fair.ARMS, seeds, recorded, here="AMD")
    assert plan == [
        (fair.BASE, 3), (fair.BASE, 4), (fair.CONTROL, 2), (fair.CONTROL, 3), (fair.CONTROL, 4),
        (fair.BASE, 2), ("mafa-rule", 2), ("srcl-rule", 2), ("mafa-rule", 3), ("srcl-rule", 3),
        ("mafa-rule", 4), ("srcl-rule", 4),
    ]  # fmt: skip
    assert fair.eval_plan(fair.ARMS, seeds, recorded, here="Intel") == [
        (fair.BASE, 2), (fair.BASE, 3), ("mafa-rule", 2), ("srcl-rule", 2), ("mafa-rule", 3), ("srcl-rule", 3),
        (fair.BASE, 4), ("mafa-rule", 4), ("srcl-rule", 4),
    ]  # fmt: skip
    # an arm recorded on Intel alone is not trained on AMD for its own sake, nor its bases
    assert fair.eval_plan(["glofnd-rule", fair.CONTROL], seeds, recorded, here="AMD") == []


def test_a_seed_on_a_second_kind_of_cpu_pairs_with_its_base_there_and_stays_out_of_the_arms_means():
    """Three seeds on Intel; seed 2 of MAFA on AMD alone, beside that seed's uniform and control trained again there,
    5 points higher than on Intel. MAFA is 1 above the control on the AMD seed and on each Intel one: paired across
    the two kinds it would be 6 above on seed 2."""
    table = _table()
    table = table[table["method"] != "glofnd-rule"]
    mafa = table[table["method"] == "uniform-c0"].assign(method="mafa-rule")
    mafa["oracle_R@1"] += 1
    amd = table[table["seed"] == 2].query("method in ('uniform-cpu', 'uniform-c0')").assign(machine=AMD)
    amd["oracle_R@1"] += 5
    mafa.loc[mafa["seed"] == 2, ["machine", "oracle_R@1"]] = [AMD, float(amd["oracle_R@1"].iloc[1]) + 1]
    table = pd.concat([table, mafa, amd], ignore_index=True)

    assert fair.paired_values(table, "mafa-rule", fair.CONTROL, "oracle_R@1") == (
        {0: 62.0, 1: 63.0, 2: 69.0},
        {0: 61.0, 1: 62.0, 2: 68.0},
    )
    # the control against uniform: both on each kind, so every seed on the first (Intel)
    assert fair.paired_values(table, fair.CONTROL, fair.BASE, "oracle_R@1")[0] == {0: 61.0, 1: 62.0, 2: 63.0}
    # the device's effect: CPU uniform (Intel where a seed has both) against the H200's
    assert fair.paired_values(table, fair.BASE, "uniform", "oracle_R@1")[0] == {0: 60.0, 1: 61.0, 2: 62.0}
    lines = fair.report_lines(table, {}, "cmd")
    mafa_row = next(line for line in lines if line.startswith("| `mafa-rule`"))
    assert "| `mafa-rule` | `uniform-c0` | 3 |" in mafa_row and "**+1.00 [+1.00, +1.00]** (3/3 +)" in mafa_row
    control_row = next(line for line in lines if line.startswith("| `uniform-c0`"))
    assert "| `uniform-c0` | `uniform-cpu` | 3 | 17.1 ± 0.0 | 62.0 ± 1.0 |" in control_row  # (Intel's three)
    other = next(line for line in lines if line.startswith("*Seeds on a second kind of CPU:*"))
    assert "`uniform-cpu` seed 2; `uniform-c0` seed 2 (AMD: " in other and "for `mafa-rule` of those seeds" in other
    effect = next(line for line in lines if line.startswith("*The kind of CPU's own effect*"))
    assert "`uniform-cpu` on AMD: ITC R@1 +0.00 (1 seed), FN-aware ITC R@1 +5.00 (1 seed)" in effect, effect
    assert "; `uniform-c0` on AMD: " in effect and "mafa-rule" not in effect  # (MAFA trained each seed on one kind)
    assert effect.count("(measurements that differ: seed 2 1 of ") == 2  # (FN-aware ITC R@1 alone moved)
    runs = next(line for line in lines if line.startswith("**Runs:**"))
    assert (
        "2 CPU cores (cpu, fp32) (Intel Xeons with AMX: the runs from before runs named their CPU); " + AMD + " (AMD)."
        in runs
    )
    assert not any(
        line.startswith(("*Seeds on a second", "*The kind of CPU")) for line in fair.report_lines(_table(), {}, "cmd")
    )
