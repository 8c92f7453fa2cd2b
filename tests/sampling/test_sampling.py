"""Sampling: embedding cache, uniform and GRIT-VLP composers, DDP sharding, the batch log.

The GRIT tests compare the vectorised composer against ``reference_grit`` below: a slow,
obviously-correct transcription of GRIT-VLP's ``grouping`` loop (reference-code.md §1),
with -inf masking instead of zeroed softmax probabilities. For bit-exact comparison the
embeddings live on a dyadic grid (multiples of 1/8, few dimensions): every dot product is
then exact in float32 whatever the summation order (bmm vs a per-space matmul), and the
grid produces many exact ties, which also checks the tie-breaking (lowest index).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from falcon_cli.artifacts.embeddings import read_embeddings
from falcon_cli.artifacts.tables import SEARCH_SPACES, write_table
from falcon_cli.errors import FalconError
from falcon_cli.sampling import (
    Batch,
    BatchComposer,
    BatchLog,
    EmbeddingCache,
    GritComposer,
    UniformComposer,
    batches_from_state,
    batches_state,
    num_batches,
    read_batch_log,
    shard_pair_ids,
)
from falcon_cli.sampling.composers import chunk_plan

ATTRS = dict(model="albef-tiny", checkpoint="", dataset="test", split="train", epoch=1)


# --- helpers --------------------------------------------------------------------------------
def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def sparse_ids(n: int, seed: int = 0) -> torch.Tensor:
    """n unique, non-contiguous, unsorted pair ids."""
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.choice(10 * n + 100, size=n, replace=False).astype(np.int64) * 3 + 5)


def grid_cache(ids: torch.Tensor, dim: int = 8, seed: int = 0) -> EmbeddingCache:
    """Cache with features on a dyadic grid (k/8, |k| <= 8): exact float32 dot products, many ties."""
    g = gen(seed)
    image = torch.randint(-8, 9, (len(ids), dim), generator=g).float() / 8
    text = torch.randint(-8, 9, (len(ids), dim), generator=g).float() / 8
    cache = EmbeddingCache(ids, dim=dim)
    cache.update(ids, image, text)
    return cache


def unit_cache(ids: torch.Tensor, dim: int = 32, seed: int = 0, scale: float = 1.0) -> EmbeddingCache:
    g = gen(seed)
    image = torch.nn.functional.normalize(torch.randn(len(ids), dim, generator=g), dim=1) * scale
    text = torch.nn.functional.normalize(torch.randn(len(ids), dim, generator=g), dim=1) * scale
    cache = EmbeddingCache(ids, dim=dim)
    cache.update(ids, image, text)
    return cache


def flat(batches: list[Batch]) -> torch.Tensor:
    return torch.cat([b.pair_ids for b in batches]) if batches else torch.empty(0, dtype=torch.int64)


def assert_batches_equal(a: list[Batch], b: list[Batch]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.sampler == y.sampler
        for name in Batch.FIELDS:
            torch.testing.assert_close(getattr(x, name), getattr(y, name), rtol=0, atol=0, equal_nan=True)


def reference_grit(
    ids: torch.Tensor, cache: EmbeddingCache, space: int, batch_size: int, drop_last: bool, generator: torch.Generator
) -> list[tuple[list[int], list[int]]]:
    """GRIT-VLP's grouping, one candidate at a time (slow, obviously correct): [(pair ids, anchors)] per batch.

    Draws from ``generator`` in the documented order: randperm(n), one float64 rand per
    space for the starts, randperm(number of batches) for the mini-batch-level shuffle.
    """
    n = len(ids)
    shuffled = ids[torch.randperm(n, generator=generator)].tolist()
    width = min(space, n)
    spaces = math.ceil(n / width)
    sizes = [width] * (spaces - 1) + [n - (spaces - 1) * width]
    u = torch.rand(spaces, generator=generator, dtype=torch.float64).tolist()
    chain: list[int] = []
    anchors: list[int] = []
    for s in range(spaces):
        members = shuffled[s * width : s * width + sizes[s]]
        image, text = cache.get(torch.tensor(members))
        image, text = image.float(), text.float()
        m = len(members)
        s_i2t = (image @ text.T).tolist()  # s_i2t[i][j] = <image_i, text_j>
        s_t2i = (text @ image.T).tolist()  # s_t2i[t][j] = <text_t, image_j>
        used = [False] * m

        def hardest(row: list[float]) -> int:
            best = -1
            for j in range(m):  # strictly greater: ties go to the lowest index
                if not used[j] and (best < 0 or row[j] > row[best]):
                    best = j
            return best

        start = min(int(u[s] * m), m - 1)
        local = [start]
        used[start] = True
        cur_i = start
        for _ in range((m - 1) // 2):
            t = hardest(s_i2t[cur_i])
            used[t] = True
            cur_i = hardest(s_t2i[t])
            used[cur_i] = True
            local += [t, cur_i]
        if (m - 1) % 2 == 1:
            last = hardest(s_i2t[cur_i])
            used[last] = True
            local.append(last)
        assert sorted(local) == list(range(m))
        chain += [members[j] for j in local]
        anchors += [-1] + [members[j] for j in local[:-1]]
    count = n // batch_size if drop_last else math.ceil(n / batch_size)
    order = torch.randperm(count, generator=generator).tolist()
    return [
        (chain[i * batch_size : (i + 1) * batch_size], anchors[i * batch_size : (i + 1) * batch_size]) for i in order
    ]


def buggy_softmax_grit(image: torch.Tensor, text: torch.Tensor, temp: float, start: int) -> list[int]:
    """GRIT-VLP's original recipe: zero rows/columns of row-softmaxed probabilities, then argmax."""
    s_i2t = torch.softmax(image @ text.T / temp, dim=1)
    s_t2i = torch.softmax(text @ image.T / temp, dim=1)
    s_i2t.fill_diagonal_(0)
    s_t2i.fill_diagonal_(0)
    n = len(image)
    out, cur = [start], start
    for _ in range((n - 1) // 2):
        t = int(torch.argmax(s_i2t[cur]))
        for mat in (s_i2t, s_t2i):
            mat[cur, :] = 0
            mat[:, cur] = 0
        cur = int(torch.argmax(s_t2i[t]))
        for mat in (s_i2t, s_t2i):
            mat[t, :] = 0
            mat[:, t] = 0
        out += [t, cur]
    if (n - 1) % 2 == 1:
        out.append(int(torch.argmax(s_i2t[cur])))
    return out


def chains_from_anchors(batches: list[Batch]) -> list[list[int]]:
    """Rebuild each search space's chain from the logged anchors (start: anchor -1)."""
    ids = flat(batches).tolist()
    anchors = torch.cat([b.anchor_pair_id for b in batches]).tolist()
    successor = {a: p for p, a in zip(ids, anchors) if a >= 0}
    assert len(successor) == sum(a >= 0 for a in anchors)  # each pair anchors at most one slot
    chains = []
    for p, a in zip(ids, anchors):
        if a < 0:
            chain = [p]
            while chain[-1] in successor:
                chain.append(successor[chain[-1]])
            chains.append(chain)
    return chains


# --- uniform ---------------------------------------------------------------------------------
def test_uniform_covers_every_pair_once_and_is_reproducible():
    ids = sparse_ids(1003)
    composer = UniformComposer(64)
    assert isinstance(composer, BatchComposer)
    g = gen(1)
    e0 = composer.compose_epoch(0, ids, None, g)
    e1 = composer.compose_epoch(1, ids, None, g)
    for batches in (e0, e1):
        assert sorted(flat(batches).tolist()) == sorted(ids.tolist())
        assert [len(b) for b in batches] == [64] * 15 + [1003 - 15 * 64]
        assert all(b.sampler == "uniform" and (b.anchor_pair_id == -1).all() and b.q.isnan().all() for b in batches)
    assert not torch.equal(flat(e0), flat(e1))
    assert_batches_equal(e0, UniformComposer(64).compose_epoch(0, ids, None, gen(1)))


def test_uniform_drop_last():
    ids = torch.arange(100)
    batches = UniformComposer(32, drop_last=True).compose_epoch(0, ids, None, gen(0))
    assert [len(b) for b in batches] == [32, 32, 32]
    assert len(set(flat(batches).tolist())) == 96
    assert num_batches(100, 32, True) == 3 and num_batches(100, 32, False) == 4


def test_composers_need_a_cpu_generator():
    with pytest.raises(TypeError):
        UniformComposer(4).compose_epoch(0, torch.arange(10), None, 0)  # type: ignore[arg-type]


# --- GRIT: fast path == reference loop ------------------------------------------------------------
@pytest.mark.parametrize(
    "n,space,batch,drop_last",
    [
        (240, 48, 16, False),  # full spaces only, even |M|
        (250, 48, 16, False),  # smaller last space (10), partial last batch
        (251, 47, 16, True),  # odd |M| and odd tail, drop_last
        (97, 33, 10, False),  # odd everything
        (50, 64, 8, False),  # one space smaller than |M|
        (131, 2, 6, False),  # spaces of two (and a last space of one)
        (7, 1, 3, False),  # spaces of one: chains are single starts
    ],
)
def test_grit_fast_path_matches_reference_loop(n, space, batch, drop_last):
    ids = sparse_ids(n, seed=n)
    cache = grid_cache(ids, seed=n)
    composer = GritComposer(batch, space, drop_last=drop_last)
    fast = composer.compose_epoch(1, ids, cache, gen(n))
    slow = reference_grit(ids, cache, space, batch, drop_last, gen(n))
    assert [b.pair_ids.tolist() for b in fast] == [p for p, _ in slow]
    assert [b.anchor_pair_id.tolist() for b in fast] == [a for _, a in slow]
    if not drop_last:
        assert sorted(flat(fast).tolist()) == sorted(ids.tolist())
    assert all(b.sampler == "grit" for b in fast)


def test_grit_chunking_and_transpose_mode_do_not_change_the_result():
    ids = sparse_ids(300, seed=3)
    cache = grid_cache(ids, dim=32, seed=3)  # exact products: the strided-view mode is bit-identical
    big = GritComposer(16, 40).compose_epoch(2, ids, cache, gen(5))
    # 1 byte: one space per chunk and the strided-view mode; then exactly one space with two blocks
    for max_bytes in (1, 40 * 40 * 4 * 2 + 2 * 40 * 32 * 4 + 3 * 40 * 8):
        small = GritComposer(16, 40, max_chunk_bytes=max_bytes).compose_epoch(2, ids, cache, gen(5))
        assert_batches_equal(big, small)
    threads = torch.get_num_threads()
    assert_batches_equal(big, GritComposer(16, 40, step_threads=None).compose_epoch(2, ids, cache, gen(5)))
    assert torch.get_num_threads() == threads  # the step loop's thread setting is restored
    assert chunk_plan(40, 32, 1) == (1, False)
    assert chunk_plan(1920, 256, 1 << 30)[1] is True


def test_grit_chain_elements_are_argmax_choices():
    ids = sparse_ids(500, seed=7)
    cache = unit_cache(ids, dim=32, seed=7)
    batches = GritComposer(32, 96).compose_epoch(1, ids, cache, gen(7))
    assert sorted(flat(batches).tolist()) == sorted(ids.tolist())
    chains = chains_from_anchors(batches)
    assert sorted(len(c) for c in chains) == [500 - 5 * 96] + [96] * 5
    sim_logged = {int(p): float(s) for b in batches for p, s in zip(b.pair_ids, b.similarity_to_anchor)}
    for chain in chains:
        image, text = (x.double() for x in cache.get(torch.tensor(chain)))
        for k in range(1, len(chain)):
            # odd slot: text most similar to the previous image; even slot: image most similar to the previous text
            scores = (text @ image[k - 1]) if k % 2 == 1 else (image @ text[k - 1])
            remaining = scores[k:]
            assert float(scores[k]) >= float(remaining.max()) - 1e-6
            assert sim_logged[chain[k]] == pytest.approx(float(scores[k]), abs=1e-5)
    meta = torch.cat([torch.stack([b.q, b.quantile_rank]) for b in batches], dim=1)
    anchors = torch.cat([b.anchor_pair_id for b in batches])
    assert (meta[:, anchors >= 0] == 1).all() and meta[:, anchors < 0].isnan().all()
    assert torch.cat([b.alpha for b in batches]).isnan().all()


def test_grit_groups_planted_near_duplicates():
    n, dim = 256, 64
    g = gen(11)
    image = torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=1)
    text = torch.nn.functional.normalize(image + 0.3 / math.sqrt(dim) * torch.randn(n, dim, generator=g), dim=1)
    planted = [(2 * i, 2 * i + 1) for i in range(0, 40, 2)]  # 20 near-duplicate pairs
    for a, b in planted:
        image[b] = torch.nn.functional.normalize(
            image[a] + 0.05 / math.sqrt(dim) * torch.randn(dim, generator=g), dim=0
        )
        text[b] = torch.nn.functional.normalize(text[a] + 0.05 / math.sqrt(dim) * torch.randn(dim, generator=g), dim=0)
    ids = torch.arange(n) * 10
    cache = EmbeddingCache(ids, dim=dim)
    cache.update(ids, image, text)
    batches = GritComposer(32, n).compose_epoch(1, ids, cache, gen(2))
    where = {int(p): i for i, b in enumerate(batches) for p in b.pair_ids}
    anchor_of = {int(p): int(a) for b in batches for p, a in zip(b.pair_ids, b.anchor_pair_id)}
    same_batch = 0
    for a, b in planted:
        pa_, pb_ = int(ids[a]), int(ids[b])
        assert anchor_of[pb_] == pa_ or anchor_of[pa_] == pb_  # adjacent in the chain
        same_batch += where[pa_] == where[pb_]
    assert same_batch >= 16  # a batch boundary can split a few; uniform would put ~12% together
    uniform = UniformComposer(32).compose_epoch(0, ids, None, gen(2))
    where_u = {int(p): i for i, b in enumerate(uniform) for p in b.pair_ids}
    assert sum(where_u[int(ids[a])] == where_u[int(ids[b])] for a, b in planted) < same_batch


