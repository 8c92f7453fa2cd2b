"""benchmarks/scheduler_sweep.py on fabricated runs: rows, the mean ± std table, the verdict, the report block."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from benchmarks import scheduler_sweep as sweep


def test_the_learning_budget_gives_every_falcon_run_over_1000_scheduler_updates():
    assert sweep.scheduler_updates(sweep.BUDGETS["learning"]) >= 1000
    assert sweep.scheduler_updates(sweep.BUDGETS["gpu"]) > sweep.scheduler_updates(sweep.BUDGETS["learning"])
    assert set(sweep.BASELINES) | {"falcon", *sweep.IMPROVED} | set(sweep.FRONTIER) == set(sweep.METHODS)
    assert set(sweep.DEFAULT) < set(sweep.METHODS) and "q1" not in sweep.DEFAULT  # issue 35's runs only when named


def _metrics(path, corrs):
    lines = [{"step": 10 * e, "epoch": e, "loss": 1.0} for e in range(len(corrs) + 1)]
    lines += [
        {
            "step": 10 * e,
            "epoch": e,
            "kind": "epoch_summary",
            "q_fn_density_corr": c,
            "expected_q_std": 0.1,
            "chain_fn_rate": 0.2,
            "fn_density_mean": 0.3,
            "reward_fn_corr": None,
        }
        for e, c in enumerate(corrs, 1)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_run_row_takes_the_last_epoch_and_the_late_mean(tmp_path):
    _metrics(tmp_path / "metrics.jsonl", [0.1, -0.2, -0.4, -0.6])
    epochs = sweep.epoch_rows("falcon-plus", 0, tmp_path)
    assert [e["epoch"] for e in epochs] == [1, 2, 3, 4]
    row = sweep.run_row(
        {"method": "falcon-plus", "seed": 0, "R@1": 12.0, "oracle_R@1": 20.0, "fn_rate_chain": 25.0}, epochs
    )
    assert row["q_fn_density_corr"] == -0.6 and row["q_fn_density_corr_late"] == pytest.approx(-0.5)
    assert row["fn_rate_chain_audit"] == 25.0 and row["reward_fn_corr"] != row["reward_fn_corr"]  # None -> NaN


def _table(plus_r1, plus_corr):
    rows = []
    for seed, (r1, corr) in enumerate(zip(plus_r1, plus_corr)):
        rows.append({"method": "falcon-plus", "seed": seed, "R@1": r1, "q_fn_density_corr": corr, "chain_fn_rate": 0.2})
    for method, values in (("grit", [10.0, 11.0, 12.0]), ("uniform", [9.0, 9.0, 9.0]), ("q05", [10.0, 10.5, 11.0])):
        rows += [
            {"method": method, "seed": s, "R@1": v, "q_fn_density_corr": float("nan"), "chain_fn_rate": float("nan")}
            for s, v in enumerate(values)
        ]
    return pd.DataFrame(rows)


def test_verdict_checks_every_seed_and_the_paired_interval():
    won = sweep.verdict(_table([15.0, 15.5, 16.0], [-0.35, -0.4, -0.31]))
    assert "**met**" in won[0] and all("beats it" in line for line in won[1:])
    # Three points ahead of GRIT on every seed: the interval is [+3, +3]; one seed at -0.29 fails target 1
    lost = sweep.verdict(_table([13.0, 14.0, 15.0], [-0.35, -0.29, -0.5]))
    assert "**not met**" in lost[0]
    grit = next(line for line in lost if "vs grit" in line)
    assert len(lost) == 4, "one improved scheduler ran: its target line and three baselines"
    assert "paired over 3 seeds +3.0 [+3.0, +3.0]" in grit and "beats it" in grit
    # Ahead by 2.0, -0.5 and 1.0: the mean is positive but t(0.975, 2) = 4.30 puts zero inside the interval
    noisy = next(line for line in sweep.verdict(_table([12.0, 10.5, 13.0], [-1, -1, -1])) if "vs grit" in line)
    assert "+0.8 [-2.3, +4.0]" in noisy and "no difference shown (the interval holds zero)" in noisy


def test_summary_table_is_mean_and_std_with_dashes_where_a_method_has_no_number():
    text = sweep.summary_table(_table([15.0, 15.5, 16.0], [-0.35, -0.4, -0.31]))
    plus = next(line for line in text.splitlines() if line.startswith("| falcon-plus"))
    assert "15.5 ± 0.5" in plus and "20.0 ± 0.0" in plus  # R@1; chain FN 0.2 -> 20.0 %
    uniform = next(line for line in text.splitlines() if line.startswith("| uniform"))
    assert "9.0 ± 0.0" in uniform and "—" in uniform


def test_fn_rate_by_q_buckets_q_and_anchor_density_terciles():
    picks = pd.DataFrame(
        {
            "q": [0.05, 0.1, 0.15, 0.9, 0.95, 1.0],
            "anchor_fn_density": [0.1, 0.5, 0.9, 0.1, 0.5, 0.9],
            "chosen_is_fn": [0.0, 0.0, 1.0, 1.0, 1.0, 1.0],
        }
    )
    lines = sweep.fn_rate_by_q([picks]).splitlines()
    low = next(line for line in lines if line.startswith("| [0.0, 0.2)"))
    high = next(line for line in lines if line.startswith("| [0.8, 1.0]"))
    assert "| 3 | 33.3 | 0.0 | 0.0 | 100.0 |" in low and "| 3 | 100.0 | 100.0 | 100.0 | 100.0 |" in high
    assert not any(line.startswith("| [0.4") for line in lines), "empty buckets are left out"
    assert "no FALCON batch log" in sweep.fn_rate_by_q([])


def test_the_frontier_gap_is_the_schedulers_fn_rate_less_the_fixed_q_curve_of_its_own_seed():
    """Seed 0's fixed-q runs put the curve at 10 % (q 0), 20 % (q 0.5) and 40 % (q 1); a scheduler at mean q 0.75 and
    22 % sits 8 points below it (30 % there). Seed 1 has one fixed-q run: no curve, no point."""
    rows = [
        {"method": m, "seed": 0, "R@1": 10.0, "q_fn_density_corr": float("nan"), "chain_fn_rate": fn, "q_mean": q}
        for m, q, fn in (("q0", 0.0, 0.10), ("q05", 0.5, 0.20), ("q1", 1.0, 0.40))
    ]
    rows += [
        {
            "method": "q05",
            "seed": 1,
            "R@1": 10.0,
            "q_fn_density_corr": float("nan"),
            "chain_fn_rate": 0.2,
            "q_mean": 0.5,
        }
    ]
    rows += [
        {
            "method": "falcon-plus-margin-0.5-itm",
            "seed": s,
            "R@1": 11.0,
            "q_fn_density_corr": -0.4,
            "chain_fn_rate": 0.22,
            "q_mean": 0.75,
            "reward_fn_corr": c,
            "frontier_gap": g,
        }
        for s, c, g in ((0, -0.35, -0.06), (1, -0.1, -0.04))
    ]
    table = pd.DataFrame(rows)
    points = sweep.frontier_rows(table)
    assert len(points) == 1 and points.iloc[0]["seed"] == 0
    assert points.iloc[0]["frontier_fn_rate"] == pytest.approx(0.30) and points.iloc[0]["gap"] == pytest.approx(-8.0)
    text = sweep.frontier_table(table)
    assert (
        "| 0.5 | 2 | 20.0 ± 0.0 |" in text
        and "| falcon-plus-margin-0.5-itm | 1 | 0.75 | 22.0 | 30.0 | -8.0 ± 0.0 (-8.0) | 1/1 |" in text
    )
    lines = sweep.verdict(table)
    reward = next(line for line in lines if "the reward sees false picks" in line)
    assert "-0.35, -0.10" in reward and "**not met**" in reward
    frontier = next(line for line in lines if "against the fixed-q frontier" in line)
    assert "-8.0 points" in frontier and "**met**" in frontier
    own = next(line for line in lines if "its own anchors" in line)
    assert "-6.0, -4.0 points" in own and "**not met**" in own


def test_the_figure_draws_the_frontier_beside_the_curves(tmp_path):
    import matplotlib.pyplot as plt

    epochs = pd.DataFrame(
        [
            {
                "method": m,
                "seed": s,
                "epoch": e,
                "q_fn_density_corr": -0.2,
                "expected_q_mean": 0.5,
                "expected_q_std": 0.1,
                "chain_fn_rate": fn + 0.01 * e,
                "fn_density_mean": 0.3,
                "q_mean": q,
            }
            for s in (0, 1)
            for e in (1, 2)
            for m, q, fn in (
                ("q0", 0.0, 0.1),
                ("q05", 0.5, 0.2),
                ("q1", 1.0, 0.4),
                ("falcon-plus-margin-0.5-itm", 0.6, 0.15),
            )
        ]
    )
    opened = []
    real = plt.subplots
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plt, "subplots", lambda *a, **k: opened.append(real(*a, **k)) or opened[-1])
        path = sweep.figure(epochs, tmp_path)
    assert path.exists() and path.stat().st_size > 0
    frontier = opened[0][1][3]
    assert len(frontier.lines) == 2, "one fixed-q curve per seed"
    assert [list(line.get_ydata()) for line in frontier.lines][0] == pytest.approx([12.0, 22.0, 42.0])  # last epoch
    assert frontier.collections[0].get_offsets().flatten().tolist() == pytest.approx([0.6, 17.0, 0.6, 17.0])


def test_write_report_rewrites_only_its_own_block_and_names_its_files_after_it(tmp_path):
    """``--block frontier`` (issue 35's) leaves issue 20's ``scheduler`` block and files alone."""
    out = tmp_path / "sweep"
    rows = [
        {"method": m, "seed": 0, "R@1": 10.0, "q_fn_density_corr": float("nan"), "chain_fn_rate": fn, "q_mean": q}
        for m, q, fn in (("q0", 0.0, 0.1), ("q1", 1.0, 0.4))
    ]
    rows.append(
        {
            "method": "falcon-plus-margin-0.5-itm",
            "seed": 0,
            "R@1": 11.0,
            "q_fn_density_corr": -0.4,
            "chain_fn_rate": 0.2,
            "q_mean": 0.5,
        }
    )
    table = pd.DataFrame(rows)
    for row in rows:
        run = out / "runs" / f"{row['method']}-s0"
        run.mkdir(parents=True)
        (run / "manifest.json").write_text(
            json.dumps(
                {
                    "git": {"sha": "abc1234def", "dirty": False},
                    "created": "2026-11-27T10:00:00",
                    "end": "2026-11-27T10:30:00",
                }
            )
        )
    table.to_csv(out / "results.csv", index=False)
    table.to_csv(out / "epochs.csv", index=False)
    sweep.frontier_rows(table).to_csv(out / "frontier.csv", index=False)
    figure = out / "frontier_sweep.png"
    figure.write_bytes(b"png")
    page = tmp_path / "docs" / "results.md"
    page.parent.mkdir()
    page.write_text(
        "<!-- scheduler:begin -->\nissue 20\n<!-- scheduler:end -->\n\n"
        "<!-- frontier:begin -->\nold\n<!-- frontier:end -->\n"
    )
    sweep.write_report(
        page, out, table, sweep.BUDGETS["learning"], "learning", "the command", 2, 3, figure, block_name="frontier"
    )
    text = page.read_text()
    assert "issue 20" in text and "old" not in text and "`abc1234`" in text
    assert "-5.0 ± 0.0 (-5.0) | 1/1 |" in text, "the frontier at q 0.5 is 25 %: the scheduler at 20 % is 5 points below"
    assert "results/frontier_results.csv" in text and "results/frontier_sweep.png" in text
    assets = {p.name for p in (page.parent / "results").iterdir()}
    assert assets == {"frontier_results.csv", "frontier_epochs.csv", "frontier_frontier.csv", "frontier_sweep.png"}


def test_collect_takes_every_finished_run_and_nothing_half_done(tmp_path):
    from benchmarks.shapes_sweep import AUDITED, EVALUATED

    def run(name, done=True):
        path = tmp_path / "runs" / name
        (path / EVALUATED).parent.mkdir(parents=True)
        (path / AUDITED).parent.mkdir(parents=True)
        status = "completed" if done else "running"
        (path / "manifest.json").write_text(json.dumps({"stages": {"pretrain": {"status": status}}}))
        (path / EVALUATED).write_text("{}")
        (path / AUDITED).write_text("{}")

    for name in (
        "q0-s0",
        "q1-s0",
        "falcon-plus-margin-0.5-s2",
        "falcon-plus-margin-0.5-s10",
        "falcon-plus-margin-0.5-itm-s1",
        "falcon-plus-margin-0.5-itm-w6-s0",
    ):
        run(name)
    run("q05-s0", done=False)
    (tmp_path / "runs" / "unknown-s0").mkdir()
    assert sweep.finished_runs(tmp_path) == [
        ("falcon-plus-margin-0.5", 2),
        ("falcon-plus-margin-0.5", 10),
        ("falcon-plus-margin-0.5-itm", 1),
        ("falcon-plus-margin-0.5-itm-w6", 0),
        ("q0", 0),
        ("q1", 0),
    ]
