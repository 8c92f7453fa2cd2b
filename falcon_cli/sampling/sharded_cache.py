"""A rank's embedding cache under DDP: the rows it composes from this epoch and the rows it fills for the next.

Before, every rank held the whole :class:`~falcon_cli.sampling.cache.EmbeddingCache` (``N`` rows; 14 GiB at 14M
pairs in fp16) although in epoch ``e`` it composes only from its own shard. The shard generator is identical on
every rank, so at the start of epoch ``e`` each rank knows its shard of epoch ``e + 1`` as well (dealt from a copy
of the generator, the real one untouched). :class:`ShardedCache` therefore holds two caches of about ``N / world``
rows each:

* ``reading``: the pairs of this epoch's shard, with their latest features (those of epoch ``e - 1``, or of an
  earlier epoch for a pair not trained since): what the composer reads at the start of the epoch and FALCON's
  search spaces snapshot one at a time during it;
* ``filling``: the pairs of next epoch's shard, filled from every step's all-gathered features (the all-gather
  stays: a rank's next shard holds pairs other ranks train now; rows of other shards are dropped).

Both take every step's features of the pairs they hold, so each always equals the full cache restricted to its
rows: a space FALCON snapshots late in the epoch sees exactly what it saw in the full cache (a pair that padding
deals to two ranks is trained twice in an epoch). The one exception is a pair of the next shard not trained this
epoch (``max_steps_per_epoch``, ``drop_last``): its latest features sit in the reading cache of the rank that held
it this epoch. :meth:`ShardedCache.end` hands those over (chunked all-gathers of the stale rows only; none when
every pair was trained), then drops the reading cache: between epochs a rank holds one cache, during an epoch two.
At the next :meth:`ShardedCache.begin` the filling cache becomes the reading one.

A single process (``world == 1``) holds one cache of every pair that is both reading and filling: exactly the
cache it held before, no more memory and no extra work.

The epoch's ``embeddings/epoch_<e>.h5`` (:meth:`ShardedCache.save`) is written by rank 0 from chunked gathers of every
rank's rows: the union of the filling caches is every pair, and no rank ever holds more than one chunk of another's.
Checkpoints hold the caches per rank (``rank-<r>.pt``, :class:`~falcon_cli.runtime.train_state.TrainState`).

:func:`cache_bytes_per_rank` says what this costs at ``N`` pairs and world ``W`` without building anything.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from falcon_cli.artifacts.embeddings import EmbeddingsWriter
from falcon_cli.errors import FalconError
from falcon_cli.runtime import distributed as D
from falcon_cli.sampling.cache import SAVE_CHUNK_ROWS, EmbeddingCache, as_id_tensor

HAND_OVER_ROWS = 65536
"""Rows every rank receives per round of :meth:`ShardedCache.end`'s hand-over (all ranks' chunks together): 64 MiB of
fp16 256-d features whatever the world size."""

_ROW_TENSORS_BYTES = 3 * 8 + 2
"""Bytes per row of an :class:`EmbeddingCache` besides its features: ``pair_ids``, the sorted id index (ids and
rows, int64) and the ``filled`` / ``written`` masks."""


class ShardedCache:
    """This rank's embedding caches (see the module docstring).

    Args:
        pair_ids: every pair id of the dataset.
        dim: feature width (256 for ALBEF).
        device: where the features live (the training device: the collectives run there).
        dtype: feature dtype (fp16).
        rank, world: this process and how many train.

    Attributes:
        reading: the cache of this epoch's shard (None between epochs when ``world > 1``).
        filling: the cache of next epoch's shard (the same object as ``reading`` when ``world == 1``).
    """

    def __init__(
        self,
        pair_ids: Any,
        dim: int = 256,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float16,
        rank: int = 0,
        world: int = 1,
    ):
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"need 0 <= rank < world, got rank {rank}, world {world}")
        self.pair_ids = as_id_tensor(pair_ids).cpu()
        self.dim, self.device, self.dtype, self.rank, self.world = int(dim), torch.device(device), dtype, rank, world
        self.reading: EmbeddingCache | None = None
        self.filling: EmbeddingCache | None = None
        self.owned: torch.Tensor | None = None
        """Rows of :attr:`filling` this rank writes to ``embeddings.h5`` (None: all): a pair padding deals to two
        ranks is written once, by the first."""
        self._full = False  # filling holds every pair (one process, or a checkpoint from before sharding)
        if world == 1:
            self.reading = self.filling = self._empty(self.pair_ids)
            self._full = True

    # --- the epoch ----------------------------------------------------------------------------------
    def begin(self, shard: Any, next_shard: Any | None) -> EmbeddingCache:
        """Start an epoch whose shard is ``shard`` (this rank's pair ids) and whose successor's is ``next_shard``
        (ignored when ``world == 1``); returns the reading cache, for the composer.

        The last epoch's filling cache becomes the reading one; it must hold exactly ``shard``'s pairs (the shards
        were dealt from identical generator states), else this raises: composing from missing features would
        silently change the batches. At the first epoch (nothing written yet) there is none (None is returned);
        after a checkpoint that holds every pair, the reading cache is built from it."""
        if self.world == 1:
            return self.reading
        shard_ids = torch.sort(as_id_tensor(shard).cpu()).values
        source, self.reading, self.filling = self.filling, None, None
        if source is not None and not self._full and not torch.equal(source.pair_ids.cpu(), shard_ids):
            raise FalconError(
                f"embedding cache (rank {self.rank}): this epoch's shard ({len(shard_ids)} pairs) is not "
                f"the one the cache was filled for ({len(source)} pairs); the shard generator's state "
                "differs from the one that dealt it"
            )
        # The first epoch (nothing filled yet) gets no reading cache: nothing would read it (epoch 0 is uniform, or
        # composed from a warm start's own cache), and it would cost N / world rows (1.7 GiB at 14M pairs, world 8).
        self.reading = None if source is None else source if not self._full else self._copy(source, shard_ids)
        del source  # (a full cache from an old checkpoint goes before the next one is allocated)
        next_ids = as_id_tensor(next_shard).cpu()
        next_sorted, order = torch.sort(next_ids)
        self.filling = self._empty(next_sorted)
        self.owned = first_holder(len(next_ids), len(self.pair_ids), self.rank)[order].to(self.device)
        self._full = False
        return self.reading

    def reset(self) -> None:
        """The epoch's batches are composed: the reading cache's ``filled`` now records what this epoch trains."""
        if self.reading is not None:
            self.reading.reset()

    @torch.no_grad()
    def update(self, pair_ids: Any, image_feat: torch.Tensor, text_feat: torch.Tensor) -> None:
        """Store a step's features: ``pair_ids`` [b] and ``image_feat``/``text_feat`` [b, D] all-gathered across the
        ranks (every rank passes the same). Each cache keeps the rows of its pairs, in the order given (of an id
        given twice the same one wins as in the full cache)."""
        if self.world == 1:
            self.filling.update(pair_ids, image_feat, text_feat)  # (exactly the single cache's update)
            return
        ids = as_id_tensor(pair_ids, device=self.device)
        for cache in self._caches():
            rows, found = cache.lookup(ids)
            keep = torch.nonzero(found).flatten()
            cache.store(rows[keep], image_feat[keep], text_feat[keep])

    def end(self) -> None:
        """The epoch is trained (every rank calls this: a collective). The pairs of next epoch's shard that were not
        trained this epoch get their latest features from the ranks that held them; the reading cache goes."""
        if self.world == 1 or self.reading is None:
            return
        if self.reading is not self.filling:
            self._hand_over()
        self.reading = None

    def _hand_over(self) -> None:
        """Rows each rank's reading cache holds that were written before but not trained this epoch, all-gathered in
        rounds of :data:`HAND_OVER_ROWS` rows, into the filling caches' rows not trained this epoch either."""
        reading, filling = self.reading, self.filling
        stale = torch.nonzero(reading.written & ~reading.filled).flatten()
        counts = D.all_gather_cat(torch.tensor([len(stale)], dtype=torch.int64, device=self.device))
        chunk = max(1, HAND_OVER_ROWS // self.world)
        for start in range(0, int(counts.max()), chunk):
            part = stale[start : start + chunk]
            ids = torch.full((chunk,), -1, dtype=torch.int64, device=self.device)  # -1: padding (ids are >= 0)
            image = torch.zeros(chunk, self.dim, dtype=self.dtype, device=self.device)
            text = torch.zeros_like(image)
            ids[: len(part)], image[: len(part)], text[: len(part)] = (
                reading.pair_ids[part],
                reading.image[part],
                reading.text[part],
            )
            ids, image, text = D.all_gather_cat(ids), D.all_gather_cat(image), D.all_gather_cat(text)
            if not len(filling):
                continue
            rows, found = filling.lookup(ids)
            # (a pair padding put in two reading caches arrives twice, with the same features)
            take = torch.nonzero(found & ~filling.filled[rows]).flatten()
            filling.image[rows[take]] = image[take]
            filling.text[rows[take]] = text[take]
            filling.written[rows[take]] = True

    # --- embeddings.h5 ---------------------------------------------------------------------------------
    def save(self, path: str | Path, attrs: dict[str, Any]) -> Path | None:
        """Write every written pair's features to ``embeddings.h5`` (atomic; after :meth:`end`; a collective):
        rank 0 writes them as they come in rounds of chunked gathers, a chunk from each rank per round, so no
        process ever holds more than one round of another's rows. Returns the path on rank 0, None elsewhere.
        ``attrs`` as :meth:`EmbeddingCache.save`. Under DDP the rows come round by round, rank by rank within a
        round, each rank's by ascending pair id (readers key on ``pair_id``)."""
        cache = self.filling
        if self.world == 1:
            return cache.save(path, attrs)
        main = self.rank == 0
        rows = torch.nonzero(cache.written if self.owned is None else cache.written & self.owned).flatten()
        counts = D.all_gather_cat(torch.tensor([len(rows)], dtype=torch.int64, device=self.device))
        writer, problem = None, None
        if main:
            try:
                writer = EmbeddingsWriter(
                    path,
                    n=int(counts.sum()),
                    dim=self.dim,
                    attrs=attrs,
                    dtype="float16" if self.dtype == torch.float16 else "float32",
                )
            except Exception as exc:  # (said to every rank, which would otherwise wait in the gathers below)
                problem = str(exc) or type(exc).__name__
        problem = D.broadcast_object(problem, 0)
        if problem is not None:
            raise FalconError(f"{path}: rank 0 could not write the epoch's embeddings ({problem})")
        # Gathers (NCCL and gloo alike) on the group every rank is in: point-to-point sends would make NCCL set up a
        # communicator, and its buffers, for every pair of ranks.
        chunk = max(1, SAVE_CHUNK_ROWS // self.world)
        offset = 0
        try:
            for start in range(0, int(counts.max()), chunk):
                part = rows[start : start + chunk]
                ids = torch.full((chunk,), -1, dtype=torch.int64, device=self.device)  # -1: padding
                image = torch.zeros(chunk, self.dim, dtype=self.dtype, device=self.device)
                text = torch.zeros_like(image)
                ids[: len(part)], image[: len(part)], text[: len(part)] = (
                    cache.pair_ids[part],
                    cache.image[part],
                    cache.text[part],
                )
                gathered = []
                for tensor in (ids, image, text):
                    parts = [torch.empty_like(tensor) for _ in range(self.world)] if main else None
                    dist.gather(tensor, parts, dst=0)
                    gathered.append(torch.cat(parts) if main else None)
                if main:
                    ids, image, text = gathered
                    keep = torch.nonzero(ids >= 0).flatten()
                    writer.write(
                        offset,
                        image[keep].float().cpu().numpy(),
                        text[keep].float().cpu().numpy(),
                        ids[keep].cpu().numpy(),
                    )
                    offset += len(keep)
        except BaseException:
            if writer is not None:
                writer.abort()  # (the target stays as it was)
            raise
        if not main:
            return None
        return writer.close()

    # --- what it holds -------------------------------------------------------------------------------
    def _caches(self) -> list[EmbeddingCache]:
        """The distinct caches held now."""
        caches = [c for c in (self.reading, self.filling) if c is not None]
        return caches[:1] if len(caches) == 2 and caches[0] is caches[1] else caches

    @property
    def rows(self) -> int:
        """Rows held now, over both caches (``N`` for one process; about ``2 N / world`` during an epoch)."""
        return sum(len(c) for c in self._caches())

    @property
    def nbytes(self) -> int:
        """Device bytes held now (features, ids, index and masks of both caches)."""
        owned = 0 if self.owned is None else self.owned.numel()
        return sum(c.nbytes for c in self._caches()) + owned

    def _empty(self, ids: torch.Tensor) -> EmbeddingCache:
        return EmbeddingCache(ids, self.dim, device=self.device, dtype=self.dtype)

    def _copy(self, source: EmbeddingCache | None, ids: torch.Tensor) -> EmbeddingCache:
        """A cache of ``ids`` with the rows ``source`` holds of them (None: nothing written yet), chunk by chunk."""
        cache = self._empty(ids)
        if source is None:
            return cache
        for start in range(0, len(ids), SAVE_CHUNK_ROWS):
            rows, found = source.lookup(cache.pair_ids[start : start + SAVE_CHUNK_ROWS])
            mine = torch.nonzero(found).flatten() + start
            theirs = rows[found]
            cache.image[mine], cache.text[mine] = source.image[theirs], source.text[theirs]
            cache.filled[mine], cache.written[mine] = source.filled[theirs], source.written[theirs]
        return cache

    # --- checkpoints (a per-rank part) ---------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This rank's caches (CPU tensors); both during an epoch, one between epochs."""
        same = self.reading is not None and self.reading is self.filling
        return {
            "world": self.world,
            "full": self._full,
            "reading_is_filling": same,
            "reading": None if self.reading is None or same else self.reading.state_dict(),
            "filling": None if self.filling is None else self.filling.state_dict(),
            "owned": None if self.owned is None else self.owned.cpu(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`. Also takes the whole cache a checkpoint from before sharding holds (an
        :meth:`EmbeddingCache.state_dict` of every pair): the ranks then use it as one cache, as before, until the
        next epoch begins and each keeps only its shard."""
        if "pair_ids" in state:
            full = self.filling if self.world == 1 else self._empty(self.pair_ids)
            full.load_state_dict(state)
            self.reading = self.filling = full
            self.owned = None if self.world == 1 else torch.full((len(full),), self.rank == 0, device=self.device)
            self._full = True
            return
        if state["world"] != self.world:
            raise FalconError(f"embedding cache state: saved by {state['world']} processes, restored by {self.world}")
        if self.world == 1:  # into the one cache it holds (a second copy of every pair would double the peak)
            self.filling.load_state_dict(state["filling"])
            return
        self.reading = self.filling = None  # (before the restored ones are allocated)
        self.filling = self._restore(state["filling"])
        self.reading = self.filling if state["reading_is_filling"] else self._restore(state["reading"])
        self.owned = None if state["owned"] is None else state["owned"].to(self.device, torch.bool)
        self._full = bool(state["full"])

    def _restore(self, state: dict[str, torch.Tensor] | None) -> EmbeddingCache | None:
        if state is None:
            return None
        ids = as_id_tensor(state["pair_ids"]).cpu()
        everyone = torch.sort(self.pair_ids).values
        position = torch.searchsorted(everyone, ids).clamp_(max=max(len(everyone) - 1, 0))
        if len(ids) and (not len(everyone) or bool((everyone[position] != ids).any())):
            raise FalconError(
                "embedding cache state: holds pair ids that are not in the dataset; was the checkpoint "
                "made on another dataset?"
            )
        cache = self._empty(ids)
        cache.load_state_dict(state)
        return cache


def first_holder(shard_size: int, pairs: int, rank: int) -> torch.Tensor:
    """[shard_size] bool: which of rank ``rank``'s shard ids it is the first rank to hold, for shards dealt by
    :func:`~falcon_cli.sampling.composers.shard_pair_ids` (``mode="pad"``) from ``pairs`` ids. Rank ``r`` holds
    positions ``r * shard_size ...`` of the cyclically extended permutation; positions ``>= pairs`` repeat its first
    ids, held already by a lower rank."""
    return torch.arange(shard_size) < max(0, min(shard_size, pairs - rank * shard_size))


def cache_bytes_per_rank(
    pairs: int, world: int, *, dim: int = 256, dtype: torch.dtype = torch.float16
) -> dict[str, int]:
    """What falcon's embedding cache costs one rank at ``pairs`` pairs and ``world`` ranks (bytes; no allocation).

    Returns:
        ``rows``: rows of one cache (``ceil(pairs / world)``; ``pairs`` when ``world == 1``);
        ``device_bytes``: held on the training device during an epoch (reading + filling; one cache of every pair
        when ``world == 1``);
        ``between_epochs_bytes``: held on the device between epochs (the filling cache only);
        ``transient_bytes``: device buffers on top while the epoch ends (a round of the hand-over, or a chunk of
        ``embeddings.h5`` on its way to rank 0, whichever is larger);
        ``checkpoint_host_bytes``: host memory of the rank's state in a checkpoint (its ``rank-<r>.pt``), on save
        and on resume;
        ``full_cache_bytes``: one cache of every pair: what every rank held before the cache was sharded.
    """
    itemsize = torch.empty(0, dtype=dtype).element_size()
    features = 2 * dim * itemsize
    rows = pairs if world == 1 else math.ceil(pairs / world)
    caches = 1 if world == 1 else 2
    owned = 0 if world == 1 else rows
    device = caches * rows * (features + _ROW_TENSORS_BYTES) + owned
    between = rows * (features + _ROW_TENSORS_BYTES) + owned
    hand_over = 0 if world == 1 else (world + 1) * max(1, HAND_OVER_ROWS // world) * (features + 8 + 8 + 1)
    save_chunk = min(SAVE_CHUNK_ROWS, rows) * (features + 8)
    state_row = features + 8 + 2  # pair_ids, features, filled, written
    return {
        "rows": rows,
        "device_bytes": device,
        "between_epochs_bytes": between,
        "transient_bytes": max(hand_over, save_chunk),
        "checkpoint_host_bytes": caches * rows * state_row + owned,
        "full_cache_bytes": pairs * (features + _ROW_TENSORS_BYTES),
    }


__all__ = ["HAND_OVER_ROWS", "ShardedCache", "cache_bytes_per_rank", "first_holder"]
