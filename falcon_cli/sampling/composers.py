"""Batch composers: which pairs form each mini-batch of an epoch.

A composer turns the pair ids one rank trains on in an epoch into an ordered list of
:class:`Batch` records. Every record carries, per slot, what the batch log
(``batches.parquet``) needs: the pair it was chained from, the quantile used to pick it,
the Beta parameters, its similarity to the anchor and its rank among the remaining
candidates.

Two composers live here:

- :class:`UniformComposer`: a random permutation cut into batches (ALBEF; every method's epoch 0).
- :class:`GritComposer`: GRIT-VLP's greedy hardest-negative chain inside shuffled search
  spaces (reference-code.md §1), vectorised over search spaces.

The quantile composers (a fixed q, a progressive q, FALCON's learned q) implement the same
:class:`BatchComposer` protocol in :mod:`falcon_cli.sampling.quantile_composer`.

Randomness comes only from the ``torch.Generator`` the caller passes (a **CPU**
generator, so an epoch's batches do not depend on the device the similarities are
computed on, and a resumed run that restores the generator's state recomposes exactly).

``drop_last``: composers concatenate their order and cut it into batches of
``batch_size``. With ``drop_last=False`` (the default) the final partial batch is kept
(smaller), so every pair is trained once per epoch. With ``drop_last=True`` it is
dropped; GRIT-VLP's code does this silently (``DataLoader(drop_last=True)``), so its
coverage shrinks every epoch (reference-code.md §1, "Consequence 2").

DDP: :func:`shard_pair_ids` deals the dataset's pair ids to ranks each epoch; each rank
composes from its own shard (its own search spaces) and all shards have the same size,
so every rank gets the same number of batches.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Iterator, Protocol, runtime_checkable

import torch

from falcon_cli.errors import FalconError
from falcon_cli.runtime.progress import track
from falcon_cli.sampling.cache import EmbeddingCache, as_id_tensor

DEFAULT_MAX_CHUNK_BYTES = 1 << 30
"""Default memory bound (bytes) for the similarity blocks of one chunk of search spaces."""


# --- the batch record ---------------------------------------------------------------------
FIXED_Q_LEVELS = (0.0, 0.25, 0.5, 0.75, 1.0)
"""The q's of the fixed-q frontier each chained slot is scored at (``Batch.fn_at_q0`` … ``fn_at_q100``)."""

FIXED_Q_FIELDS = ("fn_at_q0", "fn_at_q25", "fn_at_q50", "fn_at_q75", "fn_at_q100")
"""The batch fields of :data:`FIXED_Q_LEVELS`, in order."""


