"""benchmarks/scheduler_pilots.py: the issue's criteria as written, the table, and an earlier sweep's worlds linked."""

from __future__ import annotations

import sys

import pandas as pd

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
