"""Near-miss families of a shapes world: which images of a split are near misses of each other, and how they differ.

A world with ``near_misses: k`` draws its scenes in families of k + 1 (image ids ``f (k+1) ... f (k+1) + k``): a
drawn scene and k scenes that each differ from it in one thing (``scene.near_miss``). Two siblings differ in one
thing (the drawn scene and a near miss of it) or in up to two (two near misses of it). :func:`difference_kinds`
names what separates two scenes, so an evaluation can say which differences a model has learned to see.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from falcon_cli.data.shapes.scene import EMPTY, SceneArrays

NEAR_MISS_KINDS: tuple[str, ...] = ("color", "shape", "size", "move", "swap", "several")
"""What separates two sibling scenes: one object's colour, shape or size; one object moved to an empty cell; two
objects swapped; or more than one of these (two near misses of one drawn scene)."""


def family_size(world_dir: str | Path) -> int:
    """Images per near-miss family of the world at ``world_dir`` (its ``world.json``'s ``near_misses`` + 1; 1 for a
    world without near misses or without a ``world.json``)."""
    path = Path(world_dir) / "world.json"
    if not path.is_file():
        return 1
    return int(json.loads(path.read_text(encoding="utf-8"))["config"].get("near_misses") or 0) + 1


def difference_kinds(scenes: SceneArrays, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The kind (one of :data:`NEAR_MISS_KINDS`) of the difference between scene rows ``a[i]`` and ``b[i]`` of
    ``scenes``: an object array of strings, one per pair. Identical scenes (which generation avoids) are
    ``several`` too: nothing names them better."""
    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    attrs_a = np.stack([scenes.shape[a], scenes.color[a], scenes.size[a]], axis=-1)  # [P, 9, 3]
    attrs_b = np.stack([scenes.shape[b], scenes.color[b], scenes.size[b]], axis=-1)
    occupied_a, occupied_b = attrs_a[..., 0] != EMPTY, attrs_b[..., 0] != EMPTY
    same_cells = (occupied_a == occupied_b).all(axis=1)
    cell_differs = (attrs_a != attrs_b).any(axis=-1)  # [P, 9]
    changed = cell_differs.sum(axis=1)
    kinds = np.full(len(a), "several", dtype=object)

    # One object changed in one attribute.
    one = same_cells & (changed == 1)
    cell = cell_differs.argmax(axis=1)
    rows = np.arange(len(a))
    attribute_differs = attrs_a[rows, cell] != attrs_b[rows, cell]  # [P, 3]
    for k, name in enumerate(("shape", "color", "size")):
        only = attribute_differs[:, k] & (attribute_differs.sum(axis=1) == 1)
        kinds[one & only] = name

    # Two objects swapped: two occupied cells changed, each holding the other's object.
    two = same_cells & (changed == 2)
    last = 8 - cell_differs[:, ::-1].argmax(axis=1)  # (and ``cell`` is the first changed one)
    swapped = (
        (attrs_a[rows, cell] == attrs_b[rows, last]).all(axis=1)
        & (attrs_a[rows, last] == attrs_b[rows, cell]).all(axis=1)
        & occupied_a[rows, cell]
    )
    kinds[two & swapped] = "swap"

    # One object moved: a cell emptied, another filled with the same object, every other cell unchanged.
    vacated, filled = occupied_a & ~occupied_b, occupied_b & ~occupied_a
    moved = (vacated.sum(axis=1) == 1) & (filled.sum(axis=1) == 1) & (changed == 2)
    source, target = vacated.argmax(axis=1), filled.argmax(axis=1)
    kinds[moved & (attrs_a[rows, source] == attrs_b[rows, target]).all(axis=1)] = "move"
    return kinds


def family_pairs(
    scenes: SceneArrays, scene_rows: np.ndarray, image_ids: np.ndarray, size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every ordered pair ``(i, j)``, ``i != j``, of positions in ``image_ids`` whose images share a near-miss
    family of ``size`` images, with the kind of their difference: ``(i, j, kinds)``. ``scene_rows[i]`` is the row of
    ``image_ids[i]`` in ``scenes``. Empty arrays when ``size`` is 1 (no families)."""
    image_ids = np.asarray(image_ids, dtype=np.int64)
    if size <= 1 or len(image_ids) < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, dtype=object)
    family = image_ids // size
    order = np.argsort(family, kind="stable")
    starts = np.flatnonzero(np.r_[True, family[order][1:] != family[order][:-1]])
    ends = np.r_[starts[1:], len(order)]
    firsts, seconds = [], []
    for start, end in zip(starts, ends):
        members = order[start:end]
        if len(members) > 1:
            i, j = np.meshgrid(members, members, indexing="ij")
            off = i != j
            firsts.append(i[off])
            seconds.append(j[off])
    if not firsts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, dtype=object)
    first, second = np.concatenate(firsts), np.concatenate(seconds)
    rows = np.asarray(scene_rows, dtype=np.int64)
    return first, second, difference_kinds(scenes, rows[first], rows[second])


__all__ = ["NEAR_MISS_KINDS", "difference_kinds", "family_pairs", "family_size"]
