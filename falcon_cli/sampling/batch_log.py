"""The batch log (``batches.parquet``): every composed mini-batch, one row per slot.

On disk the log is a **directory** named ``batches.parquet/`` holding one Parquet part per
epoch (``epoch-000003.parquet``), or per epoch and rank (``epoch-000003.rank-0001.parquet``)
when each rank writes its own rows. Every part is a ``batches`` v2 table written
atomically with :func:`~falcon_cli.artifacts.tables.write_table`, so appending an epoch
never rewrites earlier ones, a killed process never leaves a half-written part, and
rewriting an epoch (after a resume) replaces its part whole. pyarrow and pandas read such
a directory as one table (``pd.read_parquet(dir)``); :func:`read_batch_log` does that with
schema validation and checks (epoch, step, rank, slot) is unique across all parts.

Columns (docs/artifacts.md): ``epoch, step, rank, slot, pair_id, anchor_pair_id, q, alpha,
beta, similarity_to_anchor, quantile_rank, sampler, safe_q, anchor_fn_density, chosen_is_fn``
(the last three: the oracle's view of each chained slot, :class:`~falcon_cli.sampling.composers.Batch`;
version-1 logs without them read as NaN). ``step`` is whatever the caller
passes (default: the batch's index within the epoch); ``slot`` is the position in the batch.

Typical use (GRIT / uniform: the whole epoch is known when it is composed)::

    log = BatchLog(run / "batches.parquet")
    batches = composer.compose_epoch(epoch, shard, cache, generator)
    log.extend(epoch, batches, rank=rank)
    log.write(epoch)

Composers that build batches step by step add them as they go (:meth:`BatchLog.add`) and
keep the pending rows in the checkpoint (:meth:`BatchLog.state_dict`) so a resumed epoch
logs every batch exactly once.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd
import torch

from falcon_cli.artifacts.tables import BATCHES, read_table, write_table
from falcon_cli.errors import FalconError
from falcon_cli.sampling.composers import Batch, batches_from_state, batches_state

PART_RE = re.compile(r"^epoch-(\d+)(?:\.rank-(\d+))?\.parquet$")


def part_name(epoch: int, rank: int | None = None) -> str:
    """File name of an epoch's part (with the rank when each rank writes its own parts)."""
    return f"epoch-{epoch:06d}.parquet" if rank is None else f"epoch-{epoch:06d}.rank-{rank:04d}.parquet"


