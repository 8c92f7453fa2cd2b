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
On CPU the row sort uses numpy's SIMD sort on packed (value, index) int64 keys (about 6x
faster than ``torch.sort`` on 2 cores); on CUDA ``torch.sort(stable=True)`` on the
column-reversed rows; both order ties the same way. A step of the chain is then O(W) numpy
work on the host, whatever device the tables live on (their order is copied to the host once):
take the availability in the anchor's sorted order, find the positions still available, pick
the ``(r + 1)``-th — no Python loop over candidates. The steps are sequential, so on a GPU
each would cost launches and a round trip (35 ms per batch of 95 steps on an H100, against
a few milliseconds here); the similarity columns and the scheduler's record are gathered on the
tables' device.

:class:`QuantileSpaces` holds the search spaces of one epoch for one rank and composes
batch after batch, for one space (on demand: FALCON's ``q`` depends on the scheduler
after the previous step) or for all spaces of a chunk at once (fixed ``q``). All
randomness comes from the caller's CPU generator, in a documented order (per round:
one uniform per active space for the starts, then per step the ``q`` draws), so a
resumed run recomposes exactly.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, Union

import numpy as np
import torch

from falcon_cli.errors import FalconError
from falcon_cli.sampling.cache import EmbeddingCache, as_id_tensor
from falcon_cli.sampling.composers import (
    FIXED_Q_FIELDS,
    FIXED_Q_LEVELS,
    Batch,
    _check_config,
    _torch_threads,
    num_space_batches,
)
from falcon_cli.sampling.policy import check_beta_parameters, draw_q, numpy_generator
from falcon_cli.sampling.scheduler_features import SchedulerFeatures

PANEL_BYTES = 32 << 20
"""Size of the float32 similarity rows computed by one matrix product (a panel): big enough
for an efficient GEMM, small enough that no ``W x W`` float matrix ever exists."""

SORT_BLOCK_BYTES = 256 << 10
"""Size of the float32 rows one CPU sort task takes (its int64 keys: twice that), so the
work stays in a core's cache; one task per core runs at a time."""


COMPOSE_CHUNK_BYTES = 512 << 20
"""Memory for the tables of the spaces :meth:`QuantileSpaces.compose_all` composes together
(|M| = 5,664: 10 spaces); more spaces per chunk spread each step's fixed cost wider."""


def nearest_rank(q, n) -> np.ndarray:
    """Nearest-rank position ``floor(q (n - 1) + 1/2)`` of the q-quantile among ``n`` sorted items (halves round
    up; at least 0; a NaN q, a step not taken, gives 0), in float64 numpy: composition computes it on the CPU
    beside the q draw, one small array per chain step."""
    q, n = np.asarray(q, dtype=np.float64), np.asarray(n, dtype=np.float64)
    return np.fmax(np.floor(q * (n - 1) + 0.5), 0).astype(np.int64)  # (fmax: NaN -> 0)


QUANTILE_SCALES = ("linear", "log_rank", "quadratic_rank")
"""How q maps to a candidate (``pretrain.composer.quantile_scale``): see :func:`quantile_position`."""


