"""The oracle: does a caption truly describe an image? Decided exactly, for any pair.

Speed matters (compatibility tables, false-negative density, audits of training runs and
FN-aware retrieval metrics score millions of pairs), so evaluation is vectorised over
scenes. Each scene is turned once into 9-bit cell masks, one per attribute value
(:class:`SceneIndex`): bit ``c`` of ``index.color[red][n]`` is set when cell ``c`` of scene
``n`` holds a red object. An object description is then an AND of a few ``uint16``
arrays, and every caption form reduces to integer operations on those masks:

* exists:   ``mask != 0``
* count k:  ``popcount(mask) == k``
* relation: ``left_of`` holds iff ``min column(subject mask) < max column(object mask)``
  (and likewise for right_of / above / below); the strict comparison puts the two objects
  in different cells, so they are always distinct objects.
* scene:    exact total count, plus Hall's condition on the description-to-object
  matching (every subset S of descriptions matches at least |S| objects).

Callers that hold many pairs group them by logical form, so each distinct form is
evaluated once (:meth:`ShapesOracle.matches`, :meth:`ShapesOracle.matrix`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np
import pyarrow.parquet as pq

from falcon_cli.data.shapes import logical_forms as lfs
from falcon_cli.data.shapes.parser import parse_caption
from falcon_cli.data.shapes.scene import SceneArrays, scenes_from_objects_column
from falcon_cli.data.shapes.vocabulary import COLORS, GRID, NUM_CELLS, POSITIONS, SHAPES, SIZES
from falcon_cli.errors import FalconError

_NUM_MASKS = 1 << NUM_CELLS
_CELL_BITS = (1 << np.arange(NUM_CELLS)).astype(np.uint16)


def _mask_tables():
    """Lookup tables over all 512 cell masks: popcount and min/max row/column of set cells.

    Empty masks get sentinels (min = 99, max = -1) so that every relation test on an empty
    mask is False without a separate emptiness check.
    """
    popcount = np.zeros(_NUM_MASKS, dtype=np.uint8)
    min_col = np.full(_NUM_MASKS, 99, dtype=np.int8)
    max_col = np.full(_NUM_MASKS, -1, dtype=np.int8)
    min_row = np.full(_NUM_MASKS, 99, dtype=np.int8)
    max_row = np.full(_NUM_MASKS, -1, dtype=np.int8)
    for mask in range(_NUM_MASKS):
        cells = [c for c in range(NUM_CELLS) if mask >> c & 1]
        popcount[mask] = len(cells)
        if cells:
            min_col[mask] = min(c % GRID for c in cells)
            max_col[mask] = max(c % GRID for c in cells)
            min_row[mask] = min(c // GRID for c in cells)
            max_row[mask] = max(c // GRID for c in cells)
    return popcount, min_col, max_col, min_row, max_row


POPCOUNT, MIN_COL, MAX_COL, MIN_ROW, MAX_ROW = _mask_tables()


class SceneIndex:
    """Per-scene cell masks (``uint16``, 9 bits used) for every attribute value."""

    def __init__(self, occupied: np.ndarray, shape: np.ndarray, color: np.ndarray, size: np.ndarray):
        self.occupied = occupied
        self.shape = shape  # [len(SHAPES), N]
        self.color = color  # [len(COLORS), N]
        self.size = size  # [len(SIZES), N]

    def __len__(self) -> int:
        return self.occupied.shape[0]

    @classmethod
    def from_scenes(cls, scenes: SceneArrays) -> "SceneIndex":
        """Build the masks from dense ``[N, 9]`` code arrays."""

        def masks(codes: np.ndarray, values: int) -> np.ndarray:
            out = np.empty((values, codes.shape[0]), dtype=np.uint16)
            for value in range(values):
                out[value] = ((codes == value) * _CELL_BITS).sum(axis=1, dtype=np.uint16)
            return out

        occupied = (scenes.occupied * _CELL_BITS).sum(axis=1, dtype=np.uint16)
        return cls(
            occupied, masks(scenes.shape, len(SHAPES)), masks(scenes.color, len(COLORS)), masks(scenes.size, len(SIZES))
        )

    def take(self, rows: np.ndarray) -> "SceneIndex":
        """The index restricted to scenes at ``rows``."""
        return SceneIndex(self.occupied[rows], self.shape[:, rows], self.color[:, rows], self.size[:, rows])

    def description_mask(self, obj: dict, rows: np.ndarray | None = None) -> np.ndarray:
        """``uint16[N]`` (or ``[len(rows)]``): cells whose object matches the object description ``obj``.

        With ``rows``, only those scenes are looked at (and only the attribute arrays the
        description needs are gathered).
        """
        mask = self.occupied if rows is None else self.occupied[rows]
        for key, table, vocab in (
            ("size", self.size, SIZES),
            ("color", self.color, COLORS),
            ("shape", self.shape, SHAPES),
        ):
            if key in obj:
                values = table[vocab.index(obj[key])]
                mask = mask & (values if rows is None else values[rows])
        if "position" in obj:
            mask = mask & _CELL_BITS[POSITIONS.index(obj["position"])]
        return mask


def scene_index(scenes: SceneArrays | SceneIndex) -> SceneIndex:
    """The :class:`SceneIndex` of ``scenes`` (cached on a SceneArrays, built once)."""
    if isinstance(scenes, SceneIndex):
        return scenes
    if scenes._index is None:
        scenes._index = SceneIndex.from_scenes(scenes)
    return scenes._index


def _relation_holds(rel: str, subject: np.ndarray, obj: np.ndarray) -> np.ndarray:
    if rel == "left_of":
        return MIN_COL[subject] < MAX_COL[obj]
    if rel == "right_of":
        return MAX_COL[subject] > MIN_COL[obj]
    if rel == "above":
        return MIN_ROW[subject] < MAX_ROW[obj]
    if rel == "below":
        return MAX_ROW[subject] > MIN_ROW[obj]
    raise ValueError(f"unknown relation {rel!r}")


def _perfect_matching(masks: list[np.ndarray]) -> np.ndarray:
    """Whether descriptions can be given distinct objects (Hall: every subset S covers >= |S| cells)."""
    ok = np.ones(masks[0].shape, dtype=bool)

    def visit(start: int, union: np.ndarray, chosen: int) -> None:
        nonlocal ok
        for j in range(start, len(masks)):
            grown = union | masks[j]
            ok &= POPCOUNT[grown] >= chosen + 1
            visit(j + 1, grown, chosen + 1)

    visit(0, np.zeros_like(masks[0]), 0)
    return ok


def _evaluate_scene(lf: dict, index: SceneIndex, rows: np.ndarray | None) -> np.ndarray:
    objects = lf["objects"]
    occupied = index.occupied if rows is None else index.occupied[rows]
    result = POPCOUNT[occupied] == len(objects)
    candidates = np.flatnonzero(result)  # positions in the evaluated scenes
    scene_rows = candidates if rows is None else rows[candidates]
    positions = [obj.get("position") for obj in objects]
    if None not in positions and len(set(positions)) == len(positions):
        # Descriptions in distinct cells can only match distinct objects: existence of each
        # suffices. Narrow the candidates description by description (cheap for full captions).
        for obj in objects:
            if candidates.size == 0:
                break
            keep = index.description_mask(obj, scene_rows) != 0
            candidates, scene_rows = candidates[keep], scene_rows[keep]
        ok_rows = candidates
    elif candidates.size:
        masks = [index.description_mask(obj, scene_rows) for obj in objects]
        ok_rows = candidates[_perfect_matching(masks)]
    else:
        ok_rows = candidates
    result[:] = False
    result[ok_rows] = True
    return result


def evaluate(logical_form: dict | str, scenes: SceneArrays | SceneIndex) -> np.ndarray:
    """``bool[N]``: whether the logical form is true of each of the N scenes.

    ``logical_form`` is a dict or its JSON text (validated; FalconError if malformed).
    """
    return evaluate_normalized(lfs.normalize(logical_form), scene_index(scenes))


def evaluate_normalized(lf: dict, index: SceneIndex, rows: np.ndarray | None = None) -> np.ndarray:
    """:func:`evaluate` for a form already checked by ``logical_forms.normalize`` (no re-validation).

    With ``rows``, only those scenes of ``index`` are evaluated (result has ``len(rows)``
    entries). The hot loops (one call per distinct form over millions of pairs) use this.
    """
    kind = lf["type"]
    if kind == "exists":
        return index.description_mask(lf["object"], rows) != 0
    if kind == "count":
        return POPCOUNT[index.description_mask(lf["object"], rows)] == lf["count"]
    if kind == "relation":
        subject = index.description_mask(lf["subject"], rows)
        obj = index.description_mask(lf["object"], rows)
        return _relation_holds(lf["relation"], subject, obj)
    return _evaluate_scene(lf, index, rows)


class ShapesOracle:
    """Ground truth for a generated world: which captions truly describe which images.

    Load with :meth:`load`; ids are the ``image_id`` / ``caption_id`` of ``scenes.parquet``
    and ``captions.parquet`` (the same ids the pretraining and retrieval JSON files carry).
    """

    def __init__(
        self,
        scenes: SceneArrays,
        image_ids: np.ndarray,
        image_splits: np.ndarray,
        caption_ids: np.ndarray,
        caption_image_ids: np.ndarray,
        caption_splits: np.ndarray,
        caption_forms: np.ndarray,
        caption_texts: np.ndarray | None = None,
        world_dir: Path | None = None,
    ):
        self.world_dir = world_dir
        self.scenes = scenes
        self.index = scene_index(scenes)
        self.image_ids = np.asarray(image_ids, dtype=np.int64)
        self.image_splits = np.asarray(image_splits).astype(str)
        self.caption_ids = np.asarray(caption_ids, dtype=np.int64)
        self.caption_image_ids = np.asarray(caption_image_ids, dtype=np.int64)
        self.caption_splits = np.asarray(caption_splits).astype(str)
        self.caption_texts = None if caption_texts is None else np.asarray(caption_texts, dtype=object)
        # Group captions by logical form once: each distinct form is evaluated once per call.
        self.forms, self.caption_form = lfs.factorize(str(form) for form in caption_forms)
        self._parsed_forms: dict[int, dict] = {}
        self._image_order = np.argsort(self.image_ids, kind="stable")
        self._caption_order = np.argsort(self.caption_ids, kind="stable")

    # --- loading ------------------------------------------------------------------------

    @classmethod
    def load(cls, world_dir: str | Path) -> "ShapesOracle":
        """Read ``scenes.parquet`` and ``captions.parquet`` of a world directory."""
        world_dir = Path(world_dir)
        tables = {}
        for name, columns in (
            ("scenes.parquet", ["image_id", "split", "objects"]),
            ("captions.parquet", ["caption_id", "image_id", "split", "text", "logical_form"]),
        ):
            path = world_dir / name
            if not path.exists():
                raise FalconError(
                    f"{path}: not found; is {world_dir} a shapes world? (make one with `falcon data shapes --out DIR`)"
                )
            try:
                table = pq.read_table(path)
            except Exception as exc:  # pyarrow raises several types for corrupt files
                raise FalconError(f"{path}: cannot be read as Parquet ({exc})") from None
            missing = [c for c in columns if c not in table.column_names]
            if missing:
                raise FalconError(f"{path}: missing column '{missing[0]}' (has: {', '.join(table.column_names)})")
            tables[name] = table
        scenes_table, captions_table = tables["scenes.parquet"], tables["captions.parquet"]
        try:
            scenes = scenes_from_objects_column(scenes_table.column("objects"), str(world_dir / "scenes.parquet"))
        except ValueError as exc:
            raise FalconError(str(exc)) from None
        oracle = cls(
            scenes=scenes,
            image_ids=scenes_table.column("image_id").to_numpy(),
            image_splits=scenes_table.column("split").to_numpy(zero_copy_only=False),
            caption_ids=captions_table.column("caption_id").to_numpy(),
            caption_image_ids=captions_table.column("image_id").to_numpy(),
            caption_splits=captions_table.column("split").to_numpy(zero_copy_only=False),
            caption_forms=captions_table.column("logical_form").to_numpy(zero_copy_only=False),
            caption_texts=captions_table.column("text").to_numpy(zero_copy_only=False),
            world_dir=world_dir,
        )
        unknown = np.setdiff1d(oracle.caption_image_ids, oracle.image_ids)
        if unknown.size:
            raise FalconError(
                f"{world_dir / 'captions.parquet'}: caption refers to image_id {unknown[0]} not in scenes.parquet"
            )
        return oracle

    # --- id lookup ----------------------------------------------------------------------

    @staticmethod
    def _rows(ids: Iterable[int] | np.ndarray, known: np.ndarray, order: np.ndarray, what: str) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        sorted_known = known[order]
        pos = np.searchsorted(sorted_known, ids)
        pos_clipped = np.minimum(pos, len(known) - 1)
        bad = (pos >= len(known)) | (sorted_known[pos_clipped] != ids)
        if bad.any():
            raise FalconError(f"shapes oracle: unknown {what} {int(ids[np.argmax(bad)])}")
        return order[pos_clipped]

    def image_rows(self, image_ids) -> np.ndarray:
        """Row of each image id in :attr:`scenes` (FalconError on an unknown id)."""
        return self._rows(image_ids, self.image_ids, self._image_order, "image_id")

    def caption_rows(self, caption_ids) -> np.ndarray:
        """Row of each caption id in the caption arrays (FalconError on an unknown id)."""
        return self._rows(caption_ids, self.caption_ids, self._caption_order, "caption_id")

    def image_ids_in(self, split: str) -> np.ndarray:
        """Image ids of one split (``train`` / ``val`` / ``test``)."""
        return self.image_ids[self.image_splits == split]

    def caption_ids_in(self, split: str) -> np.ndarray:
        """Caption ids of one split."""
        return self.caption_ids[self.caption_splits == split]

    def logical_form(self, caption_id: int) -> dict:
        """The logical form of one caption."""
        return self._form(int(self.caption_form[self.caption_rows([caption_id])[0]]))

    def specificity(self, caption_ids) -> np.ndarray:
        """``int64[n]``: the number of predicates of each caption (:func:`logical_forms.specificity`)."""
        forms = self.caption_form[self.caption_rows(caption_ids)]
        unique, inverse = np.unique(forms, return_inverse=True)
        per_form = np.array([lfs.specificity(self._form(int(f))) for f in unique], dtype=np.int64)
        return per_form[inverse].reshape(-1)

    def _form(self, form_index: int) -> dict:
        if form_index not in self._parsed_forms:
            self._parsed_forms[form_index] = lfs.normalize(str(self.forms[form_index]))
        return self._parsed_forms[form_index]

    # --- judging ------------------------------------------------------------------------

    def describes(self, image_ids, logical_form: dict | str) -> np.ndarray:
        """``bool[n]``: whether one logical form is true of each given image."""
        return evaluate_normalized(lfs.normalize(logical_form), self.index, self.image_rows(image_ids))

    def describes_text(self, image_ids, text: str) -> np.ndarray:
        """``bool[n]``: whether a caption string (parsed with the caption grammar) is true of each image.

        Raises FalconError when the text is outside the grammar (see docs/shapes.md).
        """
        return self.describes(image_ids, parse_caption(text))

    def matches(self, image_ids, caption_ids) -> np.ndarray:
        """``bool[n]``: for each pair ``(image_ids[i], caption_ids[i])``, whether the caption describes the image."""
        image_rows = self.image_rows(image_ids)
        caption_rows = self.caption_rows(caption_ids)
        if image_rows.shape != caption_rows.shape:
            raise FalconError(
                f"shapes oracle: matches() needs as many image ids as caption ids "
                f"({image_rows.size} vs {caption_rows.size})"
            )
        forms = self.caption_form[caption_rows]
        order = np.argsort(forms, kind="stable")
        boundaries = np.flatnonzero(np.diff(forms[order])) + 1
        out = np.zeros(image_rows.shape, dtype=bool)
        for group in np.split(order, boundaries):
            if group.size == 0:
                continue
            lf = self._form(int(forms[group[0]]))
            out[group] = evaluate_normalized(lf, self.index, image_rows[group])
        return out

    def matrix(self, image_ids, caption_ids) -> np.ndarray:
        """``bool[n_images, n_captions]``: entry ``[i, j]`` says whether caption j describes image i."""
        sub = self.index.take(self.image_rows(image_ids))
        caption_rows = self.caption_rows(caption_ids)
        forms, inverse = np.unique(self.caption_form[caption_rows], return_inverse=True)
        columns = np.empty((len(sub), len(forms)), dtype=bool)
        for j, form in enumerate(forms):
            columns[:, j] = evaluate_normalized(self._form(int(form)), sub)
        return columns[:, inverse.reshape(-1)]
