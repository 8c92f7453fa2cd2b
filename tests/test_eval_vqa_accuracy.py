"""VQA accuracy: the leave-one-out min(1, matches / 3) rule and the official answer normalisation."""

from __future__ import annotations

import pytest

from falcon_cli.errors import FalconError
from falcon_cli.evaluation.vqa_accuracy import CONTRACTIONS, normalize_answer, vqa_accuracy, vqa_score


def test_accuracy_leave_one_out():
    assert vqa_accuracy("yes", ["yes"] * 10) == 1.0
    assert vqa_accuracy("no", ["yes"] * 10) == 0.0
    # 2 of 10 match: 8 subsets drop a non-match and see 2 (2/3), 2 drop a match and see 1 (1/3).
    answers = ["red", "red"] + ["blue"] * 8
    assert vqa_accuracy("red", answers) == pytest.approx((8 * 2 / 3 + 2 * 1 / 3) / 10)
    assert vqa_accuracy("red", answers) == pytest.approx(0.6)
    # 3 of 10 match: 7 subsets see 3 (1), 3 see 2 (2/3).
    answers = ["red"] * 3 + ["blue"] * 7
    assert vqa_accuracy("red", answers) == pytest.approx((7 * 1 + 3 * 2 / 3) / 10) == pytest.approx(0.9)
    # 4 or more matches: every subset sees at least 3.
    assert vqa_accuracy("red", ["red"] * 4 + ["blue"] * 6) == 1.0
    # 1 of 10: 9 subsets see 1 (1/3), 1 sees 0.
    assert vqa_accuracy("red", ["red"] + ["blue"] * 9) == pytest.approx(0.3)


def test_normalisation_applies_to_prediction_and_answers():
    assert vqa_accuracy("Two", ["2"] * 10) == 1.0
    assert vqa_accuracy("the dog", ["dog"] * 10) == 1.0
    assert vqa_accuracy("dont", ["don't"] * 10) == 1.0
    assert vqa_accuracy("yes.", ["Yes"] * 10) == 1.0


@pytest.mark.parametrize("text, expected", [
    ("Two", "2"), ("none", "0"), ("ten", "10"), ("The Dog", "dog"), ("a cat and an apple", "cat and apple"),
    ("dont", "don't"), ("isnt", "isn't"), ("yes.", "yes"), ("Yes!", "yes"), ("  yes\n", "yes"), ("yes\tno", "yes no"),
    ("3.5", "3.5"), ("3.", "3"), (".5", ".5"),  # a period is kept only when a digit follows it
    ("1,000", "1000"),  # digit-comma-digit: punctuation deleted, not spaced
    ("yes, sir", "yes sir"),  # a mark next to a space is deleted
    ("black/white", "black white"),  # otherwise a mark becomes a space
    ("t-shirt", "t shirt"), ("(left)", "left"), ("it's", "it's"),  # apostrophes are not punctuation
])
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_contractions_table_is_the_official_one():
    # vqaEval.py's table (120 entries), including its odd ones.
    assert len(CONTRACTIONS) == 120
    assert CONTRACTIONS["somebody'd"] == "somebodyd" and CONTRACTIONS["yall'd've"] == "y'all'd've"


def test_vqa_score():
    ground_truth = {1: ["yes"] * 10, 2: ["2"] * 10, 3: ["red", "red"] + ["blue"] * 8}
    result = vqa_score({1: "yes", 3: "red"}, ground_truth)
    assert result["questions"] == 3 and result["missing"] == 1
    assert result["accuracy"] == pytest.approx(100 * (1.0 + 0.0 + 0.6) / 3)
    assert vqa_score({1: "Yes", 2: "two", 3: "blue"}, ground_truth)["accuracy"] == pytest.approx(100.0)
    with pytest.raises(FalconError, match="not in the ground truth"):
        vqa_score({1: "yes", "4": "no"}, ground_truth)
    with pytest.raises(FalconError):
        vqa_accuracy("yes", [])
