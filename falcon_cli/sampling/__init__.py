"""Sampling: the embedding cache, the batch composers (uniform, GRIT-VLP, fixed and progressive quantiles,
FALCON's learned scheduler in :mod:`~falcon_cli.sampling.quantile` and :mod:`~falcon_cli.sampling.scheduler`)
and the batch log.

- :mod:`~falcon_cli.sampling.cache`: :class:`EmbeddingCache`, per-pair features from the training forward;
  :mod:`~falcon_cli.sampling.sharded_cache`: a DDP rank's share of it (this epoch's shard and the next one's).
- :mod:`~falcon_cli.sampling.composers`: :class:`Batch`, the :class:`BatchComposer` protocol,
  :class:`UniformComposer`, :class:`GritComposer`, :func:`shard_pair_ids` (DDP).
- :mod:`~falcon_cli.sampling.batch_log`: :class:`BatchLog` and :func:`read_batch_log` (``batches.parquet``).
"""

from falcon_cli.sampling.batch_log import BatchLog, read_batch_log
from falcon_cli.sampling.cache import EmbeddingCache
from falcon_cli.sampling.composers import (
    Batch,
    BatchComposer,
    GritComposer,
    UniformComposer,
    batches_from_state,
    batches_state,
    num_batches,
    shard_pair_ids,
)

__all__ = [
    "EmbeddingCache",
    "Batch",
    "BatchComposer",
    "UniformComposer",
    "GritComposer",
    "shard_pair_ids",
    "num_batches",
    "batches_state",
    "batches_from_state",
    "BatchLog",
    "read_batch_log",
]
