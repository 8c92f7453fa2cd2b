"""Logical forms: the meaning of a caption as a small JSON-serialisable dict.

An *object description* constrains one object; every key is optional and names a
canonical value from :mod:`vocabulary`::

    {"size": "small", "color": "red", "shape": "circle", "position": "top left"}

A caption is one of four forms (semantics in docs/shapes.md, decided by ``oracle.py``):

* ``{"type": "exists", "object": D}`` — some object matches D.
* ``{"type": "count", "count": k, "object": D}`` — exactly k objects match D.
* ``{"type": "relation", "relation": R, "subject": D1, "object": D2}`` — two distinct
  objects a, b with a matching D1, b matching D2 and R(a, b), R in left_of / right_of /
  above / below, judged on grid columns / rows strictly.
* ``{"type": "scene", "objects": [D1, ..., Dk]}`` — the image holds exactly k objects and
  they can be paired one-to-one with D1..Dk (the full description).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from falcon_cli.data.shapes.vocabulary import COLORS, POSITIONS, RELATIONS, SHAPES, SIZES
from falcon_cli.errors import FalconError

DESCRIPTION_KEYS: tuple[str, ...] = ("size", "color", "shape", "position")
"""Keys of an object description, in canonical order."""

_ALLOWED = {"size": SIZES, "color": COLORS, "shape": SHAPES, "position": POSITIONS}
FORM_TYPES: tuple[str, ...] = ("exists", "count", "relation", "scene")


def describe(
    size: str | None = None, color: str | None = None, shape: str | None = None, position: str | None = None
) -> dict:
    """An object description with only the given attributes (canonical key order)."""
    values = {"size": size, "color": color, "shape": shape, "position": position}
    return {key: values[key] for key in DESCRIPTION_KEYS if values[key] is not None}


def exists(obj: dict) -> dict:
    """ "There is an object matching ``obj``"."""
    return {"type": "exists", "object": obj}


def count(n: int, obj: dict) -> dict:
    """ "Exactly ``n`` objects match ``obj``"."""
    return {"type": "count", "count": int(n), "object": obj}


def relation(rel: str, subject: dict, obj: dict) -> dict:
    """ "An object matching ``subject`` is ``rel`` a distinct object matching ``obj``"."""
    return {"type": "relation", "relation": rel, "subject": subject, "object": obj}


def scene(objects: list[dict]) -> dict:
    """ "Exactly these objects": as many objects as descriptions, paired one-to-one."""
    return {"type": "scene", "objects": list(objects)}


def _normalize_description(obj: Any, where: str) -> dict:
    if not isinstance(obj, dict):
        raise FalconError(f"logical form: {where} must be an object description (a mapping), got {type(obj).__name__}")
    unknown = [key for key in obj if key not in _ALLOWED]
    if unknown:
        raise FalconError(
            f"logical form: {where} has unknown key '{unknown[0]}' (allowed: {', '.join(DESCRIPTION_KEYS)})"
        )
    out = {}
    for key in DESCRIPTION_KEYS:
        if key in obj and obj[key] is not None:
            if obj[key] not in _ALLOWED[key]:
                raise FalconError(
                    f"logical form: {where}.{key} = {obj[key]!r} is not one of {', '.join(_ALLOWED[key])}"
                )
            out[key] = obj[key]
    return out


def normalize(lf: dict | str) -> dict:
    """Validate a logical form (dict or JSON string) and return it in canonical key order.

    Raises :class:`FalconError` naming the offending key.
    """
    if isinstance(lf, str):
        try:
            lf = json.loads(lf)
        except json.JSONDecodeError as exc:
            raise FalconError(f"logical form is not valid JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(lf, dict):
        raise FalconError(f"logical form must be a mapping, got {type(lf).__name__}")
    kind = lf.get("type")
    expected = {
        "exists": {"type", "object"},
        "count": {"type", "count", "object"},
        "relation": {"type", "relation", "subject", "object"},
        "scene": {"type", "objects"},
    }
    if kind not in expected:
        raise FalconError(f"logical form: type {kind!r} is not one of {', '.join(FORM_TYPES)}")
    if set(lf) != expected[kind]:
        raise FalconError(
            f"logical form of type '{kind}' needs exactly the keys {', '.join(sorted(expected[kind]))}, "
            f"got {', '.join(sorted(lf))}"
        )
    if kind == "exists":
        return exists(_normalize_description(lf["object"], "object"))
    if kind == "count":
        n = lf["count"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise FalconError(f"logical form: count must be a non-negative integer, got {n!r}")
        return count(n, _normalize_description(lf["object"], "object"))
    if kind == "relation":
        if lf["relation"] not in RELATIONS:
            raise FalconError(f"logical form: relation {lf['relation']!r} is not one of {', '.join(RELATIONS)}")
        return relation(
            lf["relation"],
            _normalize_description(lf["subject"], "subject"),
            _normalize_description(lf["object"], "object"),
        )
    objects = lf["objects"]
    if not isinstance(objects, list) or not objects:
        raise FalconError("logical form: a scene needs a non-empty list of object descriptions")
    if len(objects) > len(POSITIONS):
        raise FalconError(f"logical form: a scene holds at most {len(POSITIONS)} objects, got {len(objects)}")
    return scene([_normalize_description(obj, f"objects[{i}]") for i, obj in enumerate(objects)])


def to_json(lf: dict) -> str:
    """Canonical JSON text of a logical form: equal meaning-preserving structure gives equal text.

    Used as the grouping key that lets the oracle evaluate each distinct form once.
    """
    return form_key(normalize(lf))


def form_key(lf: dict) -> str:
    """:func:`to_json` for a form known to be valid (built by this package): no re-validation."""
    return json.dumps(lf, sort_keys=True, separators=(",", ":"))


def factorize(keys) -> tuple[list[str], np.ndarray]:
    """Distinct form keys in order of first appearance, and each key's index into them.

    (A dict is much cheaper than ``np.unique`` on long JSON strings.)
    """
    index: dict[str, int] = {}
    codes = np.fromiter((index.setdefault(key, len(index)) for key in keys), dtype=np.int64)
    return list(index), codes


def specificity(lf: dict) -> int:
    """Number of atomic predicates: one per attribute constraint, plus one for a count or relation.

    A scene description counts its object-count assertion as one predicate.
    """
    kind = lf["type"]
    if kind == "exists":
        return len(lf["object"])
    if kind == "count":
        return len(lf["object"]) + 1
    if kind == "relation":
        return len(lf["subject"]) + len(lf["object"]) + 1
    return sum(len(obj) for obj in lf["objects"]) + 1


def kind_of(lf: dict) -> str:
    """The caption kind a logical form belongs to (see ``config.CAPTION_KINDS``)."""
    kind = lf["type"]
    if kind == "exists":
        obj = lf["object"]
        if "position" in obj:
            return "position"
        return "combination" if len(obj) >= 2 else "attribute"
    return {"count": "count", "relation": "relation", "scene": "full"}[kind]
