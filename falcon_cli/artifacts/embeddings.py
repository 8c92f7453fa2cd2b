"""``embeddings.h5``: L2-normalised image and text embeddings of a dataset's pairs.

Datasets ``image`` [N, D] and ``text`` [N, D] (fp16 or fp32), ``pair_id`` [N] int64;
attributes ``schema_version``, ``model``, ``checkpoint``, ``dataset``, ``split``, ``epoch`` and
``dataset_fingerprint`` (the sha256 of the dataset's pair list, see
``falcon_cli.data.pairs.pairs_fingerprint``; absent in files written before it existed).
:class:`EmbeddingsWriter` writes in chunks (a 5M-pair dataset never sits in memory) to a
temporary file that is renamed into place when complete; :func:`read_embeddings`
validates everything it reads and holds the whole arrays; :func:`open_embeddings` validates the
same but reads the features by row, as asked (a 14M-pair fp16 file is 14 GB: a stage that needs
every row once, or a rank that needs an eighth of them, reads them in bounded chunks).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from falcon_cli.artifacts.atomic import atomic_path
from falcon_cli.errors import FalconError

EMBEDDINGS_SCHEMA_VERSION = 1
REQUIRED_ATTRS = ("model", "checkpoint", "dataset", "split", "epoch")
FINGERPRINT_ATTR = "dataset_fingerprint"
NORM_TOLERANCE = 1e-2  # fp16 storage keeps norms within ~1e-3 of 1
NORM_CHECK_ROWS = 65536
"""Rows whose norms are checked at once (a 14M-pair fp16 file would otherwise need a 14 GB fp32 copy on top of
its 14 GB arrays)."""
READ_ROWS = 65536
"""Most rows :meth:`EmbeddingsFile.take` reads in one slice (64 MiB of fp16 256-d features for both modalities)."""
READ_GAP = 4096
""":meth:`EmbeddingsFile.take` reads the rows between two wanted rows at most this far apart rather than
issuing another read (one HDF5 chunk of the writer: reading it whole costs about what a read call does)."""


@dataclass
class Embeddings:
    """Embeddings read from ``embeddings.h5`` (arrays in memory).

    ``n``, ``dim``, :meth:`rows` and :meth:`take` are those of :class:`EmbeddingsFile`, so code that reads
    embeddings by row takes either."""

    image: np.ndarray
    text: np.ndarray
    pair_id: np.ndarray
    attrs: dict[str, Any]

    @property
    def n(self) -> int:
        """Number of pairs (rows)."""
        return int(self.image.shape[0])

    @property
    def dim(self) -> int:
        """Feature width D."""
        return int(self.image.shape[1])

    def rows(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """(image, text) of rows ``start:stop``."""
        return self.image[start:stop], self.text[start:stop]

    def take(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(image, text) of the rows ``indices`` (ascending)."""
        return self.image[indices], self.text[indices]


