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
from typing import TYPE_CHECKING, Mapping

import numpy as np

from falcon_cli.errors import FalconError
from falcon_cli.runtime.progress import track

if TYPE_CHECKING:  # the oracle is only needed on the shapes world
    from falcon_cli.data.shapes.oracle import ShapesOracle

CHUNK_ROWS = 65536
"""Rows processed at once where a per-row temporary of width D (or k) is needed."""

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
        """The rows of ``search_spaces.parquet`` for this partition (``SEARCH_SPACES`` columns), sorted by space and position."""
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
        raise FalconError(f"search space size {size} is larger than the number of pairs ({ids.size}); choose a size <= {ids.size}")
    sorted_ids = np.sort(ids)
    repeated = sorted_ids[1:][sorted_ids[1:] == sorted_ids[:-1]]
    if repeated.size:
        raise FalconError(f"pair ids must be unique; pair_id {repeated[0]} appears more than once")
    return ids


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise FalconError(f"partition seed must be a non-negative integer, got {seed!r}")
    return int(seed)


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
    slot_rows = canonical[np.random.default_rng(_check_seed(seed)).permutation(n)]  # slot t holds input row slot_rows[t]
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
    out = np.empty((rows.size, image.shape[1]), dtype=np.float32)
    for start in range(0, rows.size, CHUNK_ROWS):
        chunk = rows[start:start + CHUNK_ROWS]
        joint = image[chunk].astype(np.float32) + text[chunk].astype(np.float32)
        if not np.isfinite(joint).all():
            raise FalconError("embeddings contain NaN or infinite values")
        norms = np.linalg.norm(joint, axis=1, keepdims=True)
        out[start:start + chunk.size] = np.divide(joint, norms, out=np.zeros_like(joint), where=norms > 1e-12)
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
    kmeans = faiss.Kmeans(points.shape[1], k, niter=iterations, seed=int(seed) % 2**31, spherical=True, verbose=False,
                          min_points_per_centroid=1, max_points_per_centroid=KMEANS_MAX_POINTS_PER_CENTROID)
    kmeans.train(points)
    return np.ascontiguousarray(kmeans.centroids, dtype=np.float32)


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