def test_grit_epoch_zero_or_no_cache_is_uniform():
    ids = sparse_ids(100)
    cache = unit_cache(ids)
    composer = GritComposer(16, 32)
    for epoch, c in ((0, cache), (3, None)):
        batches = composer.compose_epoch(epoch, ids, c, gen(4))
        assert_batches_equal(batches, UniformComposer(16).compose_epoch(epoch, ids, None, gen(4)))
        assert all(b.sampler == "uniform" for b in batches)


def test_grit_masks_with_minus_inf_where_softmax_underflows():
    """Regression: GRIT's zeroed-softmax recipe repeats pairs at tiny temperatures; -inf masking does not."""
    n, dim, temp = 64, 32, 0.001
    ids = torch.arange(n)
    g = gen(13)
    image = torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=1).half().float()
    text = torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=1).half().float()
    buggy = buggy_softmax_grit(image, text, temp, start=0)
    assert len(buggy) == n and len(set(buggy)) < n  # the reference bug is real on this input
    cache = EmbeddingCache(ids, dim=dim)
    scale = 1 / math.sqrt(temp)  # similarities of the cached features are cos / temp (up to ~1000)
    cache.update(ids, image * scale, text * scale)
    batches = GritComposer(16, n).compose_epoch(1, ids, cache, gen(0))
    assert sorted(flat(batches).tolist()) == list(range(n))
    assert torch.cat([b.similarity_to_anchor for b in batches]).nan_to_num(0).abs().max() > 100