class EmbeddingsFile:
    """``embeddings.h5`` open for reading by row (:func:`open_embeddings`): ``pair_id`` and ``attrs`` in memory
    (8 B a pair), the features read when asked, each read checked for unit norms. Close it (or use ``with``)."""

    def __init__(self, path: Path, handle: h5py.File, pair_id: np.ndarray, attrs: dict[str, Any]):
        self.path, self._handle, self.pair_id, self.attrs = path, handle, pair_id, attrs
        self._image, self._text = handle["image"], handle["text"]

    @property
    def n(self) -> int:
        """Number of pairs (rows)."""
        return int(self._image.shape[0])

    @property
    def dim(self) -> int:
        """Feature width D."""
        return int(self._image.shape[1])

    @property
    def dtype(self) -> np.dtype:
        """The stored feature dtype (float16 or float32); what :meth:`rows` and :meth:`take` return."""
        return self._image.dtype

    def rows(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """(image, text) of rows ``start:stop``, as stored (fp16 or fp32), norms checked."""
        image, text = self._image[start:stop], self._text[start:stop]
        _check_norms(self.path, image, text, lambda bad: start + bad)
        return image, text

    def take(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(image, text) of the rows ``indices`` (ascending; repeats allowed), as stored, norms checked.

        Read in slices of at most :data:`READ_ROWS` rows, each spanning wanted rows at most :data:`READ_GAP`
        apart (HDF5's own point selection is slow for long lists): memory is the result plus one slice."""
        indices = np.asarray(indices, dtype=np.int64)
        if indices.ndim != 1 or (indices.size and (indices[0] < 0 or indices[-1] >= self.n)):
            raise ValueError(f"{self.path}: row indices must be 1-d within 0..{self.n - 1}")
        if indices.size > 1 and (np.diff(indices) < 0).any():
            raise ValueError(f"{self.path}: row indices must be ascending")
        image = np.empty((indices.size, self.dim), dtype=self.dtype)
        text = np.empty_like(image)
        begin = 0
        while begin < indices.size:
            first = indices[begin]
            # the run: following rows within READ_GAP of the previous one and within READ_ROWS of the first
            gaps = np.flatnonzero(np.diff(indices[begin : begin + READ_ROWS]) > READ_GAP)
            end = begin + (int(gaps[0]) + 1 if gaps.size else min(READ_ROWS, indices.size - begin))
            end = begin + int(np.searchsorted(indices[begin:end], first + READ_ROWS))  # span <= READ_ROWS rows
            last = indices[end - 1]
            local = indices[begin:end] - first
            image[begin:end] = self._image[first : last + 1][local]
            text[begin:end] = self._text[first : last + 1][local]
            begin = end
        _check_norms(self.path, image, text, lambda bad: indices[bad])
        return image, text

    def close(self) -> None:
        """Close the file."""
        self._handle.close()

    def __enter__(self) -> "EmbeddingsFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class EmbeddingsWriter:
    """Write ``embeddings.h5`` chunk by chunk; the file appears only when :meth:`close` succeeds.

    >>> with EmbeddingsWriter(
    ...     path, n=10, dim=256, attrs=dict(model="albef-tiny", checkpoint="", dataset="shapes", split="train", epoch=0)
    ... ) as w:
    ...     w.write(0, image_chunk, text_chunk, pair_ids)
    """

    def __init__(self, path: str | Path, *, n: int, dim: int, attrs: dict[str, Any], dtype: str = "float16"):
        missing = [k for k in REQUIRED_ATTRS if k not in attrs]
        if missing:
            raise ValueError(f"embeddings attrs missing {missing}")
        if dtype not in ("float16", "float32"):
            raise ValueError(f"dtype must be float16 or float32, got {dtype}")
        self.path, self.n, self.dim = Path(path), n, dim
        self._atomic = atomic_path(self.path)
        self._tmp = self._atomic.__enter__()
        self._file = h5py.File(self._tmp, "w")
        chunk = (min(max(n, 1), 4096), dim)
        self._file.create_dataset("image", shape=(n, dim), dtype=dtype, chunks=chunk)
        self._file.create_dataset("text", shape=(n, dim), dtype=dtype, chunks=chunk)
        self._file.create_dataset("pair_id", shape=(n,), dtype="int64")
        self._file.attrs["schema_version"] = EMBEDDINGS_SCHEMA_VERSION
        for key, value in attrs.items():
            self._file.attrs[key] = "" if value is None else value
        self._written = np.zeros(n, dtype=bool)

    def write(self, start: int, image: np.ndarray, text: np.ndarray, pair_id: np.ndarray) -> None:
        """Write rows ``start : start + len(image)``; inputs are normalised here if they are not already."""
        image = np.asarray(image, dtype=np.float32)
        text = np.asarray(text, dtype=np.float32)
        stop = start + len(image)
        if image.shape != text.shape or image.shape[1:] != (self.dim,) or len(pair_id) != len(image) or stop > self.n:
            raise ValueError(
                f"chunk shapes image {image.shape}, text {text.shape}, pair_id {len(pair_id)} "
                f"do not fit rows {start}:{stop} of [{self.n}, {self.dim}]"
            )
        self._file["image"][start:stop] = image / np.maximum(np.linalg.norm(image, axis=1, keepdims=True), 1e-12)
        self._file["text"][start:stop] = text / np.maximum(np.linalg.norm(text, axis=1, keepdims=True), 1e-12)
        self._file["pair_id"][start:stop] = np.asarray(pair_id, dtype=np.int64)
        self._written[start:stop] = True

    def close(self) -> Path:
        """Finish the file and move it into place (fails if any row was never written)."""
        self._file.close()
        if not self._written.all():
            self._atomic.__exit__(ValueError, ValueError("incomplete"), None)
            raise ValueError(f"{self.path}: rows {np.flatnonzero(~self._written)[:5].tolist()}... were never written")
        self._atomic.__exit__(None, None, None)
        return self.path

    def abort(self) -> None:
        """Discard the temporary file; the target is left untouched."""
        self._file.close()
        self._atomic.__exit__(RuntimeError, RuntimeError("aborted"), None)

    def __enter__(self) -> "EmbeddingsWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_embeddings(
    path: str | Path,
    image: np.ndarray,
    text: np.ndarray,
    pair_id: np.ndarray,
    attrs: dict[str, Any],
    dtype: str = "float16",
) -> Path:
    """Write a whole ``embeddings.h5`` at once (see :class:`EmbeddingsWriter`)."""
    with EmbeddingsWriter(path, n=len(image), dim=np.shape(image)[1], attrs=attrs, dtype=dtype) as writer:
        writer.write(0, image, text, pair_id)
    return Path(path)


def open_embeddings(path: str | Path) -> EmbeddingsFile:
    """Open and validate ``embeddings.h5`` for reading by row: schema version, shapes, dtypes, attributes and
    unique ids now; unit norms of every row read (:meth:`EmbeddingsFile.rows`, :meth:`EmbeddingsFile.take`)."""
    path = Path(path)
    if not path.exists():
        raise FalconError(f"{path}: not found")
    try:
        handle = h5py.File(path, "r")
    except OSError as exc:
        raise FalconError(f"{path}: not a readable HDF5 file ({exc})") from None
    try:
        version = handle.attrs.get("schema_version")
        if version is None or int(version) != EMBEDDINGS_SCHEMA_VERSION:
            raise FalconError(
                f"{path}: embeddings schema_version {version}, this falcon reads {EMBEDDINGS_SCHEMA_VERSION}"
            )
        for name in ("image", "text", "pair_id"):
            if name not in handle:
                raise FalconError(f"{path}: dataset '{name}' is missing")
        image, text, pair_id = handle["image"], handle["text"], handle["pair_id"]
        if image.ndim != 2 or image.shape != text.shape:
            raise FalconError(f"{path}: 'image' {image.shape} and 'text' {text.shape} must both be [N, D]")
        if pair_id.shape != (image.shape[0],):
            raise FalconError(f"{path}: 'pair_id' has shape {pair_id.shape}, expected ({image.shape[0]},)")
        for name, ds in (("image", image), ("text", text)):
            if ds.dtype not in (np.float16, np.float32):
                raise FalconError(f"{path}: '{name}' has dtype {ds.dtype}, expected float16 or float32")
        if pair_id.dtype != np.int64:
            raise FalconError(f"{path}: 'pair_id' has dtype {pair_id.dtype}, expected int64")
        missing = [k for k in REQUIRED_ATTRS if k not in handle.attrs]
        if missing:
            raise FalconError(f"{path}: attributes {missing} are missing")
        attrs = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in handle.attrs.items()}
        ids = pair_id[...]
        if len(np.unique(ids)) != len(ids):
            raise FalconError(f"{path}: 'pair_id' has duplicates")
    except BaseException:
        handle.close()
        raise
    return EmbeddingsFile(path, handle, ids, attrs)


def read_embeddings(path: str | Path) -> Embeddings:
    """Read and validate ``embeddings.h5``, the whole arrays in memory (:func:`open_embeddings`' checks, every norm)."""
    with open_embeddings(path) as source:
        image, text = source.rows(0, source.n)
        return Embeddings(image, text, source.pair_id, source.attrs)


def _check_norms(path: Path, image: np.ndarray, text: np.ndarray, row_of) -> None:
    """Every row of ``image`` and ``text`` has unit norm (within :data:`NORM_TOLERANCE`); ``row_of`` maps a
    position in them to the file's row for the message. In chunks: no fp32 copy of the whole arrays."""
    for name, values in (("image", image), ("text", text)):
        for start in range(0, len(values), NORM_CHECK_ROWS):
            chunk = values[start : start + NORM_CHECK_ROWS].astype(np.float32)
            norms = np.sqrt(np.einsum("nd,nd->n", chunk, chunk))  # (one pass: a fifth faster than linalg.norm)
            bad = np.flatnonzero(np.abs(norms - 1) > NORM_TOLERANCE)
            if len(bad):
                raise FalconError(
                    f"{path}: '{name}' row {int(row_of(start + bad[0]))} has norm {norms[bad[0]]:.4f}; "
                    "embeddings must be L2-normalised"
                )


def check_fingerprint(path: str | Path, attrs: dict[str, Any], expected: str, dataset: str | Path) -> str | None:
    """Check that embeddings were computed on ``dataset`` (whose pair-list fingerprint is ``expected``).

    A different fingerprint raises a one-line :class:`FalconError`; a file without one (written
    before fingerprints were recorded) is accepted and the warning line to print is returned.
    """
    recorded = attrs.get(FINGERPRINT_ATTR)
    if recorded is None or recorded == "":
        return (
            f"{path}: no {FINGERPRINT_ATTR} attribute (written by an older falcon), so it cannot be checked "
            f"against {dataset}; re-run `falcon embed` for this dataset to make it checkable"
        )
    if recorded != expected:
        raise FalconError(
            f"{path}: embeddings were computed on a different dataset than {dataset} "
            f"({attrs.get('dataset')!r} {attrs.get('split')!r} split, pair-list fingerprint "
            f"{str(recorded)[:12]}... vs {expected[:12]}...); re-run `falcon embed` for this dataset"
        )
    return None


__all__ = [
    "Embeddings",
    "EmbeddingsFile",
    "EmbeddingsWriter",
    "write_embeddings",
    "read_embeddings",
    "open_embeddings",
    "check_fingerprint",
    "EMBEDDINGS_SCHEMA_VERSION",
    "FINGERPRINT_ATTR",
]