def balanced_assignment(points: np.ndarray, centroids: np.ndarray, capacity, candidates: int = 8,
                        nearest: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
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
    that first search in: (scores, centroid ids), ``[N, w]`` each, best first, over all centroids.
    """
    points = np.ascontiguousarray(points, dtype=np.float32)
    centroids = np.ascontiguousarray(centroids, dtype=np.float32)
    n, k = points.shape[0], centroids.shape[0]
    remaining = np.asarray(capacity, dtype=np.int64).copy()
    if remaining.shape != (k,) or (remaining < 0).any() or remaining.sum() != n:
        raise FalconError(f"capacities must be {k} non-negative counts summing to the {n} points, got sum {remaining.sum()}")
    if nearest is None:
        score, cand = _nearest(points, centroids, np.flatnonzero(remaining > 0), max(1, min(int(candidates), k)))
    else:
        score, cand = np.array(nearest[0], dtype=np.float32), np.array(nearest[1], dtype=np.int64)  # copies: refills write rows
    width = cand.shape[1]
    assign = np.full(n, -1, dtype=np.int64)
    pending = np.arange(n, dtype=np.int64)
    while pending.size:
        is_open = remaining[cand[pending]] > 0
        exhausted = ~is_open.any(axis=1)
        if exhausted.any():  # every candidate of these points is full: fetch the nearest open centroids
            rows = pending[exhausted]
            score[rows], cand[rows] = _nearest(points[rows], centroids, np.flatnonzero(remaining > 0), width)
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


def kmeans_partition(image: np.ndarray, text: np.ndarray, pair_ids, size: int, seed: int, *,
                     iterations: int = 20, candidates: int = 8) -> Partition:
    """Semantic search spaces: balanced spherical k-means on the joint embedding.

    1. Joint embedding (:func:`joint_embedding`) of each pair, rows in ascending pair-id order.
    2. ``k = ceil(N / size)`` centroids by :func:`spherical_kmeans` (``iterations``, ``seed``).
    3. Capacities: ``size`` for every centroid except the one that the fewest pairs have
       as their nearest (ties: the lowest index), which gets the remainder ``N - (k-1)*size``;
       :func:`balanced_assignment` then fills every centroid exactly.
    4. Space ids follow the centroid index, except that the remainder space is numbered
       last (so, as with :func:`random_partition`, only the last space may be smaller).
       ``position`` orders a space by cosine similarity to its centroid, most similar first
       (ties: lower pair id).
    """
    ids = check_partition_inputs(pair_ids, size)
    _check_embeddings(image, text, ids.size)
    seed = _check_seed(seed)
    n = ids.size
    canonical = np.argsort(ids, kind="stable")
    points = joint_embedding(image, text, canonical)
    k = math.ceil(n / size)
    centroids = spherical_kmeans(points, k, seed, iterations)
    nearest = _nearest(points, centroids, np.arange(k), max(1, min(int(candidates), k)))
    remainder_centroid = int(np.argmin(np.bincount(nearest[1][:, 0], minlength=k)))
    capacity = np.full(k, size, dtype=np.int64)
    capacity[remainder_centroid] = n - (k - 1) * size
    assign = balanced_assignment(points, centroids, capacity, nearest=nearest)

    space_of_centroid = np.empty(k, dtype=np.int64)
    others = np.flatnonzero(np.arange(k) != remainder_centroid)
    space_of_centroid[others] = np.arange(k - 1)
    space_of_centroid[remainder_centroid] = k - 1
    space = space_of_centroid[assign]
    similarity = np.empty(n, dtype=np.float32)
    for start in range(0, n, CHUNK_ROWS):
        stop = start + CHUNK_ROWS
        similarity[start:stop] = np.einsum("nd,nd->n", points[start:stop], centroids[assign[start:stop]])
    order = np.lexsort((ids[canonical], -similarity, space))
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n) - np.searchsorted(space[order], space[order], side="left")

    space_id = np.empty(n, dtype=np.int64)
    space_id[canonical] = space
    position_out = np.empty(n, dtype=np.int64)
    position_out[canonical] = position
    return Partition(space_id, position_out)


# --- what a partition is like -----------------------------------------------------------------

def space_sums(space_id: np.ndarray, values: np.ndarray, num_spaces: int) -> np.ndarray:
    """``float64[num_spaces, D]``: the sum of the ``values`` rows of each space (one vectorised sum per space)."""
    order = np.argsort(space_id, kind="stable")
    bounds = np.flatnonzero(np.diff(space_id[order])) + 1
    sums = np.zeros((num_spaces, values.shape[1]), dtype=np.float64)
    for rows in np.split(order, bounds):
        sums[space_id[rows[0]]] = values[rows].sum(axis=0, dtype=np.float64)
    return sums


def _row_dots(a: np.ndarray, b: np.ndarray) -> float:
    """``sum_n a[n]·b[n]`` (float32 row products in chunks, summed in float64)."""
    total = 0.0
    for start in range(0, a.shape[0], CHUNK_ROWS):
        stop = start + CHUNK_ROWS
        dots = np.einsum("nd,nd->n", np.asarray(a[start:stop], dtype=np.float32), np.asarray(b[start:stop], dtype=np.float32))
        total += float(dots.sum(dtype=np.float64))
    return total


def within_space_cosines(space_id: np.ndarray, image: np.ndarray, text: np.ndarray,
                         joint: np.ndarray | None = None) -> dict[str, float | None]:
    """Mean cosine similarity over all pairs (a, b), a != b, that share a space, computed exactly.

    - ``joint``: between joint embeddings (how alike two pairs of a space are);
    - ``i2t``: image of a with text of b (what GRIT's image-to-text argmax ranks).

    Exact in O(N·D), no pairwise matrix: the sum over ordered pairs a != b of a space of
    ``u_a·u_b`` is ``|Σ u|² - Σ |u_a|²``, and of ``i_a·t_b`` is ``(Σ i)·(Σ t) - Σ i_a·t_a``.
    Pooled over spaces (every within-space pair weighs the same). None when no space has
    two pairs.
    """
    joint = joint_embedding(image, text) if joint is None else joint
    k = int(space_id.max()) + 1
    sizes = np.bincount(space_id, minlength=k).astype(np.float64)
    ordered_pairs = float((sizes * (sizes - 1)).sum())
    if ordered_pairs == 0:
        return {"joint": None, "i2t": None}
    joint_sums = space_sums(space_id, joint, k)
    i2t_sums = float(np.einsum("kd,kd->", space_sums(space_id, image, k), space_sums(space_id, text, k)))
    joint_total = float(np.einsum("kd,kd->", joint_sums, joint_sums)) - _row_dots(joint, joint)
    i2t_total = i2t_sums - _row_dots(image, text)
    return {"joint": joint_total / ordered_pairs, "i2t": i2t_total / ordered_pairs}


def partition_summary(partitions: Mapping[str, Partition], image: np.ndarray, text: np.ndarray) -> dict[str, dict]:
    """Per named partition: ``spaces``, ``size_min`` / ``size_mean`` / ``size_max`` and the mean
    within-space cosines ``mean_cosine_joint`` and ``mean_cosine_i2t`` (:func:`within_space_cosines`).

    ``image`` / ``text`` rows align with the partitions' pairs. A random partition's cosines
    are about the dataset average; k-means spaces should score clearly higher.
    """
    _check_embeddings(image, text)
    joint = joint_embedding(image, text)
    out = {}
    for name, partition in partitions.items():
        if partition.space_id.shape != (image.shape[0],):
            raise FalconError(f"partition '{name}' has {partition.space_id.size} pairs, the embeddings {image.shape[0]}")
        sizes = partition.sizes()
        cosines = within_space_cosines(partition.space_id, image, text, joint)
        out[name] = {
            "spaces": int(sizes.size),
            "size_min": int(sizes.min()),
            "size_mean": round(float(sizes.mean()), 2),
            "size_max": int(sizes.max()),
            "mean_cosine_joint": None if cosines["joint"] is None else round(cosines["joint"], 4),
            "mean_cosine_i2t": None if cosines["i2t"] is None else round(cosines["i2t"], 4),
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
        raise FalconError(f"{image_ids.size} image ids and {caption_ids.size} caption ids for {partition.space_id.size} pairs")
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


__all__ = ["Partition", "random_partition", "kmeans_partition", "balanced_assignment", "joint_embedding",
           "spherical_kmeans", "check_partition_inputs", "space_sums", "within_space_cosines", "partition_summary",
           "false_negatives_in_spaces"]
