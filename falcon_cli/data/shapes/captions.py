"""Captions: sample true logical forms for a scene, and render a logical form as text.

Sampling picks caption kinds (attribute, combination, position, relation, count, full) by
the configured weights and builds a logical form from the scene's actual objects, so every
caption is true of its image by construction (the world generator still checks each one
with the oracle). Rendering turns a logical form into English; each word slot (colour,
shape noun, size, position phrase, relation phrase, number, opening words) independently
uses a synonym with probability ``paraphrase_prob``. ``parser.parse_caption`` inverts it.
"""

from __future__ import annotations

import math
import random

from falcon_cli.data.shapes import logical_forms as lfs
from falcon_cli.data.shapes.config import CAPTION_KINDS
from falcon_cli.data.shapes.vocabulary import (
    COLOR_WORDS,
    GENERIC_WORDS,
    POSITION_PHRASES,
    RELATION_PHRASES,
    SHAPE_WORDS,
    SIZE_WORDS,
    article,
    number_word,
)

# --- rendering --------------------------------------------------------------------------


class _WordChooser:
    """Picks the canonical word, or (with probability ``prob``) one of its synonyms; remembers if it did."""

    def __init__(self, rng: random.Random | None, prob: float):
        self.rng = rng
        self.prob = prob if rng is not None else 0.0
        self.paraphrased = False

    def pick(self, options: list):
        if self.prob > 0 and len(options) > 1 and self.rng.random() < self.prob:
            self.paraphrased = True
            return options[1 + self.rng.randrange(len(options) - 1)]
        return options[0]


def _noun(obj: dict, plural: bool, chooser: _WordChooser) -> str:
    forms = SHAPE_WORDS[obj["shape"]] if "shape" in obj else GENERIC_WORDS
    return chooser.pick(forms)[1 if plural else 0]


def _bare_phrase(obj: dict, plural: bool, chooser: _WordChooser) -> str:
    """Size, colour, noun and position of an object description, without a determiner."""
    words = []
    if "size" in obj:
        words.append(chooser.pick(SIZE_WORDS[obj["size"]]))
    if "color" in obj:
        words.append(chooser.pick(COLOR_WORDS[obj["color"]]))
    words.append(_noun(obj, plural, chooser))
    if "position" in obj:
        words.append(chooser.pick(POSITION_PHRASES[obj["position"]]))
    return " ".join(words)


def noun_phrase(obj: dict, chooser: _WordChooser) -> str:
    """ "a small red circle in the top left" (singular, with article)."""
    bare = _bare_phrase(obj, False, chooser)
    return f"{article(bare)} {bare}"


def _number(n: int, chooser: _WordChooser) -> str:
    # Digits are the paraphrase; "no" (zero) has no digit form in captions.
    return chooser.pick([number_word(n), str(n)]) if n > 0 else number_word(n)


def counted_phrase(n: int, obj: dict, chooser: _WordChooser) -> str:
    """ "three red circles", "one square" (number agreement from ``n``)."""
    return f"{_number(n, chooser)} {_bare_phrase(obj, n != 1, chooser)}"


def render_caption_detailed(
    lf: dict, rng: random.Random | None = None, paraphrase_prob: float = 0.0
) -> tuple[str, bool]:
    """Text of a logical form, and whether any synonym was used (see :func:`render_caption`)."""
    chooser = _WordChooser(rng, paraphrase_prob)
    kind = lf["type"]
    if kind == "exists":
        text = chooser.pick(["", "there is "]) + noun_phrase(lf["object"], chooser)
    elif kind == "count":
        n = lf["count"]
        opening = chooser.pick(["", "exactly ", "there is " if n == 1 else "there are "])
        text = opening + counted_phrase(n, lf["object"], chooser)
    elif kind == "relation":
        subject = noun_phrase(lf["subject"], chooser)
        rel = chooser.pick(RELATION_PHRASES[lf["relation"]])
        text = f"{subject} {rel} {noun_phrase(lf['object'], chooser)}"
    elif kind == "scene":
        objects = lf["objects"]
        head = counted_phrase(len(objects), {}, chooser)
        parts = [noun_phrase(obj, chooser) for obj in objects]
        body = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
        text = f"{head}: {body}"
    else:
        raise ValueError(f"unknown logical form type {kind!r}")
    return text, chooser.paraphrased


