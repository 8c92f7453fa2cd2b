"""Standard VQA accuracy (Antol et al. 2015; VQA v2 evaluation rules).

A prediction scores, against each of the (10) human answers left out in turn,
``min(1, matches among the others / 3)``; the accuracy is the mean over the leave-one-out
subsets. Which strings are compared is set by ``answer_processing``:

* ``official`` (default), as the official ``vqaEval.py`` and the evaluation server do: the
  prediction is always fully normalised (newlines and tabs to spaces, strip;
  ``processPunctuation``; lower case, number words to digits, articles dropped, contractions
  restored: ``processDigitArticle``). The human answers are compared as written, except that
  when they are not all identical each gets ``processPunctuation`` only (no lower-casing, no
  number words, articles or contractions). So ``"Yes"`` against ten ``"Yes"`` scores 0 (the
  prediction becomes ``"yes"``, the identical answers stay ``"Yes"``), and ``"dog"`` against
  eight ``"a dog"`` and two ``"dog"`` scores 0.6.
* ``normalized``: the human answers get the prediction's full normalisation too, always (a
  more forgiving score, not comparable with published numbers).

The official script drops the left-out answer by comparing whole answer records, which carry
distinct ``answer_id``s, so exactly one answer is left out per subset; here answers are left
out by position, which is the same.
"""

from __future__ import annotations

import re
from typing import Hashable, Mapping, Sequence

from falcon_cli.errors import FalconError

# The official contractions table (keys that hold capitals never match after lower-casing,
# and "somebody'd" -> "somebodyd" runs the other way, as published).
CONTRACTIONS = {
    "aint": "ain't",
    "arent": "aren't",
    "cant": "can't",
    "couldve": "could've",
    "couldnt": "couldn't",
    "couldn'tve": "couldn't've",
    "couldnt've": "couldn't've",
    "didnt": "didn't",
    "doesnt": "doesn't",
    "dont": "don't",
    "hadnt": "hadn't",
    "hadnt've": "hadn't've",
    "hadn'tve": "hadn't've",
    "hasnt": "hasn't",
    "havent": "haven't",
    "hed": "he'd",
    "hed've": "he'd've",
    "he'dve": "he'd've",
    "hes": "he's",
    "howd": "how'd",
    "howll": "how'll",
    "hows": "how's",
    "Id've": "I'd've",
    "I'dve": "I'd've",
    "Im": "I'm",
    "Ive": "I've",
    "isnt": "isn't",
    "itd": "it'd",
    "itd've": "it'd've",
    "it'dve": "it'd've",
    "itll": "it'll",
    "let's": "let's",
    "maam": "ma'am",
    "mightnt": "mightn't",
    "mightnt've": "mightn't've",
    "mightn'tve": "mightn't've",
    "mightve": "might've",
    "mustnt": "mustn't",
    "mustve": "must've",
    "neednt": "needn't",
    "notve": "not've",
    "oclock": "o'clock",
    "oughtnt": "oughtn't",
    "ow's'at": "'ow's'at",
    "'ows'at": "'ow's'at",
    "'ow'sat": "'ow's'at",
    "shant": "shan't",
    "shed've": "she'd've",
    "she'dve": "she'd've",
    "she's": "she's",
    "shouldve": "should've",
    "shouldnt": "shouldn't",
    "shouldnt've": "shouldn't've",
    "shouldn'tve": "shouldn't've",
    "somebody'd": "somebodyd",
    "somebodyd've": "somebody'd've",
    "somebody'dve": "somebody'd've",
    "somebodyll": "somebody'll",
    "somebodys": "somebody's",
    "someoned": "someone'd",
    "someoned've": "someone'd've",
    "someone'dve": "someone'd've",
    "someonell": "someone'll",
    "someones": "someone's",
    "somethingd": "something'd",
    "somethingd've": "something'd've",
    "something'dve": "something'd've",
    "somethingll": "something'll",
    "thats": "that's",
    "thered": "there'd",
    "thered've": "there'd've",
    "there'dve": "there'd've",
    "therere": "there're",
    "theres": "there's",
    "theyd": "they'd",
    "theyd've": "they'd've",
    "they'dve": "they'd've",
    "theyll": "they'll",
    "theyre": "they're",
    "theyve": "they've",
    "twas": "'twas",
    "wasnt": "wasn't",
    "wed've": "we'd've",
    "we'dve": "we'd've",
    "weve": "we've",
    "werent": "weren't",
    "whatll": "what'll",
    "whatre": "what're",
    "whats": "what's",
    "whatve": "what've",
    "whens": "when's",
    "whered": "where'd",
    "wheres": "where's",
    "whereve": "where've",
    "whod": "who'd",
    "whod've": "who'd've",
    "who'dve": "who'd've",
    "wholl": "who'll",
    "whos": "who's",
    "whove": "who've",
    "whyll": "why'll",
    "whyre": "why're",
    "whys": "why's",
    "wont": "won't",
    "wouldve": "would've",
    "wouldnt": "wouldn't",
    "wouldnt've": "wouldn't've",
    "wouldn'tve": "wouldn't've",
    "yall": "y'all",
    "yall'll": "y'all'll",
    "y'allll": "y'all'll",
    "yall'd've": "y'all'd've",
    "y'alld've": "y'all'd've",
    "y'all'dve": "y'all'd've",
    "youd": "you'd",
    "youd've": "you'd've",
    "you'dve": "you'd've",
    "youll": "you'll",
    "youre": "you're",
    "youve": "you've",
}
NUMBER_WORDS = {
    "none": "0",
    "zero": "0",
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
    "ten": "10",
}
ARTICLES = frozenset({"a", "an", "the"})
PUNCTUATION = (";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!")
_DIGIT_COMMA_DIGIT = re.compile(r"\d,\d")
# The official pattern's look-behind is misspelt, so in effect a period is dropped unless a
# digit follows it: "3.5" and ".5" keep theirs, "yes." and "3." lose it.
_PERIOD = re.compile(r"\.(?!\d)")
# The official call passes re.UNICODE (32) where ``sub`` takes its count, so at most 32
# periods are dropped per answer; kept so that no input scores differently.
_PERIODS_DROPPED = 32