def quantile_position(q, n, scale: str = "linear") -> np.ndarray:
    """Position (0 = the least similar) of the pick at hardness q among ``n`` candidates sorted by ascending
    similarity. ``linear``: the q-quantile's nearest rank (:func:`nearest_rank`, the paper's). ``log_rank``: the k-th
    most similar with k = round(n^(1 - q)), so q = 1 is the most similar, q = 0 the least, and the top ranks take a
    share of q's range that does not shrink with n (of 500 candidates q = 0.94 is the most similar and q = 0.9 the
    2nd, where linearly q = 0.94 is the 31st). ``quadratic_rank``: the k-th most similar with
    k − 1 = round((n − 1)(1 − q)²), between the two: of 500 candidates q = 0.9 is the 6th most similar and q = 0.98
    the most similar, while q 0–0.5 still spans the least similar three quarters (issue 70: where false negatives are
    dense, log-rank squeezes every safe pick below q 0.05). A NaN q (a step not taken) or no candidate gives 0."""
    if scale == "linear":
        return nearest_rank(q, n)
    if scale not in QUANTILE_SCALES:
        raise ValueError(f"scale must be one of {QUANTILE_SCALES}, got {scale!r}")
    q, n = np.asarray(q, dtype=np.float64), np.asarray(n, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        if scale == "log_rank":
            from_top = np.floor(np.power(np.fmax(n, 1.0), 1.0 - q) + 0.5)  # k: 1 = the most similar
        else:
            from_top = 1.0 + np.floor(np.fmax(n - 1, 0.0) * np.square(1.0 - q) + 0.5)
        position = np.where(n >= 1, n - from_top, 0.0)
    return np.clip(np.nan_to_num(position, nan=0.0), 0, None).astype(np.int64)


def scale_rank(position, n, scale: str = "linear") -> np.ndarray:
    """The inverse of :func:`quantile_position`: the q on ``scale`` whose pick among ``n`` candidates is at
    ``position`` (0 = the least similar), float64. ``linear``: position / (n − 1); ``log_rank``: 1 − ln k / ln n with
    k = n − position (1 = the most similar); ``quadratic_rank``: 1 − √((n − 1 − position) / (n − 1)); so that
    ``quantile_position(scale_rank(p, n), n) == p``. A lone candidate is the hardest (1.0, as in GRIT); NaN positions
    stay NaN."""
    if scale not in QUANTILE_SCALES:
        raise ValueError(f"scale must be one of {QUANTILE_SCALES}, got {scale!r}")
    position, n = np.asarray(position, dtype=np.float64), np.asarray(n, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        if scale == "linear":
            q = position / np.maximum(n - 1, 1)
        elif scale == "log_rank":
            q = 1.0 - np.log(np.fmax(n - position, 1.0)) / np.log(np.fmax(n, 2.0))
        else:
            q = 1.0 - np.sqrt(np.fmax(n - 1 - position, 0.0) / np.maximum(n - 1, 1))
        return np.where(np.isnan(position), np.nan, np.where(n > 1, q, 1.0))


def unified_similarity(image: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    """``S = I Tᵀ + T Iᵀ`` for features ``[..., W, D]`` (float32): image-to-text plus text-to-image."""
    image, text = image.float(), text.float()
    i2t = image @ text.transpose(-1, -2)
    return i2t + i2t.transpose(-1, -2)


def _orderable(bits: np.ndarray) -> np.ndarray:
    """float32 bit patterns (int32) -> int32 keys in the floats' order, in place; its own inverse."""
    bits ^= (bits >> 31) & 0x7FFFFFFF  # negatives: flip all but the sign bit
    return bits


def _sort_rows_cpu(rows: np.ndarray, order: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Sort ``rows`` [R, W] (float32 scratch, +inf where excluded) ascending, equal values by
    **descending** column (a row's last is then its lowest-index maximum, as ``argmax``):
    writes the column order into ``order`` [R, W] (int16 or int32: the keys' low bits) and returns the sorted values
    at ``positions`` [P] ([R, P] float32). numpy's SIMD sort of packed (value, reversed column)
    int64 keys, about 6x ``torch.sort`` on 2 cores."""
    width = rows.shape[1]
    rows += 0.0  # -0.0 -> +0.0: equal values must get equal keys
    keys = _orderable(rows.view(np.int32)).astype(np.int64)
    keys <<= 32
    keys |= np.arange(width - 1, -1, -1, dtype=np.int64)
    keys.sort(axis=1)
    np.subtract(width - 1, keys.astype(order.dtype), out=order)  # the low bits: the reversed column
    return _orderable((keys[:, positions] >> 32).astype(np.int32)).view(np.float32)


def _sorted_rows(block: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of ``block`` [R, W] sorted as :func:`_sort_rows_cpu` orders them, on any device:
    (column indices [R, W] int64, sorted values at ``positions`` [R, P]). ``block`` is scratch."""
    width = block.shape[1]
    if block.device.type == "cpu":
        order = np.empty(block.shape, dtype=np.int32)
        values = _sort_rows_cpu(block.numpy(), order, positions.numpy())
        return torch.from_numpy(order).long(), torch.from_numpy(values)
    values, flipped = torch.sort(
        (block + 0.0).flip(1), dim=1, stable=True
    )  # flipped + stable: ties by descending column
    return (width - 1) - flipped, values[:, positions]


@dataclass
class SpaceTables:
    """What composition needs of a group of search spaces (all on one device).

    * ``order`` [S, W, W] (int16 when W < 32768, else int32): ``order[s, a]`` lists the
      candidates of anchor ``a`` by ascending similarity; the anchor itself and padding last.
    * ``s_hat`` [S, W, d] float32: the scheduler's input rows (the paper's: softmax of the m
      quantiles, d = m; see :mod:`~falcon_cli.sampling.scheduler_features`).
    * ``size`` [S] int64: real pairs per space (the rest of W is padding).
    * ``false_negative`` [S, W, W] bool or None: the oracle's truth, ``[s, a, j]`` = pair j is a false
      negative of anchor a (either direction; never the diagonal or padding). Only for diagnostics:
      composition never reads it (:func:`false_negative_tables`).
    """

    order: torch.Tensor
    s_hat: torch.Tensor
    size: torch.Tensor
    false_negative: torch.Tensor | None = None
    _host: dict = field(default_factory=dict, repr=False, compare=False)

    def host(self, name: str) -> np.ndarray:
        """``order``, ``false_negative`` or ``size`` as a host (numpy) array, copied from the device once: the
        chain reads a row of them per step."""
        if name not in self._host:
            self._host[name] = getattr(self, name).cpu().numpy()
        return self._host[name]

    def false_negative_density(self) -> np.ndarray:
        """[S, W] float64: each anchor's share of its space's other pairs that are its false negatives (the
        oracle's; once per space, as the truth does not change while it is composed)."""
        if "density" not in self._host:
            size = self.host("size")
            self._host["density"] = self.host("false_negative").sum(2) / np.maximum(size - 1, 1)[:, None].astype(
                np.float64
            )
        return self._host["density"]


def false_negative_tables(
    truth: Callable[[torch.Tensor], torch.Tensor], spaces: Sequence[torch.Tensor], width: int, device: torch.device
) -> torch.Tensor:
    """[S, W, W] bool from an oracle ``truth(pair_ids) -> [n, n]`` (image i truly described by caption j)
    for spaces of pair ids (padded to ``width``): symmetric, as the unified similarity is, so a candidate
    is a false negative of an anchor when either's caption truly describes the other's image."""
    table = torch.zeros(len(spaces), width, width, dtype=torch.bool)
    for s, ids in enumerate(spaces):
        n = len(ids)
        matrix = truth(ids.cpu()).bool()
        table[s, :n, :n] = (matrix | matrix.T) & ~torch.eye(n, dtype=torch.bool)
    return table.to(device)


@torch.no_grad()
def space_tables(
    image: torch.Tensor,
    text: torch.Tensor,
    size: torch.Tensor,
    *,
    quantiles: int = 100,
    temperature: float = 1.0,
    features: Sequence[str] = ("softmax",),
    panel_bytes: int = PANEL_BYTES,
) -> SpaceTables:
    """Sorted candidate orders and Ŝ for spaces of features ``image``/``text`` [S, W, D].

    Rows ``>= size[s]`` of space ``s`` are padding (their features are ignored). Each row's
    quantiles are taken over its ``size - 1`` real off-diagonal entries (a space of one pair
    has none: its Ŝ row is uniform). ``features``: the groups of the scheduler's input rows
    (:class:`~falcon_cli.sampling.scheduler_features.SchedulerFeatures`; the paper's ``softmax``). Similarities are
    computed a panel of rows at a time, so beyond the int16 order (|M| = 28,320: 1.6 GB) only ``panel_bytes`` are
    needed; on CPU the panel's rows are sorted in cache-sized blocks, one per core at a time.
    """
    spaces, width, _ = image.shape
    device = image.device
    index_dtype = torch.int16 if width < 32768 else torch.int32
    order = torch.empty(spaces, width, width, dtype=index_dtype, device=device)
    inputs = SchedulerFeatures(features, quantiles, temperature)
    s_hat = torch.empty(spaces, width, inputs.dim, dtype=torch.float32, device=device)
    panel_rows = max(1, panel_bytes // (width * 4))
    workers = ThreadPoolExecutor(torch.get_num_threads()) if device.type == "cpu" else None
    try:
        for s in range(spaces):
            _fill_space(
                order[s], s_hat[s], image[s].float(), text[s].float(), int(size[s]), inputs, panel_rows, workers
            )
    finally:
        if workers is not None:
            workers.shutdown()
    return SpaceTables(order, s_hat, size.to(device=device, dtype=torch.int64))


def _fill_space(
    order: torch.Tensor,
    s_hat: torch.Tensor,
    image: torch.Tensor,
    text: torch.Tensor,
    n: int,
    inputs: SchedulerFeatures,
    panel_rows: int,
    workers: ThreadPoolExecutor | None,
) -> None:
    """Fill one space's ``order`` [W, W] and ``s_hat`` [W, dim] (its first ``n`` rows are real), panel by panel."""
    width, quantiles = s_hat.shape[0], inputs.quantiles
    image_t, text_t = image.T.contiguous(), text.T.contiguous()
    # the quantiles of the n - 1 off-diagonal entries (linear interpolation, as torch.quantile)
    position = torch.linspace(0, 1, quantiles, dtype=torch.float64) * (max(n - 1, 1) - 1)
    lo, hi = position.floor().long(), position.ceil().long()
    frac = (position - lo).float().to(image.device)

    def features(values: torch.Tensor, positive: torch.Tensor, above: torch.Tensor) -> torch.Tensor:
        """Input rows from the sorted values at lo, hi (and the own pair's similarity, the count above it)."""
        low, high = values[:, :quantiles], values[:, quantiles:]
        q = low + (high - low) * frac if n > 1 else torch.zeros_like(low)
        return inputs(q, positive, above, n - 1)

    for p0 in range(0, width, panel_rows):
        p1 = min(width, p0 + panel_rows)
        panel = torch.mm(image[p0:p1], text_t).addmm_(text[p0:p1], image_t)  # rows p0:p1 of S = I Tᵀ + T Iᵀ
        positive = panel.diagonal(p0).clone()  # S_aa: the anchor's own pair
        above = (panel[:, :n] > positive[:, None]).sum(1) if inputs.needs_positive else torch.zeros_like(positive)
        panel[:, n:] = float("inf")
        panel.diagonal(p0).fill_(float("inf"))
        if workers is None:
            index, values = _sorted_rows(panel, torch.cat([lo, hi]))
            order[p0:p1] = index.to(order.dtype)
            s_hat[p0:p1] = features(values, positive, above)
            continue
        rows, out, positions = panel.numpy(), order.numpy(), torch.cat([lo, hi]).numpy()
        step = max(1, SORT_BLOCK_BYTES // (width * 4))

        def sort_block(r0: int) -> None:
            r1 = min(p1 - p0, r0 + step)
            values = _sort_rows_cpu(rows[r0:r1], out[p0 + r0 : p0 + r1], positions)
            s_hat[p0 + r0 : p0 + r1] = features(torch.from_numpy(values), positive[r0:r1], above[r0:r1])

        for _ in workers.map(sort_block, range(0, p1 - p0, step)):
            pass


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
        quantiles, temperature, features: the scheduler's input rows (:func:`space_tables`).
        grouped: ``pair_ids`` are already grouped into consecutive spaces of |M| (a warm
            start from built search spaces): they are not shuffled.
        truth: the oracle, ``truth(pair_ids) -> bool [n, n]`` (a shapes world; ``judges.oracle.in_batch_truth``):
            every batch then carries the oracle's view of its chained slots (``safe_q``,
            ``anchor_fn_density``, ``chosen_is_fn``, and ``fn_at_q0`` … ``fn_at_q100``: what each fixed q would have
            picked for the same anchor). It changes no choice and draws no randomness.
        credit_levels: FALCON's ``scheduler.update.credit: levels``: the grid of q's whose picks each on-demand batch's
            scheduler record also carries for every step (``level_hardness``, ``level_own``, ``level_fn``: what each
            q would have picked for the same anchor, from the same candidates; see :func:`compose_round`). Changes
            no choice and draws no randomness.
        scale: how q picks among a step's candidates, ``linear`` (the paper's quantile), ``log_rank`` (the k-th
            most similar, k = n^(1 - q)) or ``quadratic_rank`` (k - 1 = (n - 1)(1 - q)^2); :func:`quantile_position`.
    """

    def __init__(
        self,
        pair_ids: Any,
        cache: EmbeddingCache,
        search_space_size: int,
        batch_size: int,
        generator: torch.Generator,
        *,
        drop_last: bool = False,
        level: str = "instance",
        quantiles: int = 100,
        temperature: float = 1.0,
        features: Sequence[str] = ("softmax",),
        sampler: str = "quantile",
        grouped: bool = False,
        truth: Callable[[torch.Tensor], torch.Tensor] | None = None,
        credit_levels: Sequence[float] | None = None,
        scale: str = "linear",
    ):
        if level not in ("instance", "batch"):
            raise ValueError(f"level must be 'instance' or 'batch', got {level!r}")
        if scale not in QUANTILE_SCALES:
            raise ValueError(f"scale must be one of {QUANTILE_SCALES}, got {scale!r}")
        self.scale = scale
        ids = as_id_tensor(pair_ids).cpu()
        self.cache = cache
        self.batch_size = int(batch_size)
        self.drop_last = bool(drop_last)
        self.level = level
        self.quantiles = int(quantiles)
        self.temperature = float(temperature)
        self.features = tuple(features)
        self.sampler = sampler
        self.truth = truth
        self.credit_levels = None if credit_levels is None else np.asarray(credit_levels, dtype=np.float64)
        n = len(ids)
        self.width = max(1, min(int(search_space_size), n))
        self.shuffled = ids if grouped else ids[torch.randperm(n, generator=generator)]
        self.num_spaces = math.ceil(n / self.width) if n else 0
        rows = cache.rows(self.shuffled)
        if n and not bool(cache.written[rows].any()):
            raise FalconError(
                f"embedding cache holds no features for any of the {n} pairs to compose; "
                "train an epoch (or load embeddings) before composing quantile batches"
            )
        self.current = -1  # index of the space being composed (one-at-a-time use)
        self.available: torch.Tensor | None = None
        self.snapshot: tuple[torch.Tensor, torch.Tensor] | None = None
        self.tables: SpaceTables | None = None

    # sizes and ids --------------------------------------------------------------------------
    def space_size(self, s: int) -> int:
        """Number of pairs in space ``s``."""
        return min(self.width, len(self.shuffled) - s * self.width)

    def space_ids(self, s: int) -> torch.Tensor:
        """Pair ids of space ``s``, in position order."""
        return self.shuffled[s * self.width : s * self.width + self.space_size(s)]

    def batches_in_space(self, s: int) -> int:
        """Batches space ``s`` yields (a short last one unless ``drop_last``)."""
        n = self.space_size(s)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __len__(self) -> int:
        """Number of batches the epoch has."""
        return num_space_batches(len(self.shuffled), self.width, self.batch_size, self.drop_last)

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

    def _tables(self, spaces: list[int], image: torch.Tensor, text: torch.Tensor, size: torch.Tensor) -> SpaceTables:
        tables = space_tables(
            image, text, size, quantiles=self.quantiles, temperature=self.temperature, features=self.features
        )
        if self.truth is not None:
            tables.false_negative = false_negative_tables(
                self.truth, [self.space_ids(s) for s in spaces], self.width, image.device
            )
        return tables

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
        self.tables = self._tables([s], image, text, size)
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
        columns, record = compose_round(
            self.tables,
            self.available,
            self.snapshot,
            source,
            self.batch_size,
            generator,
            level=self.level,
            credit_levels=self.credit_levels,
            scale=self.scale,
        )
        ids = self.space_ids(self.current)
        return _to_batch(columns, 0, ids, self.sampler), {k: v[0] for k, v in record.items()}

    def _usable(self, available: torch.Tensor) -> bool:
        remaining = int(available.sum())
        return remaining >= self.batch_size or (remaining > 0 and not self.drop_last)

    def state_dict(self) -> dict[str, Any]:
        """Position inside the epoch (the current space, what is still available, its feature snapshot)."""
        return {
            "shuffled": self.shuffled,
            "current": self.current,
            "available": None if self.available is None else self.available.cpu().clone(),
            "snapshot": None if self.snapshot is None else tuple(t.cpu() for t in self.snapshot),
            "width": self.width,
            "batch_size": self.batch_size,
            "level": self.level,
        }

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
            self.tables = self._tables([self.current], image, text, size)
            self.available = state["available"].to(device)

    # every space at once (fixed q) ----------------------------------------------------------
    def compose_all(
        self,
        source: QSource,
        generator: torch.Generator,
        *,
        spaces_per_chunk: int | None = None,
        step_threads: int | None = 1,
    ) -> list[Batch]:
        """Every batch of the epoch, spaces advancing together in chunks (for a fixed q, or a
        policy that does not change meanwhile). Batches are returned space by space.

        ``step_threads``: on CPU, torch threads for the rounds (the chain's small gathers and sums; restored
        after; ``None`` keeps torch's setting); the tables (products, sorts) and the policy use torch's
        setting. As for GRIT (:class:`~falcon_cli.sampling.composers.GritComposer`): on a busy 2-core machine
        OpenMP threads competing for the cores made each round ~40x slower (70 ms against 1.7 ms for the
        per-slot columns of 2 spaces; ``benchmarks/scale_simulation.py``)."""
        out: list[Batch] = []
        if spaces_per_chunk is None:  # order table + features + a few W-rows per space
            per_space = self.width * self.width * (2 if self.width < 32768 else 4) + self.width * (
                self.quantiles * 4 + 1024
            )
            spaces_per_chunk = max(1, COMPOSE_CHUNK_BYTES // per_space)
        for first in range(0, self.num_spaces, spaces_per_chunk):
            group = list(range(first, min(self.num_spaces, first + spaces_per_chunk)))
            image, text, size = self._features(group)
            tables = self._tables(group, image, text, size)
            available = _unselected(self.width, size, image.device)
            alpha_beta = None
            if callable(source):  # φ is fixed: the policy's output for every row, once (space by space: bounded memory)
                outputs = [source(tables.s_hat[i]) for i in range(len(group))]
                alpha_beta = tuple(torch.stack([o[k].float() for o in outputs]) for k in (0, 1))
            per_space: list[list[Batch]] = [[] for _ in group]
            with _torch_threads(step_threads if image.device.type == "cpu" else None):
                for _ in range(max(self.batches_in_space(s) for s in group)):
                    active = torch.tensor([self._usable(available[i]) for i in range(len(group))])
                    if not active.any():
                        break
                    columns, _ = compose_round(
                        tables,
                        available,
                        (image, text),
                        source,
                        self.batch_size,
                        generator,
                        level=self.level,
                        active=active,
                        alpha_beta=alpha_beta,
                        scale=self.scale,
                    )
                    for j, i in enumerate(active.nonzero().flatten().tolist()):
                        per_space[i].append(_to_batch(columns, j, self.space_ids(group[i]), self.sampler))
            for batches in per_space:
                out.extend(batches)
            del tables, alpha_beta  # before the next chunk's tables exist: one chunk's tables in memory at a time
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
    return Batch(
        ids[local],
        anchor_ids,
        *(columns[k][j, :n].float().cpu() for k in ("q", "alpha", "beta", "similarity", "rank")),
        sampler=sampler,
        **{k: columns[k][j, :n].float().cpu() for k in Batch.ORACLE_FIELDS},
    )


@torch.no_grad()
def compose_round(
    tables: SpaceTables,
    available: torch.Tensor,
    features: tuple[torch.Tensor, torch.Tensor],
    source: QSource,
    batch_size: int,
    generator: torch.Generator,
    *,
    level: str = "instance",
    active: torch.Tensor | None = None,
    alpha_beta: tuple[torch.Tensor, torch.Tensor] | None = None,
    credit_levels: np.ndarray | None = None,
    scale: str = "linear",
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """One batch from each active space (Algorithm 1), updating ``available`` [S, W] in place.

    Every active space must have a pair left. A policy runs once, on the Ŝ rows of every
    pair still available in the active spaces (any of them can become an anchor), unless
    ``alpha_beta`` ([S, W] each) already holds its output for every row. Random draws from
    ``generator``, in order: one float64 uniform per active space (the batch's first pair,
    uniform over its available pairs); then, with a policy, one :func:`numpy_generator`
    seed, from which per step one :func:`sample_q` call draws for the spaces that still
    have candidates (batch level: one call at the first step, for all active spaces). Returns per-slot columns
    ``[A, B]`` (A active spaces) and the scheduler record ``{"s_hat": [A, k, m], "q": [A, k]}`` (k = B - 1 at instance
    level, 1 at batch level; NaN q = step not taken).

    ``credit_levels`` (a policy at instance level: ``scheduler.update.credit: levels``): the record also holds, per
    step, the picks each of these q's would have made for the same anchor among the same available candidates (the
    nearest rank, as the chain's own pick): ``level_hardness`` ``[A, k, L]`` their similarity S = I_a·T_j + T_a·I_j
    to the anchor and ``level_own`` ``[A, k]`` the anchor's own pair on that scale, 2 I_a·T_a (from ``features``,
    the epoch's snapshot), and ``level_fn`` ``[A, k, L]`` the oracle's verdict on each (1.0: a false negative;
    NaN without an oracle); NaN where a step was not taken. No randomness is drawn for them.

    ``scale``: how q picks among the candidates left (:func:`quantile_position`), for the chain, the credit levels
    and the oracle's fixed-q frontier alike.
    """
    _check_q_source(source)
    device = available.device
    group = torch.arange(available.shape[0], device=device)
    if active is not None:
        group = group[active.to(device)]
    a, width = len(group), available.shape[1]
    # The chain runs on the host, in numpy: its steps are sequential and each is a few O(W) operations, so on a
    # GPU they would cost a launch and a host round trip apiece (measured on an H100: 35 ms per batch of 95
    # steps, against a few here). The tables stay on the device for the similarity columns and the record.
    group_np = group.cpu().numpy()
    order_rows = tables.host("order").reshape(-1, width)  # row (space s, anchor j) at s * W + j
    row_of = group_np * width  # [a] first row of each active space
    unselected = available[group]  # [a, W] bool, True = not yet chosen
    avail = unselected.cpu().numpy().copy()
    spaces_np = np.arange(a)
    policy = source if callable(source) else None
    if policy is not None and alpha_beta is None:  # α, β of every row that may become an anchor
        rows = unselected.nonzero(as_tuple=True)
        alpha_all = torch.ones(a, width, device=device)
        beta_all = torch.ones(a, width, device=device)
        alpha_rows, beta_rows = policy(tables.s_hat[group][rows])
        alpha_all[rows], beta_all[rows] = alpha_rows.float(), beta_rows.float()
    elif policy is not None:
        alpha_all, beta_all = (t[group].float() for t in alpha_beta)
    # the first pair: uniform over the available ones
    n = avail.sum(1, dtype=np.int64)
    u = torch.rand(a, generator=generator, dtype=torch.float64).numpy()
    pick = np.minimum((u * n).astype(np.int64), n - 1)
    first = (np.cumsum(avail, 1, dtype=np.int32) < (pick + 1)[:, None]).sum(1)
    avail[spaces_np, first] = False
    # step t (1 ≤ t < B) has n - t candidates; a space with none left just picks an already-chosen
    # slot (harmless: it is unavailable already) and its steps are masked out of the columns
    taken = min(batch_size - 1, int(n.max()) - 1)
    left_np = (n[:, None] - np.arange(1, taken + 1)).astype(np.float64)  # [a, taken]
    all_go = int(n.min()) - 1  # before step all_go every space still has a candidate
    if policy is None:  # every rank is known in advance
        rank = quantile_position(float(source), left_np, scale)
    else:  # q is drawn with numpy, from this round's generator
        alpha_np, beta_np = (t.double().cpu().numpy() for t in (alpha_all, beta_all))
        check_beta_parameters(alpha_np, beta_np)
        q_generator = numpy_generator(generator)
    last, q, qs, ranks, anchors, chosens = first, None, [], [], [], []
    oracle = tables.host("false_negative").reshape(-1, width) if tables.false_negative is not None else None
    safe, chosen_fn = np.full((a, taken), -1, dtype=np.int64), np.zeros((a, taken), dtype=bool)
    fixed_fn = np.zeros((a, taken, len(FIXED_Q_LEVELS)), dtype=bool)  # what each fixed q would have picked
    levels = np.asarray(FIXED_Q_LEVELS)
    counterfactual = credit_levels is not None and policy is not None and level == "instance"
    if counterfactual:  # the local index of what each credit level would have picked (-1: step not taken)
        level_pick = np.full((a, taken, len(credit_levels)), -1, dtype=np.int64)
        level_fn = np.full((a, taken, len(credit_levels)), np.nan)
    for t in range(taken):
        if policy is not None:
            if (level == "batch" and q is None) or (level == "instance" and t < all_go):  # every space draws
                q = draw_q(alpha_np[spaces_np, last], beta_np[spaces_np, last], q_generator)
            elif level == "instance":  # near a space's end: only the spaces that still have candidates draw
                going = left_np[:, t] > 0
                q = np.full(a, np.nan)
                q[going] = draw_q(alpha_np[going, last[going]], beta_np[going, last[going]], q_generator)
            r = quantile_position(q, left_np[:, t], scale)
            qs.append(q)
            ranks.append(r)
        else:
            r = rank[:, t]
        # per space: the anchor's candidates by ascending similarity, the positions of the available ones, and
        # the (r+1)-th of those (none left: the last position, the anchor itself, masked out of the columns)
        chosen = np.empty(a, dtype=np.int64)
        for i in range(a):
            candidates = order_rows[row_of[i] + last[i]]
            free = avail[i].take(candidates).nonzero()[0]
            chosen[i] = candidates[free[r[i]] if r[i] < len(free) else width - 1]
            if counterfactual and len(free):
                level_pick[i, t] = candidates.take(free.take(quantile_position(credit_levels, len(free), scale)))
            if oracle is not None:  # the oracle's view (no effect on the choice): the last available true negative
                fn = oracle[row_of[i] + last[i]]  # [W] by local index
                if counterfactual and len(free):
                    level_fn[i, t] = fn.take(level_pick[i, t])
                ordered_fn = fn.take(candidates.take(free))  # by rank among the available
                true_negative = (~ordered_fn).nonzero()[0]
                safe[i, t] = true_negative[-1] if len(true_negative) else -1
                chosen_fn[i, t] = fn[chosen[i]]
                if len(ordered_fn):
                    fixed_fn[i, t] = ordered_fn[quantile_position(levels, len(ordered_fn), scale)]
            avail[i, chosen[i]] = False
        anchors.append(last)
        chosens.append(chosen)
        last = chosen
    available[group] = torch.from_numpy(avail).to(device)

    def stacked(values: list[np.ndarray]) -> np.ndarray:  # [a, taken]
        return np.stack(values, 1) if values else np.empty((a, 0))

    steps = {
        "n": left_np,
        "r": rank if policy is None else stacked(ranks),
        "q": np.full_like(left_np, float(source)) if policy is None else stacked(qs),
        "anchor": stacked(anchors).astype(np.int64),
        "chosen": stacked(chosens).astype(np.int64),
    }
    if oracle is not None:  # rank of the last safe candidate (-1: none), and whether the pick is a false negative
        steps.update(safe=safe, chosen_fn=chosen_fn, fixed_fn=fixed_fn)
    if counterfactual:
        steps.update(level_pick=level_pick, level_fn=level_fn)
    return _round_columns(
        tables,
        features,
        group_np,
        first,
        steps,
        batch_size,
        level,
        None if policy is None else (alpha_np, beta_np),
        scale,
    )


def _round_columns(
    tables: SpaceTables,
    features: tuple[torch.Tensor, torch.Tensor],
    group: np.ndarray,
    first: np.ndarray,
    steps: dict[str, np.ndarray],
    batch_size: int,
    level: str,
    alpha_beta: tuple[np.ndarray, np.ndarray] | None,
    scale: str,
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The per-slot columns (CPU tensors ``[a, B]``: the chain's results, read on the host) and the scheduler
    record (on the tables' device, where the scheduler learns) of a round, from its per-step arrays ``[a, taken]``.
    A pick's rank and the oracle's safe q are on the q scale the chain picked with (``scale``), so that they compare
    with its q."""
    device, (a,) = tables.s_hat.device, first.shape
    width, m = tables.order.shape[-1], tables.s_hat.shape[-1]
    n, r, q = steps["n"], steps["r"].astype(np.float64), steps["q"].astype(np.float64)
    chosen, anchor = steps["chosen"], steps["anchor"]
    go = n > 0
    taken = go.shape[1]

    def column(
        values: np.ndarray, fill: float, first_slot: float, dtype=np.float32
    ) -> torch.Tensor:  # slot 0, steps, tail
        out = np.full((a, batch_size), fill, dtype=dtype)
        out[:, 0] = first_slot
        out[:, 1 : 1 + taken] = np.where(go, values, fill)
        return torch.from_numpy(out)

    nan = float("nan")
    # rank among the remaining candidates on the chain's q scale, 1 = hardest (a lone candidate is the hardest)
    rank = scale_rank(r, n, scale)
    # the pair's similarity to its anchor (the unified S / 2), from the features on their device: one gather
    row_of = (group * width)[:, None]
    pairs = torch.from_numpy(np.stack([(row_of + anchor).reshape(-1), (row_of + np.maximum(chosen, 0)).reshape(-1)]))
    image, text = (t.reshape(-1, t.shape[-1]) for t in features)
    left, right = pairs.to(image.device).unbind(0)
    similarity = (
        (image[left].float() * text[right].float()).sum(-1) + (text[left].float() * image[right].float()).sum(-1)
    ).view(a, taken) / 2
    source_row = np.broadcast_to(first[:, None], (a, taken)) if level == "batch" else anchor
    if alpha_beta is not None:
        alpha, beta = (np.take_along_axis(t, source_row, 1) for t in alpha_beta)
    else:
        alpha = beta = np.full((a, taken), nan)
    columns = {
        "local": column(chosen, -1, 0, np.int64),
        "anchor": column(anchor, -1, -1, np.int64),
        "q": column(q, nan, nan, np.float64),
        "alpha": column(alpha, nan, nan),
        "beta": column(beta, nan, nan),
        "similarity": column(similarity.float().cpu().numpy(), nan, nan),
        "rank": column(rank, nan, nan),
        "length": torch.from_numpy(1 + go.sum(1)),
    }
    if "safe" in steps:  # the oracle's view: safe q (on the chain's scale: its last safe rank), density, FN pick
        safe = steps["safe"].astype(np.float64)
        safe_q = np.where(safe < 0, nan, scale_rank(np.fmax(safe, 0), n, scale))
        density = tables.false_negative_density()[group]  # [a, W]
        columns.update(
            safe_q=column(safe_q, nan, nan),
            anchor_fn_density=column(np.take_along_axis(density, anchor, 1), nan, nan),
            chosen_is_fn=column(steps["chosen_fn"], nan, nan),
            **{name: column(steps["fixed_fn"][:, :, k], nan, nan) for k, name in enumerate(FIXED_Q_FIELDS)},
        )
    else:
        columns.update({k: torch.full((a, batch_size), nan) for k in Batch.ORACLE_FIELDS})
    columns["local"][:, 0] = torch.from_numpy(first)
    if alpha_beta is None or not taken:
        record = {
            "s_hat": torch.empty(a, 0, m, device=device),
            "q": torch.empty(a, 0, dtype=torch.float64, device=device),
        }
    elif level == "batch":  # the batch's one q, from its first pair's row
        rows = torch.from_numpy(row_of[:, 0] + first).to(device)
        record = {
            "s_hat": tables.s_hat.view(-1, m)[rows][:, None],
            "q": torch.from_numpy(np.where(go[:, :1], q[:, :1], nan)).to(device),
        }
    else:
        rows = torch.from_numpy((row_of + anchor).reshape(-1)).to(device)
        record = {
            "s_hat": tables.s_hat.view(-1, m)[rows].view(a, taken, m),
            "q": torch.from_numpy(np.where(go, q, nan)).to(device),
        }
        if "level_pick" in steps:
            record.update(_level_record(features, row_of, anchor, steps["level_pick"], steps["level_fn"], device))
    return columns, record


def _level_record(
    features: tuple[torch.Tensor, torch.Tensor],
    row_of: np.ndarray,
    anchor: np.ndarray,
    pick: np.ndarray,
    fn: np.ndarray,
    device: torch.device,
) -> dict[str, torch.Tensor]:
    """``scheduler.update.credit: levels``: the record's ``level_hardness`` ``[a, k, L]``, ``level_own`` ``[a, k]`` and
    ``level_fn`` ``[a, k, L]`` (see :func:`compose_round`) from the grid's picks ``pick`` (local, -1: not taken),
    one gather of the snapshot's features on their device."""
    image, text = (t.reshape(-1, t.shape[-1]) for t in features)
    left = torch.from_numpy(row_of + anchor).to(image.device)  # [a, k]
    right = torch.from_numpy(row_of[..., None] + np.maximum(pick, 0)).to(image.device)  # [a, k, L]
    anchor_i, anchor_t = image[left].float(), text[left].float()
    hardness = (anchor_i[:, :, None] * text[right].float()).sum(-1) + (anchor_t[:, :, None] * image[right].float()).sum(
        -1
    )
    missing = torch.from_numpy(pick < 0).to(image.device)
    own = torch.where(missing.all(-1), float("nan"), 2 * (anchor_i * anchor_t).sum(-1))
    return {
        "level_hardness": hardness.masked_fill(missing, float("nan")).to(device),
        "level_own": own.to(device),
        "level_fn": torch.from_numpy(np.where(pick < 0, np.nan, fn)).to(device),
    }
