"""NLVR2-style statements about a pair of images, with labels computed from both scenes.

A statement is a template over one object description D and the number of objects
matching D in the left (l) and right (r) image:

=============  ===========================================================  ==============
template       text                                                         true iff
=============  ===========================================================  ==============
both           both images contain a D                                      l > 0 and r > 0
exactly_one    exactly one image contains a D                               (l > 0) != (r > 0)
neither        neither image contains a D                                   l == 0 and r == 0
left           the left image contains a D                                  l > 0
right          the right image contains a D                                 r > 0
more           the left image contains more Ds than the right image         l > r
fewer          the left image contains fewer Ds than the right image        l < r
same           the two images contain the same number of Ds                 l == r
total          the two images contain N Ds in total                         l + r == N
=============  ===========================================================  ==============

D uses the caption grammar's description (size, colour, noun, optional position), so
:func:`parse_statement` reuses the caption parser and the oracle's semantics.
"""

from __future__ import annotations

import random

import numpy as np

from falcon_cli.data.shapes import logical_forms as lfs
from falcon_cli.data.shapes.captions import _bare_phrase, _WordChooser, counted_phrase, noun_phrase
from falcon_cli.data.shapes.parser import NUMBERS, Tokens, parse_description, parse_single, tokenize
from falcon_cli.data.shapes.vocabulary import COLORS, SHAPES, SIZES
from falcon_cli.errors import FalconError

TEMPLATES: dict[str, str] = {
    "both": "both images contain {one}",
    "exactly_one": "exactly one image contains {one}",
    "neither": "neither image contains {one}",
    "left": "the left image contains {one}",
    "right": "the right image contains {one}",
    "more": "the left image contains more {many} than the right image",
    "fewer": "the left image contains fewer {many} than the right image",
    "same": "the two images contain the same number of {many}",
    "total": "the two images contain {counted} in total",
}
"""Statement templates; ``{one}`` = "a red circle", ``{many}`` = "red circles", ``{counted}`` = "three red circles"."""

_EXISTENCE = ("both", "exactly_one", "neither", "left", "right")
_CANONICAL = _WordChooser(None, 0.0)


def statement_truth(statement: dict, left_count: int, right_count: int) -> bool:
    """Truth of a statement given how many objects match its description in each image."""
    left, right = left_count, right_count
    template = statement["template"]
    return {
        "both": lambda: left > 0 and right > 0,
        "exactly_one": lambda: (left > 0) != (right > 0),
        "neither": lambda: left == 0 and right == 0,
        "left": lambda: left > 0,
        "right": lambda: right > 0,
        "more": lambda: left > right,
        "fewer": lambda: left < right,
        "same": lambda: left == right,
        "total": lambda: left + right == statement["count"],
    }[template]()


def render_statement(statement: dict) -> str:
    """Canonical English text of a statement."""
    obj = statement["object"]
    template = TEMPLATES[statement["template"]]
    if "{one}" in template:
        return template.format(one=noun_phrase(obj, _CANONICAL))
    if "{many}" in template:
        return template.format(many=_bare_phrase(obj, True, _CANONICAL))
    return template.format(counted=counted_phrase(statement["count"], obj, _CANONICAL))


def parse_statement(text: str) -> dict:
    """``{"template", "object"[, "count"]}`` of a statement (FalconError if it fits no template)."""
    words = tokenize(text)
    for name, template in TEMPLATES.items():
        before, _, after = template.partition("{")
        slot, _, after = after.partition("}")
        prefix, suffix = before.split(), after.split()
        if len(words) <= len(prefix) + len(suffix):
            continue
        if words[: len(prefix)] != prefix or (suffix and words[-len(suffix) :] != suffix):
            continue
        middle = " ".join(words[len(prefix) : len(words) - len(suffix)])
        tokens = Tokens(middle, what="statement description")
        statement = {"template": name}
        if slot == "one":
            if not tokens.peek({("a",): None, ("an",): None}):
                continue
            statement["object"] = parse_single(tokens)
        elif slot == "many":
            statement["object"] = parse_description(tokens)
        else:
            if not tokens.peek(NUMBERS):
                continue
            statement["count"] = tokens.take(NUMBERS)
            statement["object"] = parse_description(tokens)
        tokens.expect_end()
        return statement
    raise FalconError(f"statement {text!r} matches none of the NLVR2 templates ({', '.join(TEMPLATES)})")


def count_matching(objects: list[dict], description: dict) -> int:
    """How many objects of a scene match an object description."""
    return sum(all(obj[k] == v for k, v in description.items()) for obj in objects)


def _description(rng: random.Random, pool: list[dict], k: int, num_shapes: int, num_colors: int) -> dict:
    chosen = rng.sample(("size", "color", "shape"), k) if k else ()
    if pool and rng.random() < 0.6:  # about an object that is there: keeps statements relevant
        obj = pool[rng.randrange(len(pool))]
        values = {name: obj[name] for name in chosen}
    else:
        vocab = {"size": SIZES, "color": COLORS[:num_colors], "shape": SHAPES[:num_shapes]}
        values = {name: vocab[name][rng.randrange(len(vocab[name]))] for name in chosen}
    return lfs.describe(**values)


def sample_statement(
    left: list[dict], right: list[dict], rng: random.Random, *, num_shapes: int, num_colors: int
) -> dict:
    """A random statement about (left, right) scenes: ``{"template", "object"[, "count"]}`` (true or false)."""
    names = list(TEMPLATES)
    template = names[rng.randrange(len(names))]
    if template in _EXISTENCE:
        k = rng.choices([1, 2, 3], weights=[0.4, 0.4, 0.2])[0]
    else:
        k = rng.choices([0, 1, 2], weights=[0.3, 0.4, 0.3])[0]
    obj = _description(rng, left + right, k, num_shapes, num_colors)
    statement = {"template": template, "object": obj}
    if template == "total":
        actual = count_matching(left, obj) + count_matching(right, obj)
        statement["count"] = actual if rng.random() < 0.5 else max(0, actual + rng.choice([-2, -1, 1, 2]))
    return statement


def make_statement(
    target: bool,
    image_rows: np.ndarray,
    objects: list[list[dict]],
    rng: random.Random,
    *,
    num_shapes: int,
    num_colors: int,
) -> tuple[int, int, dict, str]:
    """Draw image pairs and statements from one split until one has truth ``target``.

    Returns ``(left_row, right_row, statement, text)``.
    """
    for _attempt in range(1000):
        left, right = (int(image_rows[k]) for k in rng.sample(range(len(image_rows)), 2))
        statement = sample_statement(objects[left], objects[right], rng, num_shapes=num_shapes, num_colors=num_colors)
        truth = statement_truth(
            statement,
            count_matching(objects[left], statement["object"]),
            count_matching(objects[right], statement["object"]),
        )
        if truth == target:
            return left, right, statement, render_statement(statement)
    raise RuntimeError(f"could not draw an NLVR2 statement with label {target} in 1000 attempts")
