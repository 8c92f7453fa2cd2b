"""Scene graphs: which object (shape, colour, size) sits in which of the 9 grid cells.

A batch of scenes is stored densely as three ``int8`` arrays of shape ``[N, 9]`` (one
column per cell, ``-1`` where the cell is empty). That layout is what the vectorised oracle
works on; :func:`scene_objects` turns one row back into a readable object list.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from falcon_cli.data.shapes.vocabulary import COLORS, GRID, NUM_CELLS, POSITIONS, SHAPES, SIZES

EMPTY = -1


@dataclass
class SceneArrays:
    """N scenes as dense ``[N, 9]`` int8 code arrays (-1 = empty cell)."""

    shape: np.ndarray
    color: np.ndarray
    size: np.ndarray
    _index: object = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("shape", "color", "size"):
            arr = np.asarray(getattr(self, name), dtype=np.int8)
            if arr.ndim != 2 or arr.shape[1] != NUM_CELLS:
                raise ValueError(f"scene array '{name}' must have shape [N, {NUM_CELLS}], got {arr.shape}")
            setattr(self, name, arr)
        if not (self.shape.shape == self.color.shape == self.size.shape):
            raise ValueError("scene arrays shape/color/size must have the same shape")
        empty = self.shape == EMPTY
        if not (np.array_equal(empty, self.color == EMPTY) and np.array_equal(empty, self.size == EMPTY)):
            raise ValueError("scene arrays disagree on which cells are empty")

    def __len__(self) -> int:
        return self.shape.shape[0]

    @property
    def occupied(self) -> np.ndarray:
        """``[N, 9]`` bool: whether each cell holds an object."""
        return self.shape != EMPTY

    def take(self, rows: np.ndarray) -> "SceneArrays":
        """The scenes at ``rows`` (a new SceneArrays)."""
        return SceneArrays(self.shape[rows], self.color[rows], self.size[rows])

    @classmethod
    def from_objects(cls, scenes: list[list[dict]]) -> "SceneArrays":
        """Build from object lists (``{"shape", "color", "size", "position"}`` names, as :func:`scene_objects`
        gives)."""
        n = len(scenes)
        arrays = [np.full((n, NUM_CELLS), EMPTY, dtype=np.int8) for _ in range(3)]
        for i, objects in enumerate(scenes):
            for obj in objects:
                cell = POSITIONS.index(obj["position"])
                if arrays[0][i, cell] != EMPTY:
                    raise ValueError(f"scene {i}: two objects in cell '{obj['position']}'")
                arrays[0][i, cell] = SHAPES.index(obj["shape"])
                arrays[1][i, cell] = COLORS.index(obj["color"])
                arrays[2][i, cell] = SIZES.index(obj["size"])
        return cls(*arrays)


def sample_scene(rng: random.Random, *, min_objects: int, max_objects: int, num_shapes: int, num_colors: int):
    """Draw one scene: 1 object per chosen cell, attributes uniform over the used vocabulary.

    Returns three int8 arrays of length 9 (shape, color, size codes; -1 = empty).
    """
    k = rng.randint(min_objects, max_objects)
    shape = np.full(NUM_CELLS, EMPTY, dtype=np.int8)
    color = np.full(NUM_CELLS, EMPTY, dtype=np.int8)
    size = np.full(NUM_CELLS, EMPTY, dtype=np.int8)
    for cell in rng.sample(range(NUM_CELLS), k):
        shape[cell] = rng.randrange(num_shapes)
        color[cell] = rng.randrange(num_colors)
        size[cell] = rng.randrange(len(SIZES))
    return shape, color, size


NEAR_MISS_CHANGES: tuple[str, ...] = ("color", "shape", "size", "move", "swap")
"""How a near miss differs from its scene: one object's colour, shape or size; one object moved to an
empty cell; or two different objects swapping cells (which flips the relations between them)."""


def near_miss(
    scene: tuple[np.ndarray, np.ndarray, np.ndarray],
    rng: random.Random,
    *,
    num_shapes: int,
    num_colors: int,
    avoid: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = (),
    attempts: int = 20,
):
    """A scene that differs from ``scene`` in exactly one thing (one of :data:`NEAR_MISS_CHANGES`, drawn
    uniformly among those the scene allows), and from every scene in ``avoid`` if it can.

    Captions of ``scene`` that do not mention the changed thing stay true of the near miss (a false
    negative when the two meet in a batch); those that do mention it become false (a hard negative
    that teaches the difference). Returns three int8 arrays of length 9, like :func:`sample_scene`.
    """
    shape, color, size = scene
    cells = np.flatnonzero(shape != EMPTY).tolist()
    empty = np.flatnonzero(shape == EMPTY).tolist()
    distinct_pairs = [
        (a, b)
        for i, a in enumerate(cells)
        for b in cells[i + 1 :]
        if (shape[a], color[a], size[a]) != (shape[b], color[b], size[b])
    ]
    allowed = [c for c in NEAR_MISS_CHANGES if (c != "move" or empty) and (c != "swap" or distinct_pairs)]
    candidate = None
    for _attempt in range(attempts):
        new = [shape.copy(), color.copy(), size.copy()]
        change = allowed[rng.randrange(len(allowed))]
        if change in ("color", "shape", "size"):
            k = ("shape", "color", "size").index(change)
            levels = (num_shapes, num_colors, len(SIZES))[k]
            cell = cells[rng.randrange(len(cells))]
            old = int(new[k][cell])
            new[k][cell] = (old + 1 + rng.randrange(levels - 1)) % levels  # any other value, uniformly
        elif change == "move":
            source, target = cells[rng.randrange(len(cells))], empty[rng.randrange(len(empty))]
            for arr in new:
                arr[target], arr[source] = arr[source], EMPTY
        else:
            a, b = distinct_pairs[rng.randrange(len(distinct_pairs))]
            for arr in new:
                arr[a], arr[b] = arr[b], arr[a]
        candidate = tuple(new)
        if not any(all(np.array_equal(x, y) for x, y in zip(candidate, other)) for other in avoid):
            break
    return candidate


def scene_objects(shape_row: np.ndarray, color_row: np.ndarray, size_row: np.ndarray) -> list[dict]:
    """One scene as a list of objects in cell order:
    ``{"shape", "color", "size", "position", "row", "col", "cell"}``."""
    objects = []
    for cell in range(NUM_CELLS):
        if shape_row[cell] == EMPTY:
            continue
        objects.append(
            {
                "shape": SHAPES[shape_row[cell]],
                "color": COLORS[color_row[cell]],
                "size": SIZES[size_row[cell]],
                "position": POSITIONS[cell],
                "row": cell // GRID,
                "col": cell % GRID,
                "cell": cell,
            }
        )
    return objects


OBJECT_TYPE = pa.struct(
    [
        ("cell", pa.int8()),
        ("row", pa.int8()),
        ("col", pa.int8()),
        ("shape", pa.string()),
        ("color", pa.string()),
        ("size", pa.string()),
        ("position", pa.string()),
    ]
)
"""Arrow type of one object in ``scenes.parquet``'s ``objects`` column."""


