"""benchmarks/shapes_sweep.py: which runs it plans, how it summarises seeds, how it rewrites the results page."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from benchmarks import shapes_sweep as sweep


def test_the_plan_covers_every_method_and_the_space_sweep():
    full = [(v.name, seed) for v, seed in sweep.plan(sweep.FULL, [0, 1, 2], None)]
    methods, fixes = list(sweep.METHODS), list(sweep.FIXES)
    assert full[: 3 * len(methods)] == [(m, seed) for seed in (0, 1, 2) for m in methods]  # uniform before SRCL
    space = full[3 * len(methods) : 3 * len(methods) + 4]
    assert sorted(space) == [("falcon@M-large", 0), ("falcon@M-small", 0), ("grit@M-large", 0), ("grit@M-small", 0)]
    assert full[3 * len(methods) + 4 :] == [(m, 0) for m in fixes]
    assert len(full) == 48
    assert {s for v, s in sweep.plan(sweep.FULL, [1, 2], None) if v.space != "medium" or v.method in fixes} == {1}
    assert [(v.name, s) for v, s in sweep.plan(sweep.QUICK, [0], None)] == [(m, 0) for m in methods]  # no |M| sweep
    assert [v.name for v, _ in sweep.plan(sweep.FULL, [0], ["srcl"])] == ["uniform", "srcl"]
    assert [v.name for v, _ in sweep.plan(sweep.FULL, [0], ["falcon-ema-lr1e-2"])] == ["falcon-ema-lr1e-2"]
    overrides = sweep.FULL.overrides(sweep.Path("/x"))
    assert "pretrain.composer.search_space_size=350" in overrides and "data.dataset=/x/world" in overrides
    assert {"data.shapes.size=32", "pretrain.encoders.image_size=32"} <= set(overrides)  # the world and the model agree
    assert sweep.FULL.world_args(sweep.Path("/x"))[4:8] == ["--images", "700", "--size", "32"]
    assert sweep.FULL.spaces["large"] == int(sweep.FULL.images * sweep.SPLITS["train"]) * 5  # one space per epoch
    assert [o for o in overrides if "splits" in o] == [
        "data.shapes.splits.train=0.5",
        "data.shapes.splits.val=0.05",
        "data.shapes.splits.test=0.45",
    ]


def _row(method: str, seed: int, r1: float, space: str = "medium", size: int = 350) -> dict:
    row = {key: float(seed) for group in sweep.TABLES.values() for key, _ in group}
    row.update(
        {
            "method": method if space == "medium" else f"{method}@M-{space}",
            "base_method": method,
            "space": space,
            "search_space_size": size,
            "seed": seed,
            "R@1": r1,
        }
    )
    if method == "uniform":
        row["fn_rate_chain"] = float("nan")  # no chain without a quantile composer
    return row


@pytest.fixture
def finished(tmp_path):
    """A sweep directory as the runs leave it: the world's statistics and one manifest per run."""
    out = tmp_path / "sweep"
    (out / "world").mkdir(parents=True)
    density = {"mean": 20.0, "median": 9.0, "mean_fraction_of_split": 0.18, "fraction_with_false_negatives": 0.8}
    counts = {"images": {"total": 700, "train": 350, "test": 315}, "captions": {"train": 1750, "test": 1575}}
    (out / "world" / "world.json").write_text(
        json.dumps({"counts": counts, "statistics": {"false_negative_density": {"train": density, "test": density}}})
    )
    rows = [
        _row("uniform", 0, 10.0),
        _row("uniform", 1, 20.0),
        _row("grit", 0, 30.0),
        _row("grit", 1, 30.0),
        _row("grit", 0, 12.0, "small", 64),
        _row("grit", 1, 14.0, "small", 64),
    ]
    for i, row in enumerate(rows):
        run = out / "runs" / f"{row['method']}-s{row['seed']}"
        run.mkdir(parents=True)
        # 10 minutes each, an hour apart (a sweep resumed in parts): compute is 1 run-hour, not the 5 h 10 min span
        created, end = f"2026-01-01T{i:02d}:00:00+00:00", f"2026-01-01T{i:02d}:10:00+00:00"
        stage = {"start": f"2026-01-01T{i:02d}:01:00+00:00", "end": f"2026-01-01T{i:02d}:09:00+00:00"}
        (run / "manifest.json").write_text(
            json.dumps(
                {
                    "git": {"sha": "abcdef0123", "dirty": i == 5},
                    "created": created,
                    "end": end,
                    "stages": {"pretrain": stage},
                }
            )
        )
    return out, pd.DataFrame(rows)


