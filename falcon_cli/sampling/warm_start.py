"""Warm start: epoch 0 composed from built search spaces and the embeddings that built them.

Without it, epoch 0 is uniform (there are no features yet). With ``pretrain.composer.search_spaces``
(a ``search_spaces.parquet`` from ``falcon build-search-spaces``) the composers see epoch 0
like any later epoch, except that the pairs come already grouped (the built spaces, in
order, instead of a shuffle cut into spaces) and the features are the embeddings' (any
encoder, any width: only similarities are used). Later epochs use the model's own cache.

Under DDP each rank composes epoch 0 from its own contiguous block of the spaces
(:func:`~falcon_cli.sampling.composers.shard_pair_ids` of the spaces' order), so each rank
reads from ``embeddings.h5`` only the rows of its block, in chunks: at 14M pairs and 8 ranks,
1.75M rows a rank instead of the whole 14 GB file (docs/scaling.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from falcon_cli.artifacts.embeddings import check_fingerprint, open_embeddings
from falcon_cli.artifacts.tables import SEARCH_SPACES, read_table
from falcon_cli.errors import FalconError
from falcon_cli.sampling.cache import EmbeddingCache
from falcon_cli.sampling.composers import shard_pair_ids

FILL_ROWS = 65536
"""Rows of ``embeddings.h5`` read and put into the cache at once (bounds the host memory of the fill)."""


@dataclass
class WarmStart:
    """What epoch 0 needs: ``order`` (every pair id, space after space, each in its position
    order), ``width`` (|M|: every space has this many pairs but the last, which may have
    fewer) and ``cache`` (the embeddings' features of this rank's block of ``order``, its
    ``shard_pair_ids(order, rank, world, None)``: the only pairs it composes epoch 0 from)."""

    order: torch.Tensor
    width: int
    cache: EmbeddingCache


def load_warm_start(
    spaces_path: Path,
    embeddings_path: Path,
    pair_ids: torch.Tensor,
    *,
    rank: int = 0,
    world: int = 1,
    device: torch.device | str = "cpu",
    fingerprint: str | None = None,
    dataset: str = "this dataset",
    warn=print,
) -> WarmStart:
    """Read and check epoch 0 of ``spaces_path`` against the dataset's ``pair_ids``, and the features
    of ``embeddings_path`` that process ``rank`` of ``world`` composes from. Every problem is one
    :class:`FalconError` line naming the file.

    ``fingerprint`` (the dataset's :func:`~falcon_cli.data.pairs.pairs_fingerprint`, named
    ``dataset`` in messages): when given, embeddings of another dataset are refused, and
    ``warn`` gets the line for embeddings that record no fingerprint. Every rank checks that
    every pair of the dataset has an embedding (8 B a pair: the file's ids), then reads its
    block's rows by ascending row in chunks of :data:`FILL_ROWS`."""
    if not Path(spaces_path).exists():
        raise FalconError(
            f"pretrain.composer.search_spaces: {spaces_path} not found; build it with `falcon build-search-spaces` "
            "(or chain build_search_spaces before pretrain and set pretrain.composer.search_spaces=run)"
        )
    table = read_table(spaces_path, SEARCH_SPACES)
    rows = table[table["epoch"] == 0]
    if rows.empty:
        raise FalconError(
            f"{spaces_path}: no search spaces for epoch 0 (epochs {sorted(set(table['epoch']))}); "
            "build them with `falcon build-search-spaces`"
        )
    expected = np.unique(pair_ids.cpu().numpy())
    present = np.sort(rows["pair_id"].to_numpy(dtype=np.int64))  # (unique per epoch: read_table checks it)
    if not np.array_equal(present, expected):
        missing, unknown = np.setdiff1d(expected, present).size, np.setdiff1d(present, expected).size
        raise FalconError(
            f"{spaces_path}: the epoch-0 spaces do not cover this dataset's pairs ({missing} pairs in no "
            f"space, {unknown} unknown pair ids); build the spaces from this dataset's embeddings"
        )
    rows = rows.sort_values(["space_id", "position"], kind="stable")
    sizes = np.unique(rows["space_id"].to_numpy(), return_counts=True)[1]
    width = int(sizes[0])
    if (sizes[:-1] != width).any() or sizes[-1] > width:
        raise FalconError(
            f"{spaces_path}: epoch-0 spaces have sizes {sorted(set(sizes.tolist()))}; composers need every "
            "space at |M| pairs except a smaller last one (as build-search-spaces writes them)"
        )
    order = torch.tensor(rows["pair_id"].to_numpy(dtype=np.int64))
    del table, rows
    block = shard_pair_ids(order, rank, world, None).numpy()  # exactly what EpochBatches composes epoch 0 from
    with open_embeddings(embeddings_path) as embeddings:
        if fingerprint is not None:
            warning = check_fingerprint(embeddings_path, embeddings.attrs, fingerprint, dataset)
            if warning is not None:
                warn(f"warning: {warning}")
        by_id = np.argsort(embeddings.pair_id, kind="stable")
        file_rows = _rows_of(embeddings.pair_id, by_id, expected)
        if (file_rows < 0).any():
            absent = expected[file_rows < 0]
            raise FalconError(
                f"{embeddings_path}: no embedding for {absent.size} of the dataset's pairs (e.g. pair_id "
                f"{absent[0]}); embed this dataset, or set search_spaces.embeddings to its embeddings.h5"
            )
        take = np.sort(_rows_of(embeddings.pair_id, by_id, block))  # ascending: the file is read front to back
        cache = EmbeddingCache(torch.from_numpy(embeddings.pair_id[take]), dim=embeddings.dim, device=device)
        for start in range(0, take.size, FILL_ROWS):
            chunk = take[start : start + FILL_ROWS]
            image, text = embeddings.take(chunk)
            cache.update(
                torch.from_numpy(embeddings.pair_id[chunk]).to(device),
                torch.from_numpy(image).to(device),
                torch.from_numpy(text).to(device),
            )
    return WarmStart(order=order, width=width, cache=cache)


def _rows_of(file_ids: np.ndarray, by_id: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """The file row of each of ``wanted`` (``by_id``: ``file_ids``' ascending order), -1 where it has none."""
    if not len(file_ids):
        return np.full(len(wanted), -1, dtype=np.int64)
    rows = by_id[np.minimum(np.searchsorted(file_ids, wanted, sorter=by_id), len(file_ids) - 1)]
    return np.where(file_ids[rows] == wanted, rows, -1)
