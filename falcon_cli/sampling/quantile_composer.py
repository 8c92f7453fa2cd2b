"""The quantile composers behind the one :class:`~falcon_cli.sampling.composers.BatchComposer` protocol.

Each chains every search space from a random start, picking each next pair at a quantile q of its anchor's
remaining candidates (:class:`~falcon_cli.sampling.quantile.QuantileSpaces`); they differ in where q comes from:

- ``quantile``: one fixed q for every pick of every epoch;
- ``progressive``: a q that moves linearly from ``start`` (epoch 1) to ``end`` (the last epoch)
  (:func:`~falcon_cli.sampling.scheduler.progressive_q`);
- ``falcon``: FALCON's scheduler draws q per anchor (or per batch) from a Beta it predicts from the
  anchor's similarity features. Batch k + 1 depends on the update after step k, so its epochs are
  composed **on demand** (:attr:`QuantileComposer.on_demand`): the training loop asks :meth:`~QuantileComposer.spaces`
  for the epoch's spaces and draws one batch at a time through :class:`~falcon_cli.sampling.feed.FalconFeed`.

Epoch 0 has no features yet: like GRIT, every quantile composer gives uniform batches then (logged as
``uniform``), unless a warm start hands it built search spaces (``grouped_width``).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from falcon_cli.errors import FalconError
from falcon_cli.sampling.cache import EmbeddingCache, as_id_tensor
from falcon_cli.sampling.composers import (
    Batch,
    _check_config,
    _check_generator,
    num_batches,
    num_space_batches,
    uniform_batches,
)
from falcon_cli.sampling.quantile import QSource, QuantileSpaces
from falcon_cli.sampling.scheduler import progressive_q

QUANTILE_COMPOSERS = ("quantile", "progressive", "falcon")
"""The composers that pick at a quantile (``pretrain.composer.name`` values)."""


class QuantileComposer:
    """A fixed, progressive or learned (FALCON) quantile composer (see the module docstring).

    Args:
        name: ``quantile``, ``progressive`` or ``falcon``.
        batch_size, search_space_size, drop_last: B, |M| and whether a space's short last batch is dropped.
        quantile: the fixed q (``quantile``).
        progressive: ``(start, end, epochs)`` of the progressive schedule (``progressive``).
        source: where FALCON's q comes from when a whole epoch is composed at once (the scheduler's
            ``alpha_beta``); the on-demand path passes it to the feed instead.
        level: ``instance`` (a q per anchor) or ``batch`` (one q per batch); FALCON's ``scheduler.level``.
        quantiles, temperature, features: the scheduler's input rows
            (:func:`~falcon_cli.sampling.quantile.space_tables`).
        truth: the oracle (a shapes world): every batch then carries its view of the chained slots.
        credit_levels: FALCON's ``scheduler.update.credit: levels`` grid: each on-demand batch's scheduler record also
            carries every level's pick per step (:class:`~falcon_cli.sampling.quantile.QuantileSpaces`).
        scale: how q picks among a step's candidates (``pretrain.composer.quantile_scale``: ``linear``, ``log_rank`` or
            ``quadratic_rank``; :func:`~falcon_cli.sampling.quantile.quantile_position`).
    """

    def __init__(
        self,
        name: str,
        batch_size: int,
        search_space_size: int,
        *,
        drop_last: bool = False,
        quantile: float | None = None,
        progressive: tuple[float, float, int] | None = None,
        source: QSource | None = None,
        level: str = "instance",
        quantiles: int = 100,
        temperature: float = 1.0,
        features: Sequence[str] = ("softmax",),
        truth: Callable[[torch.Tensor], torch.Tensor] | None = None,
        credit_levels: Sequence[float] | None = None,
        scale: str = "linear",
    ):
        if name not in QUANTILE_COMPOSERS:
            raise ValueError(f"name must be one of {QUANTILE_COMPOSERS}, got {name!r}")
        if batch_size < 1 or search_space_size < 1:
            raise ValueError(f"batch_size and search_space_size must be >= 1, got {batch_size}, {search_space_size}")
        self.name, self.on_demand = name, name == "falcon"
        self.batch_size, self.search_space_size, self.drop_last = (
            int(batch_size),
            int(search_space_size),
            bool(drop_last),
        )
        self.quantile, self.progressive, self.source = quantile, progressive, source
        self.level, self.quantiles, self.temperature, self.features = level, quantiles, temperature, tuple(features)
        self.truth, self.credit_levels, self.scale = truth, credit_levels, scale

    def q(self, epoch: int) -> QSource:
        """Where ``epoch``'s q comes from: a number (fixed, progressive) or FALCON's policy."""
        if self.name == "quantile":
            return float(self.quantile)
        if self.name == "progressive":
            start, end, epochs = self.progressive
            return progressive_q(epoch, epochs, start, end)
        if self.source is None:
            raise FalconError(
                "a FALCON composer composes a whole epoch only with a q source (the scheduler's alpha_beta)"
            )
        return self.source

    def spaces(
        self,
        pair_ids: Any,
        cache: EmbeddingCache,
        generator: torch.Generator | None,
        *,
        grouped_width: int | None = None,
    ) -> QuantileSpaces:
        """The epoch's search spaces of ``pair_ids`` (shuffled with ``generator``, or already grouped into
        spaces of ``grouped_width``), ready to give batches one at a time or all at once."""
        return QuantileSpaces(
            pair_ids,
            cache,
            grouped_width or self.search_space_size,
            self.batch_size,
            generator,
            drop_last=self.drop_last,
            level=self.level,
            quantiles=self.quantiles,
            temperature=self.temperature,
            features=self.features,
            sampler=self.name,
            grouped=grouped_width is not None,
            truth=self.truth,
            credit_levels=self.credit_levels,
            scale=self.scale,
        )

    def compose_epoch(
        self,
        epoch: int,
        pair_ids: Any,
        cache: EmbeddingCache | None,
        generator: torch.Generator,
        *,
        grouped_width: int | None = None,
    ) -> list[Batch]:
        _check_generator(generator)
        if grouped_width is None and (epoch == 0 or cache is None):  # no features yet: uniform, as GRIT
            return uniform_batches(as_id_tensor(pair_ids).cpu(), self.batch_size, self.drop_last, generator, "uniform")
        return self.spaces(pair_ids, cache, generator, grouped_width=grouped_width).compose_all(
            self.q(epoch), generator
        )

    def num_epoch_batches(self, epoch: int, n: int, *, grouped_width: int | None = None) -> int:
        """Space by space once there are features (each space's short last batch its own); uniform before."""
        if grouped_width is None and epoch == 0:
            return num_batches(n, self.batch_size, self.drop_last)
        return num_space_batches(n, grouped_width or self.search_space_size, self.batch_size, self.drop_last)

    def state_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "batch_size": self.batch_size,
            "search_space_size": self.search_space_size,
            "drop_last": self.drop_last,
            "level": self.level,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_config(f"{self.name} composer", self.state_dict(), state)


__all__ = ["QUANTILE_COMPOSERS", "QuantileComposer"]
