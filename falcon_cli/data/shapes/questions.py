"""VQA questions about one scene, with answers computed from the scene graph.

Only questions whose answer is well defined are asked: "what color is the circle?" only
when the image holds exactly one circle. Each question gets 10 human-like answers as in
VQA v2: the canonical answer, with each answer independently replaced by a synonym
("crimson", "two" for "2", "yeah") with probability ``variation``; at most 4 of the 10
vary, so the canonical answer is always the majority and stays correct.

Existence questions ("is there a red circle?") are sampled with BOTH a yes and a no
version; the world generator picks one per question so that yes and no alternate within
each split (exactly balanced up to one question).
"""

from __future__ import annotations

import random

from falcon_cli.data.shapes import logical_forms as lfs
from falcon_cli.data.shapes.captions import _bare_phrase, _WordChooser
from falcon_cli.data.shapes.vocabulary import (
    COLOR_WORDS,
    COLORS,
    NO_WORDS,
    POSITION_PHRASES,
    SHAPE_WORDS,
    SHAPES,
    SIZE_WORDS,
    SIZES,
    YES_WORDS,
    article,
)

QUESTION_TYPES: tuple[str, ...] = ("color", "shape", "size", "count", "exists", "color_at_position")
"""Question types (stored in world statistics)."""

MAX_VARIANTS = 4
"""At most this many of the 10 answers differ from the canonical one."""

_CANONICAL = _WordChooser(None, 0.0)
_ATTRIBUTES = ("size", "color", "shape")


def _pick(rng: random.Random, items):
    return items[rng.randrange(len(items))]


def _phrase(description: dict, plural: bool = False) -> str:
    return _bare_phrase(description, plural, _CANONICAL)


def _matching(objects: list[dict], description: dict) -> list[dict]:
    return [obj for obj in objects if all(obj[k] == v for k, v in description.items())]


def answer_synonyms(answer: str) -> list[str]:
    """Other correct spellings of a canonical answer (what a human annotator might type)."""
    if answer in COLOR_WORDS:
        return COLOR_WORDS[answer][1:]
    if answer in SHAPE_WORDS:
        return [singular for singular, _ in SHAPE_WORDS[answer][1:]]
    if answer in SIZE_WORDS:
        return SIZE_WORDS[answer][1:]
    if answer == "yes":
        return YES_WORDS[1:]
    if answer == "no":
        return NO_WORDS[1:]
    if answer.isdigit():
        words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
        return [words[int(answer)]] if int(answer) < len(words) else []
    return []


def human_answers(answer: str, rng: random.Random, variation: float) -> list[str]:
    """10 annotator answers: mostly ``answer``, some synonyms (never more than :data:`MAX_VARIANTS`)."""
    synonyms = answer_synonyms(answer)
    answers = [answer] * 10
    varied = [k for k in range(10) if rng.random() < variation][:MAX_VARIANTS]
    if synonyms:
        for k in varied:
            answers[k] = synonyms[rng.randrange(len(synonyms))]
    return answers


def _unique_descriptions(objects: list[dict], keys_options: list[tuple[str, ...]]) -> list[tuple[dict, dict]]:
    """(description, object) pairs where the description picks out exactly one object."""
    found = []
    for obj in objects:
        for keys in keys_options:
            description = lfs.describe(**{k: obj[k] for k in keys})
            if len(_matching(objects, description)) == 1:
                found.append((description, obj))
    return found


def _random_description(rng: random.Random, num_shapes: int, num_colors: int, k: int) -> dict:
    """A description by ``k`` random attributes with random values from the used vocabulary."""
    vocab = {"size": SIZES, "color": COLORS[:num_colors], "shape": SHAPES[:num_shapes]}
    return lfs.describe(**{name: _pick(rng, vocab[name]) for name in rng.sample(_ATTRIBUTES, k)})


def _own_description(rng: random.Random, obj: dict, k: int) -> dict:
    """A description of ``obj`` by ``k`` of its attributes."""
    return lfs.describe(**{name: obj[name] for name in rng.sample(_ATTRIBUTES, k)})


