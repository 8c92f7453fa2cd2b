"""benchmarks/mafa_decisions.py: MAFA's two decisions from Con-D's p(match), the replay checked step by step against
the run's logged counts, and the decisions scored against the oracle (the whole script on a trained MAFA run:
tests/stages/test_pretrain.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import mafa_decisions as md  # noqa: E402


def test_decisions_follow_the_steps_bounds_in_float32():
    p = np.array([0.2, 0.5, 0.50001, 0.7, 0.8, 0.80001, 0.99])
    converted, swapped = md.decisions(p, high=0.8, low=0.5)
    assert converted.tolist() == [False, False, False, False, False, True, True]
    # low < p < high: p == low and p == high keep the hardest candidate as a plain negative
    assert swapped.tolist() == [False, False, True, True, False, False, False]
    # compared in float32, as the step compares its float32 p with the Python threshold
    just_above = np.nextafter(np.float64(0.8), 1.0)  # above 0.8 in float64, equal to it in float32
    assert not md.decisions(np.array([just_above]), high=0.8, low=0.5)[0][0]


def audit_frame(scores: dict[tuple[int, str], list[float]], oracle: dict[tuple[int, str], list[bool]], ranks=1):
    """An audit of ``itm`` candidates: for each (train_step, direction) its anchors' Con-D scores and truth."""
    rows = []
    for (step, direction), ps in scores.items():
        for rank in range(ranks):
            for anchor, (p, truth) in enumerate(zip(ps, oracle[(step, direction)])):
                rows.append(
                    {
                        "train_step": step * ranks + rank,
                        "rank": rank,
                        "direction": direction,
                        "anchor": anchor,
                        "score": p if rank == 0 else 0.0,  # (other ranks' anchors are not in rank 0's log)
                        "oracle": truth,
                        "caption_specificity": 1 + anchor % 2,
                    }
                )
    return pd.DataFrame(rows)


SCORES = {
    (0, "i2t"): [0.9, 0.6, 0.1, 0.3],
    (0, "t2i"): [0.55, 0.2, 0.2, 0.2],
    (1, "i2t"): [0.1, 0.1, 0.1, 0.1],
    (1, "t2i"): [0.95, 0.85, 0.7, 0.4],
}
TRUTH = {
    (0, "i2t"): [True, False, True, False],
    (0, "t2i"): [True, False, False, False],
    (1, "i2t"): [False, False, False, True],
    (1, "t2i"): [True, False, True, False],
}
# at high 0.8 and low 0.5, by hand: step 0 converts 1 i2t and swaps 1 i2t and 1 t2i; step 1 converts 2 t2i, swaps 1
LOGGED = [
    {"step": 1, "loss": 1.0, "fn_converted_i2t": 1, "fn_converted_t2i": 0, "fn_swapped_i2t": 1, "fn_swapped_t2i": 1},
    {"kind": "false_negatives", "epoch": 0, "flagged": 1},  # (an epoch's summary: not a step)
    {"step": 2, "loss": 1.0, "fn_converted_i2t": 0, "fn_converted_t2i": 2, "fn_swapped_i2t": 0, "fn_swapped_t2i": 1},
]


@pytest.mark.parametrize("ranks", [1, 2])
def test_the_replay_reproduces_the_logged_counts_of_rank_zero(ranks):
    logged = md.logged_counts(LOGGED)
    assert logged.index.tolist() == [0, 1]  # a record's step counts the steps done, this one included
    replayed = md.replayed_counts(audit_frame(SCORES, TRUTH, ranks), high=0.8, low=0.5)
    assert md.check_replay(logged, replayed) == 2


def test_a_replay_that_differs_on_a_step_is_refused_naming_it():
    replayed = md.replayed_counts(audit_frame(SCORES, TRUTH), high=0.8, low=0.5)
    changed = [dict(r) for r in LOGGED]
    changed[2]["fn_swapped_t2i"] = 2
    with pytest.raises(md.ReplayMismatch, match=r"step 1: the run logged .*1 of 2 logged steps differ"):
        md.check_replay(md.logged_counts(changed), replayed)
    # the same scores read at other thresholds are not the run's decisions either
    with pytest.raises(md.ReplayMismatch, match="step 0"):
        md.check_replay(md.logged_counts(LOGGED), md.replayed_counts(audit_frame(SCORES, TRUTH), high=0.8, low=0.25))
    later = md.logged_counts([{**LOGGED[0], "step": 50}])
    with pytest.raises(md.ReplayMismatch, match="none of the steps"):
        md.check_replay(later, replayed)


def test_the_decisions_are_scored_against_the_oracle():
    audit = audit_frame(SCORES, TRUTH)
    result = md.score_decisions(audit, high=0.8, low=0.5)
    both = result["both"]
    assert both["candidates"] == 16 and both["false_negative_rate"] == 6 / 16
    # converted: 0.9 (true), 0.95 (true), 0.85 (false): precision 2/3, recall 2 of 6 false negatives
    assert both["converted"] == {"count": 3, "share": 3 / 16, "precision": 2 / 3, "recall": 2 / 6}
    # swapped: 0.6 (false), 0.55 (true), 0.7 (true)
    assert both["swapped"] == {"count": 3, "share": 3 / 16, "precision": 2 / 3, "recall": 2 / 6}
    assert result["i2t"]["converted"]["count"] == 1 and result["t2i"]["swapped"]["count"] == 2
    # AUC: the chance a false negative's p beats a true negative's (ties half), by brute force
    p, t = audit["score"].to_numpy(), audit["oracle"].to_numpy()
    pairs = [(a > b) + 0.5 * (a == b) for a in p[t] for b in p[~t]]
    assert both["auc"] == pytest.approx(np.mean(pairs))
    assert both["mean_p_false"] == pytest.approx(p[t].mean()) and both["max_p"] == 0.95
    by = {r["specificity"]: r for r in result["swapped_by_specificity"]}
    assert sum(r["swapped"] for r in by.values()) == 3 and sum(r["candidates"] for r in by.values()) == 16
    # nothing flagged: precision undefined, recall 0
    none = md.score_decisions(audit_frame(SCORES, TRUTH), high=1.0, low=1.0)["both"]
    assert none["converted"] == {"count": 0, "share": 0.0, "precision": None, "recall": 0.0}


def test_only_a_mafa_run_is_replayed():
    config = {"pretrain": {"false_negatives": {"method": "glofnd"}}}
    with pytest.raises(SystemExit, match=r"runs/x/config.yaml: pretrain.false_negatives.method is 'glofnd'"):
        md.mafa_settings(config, Path("runs/x"))
    config = {
        "pretrain": {
            "false_negatives": {
                "method": "mafa",
                "mafa": {"judge": "checkpoint", "judge_model": "u", "high": 0.98, "low": 0.5},
            }
        }
    }
    assert md.mafa_settings(config, Path("r")) == {"judge": "checkpoint", "judge_model": "u", "high": 0.98, "low": 0.5}