def test_grit_state_dict_and_generator_state_resume_exactly():
    ids = sparse_ids(400, seed=9)
    cache = unit_cache(ids, seed=9)
    composer = GritComposer(24, 72)
    g = gen(21)
    composer.compose_epoch(1, ids, cache, g)
    saved = (composer.state_dict(), g.get_state(), cache.state_dict())
    expected = composer.compose_epoch(2, ids, cache, g)
    resumed = GritComposer(24, 72)
    resumed.load_state_dict(saved[0])
    g2 = torch.Generator()
    g2.set_state(saved[1])
    cache2 = EmbeddingCache(ids, dim=32)
    cache2.load_state_dict(saved[2])
    assert_batches_equal(expected, resumed.compose_epoch(2, ids, cache2, g2))
    with pytest.raises(FalconError, match="search_space_size"):
        GritComposer(24, 96).load_state_dict(saved[0])
    with pytest.raises(FalconError):
        UniformComposer(24).load_state_dict(saved[0])


def test_batches_state_roundtrip():
    ids = sparse_ids(90)
    batches = GritComposer(16, 40).compose_epoch(1, ids, unit_cache(ids), gen(0))
    assert_batches_equal(batches, batches_from_state(batches_state(batches)))
    assert batches_from_state(batches_state([])) == []