def _exists_question(description: dict) -> str:
    phrase = _phrase(description)
    return f"is there {article(phrase)} {phrase}?"


def _question(kind: str, objects: list[dict], rng: random.Random, num_shapes: int, num_colors: int):
    """One question of ``kind`` as ``(text, canonical answer)``, or for existence ``{"yes": ..., "no": ...}``; None if
    not askable."""
    if kind == "color":
        options = _unique_descriptions(objects, [("shape",), ("size", "shape")])
        if not options:
            return None
        description, obj = _pick(rng, options)
        return f"what color is the {_phrase(description)}?", obj["color"]
    if kind == "shape":
        options = _unique_descriptions(objects, [("color",), ("size", "color")])
        if not options:
            return None
        description, obj = _pick(rng, options)
        # "the red object" reads better than "the red shape" in a question about shape.
        words = [description[k] for k in ("size", "color") if k in description]
        return f"what shape is the {' '.join(words)} object?", obj["shape"]
    if kind == "size":
        options = _unique_descriptions(objects, [("shape",), ("color", "shape")])
        if not options:
            return None
        description, obj = _pick(rng, options)
        return f"what size is the {_phrase(description)}?", obj["size"]
    if kind == "count":
        k = rng.choices([0, 1, 2], weights=[0.2, 0.5, 0.3])[0]
        if rng.random() < 0.5:  # about an object that is there (non-zero answer) ...
            description = _own_description(rng, _pick(rng, objects), k)
        else:  # ... or about anything in the vocabulary (answers include 0)
            description = _random_description(rng, num_shapes, num_colors, k)
        return f"how many {_phrase(description, plural=True)} are there?", str(len(_matching(objects, description)))
    if kind == "exists":
        yes = _own_description(rng, _pick(rng, objects), rng.choices([1, 2, 3], weights=[0.3, 0.5, 0.2])[0])
        no = None
        for _attempt in range(50):
            candidate = _random_description(
                rng, num_shapes, num_colors, rng.choices([1, 2, 3], weights=[0.3, 0.5, 0.2])[0]
            )
            if not _matching(objects, candidate):
                no = candidate
                break
        if no is None:
            return None
        return {"yes": (_exists_question(yes), "yes"), "no": (_exists_question(no), "no")}
    if kind == "color_at_position":
        obj = _pick(rng, objects)
        return f"what color is the shape {POSITION_PHRASES[obj['position']][0]}?", obj["color"]
    raise ValueError(f"unknown question type {kind!r}")


def sample_questions(
    objects: list[dict],
    rng: random.Random,
    *,
    count: int,
    num_shapes: int,
    num_colors: int,
    variation: float,
) -> list[dict]:
    """Up to ``count`` distinct questions about one scene.

    Each item: ``{"type", "question", "answer", "answers"}``, or for existence questions
    ``{"type": "exists", "yes": {...}, "no": {...}}`` with both versions (see module doc).
    Types are drawn without replacement while there are askable types left.
    """
    questions: list[dict] = []
    seen: set[str] = set()
    order = rng.sample(QUESTION_TYPES, len(QUESTION_TYPES))
    rounds = 0
    while len(questions) < count and rounds < 4:
        rounds += 1
        for kind in order:
            if len(questions) >= count:
                break
            made = _question(kind, objects, rng, num_shapes, num_colors)
            if made is None:
                continue
            if isinstance(made, dict):
                if made["yes"][0] in seen or made["no"][0] in seen:
                    continue
                seen.update((made["yes"][0], made["no"][0]))
                item = {"type": kind}
                for label, (text, answer) in made.items():
                    item[label] = {"question": text, "answer": answer, "answers": human_answers(answer, rng, variation)}
                questions.append(item)
            else:
                text, answer = made
                if text in seen:
                    continue
                seen.add(text)
                questions.append(
                    {"type": kind, "question": text, "answer": answer, "answers": human_answers(answer, rng, variation)}
                )
    return questions
