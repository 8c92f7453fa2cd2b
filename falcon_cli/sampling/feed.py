"""FALCON's batches as a DataLoader batch sampler: composed when the loader asks for them.

Algorithm 2 composes batch k + 1 with the scheduler φ after the update of step k. A
:class:`torch.utils.data.DataLoader` asks its batch sampler for the next batch's indices:

* with no worker processes, when the training loop asks for that batch: after step k's
  update (``lag`` 0, the paper's rule; items load in the main process, between steps);
* with ``W`` workers and ``prefetch_factor`` ``P``, ``W·P`` batches ahead: on receiving batch
  k the loader asks for batch k + W·P, before step k trains. That batch is composed with φ
  after update k − 1, i.e. ``lag = W·P`` steps old, and its images load in the workers
  while steps k … k + W·P − 1 compute. The scheduler's update for it then weighs q's drawn
  from a slightly older policy (REINFORCE, mildly off-policy); :func:`loader_settings`
  picks W and P for a requested lag.

:class:`FalconFeed` is that batch sampler. It remembers every composed batch until the
training loop :meth:`~FalconFeed.take`\\s it (the composed columns for the batch log, the
scheduler's record for the update), and checkpoints them (:meth:`ahead_state`) so a resumed
run trains the very batches it had composed, then continues composing exactly.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Iterator

import torch

from falcon_cli.sampling.composers import Batch, batches_from_state, batches_state
from falcon_cli.sampling.quantile import QSource, QuantileSpaces


def loader_settings(lag: int, num_workers: int) -> dict[str, Any]:
    """DataLoader keyword arguments that compose exactly ``lag`` batches ahead: ``num_workers``
    (the largest divisor of ``lag`` not above ``num_workers``; at least 1) and ``prefetch_factor``."""
    if lag <= 0:
        return {"num_workers": 0}
    workers = max(w for w in range(1, max(1, min(lag, num_workers)) + 1) if lag % w == 0)
    return {"num_workers": workers, "prefetch_factor": lag // workers}


class FalconFeed:
    """Batch sampler of one FALCON epoch (one rank): yields dataset indices, composing each
    batch only when asked (see the module docstring for when that is).

    Args:
        spaces: this epoch's search spaces (their position is the composition state).
        source: where q comes from, e.g. the scheduler's ``alpha_beta`` (read at compose time).
        index_of: pair id -> dataset index.
        generator: the composition generator (start draws and the q seeds).
        on_compose: called with ``(batch_index, Batch)`` as each batch is composed (the batch log).
        start, stop: batch indices of the epoch to produce (resume: ``start`` > 0).
        ahead: batches composed before a checkpoint but not trained, from :meth:`ahead_state`.
    """

    def __init__(
        self,
        spaces: QuantileSpaces,
        source: QSource,
        index_of: Callable[[int], int],
        generator: torch.Generator,
        on_compose: Callable[[int, Batch], None],
        *,
        start: int,
        stop: int,
        ahead: dict[str, Any] | None = None,
    ):
        self.spaces, self.source, self.index_of, self.generator = spaces, source, index_of, generator
        self.on_compose = on_compose
        self.start, self.stop = start, stop
        self.pending: deque[tuple[Batch, dict[str, torch.Tensor]]] = deque()
        if ahead is not None:
            self.pending.extend(zip(batches_from_state(ahead["batches"]), ahead["records"]))

    def __len__(self) -> int:
        return self.stop - self.start

    def __iter__(self) -> Iterator[list[int]]:
        restored = list(self.pending)  # composed before the checkpoint: load them again first
        for composed, _ in restored:
            yield [self.index_of(int(i)) for i in composed.pair_ids]
        for index in range(self.start + len(restored), self.stop):
            if not self.spaces.has_next():
                return
            composed, record = self.spaces.next_batch(self.source, self.generator)
            self.on_compose(index, composed)
            self.pending.append((composed, record))
            yield [self.index_of(int(i)) for i in composed.pair_ids]

    def take(self, pair_ids: torch.Tensor) -> tuple[Batch, dict[str, torch.Tensor]]:
        """The oldest composed batch not yet trained (it must be the one with ``pair_ids``)."""
        composed, record = self.pending.popleft()
        if not torch.equal(composed.pair_ids.cpu(), pair_ids.cpu()):
            raise RuntimeError(
                "FALCON batch order broke: the loader returned a batch other than the oldest composed one"
            )
        return composed, record

    def ahead_state(self) -> dict[str, Any]:
        """The composed, not yet trained batches and their scheduler records (for a checkpoint)."""
        return {
            "batches": batches_state([b for b, _ in self.pending]),
            "records": [{k: v.cpu() for k, v in r.items()} for _, r in self.pending],
        }