def test_grit_empty_and_tiny_inputs():
    cache = unit_cache(torch.arange(5))
    assert GritComposer(4, 8).compose_epoch(1, torch.empty(0, dtype=torch.int64), cache, gen(0)) == []
    one = GritComposer(4, 8).compose_epoch(1, torch.tensor([3]), cache, gen(0))
    assert [b.pair_ids.tolist() for b in one] == [[3]] and one[0].anchor_pair_id.tolist() == [-1]
    assert GritComposer(4, 8, drop_last=True).compose_epoch(1, torch.arange(3), cache, gen(0)) == []
    with pytest.raises(FalconError, match="no features"):
        GritComposer(4, 8).compose_epoch(1, torch.arange(5), EmbeddingCache(torch.arange(5), dim=4), gen(0))


# --- cache -----------------------------------------------------------------------------------
def test_cache_update_filled_rows_and_unknown_ids():
    ids = torch.tensor([40, 7, 1000, 3, 55])
    cache = EmbeddingCache(ids, dim=4)
    assert cache.rows(torch.tensor([3, 40, 1000])).tolist() == [3, 0, 2]
    feats = torch.randn(2, 4, requires_grad=True)
    cache.update(torch.tensor([1000, 7]), feats, feats * 2)
    assert cache.image.dtype == torch.float16 and not cache.image.requires_grad
    assert cache.filled.tolist() == [False, True, True, False, False]
    image, text = cache.get([7])
    torch.testing.assert_close(image.float(), feats[1:2].detach().half().float())
    torch.testing.assert_close(text.float(), (feats[1:2] * 2).detach().half().float())
    cache.reset()
    assert not cache.filled.any() and cache.written.sum() == 2
    with pytest.raises(FalconError, match="pair id 8 is not in the dataset"):
        cache.rows([7, 8])
    with pytest.raises(ValueError):
        cache.update([7], torch.zeros(1, 5), torch.zeros(1, 5))
    with pytest.raises(FalconError, match="more than once"):
        EmbeddingCache([1, 2, 1], dim=4)
    with pytest.raises(FalconError, match="negative"):
        EmbeddingCache([1, -2], dim=4)


