"""Search-space partitions: random and balanced k-means spaces, their summary, and false negatives inside them."""

from __future__ import annotations

import numpy as np
import pytest

from falcon_cli.artifacts.tables import SEARCH_SPACES, read_table, write_table
from falcon_cli.errors import FalconError
from falcon_cli.sampling.partition import (
    Partition,
    balanced_assignment,
    false_negatives_in_spaces,
    joint_embedding,
    kmeans_partition,
    partition_summary,
    random_partition,
    within_space_cosines,
)


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def clustered(n_per_cluster: list[int], dim: int = 16, spread: float = 0.3, seed: int = 0):
    """Pairs around well-separated topic directions; text = image plus noise. Returns (image, text, topic)."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((len(n_per_cluster), dim))
    topic = np.repeat(np.arange(len(n_per_cluster)), n_per_cluster)
    image = unit(centers[topic] + spread * rng.standard_normal((topic.size, dim)))
    text = unit(image + spread * rng.standard_normal((topic.size, dim)))
    return image, text, topic


def assert_valid(partition: Partition, n: int, size: int) -> None:
    """Every pair in exactly one space; spaces of exactly ``size`` except the last; positions 0..n_s - 1."""
    assert partition.space_id.shape == partition.position.shape == (n,)
    k = -(-n // size)
    sizes = partition.sizes()
    assert sizes.tolist() == [size] * (k - 1) + [n - (k - 1) * size]
    for space in range(k):
        positions = np.sort(partition.position[partition.space_id == space])
        assert positions.tolist() == list(range(sizes[space]))


# --- random ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n,size", [(10, 3), (12, 4), (7, 7), (5, 1)])
def test_random_partition_places_every_pair_once_in_spaces_of_size(n, size):
    ids = np.arange(100, 100 + n) * 3
    assert_valid(random_partition(ids, size, seed=0), n, size)


def test_random_partition_is_the_seeded_shuffle_cut_into_consecutive_spaces():
    ids = np.array([40, 10, 30, 20, 50])
    partition = random_partition(ids, 2, seed=7)
    shuffled = np.sort(ids)[np.random.default_rng(7).permutation(5)]  # the documented rule
    expected = {int(pair): (slot // 2, slot % 2) for slot, pair in enumerate(shuffled)}
    got = {int(pair): (int(s), int(p)) for pair, s, p in zip(ids, partition.space_id, partition.position)}
    assert got == expected


def test_random_partition_is_deterministic_per_seed_and_independent_of_row_order():
    ids = np.arange(200)
    a, b = random_partition(ids, 32, seed=3), random_partition(ids, 32, seed=3)
    assert np.array_equal(a.space_id, b.space_id) and np.array_equal(a.position, b.position)
    assert not np.array_equal(a.space_id, random_partition(ids, 32, seed=4).space_id)
    perm = np.random.default_rng(0).permutation(200)
    c = random_partition(ids[perm], 32, seed=3)
    assert np.array_equal(c.space_id, a.space_id[perm]) and np.array_equal(c.position, a.position[perm])


# --- balanced assignment -----------------------------------------------------------------------


def reference_assignment(points: np.ndarray, centroids: np.ndarray, capacity) -> list[int]:
    """The documented rule, with plain loops over a full similarity matrix."""
    scores = points.astype(np.float64) @ centroids.astype(np.float64).T
    remaining = [int(c) for c in capacity]
    assign = [-1] * len(points)
    while -1 in assign:
        proposals: dict[int, list[tuple[float, int]]] = {}
        for p in range(len(points)):
            if assign[p] == -1:
                best = max((c for c in range(len(centroids)) if remaining[c] > 0), key=lambda c: scores[p, c])
                proposals.setdefault(best, []).append((-scores[p, best], p))
        for c, asked in proposals.items():
            for _, p in sorted(asked)[: remaining[c]]:
                assign[p] = c
                remaining[c] -= 1
    return assign


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("candidates", [1, 2, 8])
def test_balanced_assignment_matches_the_plain_reference(seed, candidates):
    rng = np.random.default_rng(seed)
    points, centroids = unit(rng.standard_normal((40, 6))), unit(rng.standard_normal((6, 6)))
    capacity = np.array([12, 3, 0, 9, 11, 5])  # uneven, one centroid takes nobody
    got = balanced_assignment(points, centroids, capacity, candidates=candidates)
    assert got.tolist() == reference_assignment(points, centroids, capacity)
    assert np.bincount(got, minlength=6).tolist() == capacity.tolist()


def test_balanced_assignment_refuses_capacities_that_do_not_add_up():
    points, centroids = unit(np.eye(3)), unit(np.eye(3))
    with pytest.raises(FalconError, match="summing to the 3 points"):
        balanced_assignment(points, centroids, [1, 1, 2])


# --- k-means --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n_per_cluster,size", [([60, 60, 60], 60), ([100, 50, 30, 20], 48), ([9, 8], 4), ([5, 4], 9), ([5, 4], 1)]
)
def test_kmeans_partition_places_every_pair_once_in_spaces_of_size(n_per_cluster, size):
    image, text, _ = clustered(n_per_cluster)
    n = image.shape[0]
    assert_valid(kmeans_partition(image, text, np.arange(n) + 1000, size, seed=0), n, size)


def test_kmeans_partition_recovers_equal_clusters_and_orders_spaces_by_closeness():
    image, text, topic = clustered([50, 50, 50, 50], spread=0.2)
    partition = kmeans_partition(image, text, np.arange(200), 50, seed=1)
    for space in range(4):
        assert len(set(topic[partition.space_id == space])) == 1, "each space is one topic"
    # position 0 is the pair closest to its space's centroid direction, the last the farthest
    joint = joint_embedding(image, text)
    for space in range(4):
        rows = np.flatnonzero(partition.space_id == space)
        centre = joint[rows].mean(axis=0)
        similarity = joint[rows] @ (centre / np.linalg.norm(centre))
        by_position = similarity[np.argsort(partition.position[rows])]
        assert by_position[0] > np.median(by_position) > by_position[-1]


def test_kmeans_spaces_are_tighter_than_random_ones():
    image, text, _ = clustered([120, 70, 50, 40, 20], spread=0.5, seed=2)
    ids = np.arange(image.shape[0])
    partitions = {"random": random_partition(ids, 48, seed=0), "kmeans": kmeans_partition(image, text, ids, 48, seed=0)}
    summary = partition_summary(partitions, image, text)
    assert (
        summary["kmeans"]["mean_cosine_joint"] > summary["random"]["mean_cosine_joint"] + 0.25
    )  # measured 0.54 vs 0.23
    assert summary["kmeans"]["mean_cosine_i2t"] > summary["random"]["mean_cosine_i2t"] + 0.15  # measured 0.34 vs 0.14
    for name in partitions:
        assert (
            summary[name]["spaces"] == 7
            and summary[name]["size_max"] == 48
            and summary[name]["size_min"] == 300 - 6 * 48
        )


def test_kmeans_partition_is_deterministic_per_seed_and_independent_of_row_order():
    image, text, _ = clustered([40, 30, 30, 20], spread=0.8, seed=3)
    ids = np.arange(120) * 7
    a = kmeans_partition(image, text, ids, 25, seed=5)
    b = kmeans_partition(image, text, ids, 25, seed=5)
    assert np.array_equal(a.space_id, b.space_id) and np.array_equal(a.position, b.position)
    perm = np.random.default_rng(1).permutation(120)
    c = kmeans_partition(image[perm], text[perm], ids[perm], 25, seed=5)
    assert np.array_equal(c.space_id, a.space_id[perm]) and np.array_equal(c.position, a.position[perm])
    others = [kmeans_partition(image, text, ids, 25, seed=s) for s in (6, 7, 8)]
    assert any(not np.array_equal(o.space_id, a.space_id) for o in others), "another seed, other spaces"


# --- summary and false negatives ---------------------------------------------------------------


def test_within_space_cosines_equal_the_brute_force_mean():
    rng = np.random.default_rng(0)
    image, text = unit(rng.standard_normal((23, 5))), unit(rng.standard_normal((23, 5)))
    space = rng.integers(0, 4, 23)
    joint = joint_embedding(image, text)
    same = (space[:, None] == space[None, :]) & ~np.eye(23, dtype=bool)
    got = within_space_cosines(space, image.astype(np.float16), text.astype(np.float16))
    assert got["joint"] == pytest.approx((joint @ joint.T)[same].mean(), abs=2e-3)
    assert got["i2t"] == pytest.approx((image @ text.T)[same].mean(), abs=2e-3)
    assert within_space_cosines(np.arange(23), image, text) == {"joint": None, "i2t": None}


def test_false_negatives_in_spaces_count_other_pairs_captions_true_of_the_image():
    class TableOracle:  # caption c describes image i iff truth[i, c]
        truth = np.array([[1, 1, 0, 1, 1], [0, 1, 0, 0, 1], [1, 1, 1, 1, 0], [0, 0, 0, 1, 0]], dtype=bool)

        def matrix(self, image_ids, caption_ids):
            return self.truth[np.ix_(image_ids, caption_ids)]

    # pairs (image, caption): 0:(0,0) 1:(1,1) 2:(2,2) 3:(3,3) 4:(0,4); spaces {0, 1, 4} and {2, 3}
    partition = Partition(np.array([0, 0, 1, 1, 0]), np.array([0, 1, 0, 1, 2]))
    got = false_negatives_in_spaces(partition, [0, 1, 2, 3, 0], [0, 1, 2, 3, 4], TableOracle())
    # pair 0: captions 1 and 4 describe image 0 -> 2; pair 1: caption 4 -> 1;
    # pair 4: captions 0 (same image) and 1 -> 2; pair 2: caption 3 -> 1;
    # pair 3: caption 2 does not describe image 3 -> 0
    assert got == {
        "pairs": 5,
        "mean_false_negatives": 1.2,
        "fraction_with_false_negatives": 0.8,
        "max_false_negatives": 2,
    }


def test_partition_rows_round_trip_through_the_search_spaces_table(tmp_path):
    ids = np.array([5, 3, 9, 1, 7])
    partition = random_partition(ids, 2, seed=0)
    write_table(tmp_path / "s.parquet", partition.columns(ids, epoch=2, method="random", seed=0), SEARCH_SPACES)
    frame = read_table(tmp_path / "s.parquet", SEARCH_SPACES)
    assert sorted(frame["pair_id"]) == sorted(ids.tolist()) and set(frame["epoch"]) == {2}
    assert list(zip(frame["space_id"], frame["position"])) == sorted(zip(frame["space_id"], frame["position"]))
    row = frame.set_index("pair_id").loc[9]
    assert (row["space_id"], row["position"]) == (partition.space_id[2], partition.position[2])


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ids,size,message",
    [
        (np.arange(5), 0, "must be a positive integer, got 0"),
        (np.arange(5), 2.5, "must be a positive integer"),
        (np.arange(5), 6, r"search space size 6 is larger than the number of pairs \(5\); choose a size <= 5"),
        (np.array([1, 2, 2, 3]), 2, "pair_id 2 appears more than once"),
        (np.array([], dtype=np.int64), 1, "no pairs to partition"),
        (np.array([0.5, 1.5]), 1, "1-D integer array"),
    ],
)
def test_bad_inputs_raise_one_clear_error(ids, size, message):
    with pytest.raises(FalconError, match=message):
        random_partition(ids, size, seed=0)
    image = unit(np.ones((max(len(ids), 1), 4)))
    with pytest.raises(FalconError, match=message):
        kmeans_partition(image[: len(ids)], image[: len(ids)], ids, size, seed=0)


def test_negative_seeds_are_refused():
    with pytest.raises(FalconError, match="seed must be a non-negative integer, got -1"):
        random_partition(np.arange(4), 2, seed=-1)


def test_kmeans_refuses_embeddings_that_do_not_fit_the_ids():
    image = unit(np.random.default_rng(0).standard_normal((6, 4)))
    with pytest.raises(FalconError, match="6 embedding rows for 5 pair ids"):
        kmeans_partition(image, image, np.arange(5), 2, seed=0)
    with pytest.raises(FalconError, match=r"must both be \[N, D\]"):
        kmeans_partition(image, image[:, :3], np.arange(6), 2, seed=0)
    broken = image.copy()
    broken[2, 1] = np.nan
    with pytest.raises(FalconError, match="NaN or infinite"):
        kmeans_partition(broken, image, np.arange(6), 2, seed=0)


# --- k-means read by row: the same spaces as the whole-array implementation it replaced ----------------------


def reference_kmeans_partition(image, text, pair_ids, size, seed, *, iterations=20, candidates=8):
    """The k-means partition as it was before it read by row (issue 61): the joint embedding of all N in memory,
    faiss subsampling it itself, one candidate search of all N, copies of the candidate lists. Kept verbatim (but
    for names) as the reference the row-wise implementation must equal."""
    import math

    from falcon_cli.sampling.partition import _nearest, spherical_kmeans

    def joint(rows):
        out = np.empty((rows.size, image.shape[1]), dtype=np.float32)
        for start in range(0, rows.size, 65536):
            chunk = rows[start : start + 65536]
            both = image[chunk].astype(np.float32) + text[chunk].astype(np.float32)
            norms = np.linalg.norm(both, axis=1, keepdims=True)
            out[start : start + chunk.size] = np.divide(both, norms, out=np.zeros_like(both), where=norms > 1e-12)
        return out

    def assignment(points, centroids, capacity, nearest):
        n, k = points.shape[0], centroids.shape[0]
        remaining = np.asarray(capacity, dtype=np.int64).copy()
        score, cand = np.array(nearest[0], dtype=np.float32), np.array(nearest[1], dtype=np.int64)
        width = cand.shape[1]
        assign = np.full(n, -1, dtype=np.int64)
        pending = np.arange(n, dtype=np.int64)
        while pending.size:
            is_open = remaining[cand[pending]] > 0
            exhausted = ~is_open.any(axis=1)
            if exhausted.any():
                rows = pending[exhausted]
                score[rows], cand[rows] = _nearest(points[rows], centroids, np.flatnonzero(remaining > 0), width)
                is_open[exhausted] = remaining[cand[rows]] > 0
            column = is_open.argmax(axis=1)
            choice, similarity = cand[pending, column], score[pending, column]
            order = np.lexsort((pending, -similarity, choice))
            chosen = choice[order]
            rank = np.arange(chosen.size) - np.searchsorted(chosen, chosen, side="left")
            accepted = rank < remaining[chosen]
            assign[pending[order[accepted]]] = chosen[accepted]
            remaining -= np.bincount(chosen[accepted], minlength=k)
            pending = pending[assign[pending] < 0]
        return assign

    ids = np.asarray(pair_ids, dtype=np.int64)
    n = ids.size
    canonical = np.argsort(ids, kind="stable")
    points = joint(canonical)
    k = math.ceil(n / size)
    centroids = spherical_kmeans(points, k, seed, iterations)
    nearest = _nearest(points, centroids, np.arange(k), max(1, min(int(candidates), k)))
    remainder_centroid = int(np.argmin(np.bincount(nearest[1][:, 0], minlength=k)))
    capacity = np.full(k, size, dtype=np.int64)
    capacity[remainder_centroid] = n - (k - 1) * size
    assign = assignment(points, centroids, capacity, nearest)
    space_of_centroid = np.empty(k, dtype=np.int64)
    others = np.flatnonzero(np.arange(k) != remainder_centroid)
    space_of_centroid[others] = np.arange(k - 1)
    space_of_centroid[remainder_centroid] = k - 1
    space = space_of_centroid[assign]
    similarity = np.einsum("nd,nd->n", points, centroids[assign])
    order = np.lexsort((ids[canonical], -similarity, space))
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n) - np.searchsorted(space[order], space[order], side="left")
    space_id, position_out = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    space_id[canonical], position_out[canonical] = space, position
    return space_id, position_out


@pytest.fixture
def small_search_pieces(monkeypatch):
    """faiss's BLAS search from 300 queries in blocks of 256 (its defaults: 128,000 and 4,096), and pieces of 1,024
    rows: a few thousand points then take every path a 14M-pair build takes (BLAS blocks, several pieces, a tail)."""
    import faiss

    from falcon_cli.sampling import partition

    saved = faiss.cvar.distance_compute_blas_threshold, faiss.cvar.distance_compute_blas_query_bs
    faiss.cvar.distance_compute_blas_threshold, faiss.cvar.distance_compute_blas_query_bs = 300, 256
    monkeypatch.setattr(partition, "SEARCH_ROWS", 1024)
    monkeypatch.setattr(partition, "CHUNK_ROWS", 1000)
    yield
    faiss.cvar.distance_compute_blas_threshold, faiss.cvar.distance_compute_blas_query_bs = saved


def random_pairs(n: int, dim: int, seed: int):
    rng = np.random.default_rng(seed)
    image = unit(rng.standard_normal((n, dim))).astype(np.float16)
    text = unit(image.astype(np.float32) + 0.5 * rng.standard_normal((n, dim))).astype(np.float16)
    ids = rng.permutation(n * 3)[:n]  # not contiguous, not sorted
    return image, text, ids


@pytest.mark.parametrize(
    "n,size,candidates,seed",
    [
        (3000, 100, 8, 0),  # 30 centroids, every point trains (n <= 256 k)
        (3000, 97, 2, 1),  # 2 candidates: many points find all their candidates full
        (6000, 1000, 8, 2),  # 6 centroids train on faiss's sample of 1,536 points
        (4301, 450, 3, 3),  # sampled, refills, a remainder space
    ],
)
@pytest.mark.parametrize("pieces", ["default", "small"])
def test_kmeans_partition_read_by_row_gives_the_spaces_of_the_whole_array_implementation(
    n, size, candidates, seed, pieces, request
):
    if pieces == "small":
        request.getfixturevalue("small_search_pieces")
    image, text, ids = random_pairs(n, 256, seed)  # D of the real cache: rounding differs between search paths
    expected_space, expected_position = reference_kmeans_partition(image, text, ids, size, seed, candidates=candidates)
    got = kmeans_partition(image, text, ids, size, seed, candidates=candidates)
    assert np.array_equal(got.space_id, expected_space)
    assert np.array_equal(got.position, expected_position)


def test_kmeans_sample_is_the_sample_faiss_trains_on():
    from falcon_cli.sampling.partition import KMEANS_MAX_POINTS_PER_CENTROID, kmeans_sample, spherical_kmeans

    points = unit(np.random.default_rng(4).standard_normal((5000, 8)))
    k = 7  # 5,000 > 7 x 256: faiss subsamples
    sample = kmeans_sample(len(points), k, 11)
    assert sample.size == k * KMEANS_MAX_POINTS_PER_CENTROID and np.unique(sample).size == sample.size
    assert np.array_equal(spherical_kmeans(points[sample], k, 11), spherical_kmeans(points, k, 11))
    assert np.array_equal(kmeans_sample(1000, 7, 11), np.arange(1000))


def test_kmeans_and_summary_read_from_the_file_equal_the_arrays_in_memory(tmp_path, small_search_pieces):
    from falcon_cli.artifacts.embeddings import open_embeddings, write_embeddings
    from falcon_cli.sampling.partition import kmeans_partition_of, partition_summary_of

    image, text, ids = random_pairs(3500, 256, 5)
    path = write_embeddings(
        tmp_path / "e.h5", image, text, ids, dict(model="m", checkpoint="", dataset="d", split="s", epoch=0)
    )
    with open_embeddings(path) as source:
        stored_image, stored_text = source.rows(0, source.n)  # (the file renormalises: compare with what it holds)
        got = kmeans_partition_of(source, 300, 0, candidates=3)
        expected = reference_kmeans_partition(stored_image, stored_text, ids, 300, 0, candidates=3)
        assert np.array_equal(got.space_id, expected[0]) and np.array_equal(got.position, expected[1])
        partitions = {"kmeans": got, "random": random_partition(ids, 300, 0)}
        from_file = partition_summary_of(partitions, source)
    in_memory = partition_summary(partitions, stored_image, stored_text)
    for name in partitions:
        for key, value in in_memory[name].items():
            assert from_file[name][key] == pytest.approx(value, abs=1.01e-4), (name, key)


def test_candidate_search_in_pieces_gives_the_scores_of_one_search(small_search_pieces):
    """Bit for bit (pieces that cut faiss's BLAS blocks differently change the last bits of 256-d scores)."""
    from falcon_cli.sampling.partition import _nearest, _search_pieces, nearest_centroids

    points = unit(np.random.default_rng(6).standard_normal((3000, 256)))
    centroids = points[:30].copy()
    assert _search_pieces(3000) == [(0, 1024), (1024, 2048), (2048, 3000)]
    assert _search_pieces(2100) == [(0, 1024), (1024, 2100)]  # a tail under the BLAS threshold joins the piece before
    assert _search_pieces(200) == [(0, 200)]
    whole = _nearest(points, centroids, np.arange(30), 8)
    pieces = nearest_centroids(lambda rows: points[rows], 3000, centroids, 8)
    assert np.array_equal(pieces[0], whole[0]) and np.array_equal(pieces[1], whole[1])
