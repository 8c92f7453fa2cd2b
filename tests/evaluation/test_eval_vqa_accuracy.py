"""VQA accuracy: the leave-one-out min(1, matches / 3) rule, the official answer processing
(prediction fully normalised; human answers only punctuation-processed, and only when they
disagree) and the ``normalized`` option (human answers fully normalised too)."""

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


def test_official_processing_is_the_default():
    # The two cases of issue 19. Ten identical answers are not processed at all, the
    # prediction always is: "Yes" -> "yes" matches none of the ten "Yes".
    assert vqa_accuracy("Yes", ["Yes"] * 10) == 0.0
    assert vqa_accuracy("yes", ["Yes"] * 10) == 0.0
    assert vqa_accuracy("Yes", ["yes"] * 10) == 1.0
    # Disagreeing answers get punctuation processing only: "a dog" keeps its article, so
    # only the two "dog" match: 8 subsets see 2 (2/3), 2 see 1 (1/3).
    assert vqa_accuracy("dog", ["a dog"] * 8 + ["dog"] * 2) == pytest.approx(0.6)
    assert vqa_accuracy("a dog", ["a dog"] * 8 + ["dog"] * 2) == pytest.approx(0.6)  # the prediction loses "a"
    assert vqa_score({1: "Yes"}, {1: ["Yes"] * 10})["accuracy"] == 0.0


def test_normalized_option_normalises_the_human_answers():
    assert vqa_accuracy("Yes", ["Yes"] * 10, "normalized") == 1.0
    assert vqa_accuracy("dog", ["a dog"] * 8 + ["dog"] * 2, "normalized") == 1.0
    assert vqa_accuracy("Two", ["2"] * 10, "normalized") == 1.0
    assert vqa_accuracy("the dog", ["dog"] * 10, "normalized") == 1.0
    assert vqa_accuracy("dont", ["don't"] * 10, "normalized") == 1.0
    assert vqa_accuracy("yes.", ["Yes"] * 10, "normalized") == 1.0
    assert vqa_score({1: "Yes"}, {1: ["Yes"] * 10}, "normalized")["accuracy"] == 100.0
    with pytest.raises(FalconError, match="answer_processing.*official or normalized"):
        vqa_score({1: "Yes"}, {1: ["Yes"] * 10}, "lenient")


@pytest.mark.parametrize(
    "prediction, answers, official, normalized",
    [
        # Disagreeing answers lose their punctuation, identical ones keep it.
        ("yes", ["yes."] * 4 + ["no"] * 6, 1.0, 1.0),
        ("yes", ["yes."] * 10, 0.0, 1.0),
        ("yes", ["yes!"] * 3 + ["no"] * 7, 0.0, 0.9),  # "!" becomes a space: "yes " is not "yes"
        # Case: human answers are never lower-cased officially.
        ("yes", ["Yes"] * 5 + ["no"] * 5, 0.0, 1.0),
        # Number words: only the prediction becomes a digit.
        ("two", ["two"] * 10, 0.0, 1.0),
        ("two", ["two"] * 3 + ["2"] * 7, 1.0, 1.0),
        ("2", ["two"] * 9 + ["2"], 0.3, 1.0),
        ("none", ["none"] * 5 + ["0"] * 5, 1.0, 1.0),  # "none" -> "0"
        # Contractions: only the prediction is repaired.
        ("dont", ["dont"] * 5 + ["yes"] * 5, 0.0, 1.0),
        ("dont", ["don't"] * 10, 1.0, 1.0),
        # Articles: only the prediction loses them.
        ("the red one", ["red one"] * 4 + ["red"] * 6, 0.0, 1.0),  # "one" -> "1" in the prediction only
        ("the red car", ["red car"] * 4 + ["red"] * 6, 1.0, 1.0),
        ("red car", ["the red car"] * 4 + ["red"] * 6, 0.0, 1.0),
        # Digit-comma-digit: every mark is deleted, in the prediction and in disagreeing answers.
        ("1,000", ["1,000"] * 4 + ["1000"] * 2 + ["many"] * 4, 1.0, 1.0),
        ("1000", ["1,000"] * 10, 0.0, 1.0),
        # A mark is a space unless a space touches it; disagreeing answers keep their spacing.
        ("black/white", ["black/white"] * 3 + ["black"] * 7, 0.9, 0.9),
        ("black and white", ["black / white"] * 4 + ["black and white"] * 6, 1.0, 1.0),
        ("black white", ["black / white"] * 4 + ["gray"] * 6, 0.0, 1.0),  # "black  white", two spaces
        # Whitespace: the prediction is stripped, disagreeing answers are not.
        (" yes\n", ["yes "] * 5 + ["no"] * 5, 0.0, 1.0),
    ],
)
def test_official_and_normalized_cases(prediction, answers, official, normalized):
    assert vqa_accuracy(prediction, answers) == pytest.approx(official)
    assert vqa_accuracy(prediction, answers, "official") == pytest.approx(official)
    assert vqa_accuracy(prediction, answers, "normalized") == pytest.approx(normalized)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("a-b - c", "ab  c"),  # " -" somewhere: every "-" deleted, spacing kept
        ("Red/Blue", "Red Blue"),  # no case change
        ("1,2-3", "123"),  # a digit-comma-digit deletes every mark
        ("2, 3", "2 3"),
        ("2,a", "2 a"),
        ("u.s.", "us"),
        ("3.5", "3.5"),
        ("3.", "3"),
        ("mr. t", "mr t"),
        ("it's", "it's"),
        ("10:30", "10:30"),
        ("#1", "#1"),
        ("50%", "50%"),  # not official punctuation
        ("." * 40, "." * 8),  # the official call drops at most 32 periods
        ("  yes\n", "  yes\n"),
    ],
)
def test_process_punctuation(text, expected):
    from falcon_cli.evaluation.vqa_accuracy import process_punctuation

    assert process_punctuation(text) == expected


def test_config_key():
    from falcon_cli.config.schema import EvaluateConfig

    assert EvaluateConfig().vqa.answer_processing == "official"
    assert (
        EvaluateConfig.model_validate({"vqa": {"answer_processing": "normalized"}}).vqa.answer_processing
        == "normalized"
    )
    with pytest.raises(ValueError):
        EvaluateConfig.model_validate({"vqa": {"answer_processing": "lenient"}})


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Two", "2"),
        ("none", "0"),
        ("ten", "10"),
        ("The Dog", "dog"),
        ("a cat and an apple", "cat and apple"),
        ("dont", "don't"),
        ("isnt", "isn't"),
        ("yes.", "yes"),
        ("Yes!", "yes"),
        ("  yes\n", "yes"),
        ("yes\tno", "yes no"),
        ("3.5", "3.5"),
        ("3.", "3"),
        (".5", ".5"),  # a period is kept only when a digit follows it
        ("1,000", "1000"),  # digit-comma-digit: punctuation deleted, not spaced
        ("yes, sir", "yes sir"),  # a mark next to a space is deleted
        ("black/white", "black white"),  # otherwise a mark becomes a space
        ("t-shirt", "t shirt"),
        ("(left)", "left"),
        ("it's", "it's"),  # apostrophes are not punctuation
    ],
)
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
    assert vqa_score({1: "Yes", 2: "two", 3: "blue"}, ground_truth, "normalized")["accuracy"] == pytest.approx(100.0)
    with pytest.raises(FalconError, match="not in the ground truth"):
        vqa_score({1: "yes", "4": "no"}, ground_truth)
    with pytest.raises(FalconError):
        vqa_accuracy("yes", [])
