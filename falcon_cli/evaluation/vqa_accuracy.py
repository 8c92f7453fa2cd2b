"""Standard VQA accuracy (Antol et al. 2015; VQA v2 evaluation rules).

Answers are normalised as the official ``vqaEval.py`` does: lower-case, newlines and tabs
to spaces, strip; punctuation (``processPunctuation``); number words to digits, articles
dropped and contractions restored (``processDigitArticle``). A prediction scores, against
each of the (10) human answers left out in turn, ``min(1, matches among the other 9 / 3)``;
the accuracy is the mean over the ten leave-one-out subsets.

Differences from ``vqaEval.py``, on purpose: the prediction and the human answers are
always normalised (the official script normalises them only when the humans disagree),
and the answers are compared as normalised strings.
"""

from __future__ import annotations

import re
from typing import Hashable, Mapping, Sequence

from falcon_cli.errors import FalconError

# The official contractions table (keys that hold capitals never match after lower-casing,
# and "somebody'd" -> "somebodyd" runs the other way, as published).
CONTRACTIONS = {
    "aint": "ain't", "arent": "aren't", "cant": "can't", "couldve": "could've", "couldnt": "couldn't",
    "couldn'tve": "couldn't've", "couldnt've": "couldn't've", "didnt": "didn't", "doesnt": "doesn't",
    "dont": "don't", "hadnt": "hadn't", "hadnt've": "hadn't've", "hadn'tve": "hadn't've", "hasnt": "hasn't",
    "havent": "haven't", "hed": "he'd", "hed've": "he'd've", "he'dve": "he'd've", "hes": "he's", "howd": "how'd",
    "howll": "how'll", "hows": "how's", "Id've": "I'd've", "I'dve": "I'd've", "Im": "I'm", "Ive": "I've",
    "isnt": "isn't", "itd": "it'd", "itd've": "it'd've", "it'dve": "it'd've", "itll": "it'll", "let's": "let's",
    "maam": "ma'am", "mightnt": "mightn't", "mightnt've": "mightn't've", "mightn'tve": "mightn't've",
    "mightve": "might've", "mustnt": "mustn't", "mustve": "must've", "neednt": "needn't", "notve": "not've",
    "oclock": "o'clock", "oughtnt": "oughtn't", "ow's'at": "'ow's'at", "'ows'at": "'ow's'at", "'ow'sat": "'ow's'at",
    "shant": "shan't", "shed've": "she'd've", "she'dve": "she'd've", "she's": "she's", "shouldve": "should've",
    "shouldnt": "shouldn't", "shouldnt've": "shouldn't've", "shouldn'tve": "shouldn't've",
    "somebody'd": "somebodyd", "somebodyd've": "somebody'd've", "somebody'dve": "somebody'd've",
    "somebodyll": "somebody'll", "somebodys": "somebody's", "someoned": "someone'd",
    "someoned've": "someone'd've", "someone'dve": "someone'd've", "someonell": "someone'll",
    "someones": "someone's", "somethingd": "something'd", "somethingd've": "something'd've",
    "something'dve": "something'd've", "somethingll": "something'll", "thats": "that's", "thered": "there'd",
    "thered've": "there'd've", "there'dve": "there'd've", "therere": "there're", "theres": "there's",
    "theyd": "they'd", "theyd've": "they'd've", "they'dve": "they'd've", "theyll": "they'll", "theyre": "they're",
    "theyve": "they've", "twas": "'twas", "wasnt": "wasn't", "wed've": "we'd've", "we'dve": "we'd've",
    "weve": "we've", "werent": "weren't", "whatll": "what'll", "whatre": "what're", "whats": "what's",
    "whatve": "what've", "whens": "when's", "whered": "where'd", "wheres": "where's", "whereve": "where've",
    "whod": "who'd", "whod've": "who'd've", "who'dve": "who'd've", "wholl": "who'll", "whos": "who's",
    "whove": "who've", "whyll": "why'll", "whyre": "why're", "whys": "why's", "wont": "won't",
    "wouldve": "would've", "wouldnt": "wouldn't", "wouldnt've": "wouldn't've", "wouldn'tve": "wouldn't've",
    "yall": "y'all", "yall'll": "y'all'll", "y'allll": "y'all'll", "yall'd've": "y'all'd've",
    "y'alld've": "y'all'd've", "y'all'dve": "y'all'd've", "youd": "you'd", "youd've": "you'd've",
    "you'dve": "you'd've", "youll": "you'll", "youre": "you're", "youve": "you've",
}
NUMBER_WORDS = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
                "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