class BatchLog:
    """Accumulate :class:`Batch` records as rows and write them one epoch part at a time.

    Args:
        path: the log directory (conventionally ``<run>/batches.parquet``); created on first write.
        part_rank: ``None`` (default) when one process (rank 0) writes every rank's rows
            (gather them first, or pass each rank's batches with its ``rank``); an int to
            name this process's parts by rank, so every rank can write its own parts.
    """

    def __init__(self, path: str | Path, *, part_rank: int | None = None):
        self.path = Path(path)
        self.part_rank = part_rank
        self._pending: dict[int, list[tuple[int, int, Batch]]] = {}

    def add(self, epoch: int, step: int, rank: int, batch: Batch) -> None:
        """Queue one batch's rows (slot = position in the batch)."""
        self._pending.setdefault(int(epoch), []).append((int(step), int(rank), batch))

    def extend(self, epoch: int, batches: Iterable[Batch], *, rank: int = 0, start_step: int = 0) -> None:
        """Queue an epoch's batches in order, as steps ``start_step, start_step + 1, ...``."""
        for i, batch in enumerate(batches):
            self.add(epoch, start_step + i, rank, batch)

    def pending_epochs(self) -> list[int]:
        """Epochs with rows not yet written."""
        return sorted(self._pending)

    def rows(self, epoch: int) -> pd.DataFrame:
        """The queued rows of ``epoch`` as a frame with the ``batches`` columns."""
        return batch_rows(epoch, self._pending.get(int(epoch), []))

    def write(self, epoch: int) -> Path:
        """Write the queued rows of ``epoch`` as its part (atomically replacing any earlier one)."""
        epoch = int(epoch)
        target = self.path / part_name(epoch, self.part_rank)
        write_table(target, self.rows(epoch), BATCHES)
        self._pending.pop(epoch, None)
        return target

    def flush(self) -> list[Path]:
        """Write every epoch with queued rows."""
        return [self.write(epoch) for epoch in self.pending_epochs()]

    def state_dict(self) -> dict[str, Any]:
        """Queued (unwritten) rows, for checkpoints."""
        return {
            str(epoch): {
                "steps": [s for s, _, _ in items],
                "ranks": [r for _, r, _ in items],
                "batches": batches_state([b for _, _, b in items]),
            }
            for epoch, items in self._pending.items()
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (replaces whatever is queued)."""
        self._pending = {}
        for epoch, entry in state.items():
            batches = batches_from_state(entry["batches"])
            self._pending[int(epoch)] = list(zip(map(int, entry["steps"]), map(int, entry["ranks"]), batches))


def batch_rows(epoch: int, items: list[tuple[int, int, Batch]]) -> pd.DataFrame:
    """Rows (one per slot) of ``(step, rank, batch)`` items of one epoch, in the ``batches`` column order."""
    sizes = np.array([len(b) for _, _, b in items], dtype=np.int64)
    total = int(sizes.sum())

    def cat(name: str, dtype: torch.dtype) -> np.ndarray:
        if not items:
            return np.empty(0, dtype=np.int64 if dtype == torch.int64 else np.float32)
        return torch.cat([getattr(b, name).to(dtype) for _, _, b in items]).numpy()

    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]) if len(sizes) else np.empty(0, dtype=np.int64)
    slot = np.arange(total, dtype=np.int64) - np.repeat(starts, sizes)
    return pd.DataFrame(
        {
            "epoch": np.full(total, epoch, dtype=np.int64),
            "step": np.repeat(np.array([s for s, _, _ in items], dtype=np.int64), sizes),
            "rank": np.repeat(np.array([r for _, r, _ in items], dtype=np.int64), sizes),
            "slot": slot,
            "pair_id": cat("pair_ids", torch.int64),
            "anchor_pair_id": cat("anchor_pair_id", torch.int64),
            "q": cat("q", torch.float32),
            "alpha": cat("alpha", torch.float32),
            "beta": cat("beta", torch.float32),
            "similarity_to_anchor": cat("similarity_to_anchor", torch.float32),
            "quantile_rank": cat("quantile_rank", torch.float32),
            "sampler": np.repeat(np.array([b.sampler for _, _, b in items], dtype=object), sizes),
            **{name: cat(name, torch.float32) for name in Batch.ORACLE_FIELDS},
        }
    )


def batch_log_parts(path: str | Path) -> list[tuple[int, int | None, Path]]:
    """``(epoch, rank or None, file)`` of every part in a batch-log directory, sorted."""
    path = Path(path)
    parts = []
    for file in path.iterdir():
        match = PART_RE.match(file.name)
        if match and file.is_file():
            parts.append((int(match.group(1)), None if match.group(2) is None else int(match.group(2)), file))
    return sorted(parts, key=lambda p: (p[0], -1 if p[1] is None else p[1]))


def read_batch_log(path: str | Path, *, epochs: Iterable[int] | None = None) -> pd.DataFrame:
    """Read a batch log (a part directory, or a single ``batches`` Parquet file) as one frame.

    Every part is validated (schema name, version, columns, types); (epoch, step, rank,
    slot) must be unique over the whole log. ``epochs`` reads only those epochs' parts.
    Rows come sorted by (epoch, step, rank, slot).
    """
    path = Path(path)
    if path.is_file():
        frame = read_table(path, BATCHES)
        if epochs is not None:
            frame = frame[frame["epoch"].isin(list(epochs))]
    elif path.is_dir():
        wanted = None if epochs is None else {int(e) for e in epochs}
        files = [f for e, _, f in batch_log_parts(path) if wanted is None or e in wanted]
        frames = [read_table(f, BATCHES) for f in files]
        for file, frame in zip(files, frames):
            match = PART_RE.match(file.name)
            assert match is not None
            if len(frame) and not (frame["epoch"] == int(match.group(1))).all():
                raise FalconError(
                    f"{file}: holds rows of epochs {sorted(frame['epoch'].unique())[:5]}, "
                    f"expected only epoch {int(match.group(1))}"
                )
        if frames:
            frame = pd.concat(frames, ignore_index=True)
        else:
            frame = pd.DataFrame({name: pd.Series(dtype=dtype.to_pandas_dtype()) for name, dtype in BATCHES.columns})
    else:
        raise FalconError(f"{path}: not found (expected a batch-log directory of epoch parts or a Parquet file)")
    key = list(BATCHES.unique)
    duplicated = frame.duplicated(key, keep=False)
    if duplicated.any():
        first = frame[duplicated].iloc[0]
        raise FalconError(
            f"{path}: duplicate rows for ({', '.join(f'{c}={first[c]}' for c in key)}); "
            f"({', '.join(key)}) must be unique across the whole batch log"
        )
    return frame.sort_values(["epoch", "step", "rank", "slot"], kind="stable").reset_index(drop=True)


__all__ = ["BatchLog", "batch_rows", "batch_log_parts", "part_name", "read_batch_log"]
