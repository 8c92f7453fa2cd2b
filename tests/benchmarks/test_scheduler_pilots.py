"""benchmarks/scheduler_pilots.py: the issue's criteria as written, the table, and an earlier sweep's worlds linked."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import scheduler_pilots as pilots  # noqa: E402


def test_the_criteria_are_the_issues():
    grit_like = {"top_share": 0.25, "sibling_share": 0.196, "chain_fn_rate": 0.469, "q_fn_density_corr": 0.0}
    assert pilots.passes("coco-like", grit_like) and not pilots.passes("dense", grit_like)
    assert not pilots.passes("coco-like", {**grit_like, "top_share": 0.19})
    assert not pilots.passes("coco-like", {**grit_like, "sibling_share": 0.149})
    assert not pilots.passes("coco-like", {**grit_like, "sibling_share": float("nan")}), "a missing number fails"
    good_dense = {**grit_like, "chain_fn_rate": 0.30, "q_fn_density_corr": -0.30}
    assert pilots.passes("dense", good_dense)
    assert not pilots.passes("dense", {**good_dense, "chain_fn_rate": 0.301})
    assert not pilots.passes("dense", {**good_dense, "q_fn_density_corr": -0.29})


def test_the_table_reports_every_pilot_and_who_passes_both():
    rows = [
        dict(preset="coco-like", method="a", top_share=0.3, sibling_share=0.2, chain_fn_rate=0.01,
             q_fn_density_corr=0.0, q_mean=0.9, passes=True),
        dict(preset="dense", method="a", top_share=0.1, sibling_share=float("nan"), chain_fn_rate=0.2,
             q_fn_density_corr=-0.5, q_mean=0.6, passes=True),
        dict(preset="coco-like", method="b", top_share=0.0, sibling_share=0.04, chain_fn_rate=0.0,
             q_fn_density_corr=0.0, q_mean=0.5, passes=False),
    ]  # fmt: skip
    lines = pilots.markdown(pd.DataFrame(rows))
    assert sum(line.startswith("| coco-like") or line.startswith("| dense") for line in lines) == 3
    assert lines[-1].endswith("Passes both: a.")
    assert "| dense | a | 10.0 | — | 20.0 | -0.50 | 0.60 | — | — | yes |" in lines
    assert pilots.markdown(pd.DataFrame(rows[2:]))[-1].endswith("No candidate passes both (yet).")


def test_an_earlier_tables_rows_stay_where_their_runs_are_gone(tmp_path, monkeypatch):
    row = dict(top_share=0.1, sibling_share=float("nan"), chain_fn_rate=0.5, q_fn_density_corr=0.0, q_mean=0.5)
    earlier = tmp_path / "pilots.csv"
    pd.DataFrame(
        [
            dict(preset="dense", method="falcon-itm-progress", **row, passes=False),
            dict(preset="dense", method="falcon-rank-oracle-quadratic", **row, passes=False),
            dict(preset="dense", method="falcon-start-top", **row, passes=True),
        ]
    ).to_csv(earlier, index=False)
    fresh = [dict(preset="dense", method="falcon-rank-oracle-quadratic", **{**row, "chain_fn_rate": 0.2}, passes=True)]
    kept = pilots.kept_rows(fresh, earlier)
    assert [r["method"] for r in kept] == [  # the pilots' order, then the follow-ups'
        "falcon-start-top",
        "falcon-itm-progress",
        "falcon-rank-oracle-quadratic",
    ]
    assert kept[2]["chain_fn_rate"] == 0.2 and kept[2]["passes"] is True, "a finished run's row replaces the old one"
    assert kept[0]["passes"] is True and "| dense | falcon-start-top |" in "\n".join(
        pilots.markdown(pd.DataFrame(kept))
    )
    with pytest.raises(ValueError, match="no such file"):
        pilots.kept_rows(fresh, tmp_path / "missing.csv")
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="no method, preset column"):
        pilots.kept_rows(fresh, tmp_path / "other.csv")
    assert pilots.main(["--out", str(tmp_path / "out"), "--keep-rows", str(tmp_path / "missing.csv")]) == 2
    assert not (tmp_path / "out").exists(), "nothing trained or written"

    # a kept pilot is not trained again (on a new machine the table is the record): nothing left, nothing trained
    done = ["--presets", "dense", "--only", "falcon-start-top", "falcon-itm-progress", "--keep-rows", str(earlier)]
    assert pilots.main(["--out", str(tmp_path / "again"), *done]) == 0
    assert not (tmp_path / "again" / "worlds").exists() and not (tmp_path / "again" / "runs").exists()
    table = pd.read_csv(tmp_path / "again" / "pilots.csv")
    assert sorted(table["method"]) == ["falcon-itm-progress", "falcon-rank-oracle-quadratic", "falcon-start-top"]
    # one kept, one not: only the other is trained, world by world
    asked = []
    monkeypatch.setattr(pilots.subprocess, "run", lambda command, **_: asked.append(command))
    both = ["--presets", "coco-like", "dense", "--only", "falcon-start-top", "falcon-rank-oracle"]
    assert pilots.main(["--out", str(tmp_path / "third"), *both, "--keep-rows", str(earlier)]) == 0
    assert [c[c.index("--presets") + 1 : c.index("--seeds")] for c in asked] == [["coco-like"], ["dense"]]
    assert [c[c.index("--only") + 1 : c.index("--jobs")] for c in asked] == [
        ["falcon-start-top", "falcon-rank-oracle"],
        ["falcon-rank-oracle"],
    ]


def test_an_earlier_sweeps_worlds_and_encoders_are_linked_not_copied(tmp_path):
    earlier, out = tmp_path / "earlier", tmp_path / "out"
    (earlier / "worlds" / "dense").mkdir(parents=True)
    (earlier / "unimodal" / "dense-s0").mkdir(parents=True)
    (out / "worlds" / "coco-like").mkdir(parents=True)  # what OUT has already is kept
    pilots.link_reused(out, earlier)
    assert (out / "worlds" / "dense").is_symlink() and (out / "unimodal" / "dense-s0").is_symlink()
    assert not (out / "worlds" / "coco-like").is_symlink()
    pilots.link_reused(out, earlier)  # (again: nothing changes)
    assert (out / "worlds" / "dense").resolve() == (earlier / "worlds" / "dense").resolve()


def _chain(density: float, false_at: list[int], rows: int, epoch: int = 5) -> list[dict]:
    """``rows`` chained slots of anchors at ``density`` whose pick at each fixed q is false (1) or not (0)."""
    fields = dict(zip(("fn_at_q0", "fn_at_q25", "fn_at_q50", "fn_at_q75", "fn_at_q100"), map(float, false_at)))
    return [dict(epoch=epoch, q=0.5, anchor_fn_density=density, **fields) for _ in range(rows)]


def test_the_charge_window_picks_each_density_groups_best_q_by_hand():
    """Two groups of anchors: the sparse ones never pick a false negative, the dense ones do above q = 0 half the time.
    Worth (1 − f)·q − w·f: the sparse group's best is q = 1 at any charge; the dense group's q = 1 is worth
    0.5 − 0.5w against 0 at q = 0, so it goes to the top below w = 1 (half its picks false) and to q = 0 above."""
    log = pd.DataFrame(
        _chain(0.05, [0, 0, 0, 0, 0], 10)
        + [{**row, "fn_at_q25": float(i % 2), "fn_at_q50": float(i % 2), "fn_at_q75": float(i % 2),
            "fn_at_q100": float(i % 2)} for i, row in enumerate(_chain(0.6, [0, 0, 0, 0, 0], 10))]
        + _chain(0.9, [1, 1, 1, 1, 1], 4, epoch=1)  # (an early epoch: not read)
    )  # fmt: skip
    frame = pilots.charge_window(log, charges=(0.5, 2.0), bins=2).set_index("charge")
    low = frame.loc[0.5]
    assert low.q_mean == 1.0 and low.chain_fn_rate == 0.25 and np.isnan(low.q_fn_density_corr) and not low.passes
    high = frame.loc[2.0]
    assert high.q_mean == 0.5 and high.chain_fn_rate == 0.0 and high.q_fn_density_corr == pytest.approx(-1.0)
    assert high.passes, "no false pick and q falls with density: the dense criterion holds"
    lines = pilots.charge_markdown(pilots.charge_window(log, charges=(0.5, 2.0), bins=2), "RUN's charges")
    assert lines[0] == "RUN's charges"
    assert "| 0.5 | 25.0 | — | 1.00 | no |" in lines and "| 2 | 0.0 | -1.00 | 0.50 | yes |" in lines


def test_a_follow_up_pilot_is_marked_in_the_table():
    row = dict(preset="dense", method="falcon-rank-oracle-w0.75", top_share=0.0, sibling_share=float("nan"),
               chain_fn_rate=0.2, q_fn_density_corr=-0.4, q_mean=0.1, passes=True)  # fmt: skip
    assert any("| falcon-rank-oracle-w0.75 (follow-up) |" in line for line in pilots.markdown(pd.DataFrame([row])))


def test_charges_of_a_run_without_a_batch_log_is_one_line_and_exit_2(tmp_path, capsys):
    assert pilots.main(["--charges", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "batches.parquet does not exist" in err


@pytest.mark.slow  # (a tiny world, its encoders and one pilot of two epochs: about two minutes)
def test_a_pilot_runs_end_to_end_and_its_charges_read_its_own_chain(tmp_path):
    """The real chain at the `quick` budget: world, encoders, the follow-up pilot trained, evaluated and audited, its
    row in pilots.csv and the report block; then ``--charges`` on the run it trained."""
    import subprocess

    out, report = tmp_path / "out", tmp_path / "results.md"
    report.write_text("# Results\n")
    command = [sys.executable, str(REPO / "benchmarks" / "scheduler_pilots.py"), "--out", str(out), "--budget",
               "quick", "--presets", "dense", "--only", "falcon-rank-oracle-w0.75", "--threads", "1", "--report",
               str(report)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = pd.read_csv(out / "pilots.csv").to_dict("records")
    assert row["method"] == "falcon-rank-oracle-w0.75" and row["preset"] == "dense" and 0 <= row["chain_fn_rate"] <= 1
    assert "| dense | falcon-rank-oracle-w0.75 (follow-up) |" in report.read_text()
    run = out / "runs" / "dense" / "falcon-rank-oracle-w0.75-s0"
    assert pilots.main(["--charges", str(run), "--report", str(report)]) == 0
    text = report.read_text()
    assert pilots.CHARGE_BEGIN in text and text.count("| 0.75 |") == 1


def test_a_spaces_counterfactual_picks_match_a_plain_sort_per_anchor():
    """Each anchor's pick at each q, written out: its space's other pairs sorted by the unified similarity
    S = I·Tᵀ + T·Iᵀ (ascending), the nearest-rank position on the scale, the oracle's verdict either way."""
    import scheduler_bandit
    import torch

    from falcon_cli.sampling.quantile import quantile_position

    generator = torch.Generator().manual_seed(1)
    concept = torch.arange(120) % 7  # pairs of one concept truly match: about 1 in 7 of a space is a false negative
    centre = torch.randn(7, 8, generator=generator)
    image = centre[concept] + 0.8 * torch.randn(120, 8, generator=generator)
    text = centre[concept] + 0.8 * torch.randn(120, 8, generator=generator)

    def truth(index):
        return concept[index][:, None] == concept[index][None, :]

    levels = np.array([0.0, 0.3, 0.7, 0.95, 1.0])
    for scale in ("linear", "log_rank"):
        false, density = pilots.space_counterfactuals(image, text, truth, 40, levels, scale, seed=2)
        assert false.shape == (120, 5) and density.shape == (120,)
        row = 0
        for members in scheduler_bandit.full_spaces(120, 40, 2):
            fn = scheduler_bandit.space_false_negatives(truth, members).numpy()
            i, t = image[members].double(), text[members].double()
            similarity = (i @ t.T + t @ i.T).numpy()
            for a in range(40):
                others = [j for j in range(40) if j != a]
                ranked = sorted(others, key=lambda j: (similarity[a, j], -j))  # ascending; ties by descending index
                for k, q in enumerate(levels):
                    pick = ranked[int(quantile_position(np.array([q]), 39, scale)[0])]
                    assert false[row, k] == fn[a, pick], (scale, a, q)
                assert density[row] == pytest.approx(fn[a].sum() / 39)
                row += 1
        assert 0 < false.mean() < 1, "the world has false negatives and true ones at these q's"


def test_charges_from_the_embeddings_of_an_epoch_the_run_lacks_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "embeddings").mkdir()
    assert pilots.main(["--charges", str(tmp_path), "--embeddings-epoch", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "epoch_003.h5 does not exist" in err
