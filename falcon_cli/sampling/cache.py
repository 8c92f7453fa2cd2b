"""The embedding cache: per-pair projected [CLS] features collected from the training forward.

GRIT-VLP and FALCON compose the batches of epoch ``e + 1`` from the image/text features
each sample had when it was trained in epoch ``e`` (methods.md A-10; reference-code.md §1:
"nothing is computed in an extra pass"). :class:`EmbeddingCache` holds those features:
``N x D`` per modality (``D = 256`` for ALBEF), fp16, on one device, one row per pair of
the dataset.

Pair ids need not be contiguous (a dataset may hold ids ``[7, 3, 1000, ...]``): rows are
found through a sorted id index with :func:`torch.searchsorted`, vectorised and on the
cache's device.

Typical use inside the training loop::

    cache = EmbeddingCache(dataset_pair_ids, dim=256, device=device)
    for epoch in range(epochs):
        batches = composer.compose_epoch(epoch, shard, cache, generator)  # reads last epoch's features
        cache.reset()                                                    # clears ``filled`` only
        for batch in batches:
            out = model(...)
            cache.update(batch.pair_ids, out.image_feat, out.text_feat)
        cache.save(run / f"embeddings/epoch_{epoch}.h5", attrs)         # optional, rank 0

**DDP.** :func:`~falcon_cli.sampling.composers.shard_pair_ids` re-deals the pairs to ranks every epoch, so a
rank composes from pairs other ranks trained: the caller all-gathers ``pair_ids``, ``image_feat`` and
``text_feat`` across ranks (e.g. with :func:`falcon_cli.runtime.distributed.all_gather_cat`; batches have equal
sizes on every rank) and every rank stores them. A rank keeps only the rows of its own shards, this epoch's and
the next one's: :class:`~falcon_cli.sampling.sharded_cache.ShardedCache` holds two caches of about ``N / world``
rows (one process: this cache of every pair). (GRIT-VLP's code does not gather: each rank groups only what it
saw itself, and its partition freezes after epoch 0.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from falcon_cli.artifacts.embeddings import EmbeddingsWriter, read_embeddings
from falcon_cli.errors import FalconError

SAVE_CHUNK_ROWS = 65536
"""Rows written to ``embeddings.h5`` per chunk (bounds host memory during :meth:`EmbeddingCache.save`)."""


def as_id_tensor(pair_ids: Any, *, device: torch.device | str | None = None) -> torch.Tensor:
    """``pair_ids`` (tensor, array or sequence of ints) as a 1-d int64 tensor."""
    if isinstance(pair_ids, torch.Tensor):
        ids = pair_ids.detach()
        if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.is_complex():
            raise TypeError(f"pair ids must be integers, got a {ids.dtype} tensor")
        ids = ids.to(torch.int64)
    else:
        array = np.asarray(pair_ids)
        if array.size and not np.issubdtype(array.dtype, np.integer):
            raise TypeError(f"pair ids must be integers, got dtype {array.dtype}")
        ids = torch.from_numpy(array.astype(np.int64, copy=False).reshape(-1))
    if ids.ndim != 1:
        raise ValueError(f"pair ids must be 1-d, got shape {tuple(ids.shape)}")
    ids = ids.contiguous()
    return ids.to(device) if device is not None else ids


class EmbeddingCache:
    """Per-pair image and text features (fp16) on one device, indexed by pair id.

    Attributes:
        pair_ids: [N] int64, the dataset's pair ids in row order (on ``device``).
        image, text: [N, D] features (``dtype``, default fp16), row ``r`` belongs to ``pair_ids[r]``.
        filled: [N] bool, rows written by :meth:`update` (or :meth:`load`) since the last :meth:`reset`.
        written: [N] bool, rows written at least once (never cleared by :meth:`reset`); rows
            that are not ``written`` hold zeros.
    """

    def __init__(
        self, pair_ids: Any, dim: int = 256, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float16
    ):
        ids = as_id_tensor(pair_ids).to(device)
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        sorted_ids, order = torch.sort(ids)
        if len(ids) and int(sorted_ids[0]) < 0:
            raise FalconError(
                f"embedding cache: pair id {int(sorted_ids[0])} is negative; pair ids must be >= 0 "
                "(-1 marks 'no anchor' in the batch log)"
            )
        if len(ids) > 1 and bool((sorted_ids[1:] == sorted_ids[:-1]).any()):
            dup = int(sorted_ids[1:][sorted_ids[1:] == sorted_ids[:-1]][0])
            raise FalconError(f"embedding cache: pair id {dup} occurs more than once; pair ids must be unique")
        self.device = torch.device(device)
        self.dim = int(dim)
        self.dtype = dtype
        self.pair_ids = ids
        self._sorted_ids = sorted_ids
        self._sorted_rows = order
        n = len(ids)
        self.image = torch.zeros(n, dim, dtype=dtype, device=self.device)
        self.text = torch.zeros(n, dim, dtype=dtype, device=self.device)
        self.filled = torch.zeros(n, dtype=torch.bool, device=self.device)
        self.written = torch.zeros(n, dtype=torch.bool, device=self.device)

    def __len__(self) -> int:
        return len(self.pair_ids)

    # --- lookup -------------------------------------------------------------------------
    def lookup(self, pair_ids: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(row of each id, whether the cache holds it), both on the cache's device; the row of an id it does not
        hold is meaningless. For a cache that holds some of the pairs (a rank's shard, :mod:`sharded_cache`)."""
        ids = as_id_tensor(pair_ids, device=self.device)
        if len(self._sorted_ids) == 0:
            return torch.zeros_like(ids), torch.zeros(len(ids), dtype=torch.bool, device=self.device)
        pos = torch.searchsorted(self._sorted_ids, ids).clamp_(max=len(self._sorted_ids) - 1)
        return self._sorted_rows[pos], self._sorted_ids[pos] == ids

    def rows(self, pair_ids: Any) -> torch.Tensor:
        """Row index (int64, on the cache's device) of each id; :class:`FalconError` names an unknown id."""
        ids = as_id_tensor(pair_ids, device=self.device)
        if len(self._sorted_ids) == 0:
            if len(ids):
                raise FalconError(f"embedding cache: pair id {int(ids[0])} is not in the dataset (the cache is empty)")
            return ids
        rows, found = self.lookup(ids)
        if (
            torch.compiler.is_compiling()
        ):  # (inside pretrain.runtime.graph_step's captured step: no host read; ids are the dataset's)
            return rows
        bad = ~found
        if bool(bad.any()):
            raise FalconError(
                f"embedding cache: pair id {int(ids[bad][0])} is not in the dataset "
                f"({int(bad.sum())} unknown id(s) of {len(ids)})"
            )
        return rows

    @property
    def nbytes(self) -> int:
        """Bytes the cache holds on its device (features, ids, the id index and the masks)."""
        return sum(
            t.numel() * t.element_size()
            for t in (
                self.image,
                self.text,
                self.pair_ids,
                self._sorted_ids,
                self._sorted_rows,
                self.filled,
                self.written,
            )
        )

    def get(self, pair_ids: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(image [b, D], text [b, D]) features of ``pair_ids``, in the cache's dtype and device."""
        rows = self.rows(pair_ids)
        return self.image[rows], self.text[rows]

    # --- writing ------------------------------------------------------------------------
    @torch.no_grad()
    def update(self, pair_ids: Any, image_feat: torch.Tensor, text_feat: torch.Tensor) -> None:
        """Store the (detached, cast) features of ``pair_ids`` [b]; ``image_feat``/``text_feat`` are [b, D].

        Under DDP pass the features all-gathered across ranks (see the module docstring).
        If an id occurs twice in one call, one of its rows wins (on CUDA which one is unspecified).
        """
        self.store(self.rows(pair_ids), image_feat, text_feat)

    @torch.no_grad()
    def store(self, rows: torch.Tensor, image_feat: torch.Tensor, text_feat: torch.Tensor) -> None:
        """:meth:`update` by row index (from :meth:`rows` or :meth:`lookup`): rows become ``filled`` and ``written``."""
        shape = (len(rows), self.dim)
        if tuple(image_feat.shape) != shape or tuple(text_feat.shape) != shape:
            raise ValueError(
                f"embedding cache update: expected features of shape {shape}, got image "
                f"{tuple(image_feat.shape)} and text {tuple(text_feat.shape)}"
            )
        self.image[rows] = image_feat.detach().to(device=self.device, dtype=self.dtype)
        self.text[rows] = text_feat.detach().to(device=self.device, dtype=self.dtype)
        self.filled[rows] = True
        self.written[rows] = True

    def reset(self) -> None:
        """Start a new epoch: clear ``filled``. Features are kept (stale rows stay usable)."""
        self.filled.zero_()

    # --- embeddings.h5 ------------------------------------------------------------------
    def save(self, path: str | Path, attrs: dict[str, Any]) -> Path:
        """Write the ``written`` rows to ``embeddings.h5`` (atomic, chunked; see ``artifacts/embeddings.py``).

        ``attrs`` must hold ``model``, ``checkpoint``, ``dataset``, ``split``, ``epoch``.
        Rows never written (all zeros) are left out, because the file's rows must be
        unit-norm; the file's ``pair_id`` says which pairs it holds.
        """
        rows = torch.nonzero(self.written).flatten()
        dtype = "float16" if self.dtype == torch.float16 else "float32"
        with EmbeddingsWriter(path, n=len(rows), dim=self.dim, attrs=attrs, dtype=dtype) as writer:
            for start in range(0, len(rows), SAVE_CHUNK_ROWS):
                chunk = rows[start : start + SAVE_CHUNK_ROWS]
                writer.write(
                    start,
                    self.image[chunk].float().cpu().numpy(),
                    self.text[chunk].float().cpu().numpy(),
                    self.pair_ids[chunk].cpu().numpy(),
                )
        return Path(path)

    def load(self, path: str | Path, embeddings=None) -> dict[str, Any]:
        """Fill rows from an ``embeddings.h5`` (validated on read); returns the file's attributes.

        Loaded rows become ``filled`` and ``written``; other rows are untouched. Every id in
        the file must belong to the cache's dataset and the dimension must match.
        ``embeddings``: the file's :class:`~falcon_cli.artifacts.embeddings.Embeddings` when the
        caller has already read it (``path`` then only names it in errors).
        """
        emb = embeddings if embeddings is not None else read_embeddings(path)
        if emb.image.shape[1] != self.dim:
            raise FalconError(f"{path}: embeddings have dimension {emb.image.shape[1]}, the cache expects {self.dim}")
        try:
            rows = self.rows(emb.pair_id)
        except FalconError as exc:
            raise FalconError(f"{path}: {exc}") from None
        for start in range(0, len(rows), SAVE_CHUNK_ROWS):
            chunk = rows[start : start + SAVE_CHUNK_ROWS]
            stop = start + len(chunk)
            self.image[chunk] = torch.from_numpy(np.ascontiguousarray(emb.image[start:stop])).to(
                self.device, self.dtype
            )
            self.text[chunk] = torch.from_numpy(np.ascontiguousarray(emb.text[start:stop])).to(self.device, self.dtype)
        self.filled[rows] = True
        self.written[rows] = True
        return dict(emb.attrs)

    # --- exact resume -------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        """Everything needed to resume exactly (CPU tensors: ids, features, masks)."""
        return {
            "pair_ids": self.pair_ids.cpu(),
            "image": self.image.cpu(),
            "text": self.text.cpu(),
            "filled": self.filled.cpu(),
            "written": self.written.cpu(),
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore :meth:`state_dict`; the pair ids (and their order) and the shapes must match."""
        missing = [k for k in ("pair_ids", "image", "text", "filled", "written") if k not in state]
        if missing:
            raise FalconError(f"embedding cache state: keys {missing} are missing")
        ids = as_id_tensor(state["pair_ids"])
        if len(ids) != len(self) or not torch.equal(ids, self.pair_ids.cpu()):
            raise FalconError(
                f"embedding cache state: holds {len(ids)} pair ids that differ from the dataset's "
                f"{len(self)}; was the checkpoint made on another dataset?"
            )
        for key in ("image", "text"):
            if tuple(state[key].shape) != (len(self), self.dim):
                raise FalconError(
                    f"embedding cache state: '{key}' has shape {tuple(state[key].shape)}, "
                    f"expected {(len(self), self.dim)}"
                )
        # (copy_ moves and casts as it copies: no second device copy of the features, even for a moment)
        self.image.copy_(state["image"])
        self.text.copy_(state["text"])
        self.filled.copy_(state["filled"])
        self.written.copy_(state["written"])


__all__ = ["EmbeddingCache", "as_id_tensor"]