def render_caption(lf: dict, rng: random.Random | None = None, paraphrase_prob: float = 0.0) -> str:
    """English text of a logical form.

    Without ``rng`` (or with ``paraphrase_prob=0``) the canonical wording is used ("a small
    red circle in the top left"); otherwise each word slot uses a synonym with probability
    ``paraphrase_prob`` ("a tiny crimson ball in the upper left").
    """
    return render_caption_detailed(lf, rng, paraphrase_prob)[0]


# --- sampling ---------------------------------------------------------------------------

_ATTRIBUTES = ("size", "color", "shape")


def _pick(rng: random.Random, items: list):
    return items[rng.randrange(len(items))]


def _weighted(rng: random.Random, values: list[int], weights: list[float], at_least: int = 0) -> int:
    """One of ``values`` by ``weights``, among those >= ``at_least`` (the smallest allowed if none is)."""
    if at_least > values[0]:
        kept = [(v, w) for v, w in zip(values, weights) if v >= at_least]
        values, weights = ([v for v, _ in kept], [w for _, w in kept]) if kept else ([at_least], [1.0])
    return rng.choices(values, weights=weights)[0]


def _subset_description(obj: dict, k: int, rng: random.Random, with_position: bool = False) -> dict:
    """Description of ``obj`` by ``k`` of its size/colour/shape attributes (random), plus its cell if asked."""
    chosen = rng.sample(_ATTRIBUTES, k) if k else ()
    values = {name: obj[name] for name in chosen}
    if with_position:
        values["position"] = obj["position"]
    return lfs.describe(**values)


def _matches(obj: dict, description: dict) -> bool:
    return all(obj[key] == value for key, value in description.items())


def _relations_between(a: dict, b: dict) -> list[str]:
    rels = []
    if a["col"] < b["col"]:
        rels.append("left_of")
    if a["col"] > b["col"]:
        rels.append("right_of")
    if a["row"] < b["row"]:
        rels.append("above")
    if a["row"] > b["row"]:
        rels.append("below")
    return rels


def sample_form(kind: str, objects: list[dict], rng: random.Random, min_attributes: int = 0) -> dict:
    """A logical form of the given kind that is true of the scene ``objects`` (needs >= 2 objects for relations).

    ``min_attributes`` > 0 makes the object descriptions of relation and position captions name at
    least that many of size / colour / shape (0 keeps the drawn mix).
    """
    if kind == "attribute":
        return lfs.exists(_subset_description(_pick(rng, objects), 1, rng))
    if kind == "combination":
        return lfs.exists(_subset_description(_pick(rng, objects), _weighted(rng, [2, 3], [0.6, 0.4]), rng))
    if kind == "position":
        k = _weighted(rng, [0, 1, 2, 3], [0.1, 0.35, 0.35, 0.2], min_attributes)
        return lfs.exists(_subset_description(_pick(rng, objects), k, rng, with_position=True))
    if kind == "relation":
        a, b = rng.sample(objects, 2)
        rel = _pick(rng, _relations_between(a, b))  # distinct cells always differ in row or column
        subject = _subset_description(a, _weighted(rng, [1, 2, 3], [0.45, 0.45, 0.1], min_attributes), rng)
        other = _subset_description(b, _weighted(rng, [1, 2, 3], [0.45, 0.45, 0.1], min_attributes), rng)
        return lfs.relation(rel, subject, other)
    if kind == "count":
        description = _subset_description(_pick(rng, objects), _weighted(rng, [0, 1, 2], [0.3, 0.4, 0.3]), rng)
        return lfs.count(sum(_matches(obj, description) for obj in objects), description)
    if kind == "full":
        return lfs.scene([lfs.describe(o["size"], o["color"], o["shape"], o["position"]) for o in objects])
    raise ValueError(f"unknown caption kind {kind!r}")


def _kind_schedule(n: int, weights: list[float], rng: random.Random) -> list[int]:
    """``n`` kind indices: weighted draws without replacement, refilled when the kinds run out."""
    schedule: list[int] = []
    while len(schedule) < n:
        remaining = [k for k, w in enumerate(weights) if w > 0]
        while remaining and len(schedule) < n:
            k = rng.choices(remaining, weights=[weights[r] for r in remaining])[0]
            schedule.append(k)
            remaining.remove(k)
    return schedule