ARTICLES = frozenset({"a", "an", "the"})
PUNCTUATION = (";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!")
_DIGIT_COMMA_DIGIT = re.compile(r"\d,\d")
# The official pattern's look-behind is misspelt, so in effect a period is dropped unless a
# digit follows it: "3.5" and ".5" keep theirs, "yes." and "3." lose it.
_PERIOD = re.compile(r"\.(?!\d)")


def _punctuation(text: str) -> str:
    """``processPunctuation``: a mark next to a space, or any mark when the text holds a
    digit-comma-digit ("1,000"), is deleted; otherwise it becomes a space ("black/white")."""
    delete_all = _DIGIT_COMMA_DIGIT.search(text) is not None
    out = text
    for mark in PUNCTUATION:
        if delete_all or mark + " " in text or " " + mark in text:
            out = out.replace(mark, "")
        else:
            out = out.replace(mark, " ")
    return _PERIOD.sub("", out)


def _digits_articles(text: str) -> str:
    """``processDigitArticle``: number words to digits, articles dropped, contractions restored."""
    words = [NUMBER_WORDS.get(word, word) for word in text.lower().split()]
    words = [CONTRACTIONS.get(word, word) for word in words if word not in ARTICLES]
    return " ".join(words)


def normalize_answer(text: str) -> str:
    """The official VQA normalisation: ``"The Two dogs."`` -> ``"2 dogs"``, ``"dont"`` -> ``"don't"``."""
    text = text.lower().replace("\n", " ").replace("\t", " ").strip()
    return _digits_articles(_punctuation(text))


def vqa_accuracy(prediction: str, answers: Sequence[str]) -> float:
    """Accuracy in [0, 1] of one prediction against the human answers (10 in VQA v2).

    Mean over answers ``i`` of ``min(1, #(other answers equal to the prediction) / 3)``,
    after :func:`normalize_answer` on all of them.
    """
    if len(answers) == 0:
        raise FalconError("a VQA question has no ground-truth answers: check the annotation file's `answers` field")
    predicted = normalize_answer(prediction)
    normalised = [normalize_answer(answer) for answer in answers]
    matches = sum(answer == predicted for answer in normalised)
    total = 0.0
    for answer in normalised:
        others = matches - (answer == predicted)
        total += min(1.0, others / 3.0)
    return total / len(normalised)


def vqa_score(predictions: Mapping[Hashable, str], ground_truth: Mapping[Hashable, Sequence[str]]) -> dict:
    """``{"accuracy": percent over questions, "questions": n, "missing": m}``.

    A question without a prediction scores 0 and is counted in ``missing``; a prediction
    for a question id absent from the ground truth is an error.
    """
    if not ground_truth:
        raise FalconError("the VQA ground truth is empty: check the annotation file")
    unknown = [qid for qid in predictions if qid not in ground_truth]
    if unknown:
        raise FalconError(f"{len(unknown)} predictions have question ids not in the ground truth (e.g. {unknown[0]!r}): "
                          "predict on the same split and keep the question ids' type (int vs str)")
    total = 0.0
    missing = 0
    for qid, answers in ground_truth.items():
        if qid in predictions:
            total += vqa_accuracy(predictions[qid], answers)
        else:
            missing += 1
    return {"accuracy": 100.0 * total / len(ground_truth), "questions": len(ground_truth), "missing": missing}