@dataclass
class Batch:
    """One composed mini-batch: ``pair_ids`` [b] int64 plus per-slot metadata for the batch log.

    All fields are 1-d CPU tensors of the same length ``b``:

    - ``anchor_pair_id`` (int64): the pair this slot was chained from; -1 where none
      (uniform batches, the first element of a chain).
    - ``q`` (float32): the quantile used to pick the slot (GRIT: 1.0, the argmax); NaN where none.
    - ``alpha``, ``beta`` (float32): the Beta parameters ``q`` was drawn from; NaN where none.
    - ``similarity_to_anchor`` (float32): the cosine similarity to the anchor at composition time; NaN where none.
    - ``quantile_rank`` (float32): the slot's rank among the anchor's remaining candidates, in [0, 1], 1 = the
      hardest, on the q scale the chain picked with (``composer.quantile_scale``: under ``log_rank`` the k-th most
      similar of n is 1 − ln k / ln n; :func:`~falcon_cli.sampling.quantile.scale_rank`); NaN where none.

    ``sampler`` names the rule that actually composed the batch (``uniform``, ``grit``, ...).

    The oracle's view of each chained slot (float32; NaN where unknown: no oracle, not a quantile
    chain, a batch's first slot), filled by the quantile composers on a shapes world:

    - ``safe_q``: the highest q (on the chain's scale, as ``quantile_rank``) whose pick among the anchor's remaining
      candidates would have been a true negative (NaN if every remaining candidate is a false negative).
    - ``anchor_fn_density``: the share of the anchor's search space that are its false negatives.
    - ``chosen_is_fn``: 1.0 if the slot is a false negative of its anchor, else 0.0.
    - ``fn_at_q0`` … ``fn_at_q100``: 1.0 if the pick one fixed q (:data:`FIXED_Q_LEVELS`) would have made for
      the same anchor among the same remaining candidates is a false negative, else 0.0: the fixed-q frontier on
      the very anchors a scheduler saw (:func:`~falcon_cli.sampling.oracle_view.composition_summary`).
    """

    pair_ids: torch.Tensor
    anchor_pair_id: torch.Tensor
    q: torch.Tensor
    alpha: torch.Tensor
    beta: torch.Tensor
    similarity_to_anchor: torch.Tensor
    quantile_rank: torch.Tensor
    sampler: str
    safe_q: torch.Tensor | None = None
    anchor_fn_density: torch.Tensor | None = None
    chosen_is_fn: torch.Tensor | None = None
    fn_at_q0: torch.Tensor | None = None
    fn_at_q25: torch.Tensor | None = None
    fn_at_q50: torch.Tensor | None = None
    fn_at_q75: torch.Tensor | None = None
    fn_at_q100: torch.Tensor | None = None

    FIELDS = ("pair_ids", "anchor_pair_id", "q", "alpha", "beta", "similarity_to_anchor", "quantile_rank")
    ORACLE_FIELDS = (
        "safe_q",
        "anchor_fn_density",
        "chosen_is_fn",
        "fn_at_q0",
        "fn_at_q25",
        "fn_at_q50",
        "fn_at_q75",
        "fn_at_q100",
    )

    def __post_init__(self) -> None:
        n = len(self.pair_ids)
        for name in self.ORACLE_FIELDS:
            if getattr(self, name) is None:
                setattr(self, name, torch.full((n,), float("nan"), dtype=torch.float32))
        for name in self.FIELDS + self.ORACLE_FIELDS:
            value = getattr(self, name)
            if value.ndim != 1 or len(value) != n:
                raise ValueError(f"Batch.{name} has shape {tuple(value.shape)}, expected ({n},)")

    def __len__(self) -> int:
        return len(self.pair_ids)

    @classmethod
    def without_anchors(cls, pair_ids: torch.Tensor, sampler: str) -> "Batch":
        """A batch whose slots were not chained from anything (anchors -1, metadata NaN)."""
        ids = as_id_tensor(pair_ids).cpu()
        nan = torch.full((len(ids),), float("nan"), dtype=torch.float32)
        return cls(ids, torch.full_like(ids, -1), nan, nan, nan, nan, nan, sampler)


def batches_state(batches: list[Batch]) -> dict[str, Any]:
    """An epoch's batches as a few flat tensors (for checkpoints: resume mid-epoch exactly)."""
    state: dict[str, Any] = {
        "sizes": torch.tensor([len(b) for b in batches], dtype=torch.int64),
        "sampler": [b.sampler for b in batches],
    }
    for name in Batch.FIELDS + Batch.ORACLE_FIELDS:
        dtype = torch.int64 if name in ("pair_ids", "anchor_pair_id") else torch.float32
        state[name] = torch.cat([getattr(b, name) for b in batches]) if batches else torch.empty(0, dtype=dtype)
    return state


def batches_from_state(state: dict[str, Any]) -> list[Batch]:
    """Inverse of :func:`batches_state`."""
    sizes = [int(s) for s in state["sizes"]]
    oracle = [name for name in Batch.ORACLE_FIELDS if name in state]  # (absent from older checkpoints)
    parts = {name: torch.split(state[name], sizes) for name in Batch.FIELDS + tuple(oracle)} if sizes else {}
    return [
        Batch(
            *(parts[name][i] for name in Batch.FIELDS),
            sampler=state["sampler"][i],
            **{name: parts[name][i] for name in oracle},
        )
        for i in range(len(sizes))
    ]