def _new_form(
    kind: str, objects: list[dict], rng: random.Random, min_attributes: int, seen: set[str], attempts: int = 12
):
    """A form of ``kind`` not in ``seen`` if one turns up within ``attempts`` draws (else the last one drawn), and its
    key."""
    for _attempt in range(attempts):
        lf = sample_form(kind, objects, rng, min_attributes)
        key = lfs.form_key(lf)
        if key not in seen:
            break
    return lf, key


def sample_captions(
    objects: list[dict],
    rng: random.Random,
    *,
    count: int,
    kind_weights: list[float],
    paraphrase_prob: float,
    min_attributes: int = 0,
    scene_captions: int = 0,
) -> list[dict]:
    """``count`` captions true of one scene: ``{"kind", "logical_form", "key", "text", "paraphrased"}`` each.

    Kinds follow ``kind_weights`` (in ``CAPTION_KINDS`` order); relations are skipped for
    one-object scenes. Logical forms are distinct within an image while possible: when the drawn
    kind has none left, another enabled kind stands in (so ``kind`` may differ from the schedule);
    a scene with no new form of any enabled kind repeats one (``world.json`` counts those).

    ``scene_captions`` of them (as many as the scene has orderings) are whole-scene descriptions
    that list the objects in distinct drawn orders, the rest follow ``kind_weights``, and the
    captions come out shuffled (with 0 nothing is drawn for this, so other worlds stay identical).
    """
    weights = [float(w) for w in kind_weights]
    if len(objects) < 2:
        weights[CAPTION_KINDS.index("relation")] = 0.0
        if sum(weights) <= 0:  # only relations enabled: fall back to single-object kinds
            weights = [0.0 if kind == "relation" else 1.0 for kind in CAPTION_KINDS]
    captions: list[dict] = []
    seen: set[str] = set()
    for lf in _scene_orderings(objects, min(scene_captions, count), rng):
        key = lfs.form_key(lf)
        seen.add(key)
        captions.append(_caption("full", lf, key, rng, paraphrase_prob))
    for kind_index in _kind_schedule(count - len(captions), weights, rng):
        kind = CAPTION_KINDS[kind_index]
        lf, key = _new_form(kind, objects, rng, min_attributes, seen)
        if key in seen:
            # The kind has no form left for this scene (a scene has one full description): try the
            # other enabled kinds, in weighted order, before repeating a caption. Only scenes that
            # would repeat one draw anything more here, so other worlds stay byte-identical.
            others = [k for k, w in enumerate(weights) if w > 0 and k != kind_index]
            while others and key in seen:
                k = rng.choices(others, weights=[weights[o] for o in others])[0]
                others.remove(k)
                kind = CAPTION_KINDS[k]
                lf, key = _new_form(kind, objects, rng, min_attributes, seen)
        seen.add(key)
        captions.append(_caption(kind, lf, key, rng, paraphrase_prob))
    if scene_captions:
        rng.shuffle(captions)  # (the whole-scene descriptions are not always the first pairs of an image)
    return captions


def _caption(kind: str, lf: dict, key: str, rng: random.Random, paraphrase_prob: float) -> dict:
    """One caption record of :func:`sample_captions`: the form rendered to text (synonyms drawn from ``rng``)."""
    text, paraphrased = render_caption_detailed(lf, rng, paraphrase_prob)
    return {"kind": kind, "logical_form": lf, "key": key, "text": text, "paraphrased": paraphrased}


def _scene_orderings(objects: list[dict], n: int, rng: random.Random) -> list[dict]:
    """Up to ``n`` whole-scene forms of ``objects``, each listing them in a different random order
    (as many as there are orderings: a scene of k objects has k! of them)."""
    if n <= 0:
        return []
    n = min(n, math.factorial(len(objects)))
    described = sample_form("full", objects, rng)["objects"]  # (the canonical whole-scene form draws nothing)
    orders: list[tuple[int, ...]] = []
    while len(orders) < n:
        order = tuple(rng.sample(range(len(objects)), len(objects)))
        if order not in orders:
            orders.append(order)
    return [lfs.scene([described[i] for i in order]) for order in orders]
