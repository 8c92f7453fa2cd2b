"""The audit's tables against direct counts: overall rates, the filter curve, the judge against the oracle."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from falcon_cli.audit import report
from falcon_cli.audit.compare import comparison_table, read_summaries, run_names
from falcon_cli.errors import FalconError


def judged(n: int = 400, seed: int = 0, oracle: bool = True) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    score = rng.random(n)
    truth = rng.random(n) < 0.2 + 0.5 * score  # a judge that is informative but wrong often
    return pd.DataFrame(
        {
            "kind": rng.choice(["chain", "itm"], n),
            "train_step": rng.integers(0, 50, n),
            "anchor": rng.integers(0, 99, n),
            "direction": rng.choice(["i2t", "t2i"], n),
            "caption_pair": np.arange(n) % 150,
            "score": score,
            "is_false_negative": score > 0.5,
            "oracle": pd.array(truth if oracle else [None] * n, dtype="boolean"),
            "caption_specificity": pd.array(rng.integers(1, 4, n) if oracle else [None] * n, dtype="Int64"),
        }
    )


def test_truth_is_the_oracle_only_where_every_row_has_one():
    assert report.truth_column(judged()) == "oracle"
    assert report.truth_column(judged(oracle=False)) == "is_false_negative"


def test_overall_rates_count_each_kind_and_all():
    audit = judged()
    overall = report.overall_rates(audit).set_index("kind")
    for kind in ("chain", "itm"):
        part = audit[audit["kind"] == kind]
        assert overall.loc[kind, "negatives"] == len(part)
        assert overall.loc[kind, "false_negatives"] == part["is_false_negative"].sum()
        assert overall.loc[kind, "oracle_rate"] == pytest.approx(part["oracle"].astype(bool).mean())
    assert overall.loc["all", "negatives"] == len(audit)
    assert "oracle_rate" not in report.overall_rates(judged(oracle=False)).columns


@pytest.mark.parametrize("oracle", [True, False])
def test_filter_curve_equals_a_direct_count(oracle):
    audit = judged(oracle=oracle)
    truth = audit["oracle"].astype(bool) if oracle else audit["is_false_negative"]
    curve = report.filter_curve(audit, [0.9, 0.25, 0.5, 0.0])
    assert list(curve[curve["kind"] == "chain"]["threshold"]) == [0.0, 0.25, 0.5, 0.9], "thresholds in order"
    for row in curve.itertuples():
        part = audit["kind"] == row.kind
        kept = part & (audit["score"] <= row.threshold)
        assert row.negatives == part.sum() and row.kept == kept.sum()
        assert row.false_negatives_kept == (kept & truth).sum()
        assert row.removed_true_negatives == (part & ~(audit["score"] <= row.threshold) & ~truth).sum()
        assert (np.isnan(row.fn_ratio) and row.kept == 0) or row.fn_ratio == pytest.approx(
            (kept & truth).sum() / kept.sum()
        )
    if not oracle:  # the judge measuring itself: above 0.5 nothing it flags is left
        assert (curve[curve["threshold"] <= 0.5]["false_negatives_kept"] == 0).all()


def test_judge_agreement_counts_confusion_overall_and_by_specificity():
    audit = judged()
    table = report.judge_agreement(audit).set_index("group")
    assert list(table.index) == ["all", "specificity 1", "specificity 2", "specificity 3"]
    for group, part in [("all", audit), *[(f"specificity {k}", p) for k, p in audit.groupby("caption_specificity")]]:
        flagged, true = part["is_false_negative"], part["oracle"].astype(bool)
        tp, fp, fn = (flagged & true).sum(), (flagged & ~true).sum(), (~flagged & true).sum()
        row = table.loc[group]
        assert (row.tp, row.fp, row.fn, row.tn) == (tp, fp, fn, (~flagged & ~true).sum())
        assert row.precision == pytest.approx(tp / (tp + fp)) and row.recall == pytest.approx(tp / (tp + fn))
        assert row.f1 == pytest.approx(2 * tp / (2 * tp + fp + fn))
        score, is_true = part["score"].to_numpy(), true.to_numpy()
        above = score[is_true][:, None] - score[~is_true][None, :]  # every (false negative, true negative) pair
        assert row.auc == pytest.approx(((above > 0) + 0.5 * (above == 0)).mean())
    assert table.loc["all"].auc > 0.6  # the fixture's judge is informative
    assert report.judge_agreement(judged(oracle=False)).empty


def test_rank_auc_counts_ties_half_and_is_nan_without_both_labels():
    assert report.rank_auc(np.array([0.1, 0.5, 0.5, 0.9]), np.array([False, False, True, True])) == pytest.approx(0.875)
    assert np.isnan(report.rank_auc(np.array([0.1, 0.2]), np.array([True, True])))
    assert report.judge_agreement(judged(oracle=False)).empty


def test_missed_false_negatives_are_true_matches_with_the_lowest_scores_one_per_caption():
    audit = judged()
    missed = report.missed_false_negatives(audit, 5)
    assert len(missed) == 5 and missed["oracle"].astype(bool).all() and not missed["is_false_negative"].any()
    assert missed["caption_pair"].is_unique and missed["score"].is_monotonic_increasing
    pool = audit[audit["oracle"].astype(bool) & ~audit["is_false_negative"]]
    assert missed["score"].iloc[0] == pool["score"].min()
    assert report.missed_false_negatives(judged(oracle=False), 5).empty


def test_markdown_shows_percentages_and_dashes():
    frame = pd.DataFrame({"kind": ["chain"], "rate": [0.1234], "fn_ratio": [np.nan]})
    text = report.markdown_table(frame, percent=("rate", "fn_ratio"))
    assert text.splitlines() == ["| kind | rate | fn_ratio |", "|---|---|---|", "| chain | 12.3% | - |"]


def test_comparison_reads_each_runs_summary(tmp_path):
    for name, rate in (("q1", 0.4), ("q0", 0.1)):
        (tmp_path / name / "audit").mkdir(parents=True)
        summary = {
            "judge": "oracle:w",
            "overall": [
                {
                    "kind": "chain",
                    "negatives": 10,
                    "false_negatives": int(rate * 10),
                    "rate": rate,
                    "oracle_false_negatives": int(rate * 10),
                    "oracle_rate": rate,
                }
            ],
        }
        (tmp_path / name / "audit" / "summary.json").write_text(json.dumps(summary))
    table = comparison_table(read_summaries([tmp_path / "q1", tmp_path / "q0"]))
    assert list(table["run"]) == ["q1", "q0"] and list(table["rate"]) == [0.4, 0.1] and "oracle_rate" in table.columns
    assert run_names(["a/x", "b/x"]) == ["a/x", "b/x"], "repeated names fall back to paths"
    with pytest.raises(FalconError, match="audit the run first"):
        read_summaries([tmp_path / "q1", tmp_path / "missing"])