# --- the protocol ------------------------------------------------------------------------
@runtime_checkable
class BatchComposer(Protocol):
    """Composes an epoch's mini-batches for one rank.

    Attributes:
        name: the composer's name (what the batch log's ``sampler`` column says for its batches).
        batch_size: B, the size of every batch except possibly the last.
        drop_last: False keeps the final partial batch (every pair is seen each epoch);
            True drops it.
    """

    name: str
    batch_size: int
    drop_last: bool
    on_demand: bool
    """True where an epoch's batches depend on training as it goes (FALCON: batch k + 1 is drawn with the
    scheduler updated at step k): such a composer also has ``spaces(...)``, the epoch's search spaces that
    give one batch at a time (:class:`~falcon_cli.sampling.feed.FalconFeed`); its ``compose_epoch`` composes
    every batch with the current policy."""

    def compose_epoch(
        self,
        epoch: int,
        pair_ids: Any,
        cache: EmbeddingCache | None,
        generator: torch.Generator,
        *,
        grouped_width: int | None = None,
    ) -> list[Batch]:
        """Batches of ``epoch`` from ``pair_ids`` (the ids this rank composes from, e.g. its
        :func:`shard_pair_ids` shard), using the features in ``cache`` (or none) and drawing
        all randomness from ``generator`` (a CPU generator owned by the caller). ``grouped_width``:
        ``pair_ids`` come already grouped into search spaces of this many pairs (a warm start)."""
        ...

    def num_epoch_batches(self, epoch: int, n: int, *, grouped_width: int | None = None) -> int:
        """How many batches :meth:`compose_epoch` makes of ``n`` pairs in ``epoch``."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The composer's state (for exact resume; the generator's state is the caller's)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (refuses a state from a differently configured composer)."""
        ...


def _check_generator(generator: torch.Generator) -> None:
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if generator.device.type != "cpu":
        raise ValueError(
            f"composers draw randomness on the CPU; pass a CPU torch.Generator, not one on {generator.device}"
        )


def _check_config(kind: str, mine: dict[str, Any], state: dict[str, Any]) -> None:
    diffs = [f"{k}={state.get(k)!r} (this composer: {v!r})" for k, v in mine.items() if state.get(k) != v]
    if diffs:
        raise FalconError(f"{kind} state does not match this composer: {', '.join(diffs)}")


def _cut(
    columns: dict[str, torch.Tensor], batch_size: int, drop_last: bool, sampler: str, order: torch.Tensor | None
) -> list[Batch]:
    """Cut flat per-slot columns into batches of ``batch_size``, in ``order`` (batch indices) if given."""
    indices = range(num_batches(len(columns["pair_ids"]), batch_size, drop_last)) if order is None else order.tolist()
    return [
        Batch(*(columns[name][i * batch_size : (i + 1) * batch_size] for name in Batch.FIELDS), sampler=sampler)
        for i in indices
    ]


def num_batches(n: int, batch_size: int, drop_last: bool) -> int:
    """Number of batches ``n`` pairs are cut into: uniform and GRIT epochs (whose chains run across
    search spaces, as GRIT-VLP's code cuts them), and each search space of a quantile epoch."""
    return n // batch_size if drop_last else math.ceil(n / batch_size)


def num_space_batches(n: int, width: int, batch_size: int, drop_last: bool) -> int:
    """Number of batches of an epoch over ``n`` pairs composed space by space (quantile, progressive,
    FALCON): spaces of ``width`` pairs (the last holds the rest), each cut on its own, so each space
    whose size is not a multiple of ``batch_size`` ends in a smaller batch (or drops it)."""
    if n <= 0:
        return 0
    full, rest = divmod(n, max(1, min(width, n)))
    return full * num_batches(max(1, min(width, n)), batch_size, drop_last) + num_batches(rest, batch_size, drop_last)


# --- uniform ---------------------------------------------------------------------------------
class UniformComposer:
    """A uniformly random permutation of the pair ids, cut into batches of ``batch_size``.

    Draws one ``torch.randperm(n)`` from the generator per epoch; ignores the cache.
    """

    name = "uniform"
    on_demand = False

    def __init__(self, batch_size: int, *, drop_last: bool = False):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = int(batch_size)
        self.drop_last = bool(drop_last)

    def compose_epoch(
        self,
        epoch: int,
        pair_ids: Any,
        cache: EmbeddingCache | None,
        generator: torch.Generator,
        *,
        grouped_width: int | None = None,
    ) -> list[Batch]:
        """(``cache`` and ``grouped_width`` are not used: a uniform epoch ignores features and spaces.)"""
        _check_generator(generator)
        return uniform_batches(as_id_tensor(pair_ids).cpu(), self.batch_size, self.drop_last, generator, self.name)

    def num_epoch_batches(self, epoch: int, n: int, *, grouped_width: int | None = None) -> int:
        return num_batches(n, self.batch_size, self.drop_last)

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "batch_size": self.batch_size, "drop_last": self.drop_last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_config("uniform composer", self.state_dict(), state)