def test_summary_is_mean_and_std_over_seeds(finished):
    out, table = finished
    table = pd.concat([table, pd.DataFrame([_row("grit", 2, 60.0)])], ignore_index=True)  # a seed without |M| runs
    mean, std, seeds = sweep.summarise(table, out)
    assert mean.loc["uniform", "R@1"] == 15.0 and std.loc["uniform", "R@1"] == pytest.approx(7.0711, abs=1e-4)
    assert seeds["grit"] == 3 and mean.loc["grit", "R@1"] == 40.0 and mean.loc["grit@M-small", "R@1"] == 13.0
    text = (out / "summary.md").read_text()
    assert "| uniform | 2 | 15.0 ± 7.1 |" in text and "| grit | 3 | 40.0 ± 17.3 |" in text
    assert "grit@M-small" not in text, "the |M| variants have their own table"
    assert "| uniform | 2 | — |" in text, "no chain negatives: a dash, not nan"
    space = (out / "space_sweep.md").read_text()
    assert "| grit | 64 | 2 | 13.0 ± 1.4 |" in space
    assert "| grit | 350 | 2 | 30.0 ± 0.0 |" in space, "every |M| averages the same seeds (not seed 2's 60)"
    assert pd.read_csv(out / "results.csv").shape[0] == 7


def test_report_rewrites_only_its_block(finished, tmp_path):
    out, table = finished
    sweep.summarise(table, out)
    page = tmp_path / "docs" / "results.md"
    page.parent.mkdir()
    page.write_text(
        "# Results\n\nintro by hand\n\n<!-- sweep:begin -->\nold table\n<!-- sweep:end -->\n\nanalysis by hand\n"
    )
    for _ in range(2):  # idempotent: a second run replaces its own block again
        sweep.write_report(page, out, table, sweep.FULL, [0, 1], "the command", paths=[])
    text = page.read_text()
    assert text.startswith("# Results\n\nintro by hand\n\n<!-- sweep:begin -->") and text.endswith(
        "<!-- sweep:end -->\n\nanalysis by hand\n"
    )
    assert "old table" not in text and text.count("<!-- sweep:begin -->") == 1
    assert "`the command`" in text and "`abcdef0` (uncommitted changes)" in text and "`abcdef0`," in text
    assert "6 runs; 1.0 run-hours" in text and "about 0.5 h of wall-clock at 2 at a time" in text
    assert "18.0% of the time" in text and "2 runs at a time" in text
    assert "350 train (1750 pairs), 315 zero-shot test images (1575 captions)" in text
    assert "### Search-space size |M|" in text and "| grit | 64 | 2 |" in text
    assert "32-pixel images" in text and "(GRIT and FALCON also 64, at seeds 0, 1)" in text, "what the runs used"
    assert "fix variants" not in text, "no fix runs in the tables"
    assert sweep.seeds_phrase([2, 0, 0]) == "seeds 0, 2" and sweep.seeds_phrase(pd.Series([1])) == "seed 1"
    assert (page.parent / "results" / "summary.csv").exists() and (page.parent / "results" / "results.csv").exists()

    sweep.write_report(page, out, table, sweep.FULL, [0, 1], "the command", paths=[], planned=8)
    assert "6 runs of the 8 planned (the sweep is still in progress)" in page.read_text()

    page.write_text("# a page without the markers\n")
    with pytest.raises(SystemExit, match="sweep:begin"):
        sweep.write_report(page, out, table, sweep.FULL, [0, 1], "the command", paths=[])
    assert page.read_text() == "# a page without the markers\n", "left untouched"


