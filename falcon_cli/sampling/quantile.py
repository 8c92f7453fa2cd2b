"""FALCON's quantile batch composition (methods.md §1.3–1.5, Algorithm 1), vectorised.

For one search space of W pairs with cached features ``I`` (images) and ``T`` (texts):

* ``S = I Tᵀ + T Iᵀ`` — the unified, symmetric similarity (raw cosines, A-1);
* ``Q[a, k]`` — the ``levels[k]``-quantile (linear interpolation, ``torch.quantile``
  semantics) of row ``a`` without its diagonal (A-2, A-3), ``levels = linspace(0, 1, m)``;
* ``Ŝ = softmax(Q / tau)`` row-wise (``tau = 1`` by default: raw sums, A-1) — the
  scheduler's input, sorted by construction (A-5), computed once per space (A-4).

A mini-batch starts at a uniformly random pair of the unselected set ``U``; every next
slot is the **nearest-rank q-quantile** of ``S[last, j ∈ U]``: with the ``n`` candidates
sorted by ascending similarity (equal values by descending index), rank ``r = floor(q · (n − 1) + 1/2)``, so
``q = 1`` is the argmax (GRIT's rule on ``S``; among equal maxima the lowest index, like ``argmax``)
and ``q = 0`` the argmin. ``q`` comes from
the last chosen pair (instance level) or once per batch (batch level).

Vectorisation. :func:`space_tables` sorts every row once (``order[a]`` = candidate indices
by ascending ``S[a]``, diagonal and padding last), in row blocks so the full ``W x W``
float matrix never exists at once (|M| = 28,320 fits in a few GB: ``order`` is int16/int32).
A step is then O(W) tensor work for every active space at once: gather availability in
the anchor's sorted order, cumulative sum, pick the position where the count reaches
``r + 1`` — no Python loop over candidates. On CPU the row sort uses numpy's SIMD sort on
packed (value, index) int64 keys (about 6x faster than ``torch.sort`` on 2 cores); on
CUDA ``torch.sort(stable=True)`` on the column-reversed rows; both order ties the same way.

:class:`QuantileSpaces` holds the search spaces of one epoch for one rank and composes
batch after batch, for one space (on demand: FALCON's ``q`` depends on the scheduler
after the previous step) or for all spaces of a chunk at once (fixed ``q``). All
randomness comes from the caller's CPU generator, in a documented order (per round:
one uniform per active space for the starts, then per step the ``q`` draws), so a
resumed run recomposes exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Union

import numpy as np
import torch

from falcon_cli.errors import FalconError
from falcon_cli.sampling.cache import EmbeddingCache, as_id_tensor
from falcon_cli.sampling.composers import Batch, _check_config
from falcon_cli.sampling.policy import sample_q

ROW_BLOCK_BYTES = 256 << 20
"""Memory bound for the float rows sorted at once by :func:`space_tables`."""


def nearest_rank(q: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Nearest-rank position ``floor(q (n - 1) + 1/2)`` of the q-quantile among ``n`` sorted items (halves round up)."""
    return torch.floor(q.double() * (n.double() - 1) + 0.5).long().clamp_(min=0)