def uniform_batches(
    ids: torch.Tensor, batch_size: int, drop_last: bool, generator: torch.Generator, sampler: str = "uniform"
) -> list[Batch]:
    """Random permutation of ``ids`` (one ``randperm`` from ``generator``) cut into batches."""
    perm = torch.randperm(len(ids), generator=generator)
    chain = ids[perm]
    nan = torch.full((len(chain),), float("nan"), dtype=torch.float32)
    columns = {
        "pair_ids": chain,
        "anchor_pair_id": torch.full_like(chain, -1),
        "q": nan,
        "alpha": nan,
        "beta": nan,
        "similarity_to_anchor": nan,
        "quantile_rank": nan,
    }
    return _cut(columns, batch_size, drop_last, sampler, None)


# --- GRIT-VLP ----------------------------------------------------------------------------------
class GritComposer:
    """GRIT-VLP grouped mini-batches: greedy hardest-negative chains inside search spaces.

    Per epoch (epoch 0, or no cache: uniform batches, logged as ``uniform``):

    1. Example-level shuffle: ``randperm(n)`` of the pair ids.
    2. Split into search spaces of ``composer.search_space_size`` = |M| consecutive ids (the last one
       holds the remainder and may be smaller).
    3. In each space, start at a uniformly random pair (one float64 ``rand`` per space, all
       spaces drawn at once) and chain: slot ``k`` (k = 1, 2, ...) is the pair whose **text**
       is most similar to the **image** of slot ``k - 1`` when ``k`` is odd (I2T argmax), and
       the pair whose **image** is most similar to the **text** of slot ``k - 1`` when ``k``
       is even (T2I argmax). Pairs already in the chain are masked with ``-inf``.
       This is exactly the reference order (``start, t, cur_i, t, cur_i, ...``) including its
       tail rule: when |M| is even, the reference appends one extra I2T argmax from the last
       image, which is slot ``|M| - 1``, an odd slot, i.e. the same rule.
    4. Concatenate the chains (space order), cut into batches of ``batch_size``
       (``drop_last`` decides about the partial last batch) and shuffle the batch order
       (one ``randperm`` over batches: GRIT's mini-batch-level shuffle).

    Similarities are raw cosines of the cached fp16 features, computed in float32
    (``S_i2t = I Tᵀ``, ``S_t2i = T Iᵀ = S_i2tᵀ``). The reference row-softmaxes ``sim / temp``
    first; softmax is monotonic within a row, so the argmax, and hence the chain, does not
    depend on the temperature, which is why none is taken here. Masking raw similarities
    with ``-inf`` (rather than zeroing softmax probabilities, which underflow to exactly 0
    at small temperatures so that argmax can return an already-used pair) guarantees each
    pair appears exactly once. Ties go to the lowest index (``torch.max`` semantics).

    Logged per slot: ``anchor_pair_id`` = the previous pair of the chain (-1 at a chain
    start; a batch's first slot may be chained from the last slot of another batch),
    ``similarity_to_anchor`` = the similarity used for the argmax, ``q = 1.0`` (GRIT is the
    q = 1 extreme of FALCON's quantile rule), ``quantile_rank = 1.0`` (the argmax is by
    construction the hardest remaining candidate; tied candidates count as equally hard);
    ``alpha``/``beta`` are NaN. Chain starts have NaN metadata.

    Vectorisation: the chain is sequential inside a space, but all spaces of a chunk run
    together as ``[S, W, W]`` similarity blocks (W = min(|M|, n)): one epoch is ``W - 1``
    batched argmax steps per chunk, no Python loop over spaces or candidates. The smaller
    last space is padded with dummy rows that start out masked. Chunks hold as many spaces
    as fit in ``max_chunk_bytes`` (at least one, see :func:`chunk_plan`). Each step fetches
    one row per space (``index_select`` on the flattened block), adds a ``0 / -inf`` penalty
    row and takes the row maximum. The I2T block ``I Tᵀ`` and the T2I block ``T Iᵀ`` are
    both computed when two blocks fit the budget; otherwise T2I rows are read from a strided
    view of the I2T block (slower; equal up to float32 summation order, so it can differ
    only where two candidates tie to within rounding). The chunk size does not change the
    result. On CUDA every step is a handful of kernels; no host synchronisation happens
    inside the loop. On CPU the step loop runs with ``step_threads`` torch threads (default
    1; ``None`` keeps torch's setting), the products with torch's setting: each step's ops
    are small (``S x W`` elements), so extra threads gain little, and on a busy machine
    OpenMP threads competing for cores made the loop several times slower (measured in
    ``benchmarks/grit_compose.py``).

    Rows of ``cache`` never written (zeros) have similarity 0 to everything; they are still
    placed exactly once. A cache with no features at all for the pairs is refused
    (:class:`FalconError`): that is a wiring bug (e.g. a resume that did not restore it).
    """

    name = "grit"
    on_demand = False

    def __init__(
        self,
        batch_size: int,
        search_space_size: int,
        *,
        drop_last: bool = False,
        max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES,
        step_threads: int | None = 1,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if search_space_size < 1:
            raise ValueError(f"search_space_size must be >= 1, got {search_space_size}")
        self.batch_size = int(batch_size)
        self.search_space_size = int(search_space_size)
        self.drop_last = bool(drop_last)
        self.max_chunk_bytes = int(max_chunk_bytes)
        self.step_threads = step_threads

    def state_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "batch_size": self.batch_size,
            "search_space_size": self.search_space_size,
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_config("grit composer", self.state_dict(), state)

    def num_epoch_batches(self, epoch: int, n: int, *, grouped_width: int | None = None) -> int:
        """(GRIT's chains run across search spaces and are cut as one: the uniform count.)"""
        return num_batches(n, self.batch_size, self.drop_last)

    def compose_epoch(
        self,
        epoch: int,
        pair_ids: Any,
        cache: EmbeddingCache | None,
        generator: torch.Generator,
        *,
        grouped_width: int | None = None,
    ) -> list[Batch]:
        """``grouped_width``: ``pair_ids`` are already grouped into consecutive search spaces of
        this many pairs (a warm start, any epoch): no shuffle, no uniform epoch 0."""
        _check_generator(generator)
        ids = as_id_tensor(pair_ids).cpu()
        if grouped_width is None and (epoch == 0 or cache is None):
            return uniform_batches(ids, self.batch_size, self.drop_last, generator, "uniform")
        n = len(ids)
        width = min(grouped_width or self.search_space_size, n)
        spaces = math.ceil(n / width) if n else 0
        shuffled = ids if grouped_width is not None else ids[torch.randperm(n, generator=generator)]
        sizes = torch.full((spaces,), width, dtype=torch.int64)
        if spaces:
            sizes[-1] = n - (spaces - 1) * width
        starts = (torch.rand(spaces, generator=generator, dtype=torch.float64) * sizes).long()
        starts = torch.minimum(starts, sizes - 1)
        columns = grit_chains(
            shuffled, starts, width, cache, max_chunk_bytes=self.max_chunk_bytes, step_threads=self.step_threads
        )
        order = torch.randperm(num_batches(n, self.batch_size, self.drop_last), generator=generator)
        return _cut(columns, self.batch_size, self.drop_last, self.name, order)


def chunk_plan(width: int, dim: int, max_chunk_bytes: int) -> tuple[int, bool]:
    """(search spaces per chunk, keep a separate contiguous T2I block?) for spaces of ``width``.

    Per space: one or two ``W x W`` float32 blocks, the float32 features (2 x W x D) and a
    few W-sized step buffers. At least one space per chunk, whatever the budget.
    """
    block = width * width * 4
    features = 2 * width * dim * 4
    two = 2 * block + features + 3 * width * 8
    one = block + features + 3 * width * 8
    if two <= max_chunk_bytes:
        return max(1, max_chunk_bytes // two), True
    return max(1, max_chunk_bytes // one), False


@torch.no_grad()
def grit_chains(
    shuffled: torch.Tensor,
    starts: torch.Tensor,
    width: int,
    cache: EmbeddingCache,
    *,
    max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES,
    step_threads: int | None = 1,
) -> dict[str, torch.Tensor]:
    """GRIT chains of consecutive search spaces of ``shuffled`` ids (all of size ``width``
    except a smaller last one), starting at local index ``starts[s]`` in space ``s``.

    ``step_threads``: on CPU, torch threads for the sequential step loop (restored after);
    ``None`` keeps torch's setting. See :class:`GritComposer`.
    Returns flat CPU per-slot columns (the concatenated chains) for :func:`_cut`.
    """
    n = len(shuffled)
    device = cache.device
    spaces = len(starts)
    per_chunk, two_blocks = chunk_plan(max(width, 1), cache.dim, max_chunk_bytes)
    rows_all = cache.rows(shuffled)
    if n and not bool(cache.written[rows_all].any()):
        raise FalconError(
            f"embedding cache holds no features for any of the {n} pairs to compose; update it during "
            "training (or load an embeddings.h5 / checkpoint state) before composing GRIT batches"
        )
    ids_dev = shuffled.to(device)
    chain_parts, anchor_parts, sim_parts, start_parts = [], [], [], []
    for first in track(
        range(0, spaces, per_chunk),
        "grit: chaining search spaces",
        total=math.ceil(spaces / per_chunk) if spaces else 0,
    ):
        count_spaces = min(per_chunk, spaces - first)
        lo, hi = first * width, min((first + count_spaces) * width, n)
        padded = count_spaces * width
        valid = torch.arange(padded, device=device) < (hi - lo)
        rows = torch.zeros(padded, dtype=torch.int64, device=device)
        rows[: hi - lo] = rows_all[lo:hi]
        ids = torch.full((padded,), -1, dtype=torch.int64, device=device)
        ids[: hi - lo] = ids_dev[lo:hi]
        image = cache.image[rows].float().masked_fill_(~valid[:, None], 0).view(count_spaces, width, -1)
        text = cache.text[rows].float().masked_fill_(~valid[:, None], 0).view(count_spaces, width, -1)
        i2t = torch.bmm(image, text.transpose(1, 2))  # i2t[s, i, j] = <image_i, text_j>
        # t2i[s, t, j] = <text_t, image_j>: its own product (faster than a transposed copy on CPU),
        # or, when two blocks do not fit the budget, a strided view of i2t
        t2i = torch.bmm(text, image.transpose(1, 2)) if two_blocks else i2t.transpose(1, 2)
        del image, text
        with _torch_threads(step_threads if device.type == "cpu" else None):
            order, sims = _chain_steps(
                i2t, t2i, starts[first : first + count_spaces].to(device), ~valid.view(count_spaces, width)
            )
        del i2t, t2i
        ids = ids.view(count_spaces, width)
        chain = torch.gather(ids, 1, order)
        anchors = torch.cat([torch.full((count_spaces, 1), -1, dtype=torch.int64, device=device), chain[:, :-1]], dim=1)
        starts_mask = torch.zeros(count_spaces, width, dtype=torch.bool)
        starts_mask[:, 0] = True
        chain_parts.append(chain.flatten()[: hi - lo].cpu())
        anchor_parts.append(anchors.flatten()[: hi - lo].cpu())
        sim_parts.append(sims.flatten()[: hi - lo].cpu())
        start_parts.append(starts_mask.flatten()[: hi - lo])
    if chain_parts:
        chain, anchors, sims = torch.cat(chain_parts), torch.cat(anchor_parts), torch.cat(sim_parts)
        is_start = torch.cat(start_parts)
    else:
        chain, anchors, sims = (
            torch.empty(0, dtype=torch.int64),
            torch.empty(0, dtype=torch.int64),
            torch.empty(0, dtype=torch.float32),
        )
        is_start = torch.empty(0, dtype=torch.bool)
    one = torch.where(is_start, float("nan"), 1.0).to(torch.float32)
    nan = torch.full((len(chain),), float("nan"), dtype=torch.float32)
    return {
        "pair_ids": chain,
        "anchor_pair_id": anchors,
        "q": one,
        "alpha": nan,
        "beta": nan,
        "similarity_to_anchor": sims,
        "quantile_rank": one.clone(),
    }


@contextlib.contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(threads)`` (restored after); ``None``: unchanged."""
    if threads is None or threads == torch.get_num_threads():
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(max(1, int(threads)))
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _chain_steps(
    i2t: torch.Tensor, t2i: torch.Tensor, starts: torch.Tensor, used: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the chains of ``S`` spaces at once: ``W - 1`` batched masked-argmax steps.

    ``used`` [S, W] is True for padding on entry. Returns the local order [S, W] (int64) and
    each slot's similarity to its predecessor [S, W] (NaN at slot 0). Padded spaces run past
    their end on all ``-inf`` rows; those slots are discarded by the caller.
    """
    count, width = used.shape
    device = used.device
    base = torch.arange(count, device=device) * width
    order = torch.empty(width, count, dtype=torch.int64, device=device)
    sims = torch.empty(width, count, dtype=torch.float32, device=device)
    # penalty[s, j] = -inf once pair j of space s is in the chain (or is padding), else 0
    penalty = torch.zeros(count, width, dtype=torch.float32, device=device).masked_fill_(used, float("-inf"))
    flat_penalty = penalty.view(-1)
    row = torch.empty(count, width, dtype=torch.float32, device=device)

    def fetch(matrix: torch.Tensor, cur: torch.Tensor) -> torch.Tensor:
        if matrix.is_contiguous():  # row `cur` of every space: one index_select on the flat [S*W, W] view
            return torch.index_select(matrix.view(count * width, width), 0, base + cur, out=row)
        return matrix[torch.arange(count, device=device), cur]  # strided transpose view (memory-bound mode)

    cur = starts.to(device=device, dtype=torch.int64)
    order[0] = cur
    sims[0] = float("nan")
    flat_penalty.index_fill_(0, base + cur, float("-inf"))
    for k in range(1, width):
        # odd slots: hardest text for the previous image; even slots: hardest image for the previous text
        candidates = fetch(i2t if k % 2 == 1 else t2i, cur)
        candidates.add_(penalty)
        value, cur = candidates.max(dim=1)  # ties: the lowest index
        flat_penalty.index_fill_(0, base + cur, float("-inf"))
        order[k] = cur
        sims[k] = value
    return order.T, sims.T


# --- DDP ------------------------------------------------------------------------------------
def shard_pair_ids(
    pair_ids: Any, rank: int, world_size: int, generator: torch.Generator | None, *, mode: str = "pad"
) -> torch.Tensor:
    """This rank's pair ids for one epoch: a disjoint, equal-size shard of a fresh permutation
    (``generator`` None: of ``pair_ids`` in their given order, e.g. grouped into search spaces).

    Every rank must call this with the same ``pair_ids`` and a generator in the **same
    state** (e.g. a dedicated CPU generator seeded with the run seed, identical on all
    ranks; it draws one ``randperm(n)`` per call), so all ranks agree on the permutation.
    Rank ``r`` gets the ``r``-th contiguous block of it. Each rank then composes from its own
    search spaces, and together the ranks cover every pair once per epoch.

    All shards have the same length, so every composer gives every rank the same number of
    batches (DDP ranks would otherwise deadlock at the last step):

    - ``mode="pad"`` (default): ``ceil(n / world_size)`` ids per rank; the permutation is
      extended cyclically by its first ``(-n) % world_size`` ids, so fewer than
      ``world_size`` pairs are trained twice in the epoch (as
      ``torch.utils.data.DistributedSampler`` does). A shard never holds an id twice.
    - ``mode="trim"``: ``n // world_size`` ids per rank; the last ``n % world_size`` ids of
      the permutation (different ones each epoch) are skipped this epoch.
    """
    if generator is not None:
        _check_generator(generator)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank {rank}, world_size {world_size}")
    if mode not in ("pad", "trim"):
        raise ValueError(f"mode must be 'pad' or 'trim', got {mode!r}")
    ids = as_id_tensor(pair_ids).cpu()
    n = len(ids)
    perm = ids[torch.randperm(n, generator=generator)] if generator is not None else ids
    if n == 0:
        return perm
    if mode == "pad":
        per = math.ceil(n / world_size)
        total = per * world_size
        if total > n:
            perm = perm.repeat(math.ceil(total / n))[:total]
    else:
        per = n // world_size
    return perm[rank * per : (rank + 1) * per].clone()


__all__ = [
    "Batch",
    "BatchComposer",
    "UniformComposer",
    "GritComposer",
    "shard_pair_ids",
    "num_batches",
    "num_space_batches",
    "uniform_batches",
    "grit_chains",
    "chunk_plan",
    "batches_state",
    "batches_from_state",
    "DEFAULT_MAX_CHUNK_BYTES",
]