ANSWER_PROCESSING = ("official", "normalized")
"""How the human answers are processed before matching (see the module docstring)."""


def process_punctuation(text: str) -> str:
    """``processPunctuation``: each mark that stands next to a space anywhere in ``text``, and
    every mark when ``text`` holds a digit-comma-digit ("1,000"), is deleted; otherwise it
    becomes a space ("black/white"). Then periods not followed by a digit are dropped.
    Case and spacing are left alone ("a-b - c" -> "ab  c")."""
    delete_all = _DIGIT_COMMA_DIGIT.search(text) is not None
    out = text
    for mark in PUNCTUATION:
        # The test reads the original text, the replacement the text so far, as officially.
        if delete_all or mark + " " in text or " " + mark in text:
            out = out.replace(mark, "")
        else:
            out = out.replace(mark, " ")
    return _PERIOD.sub("", out, count=_PERIODS_DROPPED)


def process_digit_article(text: str) -> str:
    """``processDigitArticle``: lower case, split on whitespace, number words to digits,
    articles dropped, contractions restored, joined by single spaces."""
    words = [NUMBER_WORDS.get(word, word) for word in text.lower().split()]
    words = [CONTRACTIONS.get(word, word) for word in words if word not in ARTICLES]
    return " ".join(words)


def normalize_answer(text: str) -> str:
    """The official normalisation of a prediction: ``"The Two dogs."`` -> ``"2 dogs"``, ``"dont"`` -> ``"don't"``."""
    text = text.replace("\n", " ").replace("\t", " ").strip()
    return process_digit_article(process_punctuation(text))


def _check_processing(processing: str) -> None:
    if processing not in ANSWER_PROCESSING:
        raise FalconError(
            f"evaluate.vqa.answer_processing: unknown value {processing!r}; use {' or '.join(ANSWER_PROCESSING)}"
        )


def human_answers_as_compared(answers: Sequence[str], processing: str = "official") -> list[str]:
    """The human answers as a prediction is matched against them (``processing``: module docstring)."""
    _check_processing(processing)
    if processing == "normalized":
        return [normalize_answer(answer) for answer in answers]
    if len(set(answers)) > 1:  # officially only answers that disagree are processed, and only for punctuation
        return [process_punctuation(answer) for answer in answers]
    return list(answers)


def vqa_accuracy(prediction: str, answers: Sequence[str], processing: str = "official") -> float:
    """Accuracy in [0, 1] of one prediction against the human answers (10 in VQA v2).

    Mean over answers ``i`` of ``min(1, #(other answers equal to the prediction) / 3)``;
    the prediction is :func:`normalize_answer`-ed, the answers processed as
    :func:`human_answers_as_compared` says for ``processing`` (``official`` or ``normalized``).
    """
    if len(answers) == 0:
        raise FalconError("a VQA question has no ground-truth answers: check the annotation file's `answers` field")
    predicted = normalize_answer(prediction)
    compared = human_answers_as_compared(answers, processing)
    matches = sum(answer == predicted for answer in compared)
    total = 0.0
    for answer in compared:
        others = matches - (answer == predicted)
        total += min(1.0, others / 3.0)
    return total / len(compared)


def vqa_score(
    predictions: Mapping[Hashable, str], ground_truth: Mapping[Hashable, Sequence[str]], processing: str = "official"
) -> dict:
    """``{"accuracy": percent over questions, "questions": n, "missing": m}``.

    A question without a prediction scores 0 and is counted in ``missing``; a prediction
    for a question id absent from the ground truth is an error. ``processing``: see
    :func:`vqa_accuracy`.
    """
    _check_processing(processing)
    if not ground_truth:
        raise FalconError("the VQA ground truth is empty: check the annotation file")
    unknown = [qid for qid in predictions if qid not in ground_truth]
    if unknown:
        raise FalconError(
            f"{len(unknown)} predictions have question ids not in the ground truth (e.g. {unknown[0]!r}): "
            "predict on the same split and keep the question ids' type (int vs str)"
        )
    total = 0.0
    missing = 0
    for qid, answers in ground_truth.items():
        if qid in predictions:
            total += vqa_accuracy(predictions[qid], answers, processing)
        else:
            missing += 1
    return {"accuracy": 100.0 * total / len(ground_truth), "questions": len(ground_truth), "missing": missing}