def objects_column(scenes: SceneArrays) -> pa.Array:
    """The ``objects`` column (list of structs, cell order) for all scenes, built without Python loops."""
    occupied = scenes.occupied
    rows, cells = np.nonzero(occupied)  # row-major: scene by scene, cells ascending
    counts = occupied.sum(axis=1)
    offsets = np.zeros(len(scenes) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])

    def names(codes: np.ndarray, vocab: tuple[str, ...]) -> pa.Array:
        return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(list(vocab))).cast(pa.string())

    struct = pa.StructArray.from_arrays(
        [
            pa.array(cells.astype(np.int8)),
            pa.array((cells // GRID).astype(np.int8)),
            pa.array((cells % GRID).astype(np.int8)),
            names(scenes.shape[rows, cells], SHAPES),
            names(scenes.color[rows, cells], COLORS),
            names(scenes.size[rows, cells], SIZES),
            names(cells, POSITIONS),
        ],
        fields=list(OBJECT_TYPE),
    )
    return pa.ListArray.from_arrays(pa.array(offsets), struct)


def scenes_from_objects_column(column: pa.ChunkedArray | pa.Array, source: str = "scenes.parquet") -> SceneArrays:
    """Inverse of :func:`objects_column`: dense arrays from the stored object lists (vectorised)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    n = len(column)
    offsets = column.offsets.to_numpy()
    values = column.flatten()
    counts = np.diff(offsets)
    rows = np.repeat(np.arange(n), counts)
    cells = values.field("cell").to_numpy(zero_copy_only=False).astype(np.int64)
    if cells.size and (cells.min() < 0 or cells.max() >= NUM_CELLS):
        raise ValueError(f"{source}: object cell outside 0..{NUM_CELLS - 1}")

    def codes(name: str, vocab: tuple[str, ...]) -> np.ndarray:
        strings = values.field(name).to_numpy(zero_copy_only=False).astype(str)
        lookup = {word: i for i, word in enumerate(vocab)}
        uniq, inverse = np.unique(strings, return_inverse=True)
        bad = [u for u in uniq if u not in lookup]
        if bad:
            raise ValueError(f"{source}: unknown {name} '{bad[0]}' (known: {', '.join(vocab)})")
        return np.array([lookup[u] for u in uniq], dtype=np.int8)[inverse] if len(uniq) else np.zeros(0, np.int8)

    if np.unique(rows * NUM_CELLS + cells).size != cells.size:
        raise ValueError(f"{source}: two objects in the same cell of one scene")
    out = [np.full((n, NUM_CELLS), EMPTY, dtype=np.int8) for _ in range(3)]
    for arr, (name, vocab) in zip(out, (("shape", SHAPES), ("color", COLORS), ("size", SIZES))):
        arr[rows, cells] = codes(name, vocab)
    return SceneArrays(*out)