def test_cache_save_load_roundtrip(tmp_path):
    ids = sparse_ids(300)
    cache = unit_cache(ids, dim=16)
    partial = EmbeddingCache(ids, dim=16)
    some = ids[::3]
    partial.update(some, *cache.get(some))
    path = partial.save(tmp_path / "embeddings.h5", ATTRS)
    emb = read_embeddings(path)
    assert emb.image.dtype == np.float16 and sorted(emb.pair_id.tolist()) == sorted(some.tolist())
    loaded = EmbeddingCache(ids, dim=16)
    attrs = loaded.load(path)
    assert attrs["epoch"] == 1 and attrs["model"] == "albef-tiny"
    assert torch.equal(loaded.filled, partial.written) and torch.equal(loaded.written, partial.written)
    torch.testing.assert_close(loaded.image.float(), partial.image.float(), atol=2e-3, rtol=0)
    torch.testing.assert_close(loaded.text.float(), partial.text.float(), atol=2e-3, rtol=0)
    full = cache.save(tmp_path / "full.h5", ATTRS)
    again = EmbeddingCache(ids, dim=16)
    again.load(full)
    assert again.filled.all()
    with pytest.raises(FalconError, match="dimension"):
        EmbeddingCache(ids, dim=8).load(full)
    with pytest.raises(FalconError, match="not in the dataset"):
        EmbeddingCache(ids[:10], dim=16).load(full)