def test_reward_row_against_hand_computed_statistics():
    import numpy as np

    q = np.array([0.1, 0.2, 0.3, 0.4])
    records = [
        {"rewards": [0.1, 0.2, 0.3, 0.4], "step_q": q, "first_q": 0.5, "last_q": 0.3},  # corr +1
        {"rewards": [0.4, 0.3, 0.2, -0.1], "step_q": q, "first_q": 0.5, "last_q": 0.5},
    ]  # corr < 0
    row = sweep.reward_row("falcon", records).strip().strip("|").split("|")
    cells = [c.strip() for c in row]
    both = np.array([0.1, 0.2, 0.3, 0.4, 0.4, 0.3, 0.2, -0.1])
    second = np.corrcoef(q, [0.4, 0.3, 0.2, -0.1])[0, 1]
    assert cells[:2] == ["falcon", "2"]
    assert float(cells[2]) == pytest.approx(both.mean(), abs=1e-4) and float(cells[3]) == pytest.approx(
        both.std(), abs=1e-4
    )
    assert cells[4] == "88%"  # 7 of 8 rewards positive
    assert float(cells[5]) == pytest.approx((1.0 + second) / 2, abs=0.01)
    assert cells[6:] == ["0.500", "0.400"]
    constant = [{"rewards": [0.1, 0.1], "step_q": np.array([0.2, 0.3]), "first_q": 0.4, "last_q": 0.4}]
    assert sweep.reward_row("falcon", constant).split("|")[6].strip() == "—", "no correlation of a constant reward"


def test_a_run_counts_as_finished_only_with_all_three_parts(tmp_path):
    run = tmp_path / "falcon-s0"
    (run / "results").mkdir(parents=True)
    (run / "audit").mkdir()
    (run / "manifest.json").write_text(json.dumps({"stages": {"pretrain": {"status": "completed"}}}))
    (run / "results" / "retrieval.json").write_text("{}")
    assert not sweep.finished(run), "not audited yet"
    (run / "audit" / "summary.json").write_text("{}")
    assert sweep.finished(run)
    (run / "manifest.json").write_text(json.dumps({"stages": {"pretrain": {"status": "running"}}}))
    assert not sweep.finished(run), "killed mid-training"


def test_an_interrupted_run_resumes_from_its_checkpoint_and_a_refused_resume_trains_again(tmp_path, monkeypatch):
    calls = []

    def fake_falcon(*args, log, threads):
        calls.append(args[-1])
        if args[-1] == "--resume" and refuse:
            raise RuntimeError("falcon run failed (exit 1)")

    monkeypatch.setattr(sweep, "falcon", fake_falcon)
    run, log, refuse = tmp_path / "grit-s0", tmp_path / "grit-s0.log", False
    sweep.train(run, "shapes-grit", "seed=0", log=log, threads=1)
    assert calls == ["--overwrite"]  # nothing to continue
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "latest").write_text("00000710")
    calls.clear()
    sweep.train(run, "shapes-grit", "seed=0", log=log, threads=1)
    assert calls == ["--resume"]  # killed after an epoch's checkpoint: continue it
    calls.clear()
    refuse = True  # e.g. the run there had another config
    sweep.train(run, "shapes-grit", "seed=0", log=log, threads=1)
    assert calls == ["--resume", "--overwrite"]
    assert "training again from the start" in log.read_text()


def test_replace_block_and_the_same_image_table(tmp_path):
    """The report block is replaced between its markers only; the same-image table keeps the variants' order."""
    import pandas as pd

    from benchmarks import same_image

    page = tmp_path / "results.md"
    page.write_text(f"intro\n{same_image.BEGIN}\nold\n{same_image.END}\nanalysis\n")
    sweep.replace_block(page, same_image.BEGIN, same_image.END, ["new"])
    assert page.read_text() == f"intro\n{same_image.BEGIN}\nnew\n{same_image.END}\nanalysis\n"
    with pytest.raises(SystemExit, match="no <!-- sweep:begin -->"):
        sweep.replace_block(page, sweep.BEGIN, sweep.END, ["x"])
    rows = [
        {"method": m, "seed": s, "in_batch_fn_rate": 18.0 + s, "R@1": 3.0}
        for m in ("grit-mask", "grit")
        for s in (0, 1)
    ]
    table = same_image.table_markdown(pd.DataFrame(rows))
    lines = table.splitlines()
    assert lines[2].startswith("| grit | 0, 1 | 18.5 ± 0.7 |") and lines[3].startswith("| grit-mask |")
    assert "| —" in lines[2]  # columns without values


def test_finished_futures_yields_results_and_collects_failures(capsys):
    from concurrent.futures import Future

    from benchmarks.shapes_sweep import finished_futures

    good, bad = Future(), Future()
    good.set_result({"R@1": 1.0})
    bad.set_exception(RuntimeError("exit 1"))
    failures: list[str] = []
    got = list(finished_futures({("grit", 0): bad, ("uniform", 0): good}, failures))
    assert got == [(("uniform", 0), {"R@1": 1.0})]
    assert failures == ["grit 0: exit 1"] and "FAILED grit 0: exit 1" in capsys.readouterr().err
