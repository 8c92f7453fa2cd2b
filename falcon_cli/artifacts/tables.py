"""Versioned Parquet tables: one :class:`TableSchema` per artifact, one writer, one validating reader.

The schema name and version travel inside the Parquet file's metadata, so a reader can
refuse a file written by an incompatible falcon with one clear line. Column meanings are
documented in ``docs/artifacts.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from falcon_cli.artifacts.atomic import atomic_path
from falcon_cli.errors import FalconError

META_NAME = b"falcon.schema"
META_VERSION = b"falcon.schema_version"


@dataclass(frozen=True)
class TableSchema:
    """A named, versioned table: ordered columns with Arrow types, optional unique-key columns."""

    name: str
    version: int
    columns: tuple[tuple[str, pa.DataType], ...]
    unique: tuple[str, ...] = field(default=())
    """Columns whose combination must be unique (checked on read and write); empty = no check."""
    added: Mapping[str, int] = field(default_factory=dict)
    """Column -> the version that added it. A file of an earlier version (without those columns) is
    still read: the columns it lacks come back null (NaN for floats)."""

    @property
    def arrow(self) -> pa.Schema:
        """The Arrow schema, with the falcon name and version in its metadata."""
        return pa.schema(
            list(self.columns), metadata={META_NAME: self.name.encode(), META_VERSION: str(self.version).encode()}
        )

    @property
    def names(self) -> list[str]:
        """Column names in order."""
        return [name for name, _ in self.columns]


SEARCH_SPACES = TableSchema(
    "search_spaces",
    1,
    (
        ("pair_id", pa.int64()),
        ("space_id", pa.int64()),
        ("position", pa.int64()),
        ("epoch", pa.int64()),
        ("method", pa.string()),
        ("seed", pa.int64()),
    ),
    unique=("epoch", "pair_id"),
)
"""Which search space each pair belongs to in each epoch (``search_spaces.parquet``)."""

BATCHES = TableSchema(
    "batches",
    3,
    (
        ("epoch", pa.int64()),
        ("step", pa.int64()),
        ("rank", pa.int64()),
        ("slot", pa.int64()),
        ("pair_id", pa.int64()),
        ("anchor_pair_id", pa.int64()),
        ("q", pa.float32()),
        ("alpha", pa.float32()),
        ("beta", pa.float32()),
        ("similarity_to_anchor", pa.float32()),
        ("quantile_rank", pa.float32()),
        ("sampler", pa.string()),
        ("safe_q", pa.float32()),
        ("anchor_fn_density", pa.float32()),
        ("chosen_is_fn", pa.float32()),
        ("fn_at_q0", pa.float32()),
        ("fn_at_q25", pa.float32()),
        ("fn_at_q50", pa.float32()),
        ("fn_at_q75", pa.float32()),
        ("fn_at_q100", pa.float32()),
    ),
    unique=("epoch", "step", "rank", "slot"),
    added={
        "safe_q": 2,
        "anchor_fn_density": 2,
        "chosen_is_fn": 2,
        "fn_at_q0": 3,
        "fn_at_q25": 3,
        "fn_at_q50": 3,
        "fn_at_q75": 3,
        "fn_at_q100": 3,
    },
)
"""Every composed mini-batch, one row per slot (``batches.parquet``, the batch log). Version 2 added
the oracle's view of each chained slot (shapes world, quantile composers): ``safe_q``,
``anchor_fn_density``, ``chosen_is_fn``; version 3 whether the pick of each fixed q (0, 0.25, 0.5, 0.75, 1) for
the same anchor would have been a false negative, ``fn_at_q0`` … ``fn_at_q100``. Older logs read with the
columns they lack NaN."""

AUDIT = TableSchema(
    "audit",
    1,
    (
        ("epoch", pa.int64()),
        ("step", pa.int64()),
        ("rank", pa.int64()),
        ("train_step", pa.int64()),
        ("kind", pa.string()),
        ("anchor", pa.int64()),
        ("negative", pa.int64()),
        ("direction", pa.string()),
        ("image_pair", pa.int64()),
        ("caption_pair", pa.int64()),
        ("q", pa.float32()),
        ("hardness", pa.float32()),
        ("similarity", pa.float32()),
        ("sampler", pa.string()),
        ("judge", pa.string()),
        ("score", pa.float32()),
        ("is_false_negative", pa.bool_()),
        ("oracle", pa.bool_()),
        ("caption_specificity", pa.int64()),
    ),
)
"""Judged negatives of a run (``audit/audit.parquet``); ``oracle`` and ``caption_specificity`` are
null where the data has no oracle."""

COMPATIBILITY = TableSchema(
    "compatibility",
    1,
    (("image_id", pa.int64()), ("caption_id", pa.int64())),
    unique=("image_id", "caption_id"),
)
"""Every truly compatible (image, caption) pair of a split, by the shapes oracle (``compatibility_<split>.parquet``)."""

SCHEMAS: dict[str, TableSchema] = {s.name: s for s in (SEARCH_SPACES, BATCHES, AUDIT, COMPATIBILITY)}


def _to_arrow(data: pd.DataFrame | Mapping[str, Any], schema: TableSchema, where: str) -> pa.Table:
    frame = data if isinstance(data, pd.DataFrame) else pd.DataFrame(dict(data))
    missing = [c for c in schema.names if c not in frame.columns]
    extra = [c for c in frame.columns if c not in schema.names]
    if missing or extra:
        raise FalconError(
            f"{where}: columns do not match schema '{schema.name}' v{schema.version} "
            f"(missing {missing}, unexpected {extra})"
        )
    try:
        return pa.Table.from_pandas(frame[schema.names], schema=schema.arrow, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, TypeError) as exc:
        raise FalconError(f"{where}: values do not fit schema '{schema.name}': {exc}") from None


def _check_unique(frame: pd.DataFrame, schema: TableSchema, where: str) -> None:
    if schema.unique and len(frame) and frame.duplicated(list(schema.unique)).any():
        first = frame[frame.duplicated(list(schema.unique), keep=False)].iloc[0]
        key = ", ".join(f"{c}={first[c]}" for c in schema.unique)
        raise FalconError(f"{where}: duplicate rows for ({key}); ({', '.join(schema.unique)}) must be unique")


def write_table(path: str | Path, data: pd.DataFrame | Mapping[str, Any], schema: TableSchema) -> Path:
    """Validate ``data`` against ``schema`` and write it atomically as Parquet (zstd)."""
    path = Path(path)
    table = _to_arrow(data, schema, str(path))
    _check_unique(table.to_pandas(), schema, str(path))
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    return path


def read_table(path: str | Path, schema: TableSchema) -> pd.DataFrame:
    """Read a Parquet artifact, checking schema name, version, columns, types and unique keys."""
    path = Path(path)
    if not path.exists():
        raise FalconError(f"{path}: not found")
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise FalconError(f"{path}: not a readable Parquet file ({exc})") from None
    meta = table.schema.metadata or {}
    name = meta.get(META_NAME, b"").decode() or None
    version = meta.get(META_VERSION, b"").decode() or None
    if name != schema.name:
        raise FalconError(f"{path}: holds a '{name}' table, expected '{schema.name}'")
    readable = [str(v) for v in range(1 if schema.added else schema.version, schema.version + 1)]
    if version not in readable:
        raise FalconError(
            f"{path}: '{schema.name}' schema version {version}, this falcon reads version "
            f"{schema.version}{' (and earlier)' if schema.added else ''}"
        )
    for column, dtype in schema.columns:
        if column not in table.column_names and schema.added.get(column, 1) > int(version):
            table = table.append_column(pa.field(column, dtype), pa.nulls(len(table), dtype))  # added later: null
        elif column not in table.column_names:
            raise FalconError(f"{path}: column '{column}' is missing")
        if not table.schema.field(column).type.equals(dtype):
            raise FalconError(f"{path}: column '{column}' has type {table.schema.field(column).type}, expected {dtype}")
    frame = table.select(schema.names).to_pandas()
    _check_unique(frame, schema, str(path))
    return frame
