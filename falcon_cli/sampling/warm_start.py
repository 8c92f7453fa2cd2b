"""Warm start: epoch 0 composed from built search spaces and the embeddings that built them.

Without it, epoch 0 is uniform (there are no features yet). With ``pretrain.search_spaces``
(a ``search_spaces.parquet`` from ``falcon build-search-spaces``) the composers see epoch 0
like any later epoch, except that the pairs come already grouped (the built spaces, in
order, instead of a shuffle cut into spaces) and the features are the embeddings' (any
encoder, any width: only similarities are used). Later epochs use the model's own cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from falcon_cli.artifacts.embeddings import check_fingerprint, read_embeddings
from falcon_cli.artifacts.tables import SEARCH_SPACES, read_table
from falcon_cli.errors import FalconError
from falcon_cli.sampling.cache import EmbeddingCache


@dataclass
class WarmStart:
    """What epoch 0 needs: ``order`` (the pair ids, space after space, each in its position
    order), ``width`` (|M|: every space has this many pairs but the last, which may have
    fewer) and ``cache`` (the embeddings' features of every pair)."""

    order: torch.Tensor
    width: int
    cache: EmbeddingCache


def load_warm_start(spaces_path: Path, embeddings_path: Path, pair_ids: torch.Tensor, *,
                    device: torch.device | str = "cpu", fingerprint: str | None = None,
                    dataset: str = "this dataset", warn=print) -> WarmStart:
    """Read and check epoch 0 of ``spaces_path`` against the dataset's ``pair_ids``, and the features
    of ``embeddings_path``. Every problem is one :class:`FalconError` line naming the file.

    ``fingerprint`` (the dataset's :func:`~falcon_cli.data.pairs.pairs_fingerprint`, named
    ``dataset`` in messages): when given, embeddings of another dataset are refused, and
    ``warn`` gets the line for embeddings that record no fingerprint."""
    if not Path(spaces_path).exists():
        raise FalconError(f"pretrain.search_spaces: {spaces_path} not found; build it with `falcon build-search-spaces` "
                          "(or chain build_search_spaces before pretrain and set pretrain.search_spaces=run)")
    table = read_table(spaces_path, SEARCH_SPACES)
    rows = table[table["epoch"] == 0]
    if rows.empty:
        raise FalconError(f"{spaces_path}: no search spaces for epoch 0 (epochs {sorted(set(table['epoch']))}); "
                          "build them with `falcon build-search-spaces`")
    expected = set(pair_ids.tolist())
    present = set(rows["pair_id"].tolist())
    if present != expected:
        missing, unknown = len(expected - present), len(present - expected)
        raise FalconError(f"{spaces_path}: the epoch-0 spaces do not cover this dataset's pairs ({missing} pairs in no "
                          f"space, {unknown} unknown pair ids); build the spaces from this dataset's embeddings")
    rows = rows.sort_values(["space_id", "position"], kind="stable")
    sizes = rows.groupby("space_id", sort=True).size().to_numpy()
    width = int(sizes[0])
    if (sizes[:-1] != width).any() or sizes[-1] > width:
        raise FalconError(f"{spaces_path}: epoch-0 spaces have sizes {sorted(set(sizes.tolist()))}; composers need every "
                          "space at |M| pairs except a smaller last one (as build-search-spaces writes them)")
    embeddings = read_embeddings(embeddings_path)
    if fingerprint is not None:
        warning = check_fingerprint(embeddings_path, embeddings.attrs, fingerprint, dataset)
        if warning is not None:
            warn(f"warning: {warning}")
    rows_of = {int(p): r for r, p in enumerate(embeddings.pair_id)}
    absent = [p for p in expected if p not in rows_of]
    if absent:
        raise FalconError(f"{embeddings_path}: no embedding for {len(absent)} of the dataset's pairs (e.g. pair_id "
                          f"{absent[0]}); embed this dataset, or set search_spaces.embeddings to its embeddings.h5")
    ids = pair_ids.cpu()
    take = np.array([rows_of[int(p)] for p in ids.tolist()], dtype=np.int64)
    cache = EmbeddingCache(ids, dim=int(embeddings.image.shape[1]), device=device)
    cache.update(ids.to(device), torch.from_numpy(np.asarray(embeddings.image[take], dtype=np.float32)).to(device),
                 torch.from_numpy(np.asarray(embeddings.text[take], dtype=np.float32)).to(device))
    order = torch.tensor(rows["pair_id"].to_numpy(dtype=np.int64))
    return WarmStart(order=order, width=width, cache=cache)