def test_cache_state_dict_roundtrip():
    ids = sparse_ids(50)
    cache = unit_cache(ids, dim=8)
    cache.reset()
    cache.update(ids[:5], *cache.get(ids[:5]))
    other = EmbeddingCache(ids, dim=8)
    other.load_state_dict(cache.state_dict())
    for key in ("image", "text", "filled", "written"):
        assert torch.equal(getattr(other, key), getattr(cache, key))
    with pytest.raises(FalconError, match="differ"):
        EmbeddingCache(ids.flip(0), dim=8).load_state_dict(cache.state_dict())


# --- sharding --------------------------------------------------------------------------------
@pytest.mark.parametrize("n,world", [(100, 1), (100, 4), (103, 4), (101, 3), (5, 4), (2, 3)])
@pytest.mark.parametrize("mode", ["pad", "trim"])
def test_shards_are_disjoint_cover_all_and_give_equal_batch_counts(n, world, mode):
    ids = sparse_ids(n)
    shards = [shard_pair_ids(ids, r, world, gen(8), mode=mode) for r in range(world)]
    sizes = {len(s) for s in shards}
    assert len(sizes) == 1
    for s in shards:
        assert len(set(s.tolist())) == len(s)  # no pair twice within a rank
    union = torch.cat(shards).tolist()
    if mode == "pad":
        assert set(union) == set(ids.tolist())
        assert len(union) - n == (-n) % world
    else:
        assert len(union) == len(set(union)) == (n // world) * world
    cache = unit_cache(ids, dim=8)
    for composer in (GritComposer(8, 24), UniformComposer(8), GritComposer(8, 24, drop_last=True)):
        counts = {len(composer.compose_epoch(1, s, cache, gen(r))) for r, s in enumerate(shards)}
        assert len(counts) == 1
    # a new epoch (generator moved on) deals differently
    g = gen(8)
    first = shard_pair_ids(ids, 0, world, g, mode=mode)
    second = shard_pair_ids(ids, 0, world, g, mode=mode)
    if n >= 20:
        assert not torch.equal(first, second)


def test_shard_arguments_are_checked():
    with pytest.raises(ValueError):
        shard_pair_ids(torch.arange(10), 2, 2, gen())
    with pytest.raises(ValueError):
        shard_pair_ids(torch.arange(10), 0, 2, gen(), mode="drop")


# --- batch log -------------------------------------------------------------------------------
def test_batch_log_rows_match_batches_and_append_epochs(tmp_path):
    ids = sparse_ids(130)
    cache = unit_cache(ids, dim=8)
    composer = GritComposer(32, 64)
    log = BatchLog(tmp_path / "batches.parquet")
    g = gen(3)
    epochs = {}
    for epoch in range(3):
        epochs[epoch] = composer.compose_epoch(epoch, ids, cache, g)
        log.extend(epoch, epochs[epoch], rank=0, start_step=100 * epoch)
        log.write(epoch)
    assert sorted(p.name for p in (tmp_path / "batches.parquet").iterdir()) == [
        "epoch-000000.parquet",
        "epoch-000001.parquet",
        "epoch-000002.parquet",
    ]
    frame = read_batch_log(tmp_path / "batches.parquet")
    assert len(frame) == 3 * 130 and list(frame.columns)[:4] == ["epoch", "step", "rank", "slot"]
    assert frame["q"].dtype == np.float32
    for epoch, batches in epochs.items():
        part = frame[frame["epoch"] == epoch]
        assert part["step"].unique().tolist() == [100 * epoch + i for i in range(len(batches))]
        assert part["pair_id"].tolist() == flat(batches).tolist()
        assert part["anchor_pair_id"].tolist() == torch.cat([b.anchor_pair_id for b in batches]).tolist()
        assert part["slot"].tolist() == [s for b in batches for s in range(len(b))]
        np.testing.assert_array_equal(
            part["similarity_to_anchor"].to_numpy(), torch.cat([b.similarity_to_anchor for b in batches]).numpy()
        )
        assert set(part["sampler"]) == {"uniform" if epoch == 0 else "grit"}
    assert read_batch_log(tmp_path / "batches.parquet", epochs=[1])["epoch"].unique().tolist() == [1]
    assert len(pd.read_parquet(tmp_path / "batches.parquet")) == 3 * 130  # plain pandas reads it too
    # rewriting an epoch (a resumed run) replaces its part
    log.extend(1, epochs[1][:2], rank=0)
    log.write(1)
    assert len(read_batch_log(tmp_path / "batches.parquet", epochs=[1])) == len(epochs[1][0]) + len(epochs[1][1])


def test_batch_log_per_rank_parts_state_and_validation(tmp_path):
    path = tmp_path / "batches.parquet"
    batches = UniformComposer(4).compose_epoch(0, torch.arange(10), None, gen(0))
    for rank in (0, 1):
        log = BatchLog(path, part_rank=rank)
        log.extend(0, batches, rank=rank)
        state = log.state_dict()
        resumed = BatchLog(path, part_rank=rank)
        resumed.load_state_dict(state)
        assert resumed.pending_epochs() == [0]
        pd.testing.assert_frame_equal(resumed.rows(0), log.rows(0))
        resumed.flush()
    frame = read_batch_log(path)
    assert len(frame) == 20 and frame["rank"].value_counts().to_dict() == {0: 10, 1: 10}
    # same (epoch, step, rank, slot) in two parts
    log = BatchLog(path)
    log.extend(0, batches, rank=1)
    log.write(0)
    with pytest.raises(FalconError, match="duplicate rows"):
        read_batch_log(path)
    (path / "epoch-000000.parquet").unlink()
    # a part that is not a batches table
    write_table(
        path / "epoch-000005.parquet",
        {"pair_id": [1], "space_id": [0], "position": [0], "epoch": [5], "method": ["grit"], "seed": [0]},
        SEARCH_SPACES,
    )
    with pytest.raises(FalconError, match="expected 'batches'"):
        read_batch_log(path)
    with pytest.raises(FalconError, match="not found"):
        read_batch_log(tmp_path / "missing")


def test_batch_log_single_file_and_empty(tmp_path):
    log = BatchLog(tmp_path / "log")
    log.extend(2, [], rank=0)
    written = log.write(2)
    assert read_batch_log(written).empty
    assert read_batch_log(tmp_path / "log").empty
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    frame = read_batch_log(empty_dir)
    assert frame.empty and list(frame.columns)[:2] == ["epoch", "step"]
