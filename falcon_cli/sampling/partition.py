"""Search spaces: partition a dataset's pairs into groups of |M| before batches are composed.

GRIT-VLP and FALCON mine negatives only inside a search space, so how the spaces are drawn
decides how similar (hard, and how often falsely negative) the candidates of an anchor are:

- :func:`random_partition`: GRIT-VLP's way. Shuffle the pairs with a seed and cut the
  shuffled order into consecutive spaces of ``size``; the last space holds the remainder.
- :func:`kmeans_partition`: semantic spaces. Spherical k-means (faiss, CPU, seeded) on the
  joint embedding with ``k = ceil(N / size)`` centroids, then a *balanced* assignment
  (:func:`balanced_assignment`) so that every space holds exactly ``size`` pairs except one,
  the last, which holds the remainder. Plain nearest-centroid clusters would be as uneven
  as the data (a few huge, many tiny); the batch composers need equal spaces.

Both return a :class:`Partition` (space id and position per pair, aligned with the input).
The result depends only on the set of (pair id, embedding) rows and the seed, never on the
row order of the input: every function first puts the rows in ascending pair-id order.

The k-means spaces and the summary also read the embeddings by row (the ``*_of`` functions): from
an ``embeddings.h5`` opened with :func:`~falcon_cli.artifacts.embeddings.open_embeddings`, a 14M-pair
build holds the training sample and the candidate lists, never an N x D array. They read it in
pair-id order, as ``falcon embed`` writes it; a file in another order is read across for every
piece of :data:`SEARCH_ROWS` rows (the same result, more reading).

The joint embedding of a pair is the L2-normalised **sum** of its (unit) image and text
embeddings, :func:`joint_embedding`. Chosen over the normalised concatenation because the
dot product of two sums, ``(i_a + t_a)·(i_b + t_b)``, contains the cross-modal terms
``i_a·t_b`` and ``t_a·i_b`` that GRIT's I2T/T2I chains rank by, while the concatenation only
sees ``i_a·i_b + t_a·t_b``; it also keeps the dimension D instead of 2D (half the k-means cost).

:func:`partition_summary` says what a partition is like (space sizes, mean cosine similarity
between the pairs of a space, computed exactly), and :func:`false_negatives_in_spaces`, on the
shapes world, how many captions of other pairs in an image's space truly describe it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Sequence, Union

import numpy as np

from falcon_cli.artifacts.embeddings import Embeddings, EmbeddingsFile
from falcon_cli.errors import FalconError
from falcon_cli.runtime.progress import track

if TYPE_CHECKING:  # the oracle is only needed on the shapes world
    from falcon_cli.data.shapes.oracle import ShapesOracle

CHUNK_ROWS = 65536
"""Rows processed at once where a per-row temporary of width D (or k) is needed."""

SEARCH_ROWS = 262144
"""Rows whose nearest centroids one faiss search finds (k-means' candidate lists are searched in such pieces)."""

EmbeddingRows = Union[Embeddings, EmbeddingsFile]
"""Embeddings read by row (``n``, ``dim``, ``pair_id``, ``rows(start, stop)``, ``take(ascending rows)``): in
memory, or an ``embeddings.h5`` read as needed."""

KMEANS_MAX_POINTS_PER_CENTROID = 256
"""k-means trains on at most this many points per centroid (a seeded sample; faiss's default).
Every pair is assigned afterwards, so the sample only has to place the centroids."""


@dataclass(frozen=True)
class Partition:
    """Search spaces of N pairs: ``space_id[i]`` and ``position[i]`` of the i-th input pair.

    Space ids run ``0 .. num_spaces - 1``; positions run ``0 .. size - 1`` inside each space.
    """

    space_id: np.ndarray
    """``int64[N]``: the search space of each pair, aligned with the pair ids given."""
    position: np.ndarray
    """``int64[N]``: the pair's place inside its space (a deterministic order, see the builders)."""

    @property
    def num_spaces(self) -> int:
        """How many search spaces there are."""
        return int(self.space_id.max()) + 1 if self.space_id.size else 0

    def sizes(self) -> np.ndarray:
        """``int64[num_spaces]``: pairs per space."""
        return np.bincount(self.space_id, minlength=self.num_spaces).astype(np.int64)

    def columns(self, pair_ids: np.ndarray, *, epoch: int, method: str, seed: int) -> dict[str, np.ndarray]:
        """The rows of ``search_spaces.parquet`` for this partition (``SEARCH_SPACES`` columns), sorted by space and
        position."""
        order = np.lexsort((self.position, self.space_id))
        n = len(order)
        return {
            "pair_id": np.asarray(pair_ids, dtype=np.int64)[order],
            "space_id": self.space_id[order],
            "position": self.position[order],
            "epoch": np.full(n, epoch, dtype=np.int64),
            "method": np.full(n, method, dtype=object),
            "seed": np.full(n, seed, dtype=np.int64),
        }


# --- input checks ---------------------------------------------------------------------------


def check_partition_inputs(pair_ids, size: int) -> np.ndarray:
    """``pair_ids`` as int64, after checking that a partition into spaces of ``size`` makes sense.

    Raises :class:`FalconError` when there are no pairs, ids repeat, ``size`` is not a
    positive integer, or ``size`` exceeds the number of pairs (one space of everything is
    not a search space; pick ``size <= N``).
    """
    ids = np.asarray(pair_ids)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise FalconError(f"pair ids must be a 1-D integer array, got shape {ids.shape} dtype {ids.dtype}")
    ids = ids.astype(np.int64, copy=False)
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise FalconError(f"search space size must be a positive integer, got {size!r}")
    if ids.size == 0:
        raise FalconError("no pairs to partition (the embeddings are empty)")
    if size > ids.size:
        raise FalconError(
            f"search space size {size} is larger than the number of pairs ({ids.size}); choose a size <= {ids.size}"
        )
    sorted_ids = np.sort(ids)
    repeated = sorted_ids[1:][sorted_ids[1:] == sorted_ids[:-1]]
    if repeated.size:
        raise FalconError(f"pair ids must be unique; pair_id {repeated[0]} appears more than once")
    return ids


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise FalconError(f"partition seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def _in_memory(image: np.ndarray, text: np.ndarray) -> Embeddings:
    """Arrays as :data:`EmbeddingRows` (for the functions that take either; no pair ids needed)."""
    return Embeddings(image, text, np.empty(0, dtype=np.int64), {})


def _check_embeddings(image: np.ndarray, text: np.ndarray, n: int | None = None) -> None:
    if image.ndim != 2 or image.shape != text.shape:
        raise FalconError(f"image {image.shape} and text {text.shape} embeddings must both be [N, D]")
    if n is not None and image.shape[0] != n:
        raise FalconError(f"{image.shape[0]} embedding rows for {n} pair ids; they must match one to one")


# --- random ---------------------------------------------------------------------------------


def random_partition(pair_ids, size: int, seed: int) -> Partition:
    """GRIT-VLP's search spaces: shuffle the pairs with ``seed``, cut into consecutive spaces of ``size``.

    The shuffle permutes the pairs in ascending pair-id order (numpy's PCG64 seeded with
    ``seed``), so the result depends only on the ids and the seed. Space ``s`` holds shuffled
    slots ``s*size .. (s+1)*size - 1``; the last space holds the remainder ``N - (k-1)*size``.
    ``position`` is the slot inside the space.
    """
    ids = check_partition_inputs(pair_ids, size)
    n = ids.size
    canonical = np.argsort(ids, kind="stable")
    slot_rows = canonical[
        np.random.default_rng(_check_seed(seed)).permutation(n)
    ]  # slot t holds input row slot_rows[t]
    slots = np.arange(n, dtype=np.int64)
    space_id = np.empty(n, dtype=np.int64)
    position = np.empty(n, dtype=np.int64)
    space_id[slot_rows] = slots // size
    position[slot_rows] = slots % size
    return Partition(space_id, position)


# --- k-means ----------------------------------------------------------------------------------


def joint_embedding(image: np.ndarray, text: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """``float32[N, D]``: the L2-normalised sum ``(i + t) / |i + t|`` of each pair's embeddings.

    ``rows`` picks (and orders) the pairs; default all. Computed in chunks (no float32 copy of
    the fp16 inputs). A pair whose image and text point in exactly opposite directions has no
    direction; its joint vector stays zero (similarity 0 to everything).
    """
    _check_embeddings(image, text)
    rows = np.arange(image.shape[0]) if rows is None else np.asarray(rows)
    return joint_rows(_in_memory(image, text), rows)


def joint_rows(embeddings: EmbeddingRows, rows: np.ndarray) -> np.ndarray:
    """``float32[len(rows), D]``: :func:`joint_embedding` of the pairs at ``rows`` (any order) of ``embeddings``,
    read in ascending chunks of :data:`CHUNK_ROWS` rows. Each row's value depends on that row alone."""
    rows = np.asarray(rows, dtype=np.int64)
    order = np.argsort(rows, kind="stable")
    out = np.empty((rows.size, embeddings.dim), dtype=np.float32)
    for start in range(0, rows.size, CHUNK_ROWS):
        pick = order[start : start + CHUNK_ROWS]
        image, text = embeddings.take(rows[pick])
        joint = image.astype(np.float32) + text.astype(np.float32)
        if not np.isfinite(joint).all():
            raise FalconError("embeddings contain NaN or infinite values")
        norms = np.linalg.norm(joint, axis=1, keepdims=True)
        out[pick] = np.divide(joint, norms, out=np.zeros_like(joint), where=norms > 1e-12)
    return out


def spherical_kmeans(points: np.ndarray, k: int, seed: int, iterations: int = 20) -> np.ndarray:
    """``float32[k, D]`` unit centroids of faiss's spherical k-means on ``points`` (CPU, seeded).

    Trains on at most :data:`KMEANS_MAX_POINTS_PER_CENTROID` × k points (a sample drawn with
    ``seed``). The same points, seed and thread count give the same centroids.
    """
    import faiss

    points = np.ascontiguousarray(points, dtype=np.float32)
    if not 1 <= k <= points.shape[0]:
        raise FalconError(f"k-means needs 1 <= k <= {points.shape[0]} centroids, got {k}")
    if iterations < 1:
        raise FalconError(f"k-means iterations must be >= 1, got {iterations}")
    kmeans = faiss.Kmeans(
        points.shape[1],
        k,
        niter=iterations,
        seed=int(seed) % 2**31,
        spherical=True,
        verbose=False,
        min_points_per_centroid=1,
        max_points_per_centroid=KMEANS_MAX_POINTS_PER_CENTROID,
    )
    kmeans.train(points)
    return np.ascontiguousarray(kmeans.centroids, dtype=np.float32)


def kmeans_sample(n: int, k: int, seed: int) -> np.ndarray:
    """``int64[m]``: which of ``n`` points faiss's k-means with ``k`` centroids and ``seed`` trains on, in its order.

    All ``n`` when ``n <= k`` × :data:`KMEANS_MAX_POINTS_PER_CENTROID`; otherwise the first k × that of faiss's own
    seeded permutation (``faiss.rand_perm``, as its ``Clustering`` subsamples). :func:`spherical_kmeans` of these
    points alone gives the centroids it gives for all ``n``, so only the sample needs a joint embedding.
    """
    import faiss

    limit = k * KMEANS_MAX_POINTS_PER_CENTROID
    if n <= limit:
        return np.arange(n, dtype=np.int64)
    perm = np.empty(n, dtype=np.int32)  # faiss's permutation is of C ints
    faiss.rand_perm(faiss.swig_ptr(perm), n, int(seed) % 2**31)  # the seed spherical_kmeans gives faiss
    return perm[:limit].astype(np.int64)


def _nearest(points: np.ndarray, centroids: np.ndarray, among: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-``width`` centroids of ``among`` by inner product for each point: (scores, centroid ids), best first.

    Fewer than ``width`` candidates are padded by repeating the last one (harmless: a
    repeated full centroid is skipped like the original).
    """
    import faiss

    index = faiss.IndexFlatIP(centroids.shape[1])
    index.add(np.ascontiguousarray(centroids[among], dtype=np.float32))
    found = min(width, among.size)
    scores, local = index.search(np.ascontiguousarray(points, dtype=np.float32), found)
    ids = among[local]
    if found < width:
        pad = width - found
        scores = np.concatenate([scores, np.repeat(scores[:, -1:], pad, axis=1)], axis=1)
        ids = np.concatenate([ids, np.repeat(ids[:, -1:], pad, axis=1)], axis=1)
    return scores, ids.astype(np.int64)


def _search_pieces(n: int) -> list[tuple[int, int]]:
    """``(start, stop)`` pieces of ``0..n`` whose searches give exactly the scores of one search of all ``n``.

    faiss searches ``distance_compute_blas_threshold`` queries or more with BLAS, in blocks of
    ``distance_compute_blas_query_bs`` rows, and fewer one query at a time (other rounding). So a piece starts
    at a multiple of the block and has at least the threshold of rows (a short tail joins the piece before),
    or is all ``n``: every BLAS block holds the rows it would hold in one search."""
    import faiss

    threshold, block = int(faiss.cvar.distance_compute_blas_threshold), int(faiss.cvar.distance_compute_blas_query_bs)
    if n < threshold:
        return [(0, n)]
    size = -(-max(SEARCH_ROWS, threshold) // block) * block
    pieces = [(start, min(start + size, n)) for start in range(0, n, size)]
    if len(pieces) > 1 and pieces[-1][1] - pieces[-1][0] < threshold:
        pieces[-2:] = [(pieces[-2][0], n)]
    return pieces


def nearest_centroids(
    points: Callable[[np.ndarray], np.ndarray], n: int, centroids: np.ndarray, width: int
) -> tuple[np.ndarray, np.ndarray]:
    """The ``width`` nearest centroids of ``n`` points by inner product, (scores ``float32[n, width]``, ids
    ``int64[n, width]``), best first; ``points(rows)`` gives the points at ``rows``. Searched in pieces
    (:func:`_search_pieces`, :data:`SEARCH_ROWS` rows): memory is one piece, and the result is one search's."""
    score = np.empty((n, width), dtype=np.float32)
    cand = np.empty((n, width), dtype=np.int64)
    among = np.arange(centroids.shape[0])
    for start, stop in _search_pieces(n):
        score[start:stop], cand[start:stop] = _nearest(points(np.arange(start, stop)), centroids, among, width)
    return score, cand


def balanced_assignment(
    points: np.ndarray | Callable[[np.ndarray], np.ndarray],
    centroids: np.ndarray,
    capacity,
    candidates: int = 8,
    nearest: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """``int64[N]``: a centroid for each point such that centroid c receives exactly ``capacity[c]`` points.

    Greedy in rounds (``sum(capacity)`` must equal N). In each round every unassigned point
    proposes to its most similar centroid (inner product) that still has room; each centroid
    accepts its proposers in order of similarity, most similar first (ties: the lower row),
    until it is full, and rejects the rest, who propose again in the next round. Each round
    either places every proposer or fills at least one centroid, so there are at most k + 1
    rounds, each a few vectorised passes over the unassigned points.

    Scaling: a point keeps only its ``candidates`` nearest centroids (one faiss search, no
    N x k matrix); a point whose candidates are all full gets the nearest still-open ones
    (another search over the open centroids only). Because capacities only shrink, this
    gives exactly the result of ranking every centroid for every point. ``nearest`` may pass
    that first search in: (scores, centroid ids), ``[N, w]`` each, best first, over all centroids;
    its rows are refilled in place (no second copy of N x w candidates).

    ``points``: ``float32[N, D]``, or a function giving the points at given rows (then ``nearest`` is
    required): only the rows refilled are asked for, so N x D never needs to be in memory.
    """
    centroids = np.ascontiguousarray(centroids, dtype=np.float32)
    k = centroids.shape[0]
    if callable(points):
        if nearest is None:
            raise ValueError("balanced_assignment: points given as a function need their nearest centroids")
        n, points_at = len(nearest[1]), points
    else:
        points = np.ascontiguousarray(points, dtype=np.float32)
        n, points_at = points.shape[0], points.__getitem__
    remaining = np.asarray(capacity, dtype=np.int64).copy()
    if remaining.shape != (k,) or (remaining < 0).any() or remaining.sum() != n:
        raise FalconError(
            f"capacities must be {k} non-negative counts summing to the {n} points, got sum {remaining.sum()}"
        )
    if nearest is None:
        score, cand = _nearest(points, centroids, np.flatnonzero(remaining > 0), max(1, min(int(candidates), k)))
    else:
        score, cand = np.asarray(nearest[0], dtype=np.float32), np.asarray(nearest[1], dtype=np.int64)
    width = cand.shape[1]
    assign = np.full(n, -1, dtype=np.int64)
    pending = np.arange(n, dtype=np.int64)
    while pending.size:
        # (the first round asks about every point: no N x w copy of the candidates for it)
        is_open = (remaining > 0)[cand if pending.size == n else cand[pending]]
        exhausted = ~is_open.any(axis=1)
        if exhausted.any():  # every candidate of these points is full: fetch the nearest open centroids
            rows = pending[exhausted]
            score[rows], cand[rows] = _nearest(points_at(rows), centroids, np.flatnonzero(remaining > 0), width)
            is_open[exhausted] = remaining[cand[rows]] > 0
        column = is_open.argmax(axis=1)
        choice, similarity = cand[pending, column], score[pending, column]
        # Per centroid, most similar proposer first (ties: lower row); accept as many as fit.
        order = np.lexsort((pending, -similarity, choice))
        chosen = choice[order]
        rank = np.arange(chosen.size) - np.searchsorted(chosen, chosen, side="left")
        accepted = rank < remaining[chosen]
        assign[pending[order[accepted]]] = chosen[accepted]
        remaining -= np.bincount(chosen[accepted], minlength=k)
        pending = pending[assign[pending] < 0]
    return assign


def kmeans_partition(
    image: np.ndarray, text: np.ndarray, pair_ids, size: int, seed: int, *, iterations: int = 20, candidates: int = 8
) -> Partition:
    """Semantic search spaces of embeddings in memory: :func:`kmeans_partition_of` of ``image`` and ``text``
    (``[N, D]``, row i the pair ``pair_ids[i]``)."""
    ids = check_partition_inputs(pair_ids, size)
    _check_embeddings(image, text, ids.size)
    return kmeans_partition_of(
        Embeddings(image, text, ids, {}), size, seed, iterations=iterations, candidates=candidates
    )


def kmeans_partition_of(
    embeddings: EmbeddingRows, size: int, seed: int, *, iterations: int = 20, candidates: int = 8
) -> Partition:
    """Semantic search spaces: balanced spherical k-means on the joint embedding of ``embeddings``' pairs.

    1. Joint embedding (:func:`joint_embedding`) of each pair, rows in ascending pair-id order.
    2. ``k = ceil(N / size)`` centroids by :func:`spherical_kmeans` (``iterations``, ``seed``).
    3. Capacities: ``size`` for every centroid except the one that the fewest pairs have
       as their nearest (ties: the lowest index), which gets the remainder ``N - (k-1)*size``;
       :func:`balanced_assignment` then fills every centroid exactly.
    4. Space ids follow the centroid index, except that the remainder space is numbered
       last (so, as with :func:`random_partition`, only the last space may be smaller).
       ``position`` orders a space by cosine similarity to its centroid, most similar first
       (ties: lower pair id).

    Memory: the joint embedding is computed only where it is used, from rows read as needed: for the
    training sample (:func:`kmeans_sample`, at most 256 k points), for each piece of the candidate search
    (:func:`nearest_centroids`), for the points whose candidates all fill up, and for each chunk of the
    similarities of step 4. What stays is the sample and the candidate lists (N x ``candidates`` x 12 B);
    ``embeddings`` is read about three times, plus the rows refilled. The result is that of one joint embedding
    of every pair, bit for bit (the candidate search's pieces keep faiss's BLAS blocks: :func:`_search_pieces`).
    """
    ids = check_partition_inputs(embeddings.pair_id, size)
    seed = _check_seed(seed)
    n = ids.size
    canonical = np.argsort(ids, kind="stable")

    def points(at: np.ndarray) -> np.ndarray:  # joint embeddings of the pairs at places `at` of the pair-id order
        return joint_rows(embeddings, canonical[at])

    k = math.ceil(n / size)
    centroids = spherical_kmeans(points(kmeans_sample(n, k, seed)), k, seed, iterations)
    nearest = nearest_centroids(points, n, centroids, max(1, min(int(candidates), k)))
    remainder_centroid = int(np.argmin(np.bincount(nearest[1][:, 0], minlength=k)))
    capacity = np.full(k, size, dtype=np.int64)
    capacity[remainder_centroid] = n - (k - 1) * size
    assign = balanced_assignment(points, centroids, capacity, nearest=nearest)
    del nearest

    space_of_centroid = np.empty(k, dtype=np.int64)
    others = np.flatnonzero(np.arange(k) != remainder_centroid)
    space_of_centroid[others] = np.arange(k - 1)
    space_of_centroid[remainder_centroid] = k - 1
    space = space_of_centroid[assign]
    similarity = np.empty(n, dtype=np.float32)
    for start in range(0, n, SEARCH_ROWS):  # (each row's product is its own: any pieces give the same values)
        stop = min(start + SEARCH_ROWS, n)
        similarity[start:stop] = np.einsum("nd,nd->n", points(np.arange(start, stop)), centroids[assign[start:stop]])
    order = np.lexsort((ids[canonical], -similarity, space))
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n) - np.searchsorted(space[order], space[order], side="left")

    space_id = np.empty(n, dtype=np.int64)
    space_id[canonical] = space
    position_out = np.empty(n, dtype=np.int64)
    position_out[canonical] = position
    return Partition(space_id, position_out)


# --- what a partition is like -----------------------------------------------------------------


def _add_by_space(sums: np.ndarray, space_id: np.ndarray, values: np.ndarray) -> None:
    """``sums[s] += `` the sum (float64) of the ``values`` rows whose ``space_id`` is ``s``."""
    order = np.argsort(space_id, kind="stable")
    ordered = space_id[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    sums[ordered[starts]] += np.add.reduceat(values[order], starts, axis=0, dtype=np.float64)


def _space_cosines(space_ids: Sequence[np.ndarray], embeddings: EmbeddingRows) -> list[dict[str, float | None]]:
    """:func:`within_space_cosines` of each of ``space_ids`` (aligned with ``embeddings``' rows), all from one
    pass over the rows in chunks of :data:`CHUNK_ROWS`: memory is the per-space sums, k x D each."""
    sizes = [np.bincount(space, minlength=int(space.max()) + 1).astype(np.float64) for space in space_ids]
    sums = [{name: np.zeros((len(size), embeddings.dim)) for name in ("joint", "image", "text")} for size in sizes]
    self_joint = self_i2t = 0.0  # sum over pairs of |u_a|^2 and of i_a.t_a
    for start in range(0, embeddings.n, CHUNK_ROWS):
        stop = min(start + CHUNK_ROWS, embeddings.n)
        image, text = embeddings.rows(start, stop)
        joint = joint_rows(_in_memory(image, text), np.arange(stop - start))  # (from the rows just read)
        self_joint += _row_dots(joint, joint)
        self_i2t += _row_dots(image, text)
        for space, totals in zip(space_ids, sums):
            for name, values in (("joint", joint), ("image", image), ("text", text)):
                _add_by_space(totals[name], space[start:stop], values)
    out = []
    for size, totals in zip(sizes, sums):
        ordered_pairs = float((size * (size - 1)).sum())
        if ordered_pairs == 0:
            out.append({"joint": None, "i2t": None})
            continue
        joint_total = float(np.einsum("kd,kd->", totals["joint"], totals["joint"])) - self_joint
        i2t_total = float(np.einsum("kd,kd->", totals["image"], totals["text"])) - self_i2t
        out.append({"joint": joint_total / ordered_pairs, "i2t": i2t_total / ordered_pairs})
    return out


def _row_dots(a: np.ndarray, b: np.ndarray) -> float:
    """``sum_n a[n]·b[n]`` (float32 row products in chunks, summed in float64)."""
    total = 0.0
    for start in range(0, a.shape[0], CHUNK_ROWS):
        stop = start + CHUNK_ROWS
        dots = np.einsum(
            "nd,nd->n", np.asarray(a[start:stop], dtype=np.float32), np.asarray(b[start:stop], dtype=np.float32)
        )
        total += float(dots.sum(dtype=np.float64))
    return total


def within_space_cosines(space_id: np.ndarray, image: np.ndarray, text: np.ndarray) -> dict[str, float | None]:
    """Mean cosine similarity over all pairs (a, b), a != b, that share a space, computed exactly.

    - ``joint``: between joint embeddings (how alike two pairs of a space are);
    - ``i2t``: image of a with text of b (what GRIT's image-to-text argmax ranks).

    Exact in O(N·D), no pairwise matrix: the sum over ordered pairs a != b of a space of
    ``u_a·u_b`` is ``|Σ u|² - Σ |u_a|²``, and of ``i_a·t_b`` is ``(Σ i)·(Σ t) - Σ i_a·t_a``.
    Pooled over spaces (every within-space pair weighs the same). None when no space has
    two pairs.
    """
    _check_embeddings(image, text)
    return _space_cosines([np.asarray(space_id)], _in_memory(image, text))[0]


def partition_summary(partitions: Mapping[str, Partition], image: np.ndarray, text: np.ndarray) -> dict[str, dict]:
    """:func:`partition_summary_of` embeddings in memory (``image`` / ``text`` rows aligned with the partitions'
    pairs)."""
    _check_embeddings(image, text)
    return partition_summary_of(partitions, _in_memory(image, text))


def partition_summary_of(partitions: Mapping[str, Partition], embeddings: EmbeddingRows) -> dict[str, dict]:
    """Per named partition: ``spaces``, ``size_min`` / ``size_mean`` / ``size_max`` and the mean
    within-space cosines ``mean_cosine_joint`` and ``mean_cosine_i2t`` (:func:`within_space_cosines`).

    ``embeddings``' rows align with the partitions' pairs; they are read once, in chunks, for all the
    partitions together. A random partition's cosines are about the dataset average; k-means spaces
    should score clearly higher.
    """
    for name, partition in partitions.items():
        if partition.space_id.shape != (embeddings.n,):
            raise FalconError(f"partition '{name}' has {partition.space_id.size} pairs, the embeddings {embeddings.n}")
    cosines = _space_cosines([p.space_id for p in partitions.values()], embeddings)
    out = {}
    for (name, partition), cosine in zip(partitions.items(), cosines):
        sizes = partition.sizes()
        out[name] = {
            "spaces": int(sizes.size),
            "size_min": int(sizes.min()),
            "size_mean": round(float(sizes.mean()), 2),
            "size_max": int(sizes.max()),
            "mean_cosine_joint": None if cosine["joint"] is None else round(cosine["joint"], 4),
            "mean_cosine_i2t": None if cosine["i2t"] is None else round(cosine["i2t"], 4),
        }
    return out


def false_negatives_in_spaces(partition: Partition, image_ids, caption_ids, oracle: "ShapesOracle") -> dict:
    """On the shapes world: per pair, how many captions of the *other* pairs in its space truly describe its image.

    ``image_ids[i]`` / ``caption_ids[i]`` are the shapes-world ids of pair i. Every such
    caption is a false negative for the pair's image when batches are drawn from the space.
    Returns ``pairs``, ``mean_false_negatives`` (mean count per pair), ``fraction_with_false_negatives``
    (pairs with at least one) and ``max_false_negatives``. Exact: one oracle matrix per space
    (each distinct caption form evaluated once over the space's scenes), |M|² checks per space.
    """
    image_ids = np.asarray(image_ids, dtype=np.int64)
    caption_ids = np.asarray(caption_ids, dtype=np.int64)
    if image_ids.shape != partition.space_id.shape or caption_ids.shape != partition.space_id.shape:
        raise FalconError(
            f"{image_ids.size} image ids and {caption_ids.size} caption ids for {partition.space_id.size} pairs"
        )
    counts = np.zeros(partition.space_id.size, dtype=np.int64)
    order = np.argsort(partition.space_id, kind="stable")
    bounds = np.flatnonzero(np.diff(partition.space_id[order])) + 1
    for rows in track(np.split(order, bounds), "false negatives per space"):
        truth = oracle.matrix(image_ids[rows], caption_ids[rows])  # [image of pair a, caption of pair b]
        counts[rows] = truth.sum(axis=1) - np.diagonal(truth)  # a pair's own caption is no negative
    return {
        "pairs": int(counts.size),
        "mean_false_negatives": round(float(counts.mean()), 4),
        "fraction_with_false_negatives": round(float((counts > 0).mean()), 4),
        "max_false_negatives": int(counts.max()),
    }


__all__ = [
    "Partition",
    "EmbeddingRows",
    "random_partition",
    "kmeans_partition",
    "kmeans_partition_of",
    "balanced_assignment",
    "nearest_centroids",
    "joint_embedding",
    "joint_rows",
    "spherical_kmeans",
    "kmeans_sample",
    "check_partition_inputs",
    "within_space_cosines",
    "partition_summary",
    "partition_summary_of",
    "false_negatives_in_spaces",
]