def unified_similarity(image: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    """``S = I Tᵀ + T Iᵀ`` for features ``[..., W, D]`` (float32): image-to-text plus text-to-image."""
    image, text = image.float(), text.float()
    i2t = image @ text.transpose(-1, -2)
    return i2t + i2t.transpose(-1, -2)


def _sorted_rows(block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of ``block`` [R, W] (float32, +inf where excluded) sorted ascending, equal values by
    **descending** column (so the last of a row is the lowest-index maximum, as ``argmax``):
    (values [R, W] float32, column indices [R, W] int64)."""
    width = block.shape[1]
    block = block + 0.0  # -0.0 -> +0.0: equal values must compare equal below
    if block.device.type != "cpu":
        values, flipped = torch.sort(block.flip(1), dim=1, stable=True)
        return values, (width - 1) - flipped
    bits = block.contiguous().view(torch.int32)
    # float32 bits -> int32 keys with the same order (negatives: flip all but the sign bit)
    keys = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(torch.int64)
    reversed_columns = (width - 1) - torch.arange(width, dtype=torch.int64)
    packed = torch.from_numpy(np.sort(((keys << 32) | reversed_columns).numpy(), axis=1))
    index = (width - 1) - (packed & 0xFFFFFFFF)
    return torch.gather(block, 1, index), index


@dataclass
class SpaceTables:
    """What composition needs of a group of search spaces (all on one device).

    * ``order`` [S, W, W] (int16 when W < 32768, else int32): ``order[s, a]`` lists the
      candidates of anchor ``a`` by ascending similarity; the anchor itself and padding last.
    * ``s_hat`` [S, W, m] float32: the scheduler's input rows (softmax of the quantiles).
    * ``size`` [S] int64: real pairs per space (the rest of W is padding).
    """

    order: torch.Tensor
    s_hat: torch.Tensor
    size: torch.Tensor


@torch.no_grad()
def space_tables(image: torch.Tensor, text: torch.Tensor, size: torch.Tensor, *, quantiles: int = 100,
                 temperature: float = 1.0, row_block_bytes: int = ROW_BLOCK_BYTES) -> SpaceTables:
    """Sorted candidate orders and Ŝ for spaces of features ``image``/``text`` [S, W, D].

    Rows ``>= size[s]`` of space ``s`` are padding (their features are ignored). Each row's
    quantiles are taken over its ``size - 1`` real off-diagonal entries (a space of one pair
    has none: its Ŝ row is uniform).
    """
    spaces, width, _ = image.shape
    device = image.device
    index_dtype = torch.int16 if width < 32768 else torch.int32
    order = torch.empty(spaces, width, width, dtype=index_dtype, device=device)
    s_hat = torch.empty(spaces, width, quantiles, dtype=torch.float32, device=device)
    levels = torch.linspace(0, 1, quantiles, dtype=torch.float64, device=device)
    columns = torch.arange(width, device=device)
    block_rows = max(1, row_block_bytes // max(1, width * 4 * 6))
    image, text = image.float(), text.float()
    for s in range(spaces):
        n = int(size[s])
        count = max(n - 1, 1)
        pos = levels * (count - 1)
        lo, hi = pos.floor().long(), pos.ceil().long()
        frac = (pos - lo).float()
        for r0 in range(0, width, block_rows):
            r1 = min(width, r0 + block_rows)
            block = image[s, r0:r1] @ text[s].T + text[s, r0:r1] @ image[s].T
            rows = torch.arange(r0, r1, device=device)
            excluded = (columns[None, :] >= n) | (columns[None, :] == rows[:, None])
            block.masked_fill_(excluded, float("inf"))
            values, index = _sorted_rows(block)
            order[s, r0:r1] = index.to(index_dtype)
            if n > 1:
                q = values[:, lo] + (values[:, hi] - values[:, lo]) * frac
            else:
                q = torch.zeros(r1 - r0, quantiles, device=device)
            s_hat[s, r0:r1] = torch.softmax(q / temperature, dim=1)
    return SpaceTables(order, s_hat, size.to(device=device, dtype=torch.int64))


# --- where q comes from ----------------------------------------------------------------------
QSource = Union[float, Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]]
"""A fixed ``q`` in [0, 1], or a policy: ``policy(s_hat [..., m]) -> (alpha, beta)`` (each ``[...]``);
q is then drawn from Beta(alpha, beta) of the anchor with :func:`~falcon_cli.sampling.policy.sample_q`."""


def _check_q_source(source: QSource) -> None:
    if not callable(source) and not 0.0 <= float(source) <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {source}")


# --- the composer state -----------------------------------------------------------------------
class QuantileSpaces:
    """The search spaces of one epoch on one rank, and the batches composed from them so far.

    Args:
        pair_ids: this rank's pair ids for the epoch (e.g. its shard).
        cache: features of the previous epoch. Each space's features are copied when the
            space is first used (``snapshot``), so pairs trained earlier in this epoch do
            not change the spaces still to come, and a resumed run sees the same features.
        search_space_size: |M|; the shuffled ids are split into spaces of |M| (last smaller).
        batch_size: B; each space yields ``floor(|M| / B)`` full batches and, unless
            ``drop_last``, one last smaller batch with its remainder (A-8).
        generator: CPU generator; the example-level shuffle is drawn here.
        level: ``instance`` (a q per anchor) or ``batch`` (one q per batch, drawn at the
            batch's first pair and used for all its steps).
    """

    def __init__(self, pair_ids: Any, cache: EmbeddingCache, search_space_size: int, batch_size: int,
                 generator: torch.Generator, *, drop_last: bool = False, level: str = "instance",
                 quantiles: int = 100, temperature: float = 1.0, sampler: str = "quantile"):
        if level not in ("instance", "batch"):
            raise ValueError(f"level must be 'instance' or 'batch', got {level!r}")
        ids = as_id_tensor(pair_ids).cpu()
        self.cache = cache
        self.batch_size = int(batch_size)
        self.drop_last = bool(drop_last)
        self.level = level
        self.quantiles = int(quantiles)
        self.temperature = float(temperature)
        self.sampler = sampler
        n = len(ids)
        self.width = max(1, min(int(search_space_size), n))
        self.shuffled = ids[torch.randperm(n, generator=generator)]
        self.num_spaces = math.ceil(n / self.width) if n else 0
        rows = cache.rows(self.shuffled)
        if n and not bool(cache.written[rows].any()):
            raise FalconError(f"embedding cache holds no features for any of the {n} pairs to compose; "
                              "train an epoch (or load embeddings) before composing quantile batches")
        self.current = -1          # index of the space being composed (one-at-a-time use)
        self.available: torch.Tensor | None = None
        self.snapshot: tuple[torch.Tensor, torch.Tensor] | None = None
        self.tables: SpaceTables | None = None

    # sizes and ids --------------------------------------------------------------------------
    def space_size(self, s: int) -> int:
        """Number of pairs in space ``s``."""
        return min(self.width, len(self.shuffled) - s * self.width)

    def space_ids(self, s: int) -> torch.Tensor:
        """Pair ids of space ``s``, in position order."""
        return self.shuffled[s * self.width: s * self.width + self.space_size(s)]

    def batches_in_space(self, s: int) -> int:
        """Batches space ``s`` yields (a short last one unless ``drop_last``)."""
        n = self.space_size(s)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __len__(self) -> int:
        """Number of batches the epoch has."""
        return sum(self.batches_in_space(s) for s in range(self.num_spaces))

    # features -------------------------------------------------------------------------------
    def _features(self, spaces: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Padded features [S, W, D] (fp16, cache device) of ``spaces`` and their sizes."""
        dim, device = self.cache.dim, self.cache.device
        image = torch.zeros(len(spaces), self.width, dim, dtype=self.cache.image.dtype, device=device)
        text = torch.zeros_like(image)
        size = torch.tensor([self.space_size(s) for s in spaces], dtype=torch.int64)
        for i, s in enumerate(spaces):
            rows = self.cache.rows(self.space_ids(s).to(device))
            image[i, : len(rows)] = self.cache.image[rows]
            text[i, : len(rows)] = self.cache.text[rows]
        return image, text, size

    def _tables(self, image: torch.Tensor, text: torch.Tensor, size: torch.Tensor) -> SpaceTables:
        return space_tables(image, text, size, quantiles=self.quantiles, temperature=self.temperature)

    # one space at a time (on demand) --------------------------------------------------------
    def has_next(self) -> bool:
        """True while :meth:`next_batch` has a batch to give."""
        if self.available is not None and self._usable(self.available):
            return True
        return any(self.batches_in_space(s) > 0 for s in range(self.current + 1, self.num_spaces))

    def _enter(self, s: int) -> None:
        image, text, size = self._features([s])
        self.current = s
        self.snapshot = (image, text)
        self.tables = self._tables(image, text, size)
        self.available = _unselected(self.width, size, image.device)

    def next_batch(self, source: QSource, generator: torch.Generator) -> tuple[Batch, dict[str, torch.Tensor]]:
        """The next batch (on demand), and what the scheduler's update needs:
        ``{"s_hat": [k, m] the input rows the q's were drawn from, "q": [k]}`` (``q`` is NaN
        for steps a short last batch did not take: leave those out of the log-probability)."""
        if self.available is None or not self._usable(self.available):
            following = [s for s in range(self.current + 1, self.num_spaces) if self.batches_in_space(s) > 0]
            if not following:
                raise StopIteration("every search space of the epoch has been composed")
            self._enter(following[0])
        columns, record = compose_round(self.tables, self.available, self.snapshot, source, self.batch_size, generator,
                                        level=self.level)
        ids = self.space_ids(self.current)
        return _to_batch(columns, 0, ids, self.sampler), {k: v[0] for k, v in record.items()}

    def _usable(self, available: torch.Tensor) -> bool:
        remaining = int(available.sum())
        return remaining >= self.batch_size or (remaining > 0 and not self.drop_last)

    def state_dict(self) -> dict[str, Any]:
        """Position inside the epoch (the current space, what is still available, its feature snapshot)."""
        return {"shuffled": self.shuffled, "current": self.current,
                "available": None if self.available is None else self.available.cpu().clone(),
                "snapshot": None if self.snapshot is None else tuple(t.cpu() for t in self.snapshot),
                "width": self.width, "batch_size": self.batch_size, "level": self.level}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`: the current space's tables are rebuilt from its snapshot."""
        _check_config("quantile spaces", {"batch_size": self.batch_size, "level": self.level}, state)
        self.shuffled = state["shuffled"]
        self.width = state["width"]
        self.num_spaces = math.ceil(len(self.shuffled) / self.width) if len(self.shuffled) else 0
        self.current = state["current"]
        if state["snapshot"] is not None:
            device = self.cache.device
            image, text = (t.to(device) for t in state["snapshot"])
            self.snapshot = (image, text)
            size = torch.tensor([self.space_size(self.current)], dtype=torch.int64)
            self.tables = self._tables(image, text, size)
            self.available = state["available"].to(device)

    # every space at once (fixed q) ----------------------------------------------------------
    def compose_all(self, source: QSource, generator: torch.Generator, *, spaces_per_chunk: int | None = None) -> list[Batch]:
        """Every batch of the epoch, spaces advancing together in chunks (for a fixed q, or a
        policy that does not change meanwhile). Batches are returned space by space."""
        out: list[Batch] = []
        if spaces_per_chunk is None:  # order table + features + a few W-rows per space, ~1 GB per chunk
            per_space = self.width * self.width * (2 if self.width < 32768 else 4) + self.width * (self.quantiles * 4 + 1024)
            spaces_per_chunk = max(1, (1 << 30) // per_space)
        for first in range(0, self.num_spaces, spaces_per_chunk):
            group = list(range(first, min(self.num_spaces, first + spaces_per_chunk)))
            image, text, size = self._features(group)
            tables = self._tables(image, text, size)
            available = _unselected(self.width, size, image.device)
            per_space: list[list[Batch]] = [[] for _ in group]
            for _ in range(max(self.batches_in_space(s) for s in group)):
                active = torch.tensor([self._usable(available[i]) for i in range(len(group))])
                if not active.any():
                    break
                columns, _ = compose_round(tables, available, (image, text), source, self.batch_size, generator,
                                           level=self.level, active=active)
                for j, i in enumerate(active.nonzero().flatten().tolist()):
                    per_space[i].append(_to_batch(columns, j, self.space_ids(group[i]), self.sampler))
            for batches in per_space:
                out.extend(batches)
        return out


def _unselected(width: int, size: torch.Tensor, device: torch.device) -> torch.Tensor:
    """[S, W] availability at the start of spaces of ``size`` pairs: every real pair, no padding."""
    return torch.arange(width, device=device)[None, :] < size.to(device)[:, None]


def _to_batch(columns: dict[str, torch.Tensor], j: int, ids: torch.Tensor, sampler: str) -> Batch:
    """Batch ``j`` of a round (local indices -> pair ids), trimmed to its real length."""
    n = int(columns["length"][j])
    local = columns["local"][j, :n].cpu()
    anchor = columns["anchor"][j, :n].cpu()
    anchor_ids = torch.where(anchor >= 0, ids[anchor.clamp(min=0)], torch.full_like(anchor, -1))
    return Batch(ids[local], anchor_ids, *(columns[k][j, :n].float().cpu() for k in ("q", "alpha", "beta", "similarity", "rank")),
                 sampler=sampler)


@torch.no_grad()
def compose_round(tables: SpaceTables, available: torch.Tensor, features: tuple[torch.Tensor, torch.Tensor],
                  source: QSource, batch_size: int, generator: torch.Generator, *, level: str = "instance",
                  active: torch.Tensor | None = None) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """One batch from each active space (Algorithm 1), updating ``available`` [S, W] in place.

    A policy runs once, on the Ŝ rows of every pair still available in the active spaces
    (any of them can become an anchor). Random draws, in order: one float64 uniform per
    active space (the batch's first pair, uniform over its available pairs); then, with a
    policy, per step one :func:`sample_q` call for the spaces that still have candidates
    (batch level: one call at the first step, for all active spaces). Returns per-slot
    columns ``[A, B]`` (A active spaces) and the scheduler record ``{"s_hat": [A, k, m],
    "q": [A, k]}`` (k = B - 1 at instance level, 1 at batch level; NaN q = step not taken).
    """
    _check_q_source(source)
    device = available.device
    group = torch.arange(available.shape[0], device=device)
    if active is not None:
        group = group[active.to(device)]
    a, width = len(group), available.shape[1]
    image, text = features
    arange = torch.arange(a, device=device)
    avail = available[group]
    policy = source if callable(source) else None
    if policy is not None:  # α, β of every row that may become an anchor in this round
        rows = avail.nonzero(as_tuple=True)
        alpha_all = torch.ones(a, width, device=device)
        beta_all = torch.ones(a, width, device=device)
        alpha_rows, beta_rows = policy(tables.s_hat[group][rows])
        alpha_all[rows], beta_all[rows] = alpha_rows.float(), beta_rows.float()
    local = torch.full((a, batch_size), -1, dtype=torch.int64, device=device)
    anchor = torch.full_like(local, -1)
    nan = torch.full((a, batch_size), float("nan"), dtype=torch.float32, device=device)
    q_col, alpha_col, beta_col, sim_col, rank_col = (nan.clone() for _ in range(5))
    q_col = q_col.double()
    # the first pair: uniform over the available ones
    remaining = avail.sum(1)
    u = torch.rand(a, generator=generator, dtype=torch.float64).to(device)
    pick = torch.minimum((u * remaining).long(), remaining - 1)
    first = (avail.long().cumsum(1) <= pick[:, None]).sum(1)
    local[:, 0] = first
    avail[arange, first] = False
    length = torch.ones(a, dtype=torch.int64, device=device)
    record_rows, record_q = [], []
    last = first
    batch_q = None
    for step in range(1, batch_size):
        n = avail.sum(1)
        go = n > 0
        if not bool(go.any()):
            break
        q = torch.full((a,), float("nan"), dtype=torch.float64, device=device)
        if policy is None:
            q[go] = float(source)
        elif level == "batch":
            if batch_q is None:  # one q per batch, from the Beta of its first pair
                batch_q = sample_q(alpha_all[arange, first], beta_all[arange, first], generator).double().to(device)
                record_rows.append(tables.s_hat[group, first])
                record_q.append(batch_q)
            q[go] = batch_q[go]
        else:
            q[go] = sample_q(alpha_all[arange[go], last[go]], beta_all[arange[go], last[go]], generator).double().to(device)
            record_rows.append(tables.s_hat[group, last])
            record_q.append(q.clone())
        if policy is not None:
            source_row = first if level == "batch" else last
            alpha_col[:, step] = torch.where(go, alpha_all[arange, source_row], alpha_col[:, step])
            beta_col[:, step] = torch.where(go, beta_all[arange, source_row], beta_col[:, step])
        order = tables.order[group, last].long()                       # [a, W] candidates of `last`, ascending
        in_order = torch.gather(avail, 1, order)                       # their availability, in that order
        r = torch.minimum(nearest_rank(q.nan_to_num(0.0), n), (n - 1).clamp(min=0))
        position = (in_order.long().cumsum(1) <= r[:, None]).sum(1).clamp(max=width - 1)
        chosen = torch.where(go, order[arange, position], torch.full_like(last, -1))
        local[:, step] = chosen
        anchor[:, step] = torch.where(go, last, torch.full_like(last, -1))
        q_col[:, step] = q
        # rank among the remaining candidates, 1 = hardest (a lone candidate is the hardest, as in GRIT)
        rank = torch.where(n > 1, r.double() / (n - 1).clamp(min=1), torch.ones_like(r, dtype=torch.float64))
        rank_col[:, step] = torch.where(go, rank.float(), rank_col[:, step])
        safe = chosen.clamp(min=0)
        sim = ((image[group, last].float() * text[group, safe].float()).sum(-1)
               + (text[group, last].float() * image[group, safe].float()).sum(-1)) / 2
        sim_col[:, step] = torch.where(go, sim, sim_col[:, step])
        avail[arange[go], chosen[go]] = False
        length += go.long()
        last = torch.where(go, chosen, last)
    available[group] = avail
    columns = {"local": local, "anchor": anchor, "q": q_col, "alpha": alpha_col, "beta": beta_col,
               "similarity": sim_col, "rank": rank_col, "length": length}
    m = tables.s_hat.shape[-1]
    record = ({"s_hat": torch.stack(record_rows, 1), "q": torch.stack(record_q, 1)} if record_rows else
              {"s_hat": torch.empty(a, 0, m, device=device), "q": torch.empty(a, 0, dtype=torch.float64, device=device)})
    return columns, record
