"""One rank's batches, epoch by epoch: what the pretraining loop trains on.

:class:`EpochBatches` deals the rank its shard each epoch, has the composer compose it (all at once: uniform,
GRIT, a fixed or progressive q; or one batch at a time as the loader asks: FALCON), writes the batch log,
hands the loop a ``DataLoader`` over the epoch from any batch on, and checkpoints where the epoch stands,
so a resumed run trains exactly the batches the uninterrupted run would have.

An epoch with a warm start (epoch 0 with ``pretrain.composer.search_spaces``) takes the built spaces in order
(under DDP each rank gets a contiguous block of them) and the embeddings that built them; every other
epoch shuffles the pair ids with the shard generator (identical on every rank, so shards are disjoint)
and composes from the model's own cache of the previous epoch. Under DDP that cache is sharded
(:class:`~falcon_cli.sampling.sharded_cache.ShardedCache`): each epoch also deals, from a copy of the shard
generator, the rank's shard of the next epoch, whose rows the cache fills meanwhile.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader

from falcon_cli.registry import COMPOSERS
from falcon_cli.sampling.batch_log import BatchLog
from falcon_cli.sampling.composers import (
    Batch,
    BatchComposer,
    batches_from_state,
    batches_state,
    shard_pair_ids,
)
from falcon_cli.sampling.feed import FalconFeed, loader_settings
from falcon_cli.sampling.oracle_view import composition_summary
from falcon_cli.sampling.quantile import QSource, QuantileSpaces
from falcon_cli.sampling.quantile_composer import QUANTILE_COMPOSERS
from falcon_cli.sampling.sharded_cache import ShardedCache
from falcon_cli.sampling.warm_start import WarmStart


def build_composer(
    p: Any, *, truth: Callable[[torch.Tensor], torch.Tensor] | None = None, source: QSource | None = None
) -> BatchComposer:
    """The composer ``pretrain.composer.name`` names, found in the registry (falcon's own: falcon_cli/methods/
    composers.py), with the pretrain settings ``p`` (a ``PretrainConfig``). ``truth``: the oracle of a shapes world
    (quantile composers log its view of every chained slot; it changes no choice); ``source``: FALCON's q source
    (the scheduler's ``alpha_beta``)."""
    return COMPOSERS.get(p.composer.name).build(p, truth, source)


class EpochBatches:
    """One rank's batches of each epoch (see the module docstring).

    Args:
        composer: any :class:`~falcon_cli.sampling.composers.BatchComposer`.
        cache: the model's embedding cache (the previous epoch's features), this rank's shards of it.
        pair_ids: every pair id of the dataset.
        rank, world: this process and how many train.
        shard_generator: deals the shards (identical state on every rank).
        compose_generator: the composer's randomness (this rank's).
        batch_log: where every composed batch is recorded (``batches.parquet``).
        warm: epoch 0's built search spaces and their embeddings, or None.
        max_steps: cap on the batches of an epoch (``max_steps_per_epoch``), or None.
    """

    def __init__(
        self,
        composer: BatchComposer,
        cache: ShardedCache,
        pair_ids: torch.Tensor,
        *,
        rank: int,
        world: int,
        shard_generator: torch.Generator,
        compose_generator: torch.Generator,
        batch_log: BatchLog,
        warm: WarmStart | None = None,
        max_steps: int | None = None,
    ):
        self.composer, self.cache, self.pair_ids = composer, cache, pair_ids
        self.rank, self.world = rank, world
        self.shard_generator, self.compose_generator = shard_generator, compose_generator
        self.batch_log, self.warm, self.max_steps = batch_log, warm, max_steps
        self.epoch: int | None = None
        self.batches: list[Batch] | None = None
        """The epoch's batches, composed up front (None: on demand, or between epochs)."""
        self.spaces: QuantileSpaces | None = None
        """An on-demand epoch's search spaces (their position is where composing stands)."""
        self.feed: FalconFeed | None = None
        self.summary: dict[str, Any] | None = None
        """The last composed epoch's summary (q and the oracle's view), for quantile batches composed up front."""
        self._ahead: dict[str, Any] | None = None  # composed before a checkpoint, not yet trained

    # --- the epoch's shape ---------------------------------------------------------------------
    def warm_epoch(self, epoch: int) -> bool:
        """Whether ``epoch`` is composed from the warm start's built spaces."""
        return self.warm is not None and epoch == 0

    def on_demand(self, epoch: int) -> bool:
        """Whether ``epoch``'s batches are composed one at a time (FALCON once there are features)."""
        return self.composer.on_demand and (epoch > 0 or self.warm_epoch(epoch))

    def steps(self, epoch: int) -> int:
        """Steps of ``epoch`` on every rank: all the batches its composer makes (every pair of the shard
        once; equal shards give every rank the same count), capped by ``max_steps``."""
        shard = math.ceil(len(self.pair_ids) / self.world)
        steps = self.composer.num_epoch_batches(
            epoch, shard, grouped_width=self.warm.width if self.warm_epoch(epoch) else None
        )
        return min(steps, self.max_steps) if self.max_steps else steps

    def sampler(self, index: int) -> str:
        """The rule that composed batch ``index`` of the epoch (the metrics log's ``sampler``)."""
        return self.batches[index].sampler if self.batches is not None else self.composer.name

    # --- an epoch ------------------------------------------------------------------------------
    def begin(self, epoch: int) -> bool:
        """Compose ``epoch``, unless a resumed checkpoint already holds it; True when it was composed now.
        A fresh epoch empties the cache's record of what was filled (features stay until overwritten) and,
        for quantile batches composed up front, leaves their summary (q and the oracle's view) in
        :attr:`summary`."""
        self.summary = None
        if self.epoch == epoch and (self.batches is not None or self.spaces is not None):
            return False
        self.epoch = epoch
        warm = self.warm_epoch(epoch)
        shard = (
            shard_pair_ids(self.warm.order, self.rank, self.world, None)
            if warm
            else shard_pair_ids(self.pair_ids, self.rank, self.world, self.shard_generator)
        )
        reading = self.cache.begin(shard, self.next_shard() if self.world > 1 else None)
        cache = self.warm.cache if warm else reading
        width = self.warm.width if warm else None
        if self.on_demand(epoch):  # the spaces now, each batch when the previous step (and its update) is done
            self.spaces = self.composer.spaces(shard, cache, self.compose_generator, grouped_width=width)
        else:
            self.batches = self.composer.compose_epoch(
                epoch, shard, cache, self.compose_generator, grouped_width=width
            )[: self.steps(epoch)]
            self.batch_log.extend(epoch, self.batches, rank=self.rank)
            if self.composer.name in QUANTILE_COMPOSERS and (epoch > 0 or warm):
                self.summary = composition_summary(self.batch_log.rows(epoch))
            self.batch_log.write(epoch)
        self.cache.reset()
        return True

    def next_shard(self) -> torch.Tensor:
        """This rank's shard of the epoch after the one being begun, dealt from a copy of the shard generator (the
        generator itself stays where it is, so that epoch deals the same shard from it). A warm epoch deals without
        the generator, so its successor deals from the generator's state as it is."""
        peek = torch.Generator()
        peek.set_state(self.shard_generator.get_state())
        return shard_pair_ids(self.pair_ids, self.rank, self.world, peek)

    def loader(
        self, dataset, collate, start: int, *, num_workers: int, lag: int, pin_memory: bool, seed: int
    ) -> tuple[DataLoader, int]:
        """A ``DataLoader`` over the epoch from batch ``start``, and the epoch's number of batches. The loader
        gets its own generator: a fresh iterator must not draw from the global RNG, or a resumed run's
        dropout would drift from the uninterrupted run's (augmentation is seeded per item)."""
        generator = torch.Generator().manual_seed(seed)
        if self.batches is not None:
            order = [[dataset.index_of(int(i)) for i in b.pair_ids] for b in self.batches[start:]]
            return DataLoader(
                dataset,
                batch_sampler=order,
                collate_fn=collate,
                num_workers=num_workers,
                pin_memory=pin_memory,
                generator=generator,
            ), len(self.batches)
        epoch, total = self.epoch, self.steps(self.epoch)
        self.feed = FalconFeed(
            self.spaces,
            self.composer.q(epoch),
            dataset.index_of,
            self.compose_generator,
            lambda index, composed: self.batch_log.add(epoch, index, self.rank, composed),
            start=start,
            stop=total,
            ahead=self._ahead,
        )
        self._ahead = None
        return DataLoader(
            dataset,
            batch_sampler=self.feed,
            collate_fn=collate,
            pin_memory=pin_memory,
            generator=generator,
            **loader_settings(lag, num_workers),
        ), total

    def take(self, pair_ids: torch.Tensor) -> tuple[Batch, dict[str, torch.Tensor]]:
        """An on-demand epoch: the batch just trained (it must hold ``pair_ids``) and its scheduler record."""
        return self.feed.take(pair_ids)

    def end(self) -> None:
        """The epoch is trained: an on-demand epoch's batch log part is written; nothing of it is kept; the cache
        completes next epoch's rows and lets this epoch's go (every rank calls this: a collective under DDP)."""
        if self.spaces is not None:
            self.batch_log.write(self.epoch)
        self.batches = self.spaces = self.feed = None
        self.cache.end()

    # --- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where this rank's epoch stands: its batches (composed up front), or its spaces, batch log rows and
        the batches composed ahead of training (on demand). Between epochs: nothing."""
        return {
            "epoch": self.epoch,
            "batches": batches_state(self.batches) if self.batches is not None else None,
            "spaces": self.spaces.state_dict() if self.spaces is not None else None,
            "batch_log": self.batch_log.state_dict() if self.spaces is not None else None,
            "ahead": self.feed.ahead_state() if self.feed is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = state["epoch"]
        self.batches = batches_from_state(state["batches"]) if state["batches"] is not None else None
        self.spaces, self._ahead = None, state["ahead"]
        if state["spaces"] is not None:
            warm = self.warm_epoch(self.epoch)
            self.spaces = self.composer.spaces(
                torch.empty(0, dtype=torch.long),
                self.warm.cache if warm else self.cache.reading,
                None,
                grouped_width=self.warm.width if warm else None,
            )
            self.spaces.load_state_dict(state["spaces"])
            self.batch_log.load_state_dict(state["batch_log"])


__all__ = ["EpochBatches", "build_composer"]
