"""FALCON's quantile composition (Algorithm 1): the vectorised path against a plain loop."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from falcon_cli.sampling import quantile
from falcon_cli.sampling.cache import EmbeddingCache
from falcon_cli.sampling.policy import numpy_generator, sample_q
from falcon_cli.sampling.quantile import QuantileSpaces, _sorted_rows, space_tables, unified_similarity


def exact_features(n: int, dim: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Features that are multiples of 1/4 in [-1, 1]: every dot product is exact in float32, so the
    reference and the fast path see bit-identical similarities (and many ties, which tests tie order)."""
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randint(-4, 5, (n, dim), generator=g).float() / 4,
        torch.randint(-4, 5, (n, dim), generator=g).float() / 4,
    )


def make_cache(n: int, seed: int = 0, first_id: int = 100) -> tuple[EmbeddingCache, torch.Tensor, torch.Tensor]:
    image, text = exact_features(n, seed=seed)
    ids = torch.arange(first_id, first_id + n)
    cache = EmbeddingCache(ids, dim=image.shape[1], dtype=torch.float32)
    cache.update(ids, image, text)
    return cache, image, text


def toy_policy(s_hat):
    """A deterministic stand-in for the scheduler: Beta parameters from the row's shape."""
    return 0.3 + 40 * (s_hat.max(-1).values - s_hat.min(-1).values), 0.4 + 3 * s_hat[..., 0] * s_hat.shape[-1]


def plain_s_hat(row_without_diagonal, m=100):
    levels = torch.linspace(0, 1, m, dtype=torch.float64)
    return torch.softmax(torch.quantile(row_without_diagonal.double(), levels).float(), 0)


def reference(
    spaces_ids, img, txt, batch_size, source, generator, *, drop_last=False, level="instance", scale="linear"
):
    """Algorithm 1, one candidate at a time, over spaces in lockstep, with the fast path's order of
    random draws: per round one uniform per active space (its start), then per step the rule's draws.
    ``img``/``txt`` [S, W, D]: position k of space s has features img[s, k]. ``source``: a fixed q or
    a policy applied to plain Ŝ rows (torch.quantile of the row without its diagonal). ``scale``: ``linear``
    (the q-quantile's nearest rank) or ``log_rank`` (the k-th most similar, k = n^(1 - q) rounded)."""
    sims = [
        [[float(img[s][a] @ txt[s][b] + txt[s][a] @ img[s][b]) for b in range(len(ids))] for a in range(len(ids))]
        for s, ids in enumerate(spaces_ids)
    ]
    available = [list(range(len(ids))) for ids in spaces_ids]
    out = [[] for _ in spaces_ids]

    def usable(s):
        return len(available[s]) >= batch_size or (bool(available[s]) and not drop_last)

    while True:
        active = [s for s in range(len(spaces_ids)) if usable(s)]
        if not active:
            return out
        u = torch.rand(len(active), generator=generator, dtype=torch.float64)
        chains = {}
        for k, s in enumerate(active):
            pick = min(int(u[k] * len(available[s])), len(available[s]) - 1)
            first = sorted(available[s])[pick]
            available[s].remove(first)
            chains[s] = [(first, -1, math.nan)]
        batch_q = None
        q_generator = numpy_generator(generator) if callable(source) else None
        for _step in range(1, batch_size):
            going = [s for s in active if available[s]]
            if not going:
                break
            lasts = [chains[s][-1][0] for s in going]
            if not callable(source):
                qs = [float(source)] * len(going)
            elif level == "batch":
                if batch_q is None:
                    params = [beta_params(source, sims[s], chains[s][0][0]) for s in active]
                    draws = sample_q(
                        torch.tensor([p[0] for p in params]), torch.tensor([p[1] for p in params]), q_generator
                    )
                    batch_q = {s: float(d) for s, d in zip(active, draws)}
                qs = [batch_q[s] for s in going]
            else:
                params = [beta_params(source, sims[s], last) for s, last in zip(going, lasts)]
                draws = sample_q(
                    torch.tensor([p[0] for p in params]), torch.tensor([p[1] for p in params]), q_generator
                )
                qs = [float(d) for d in draws]
            for s, last, q in zip(going, lasts, qs):
                row = sims[s][last]
                candidates = sorted(available[s], key=lambda j: (row[j], -j))
                if scale == "linear":
                    r = min(math.floor(q * (len(candidates) - 1) + 0.5), len(candidates) - 1)
                elif scale == "log_rank":  # counted from the most similar: k = 1 is the last of the ascending order
                    r = len(candidates) - math.floor(len(candidates) ** (1 - q) + 0.5)
                else:  # quadratic_rank: k - 1 = round((n - 1)(1 - q)^2) from the most similar
                    r = len(candidates) - 1 - math.floor((len(candidates) - 1) * (1 - q) ** 2 + 0.5)
                chosen = candidates[r]
                available[s].remove(chosen)
                chains[s].append((chosen, last, q))
        for s in active:
            ids = spaces_ids[s]
            out[s].append([(int(ids[c]), int(ids[a]) if a >= 0 else -1, q) for c, a, q in chains[s]])


def beta_params(policy, sims_of_space, anchor):
    row = torch.tensor([v for j, v in enumerate(sims_of_space[anchor]) if j != anchor])
    alpha, beta = policy(plain_s_hat(row)[None])
    return float(alpha[0]), float(beta[0])


def space_features(parts, image, text):
    """[S, W, D] feature tables of the spaces ``parts`` (pair ids; features are indexed by id - 100)."""
    width = max(len(p) for p in parts)
    img = torch.zeros(len(parts), width, image.shape[1])
    txt = torch.zeros_like(img)
    for s, p in enumerate(parts):
        img[s, : len(p)] = image[p - 100]
        txt[s, : len(p)] = text[p - 100]
    return img, txt


def batch_tuples(batch):
    return [(int(p), int(a), float(q)) for p, a, q in zip(batch.pair_ids, batch.anchor_pair_id, batch.q)]


def same(expected, got):
    assert len(expected) == len(got)
    for e, g in zip(expected, got):
        assert [x[:2] for x in e] == [x[:2] for x in g]
        assert all((math.isnan(a[2]) and math.isnan(b[2])) or abs(a[2] - b[2]) < 1e-6 for a, b in zip(e, g))


def test_cpu_sort_orders_like_stable_torch_sort_with_ties_by_descending_index():
    g = torch.Generator().manual_seed(1)
    block = torch.randint(-3, 4, (7, 50), generator=g).float() / 2
    block[0, :5] = -0.0
    block[1, 3] = float("inf")
    positions = torch.tensor([0, 3, 49])
    index, values = _sorted_rows(block.clone(), positions)
    keyed = [sorted(range(50), key=lambda j: (float(block[r, j]), -j)) for r in range(7)]
    assert index.tolist() == keyed
    assert torch.equal(values, torch.gather(block + 0.0, 1, index)[:, positions])


@pytest.mark.parametrize("panel_rows, sort_rows", [(64, 64), (7, 3)])
def test_space_tables_match_plain_quantiles_and_sorts(monkeypatch, panel_rows, sort_rows):
    monkeypatch.setattr(quantile, "SORT_BLOCK_BYTES", sort_rows * 30 * 4)  # several panels and sort blocks per space
    cache, image, text = make_cache(30)
    size = torch.tensor([30, 17])
    img = torch.stack([image, torch.cat([image[:17], torch.zeros(13, 8)])])
    txt = torch.stack([text, torch.cat([text[:17], torch.zeros(13, 8)])])
    tables = space_tables(img, txt, size, quantiles=11, panel_bytes=panel_rows * 30 * 4)
    levels = torch.linspace(0, 1, 11, dtype=torch.float64)
    for s, n in enumerate(size.tolist()):
        full = unified_similarity(img[s, :n], txt[s, :n])
        for a in range(n):
            others = [j for j in range(n) if j != a]
            expected_order = sorted(others, key=lambda j: (float(full[a, j]), -j))
            assert tables.order[s, a, : n - 1].tolist() == expected_order
            row = full[a, others].double()
            expected = torch.softmax(torch.quantile(row, levels).float(), 0)
            assert torch.allclose(tables.s_hat[s, a], expected, atol=1e-6)
    assert tables.order.dtype == torch.int16


def test_quantile_features_do_not_depend_on_candidate_order():
    image, text = exact_features(20, seed=3)
    perm = torch.randperm(20, generator=torch.Generator().manual_seed(0))
    size = torch.tensor([20])
    a = space_tables(image[None], text[None], size).s_hat[0]
    b = space_tables(image[perm][None], text[perm][None], size).s_hat[0]
    assert torch.allclose(a[perm], b, atol=1e-6)


@pytest.mark.parametrize("scale", ["linear", "log_rank", "quadratic_rank"])
@pytest.mark.parametrize("q", [0.0, 0.3, 0.5, 0.94, 1.0])
def test_fixed_q_one_space_at_a_time_equals_reference(q, scale):
    cache, image, text = make_cache(45)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    spaces = QuantileSpaces(cache.pair_ids, cache, search_space_size=20, batch_size=6, generator=g1, scale=scale)
    got = []
    while spaces.has_next():
        batch, record = spaces.next_batch(q, g1)
        got.append(batch_tuples(batch))
    # the reference replays the same shuffle, then each space on its own
    shuffled = cache.pair_ids[torch.randperm(45, generator=g2)]
    expected = []
    for s in range(3):
        part = shuffled[s * 20 : (s + 1) * 20]
        expected += reference([part], *space_features([part], image, text), 6, q, g2, scale=scale)[0]
    same(expected, got)
    assert sorted(p for b in got for p, _, _ in b) == list(range(100, 145)), "every pair exactly once"
    assert [len(b) for b in got] == [6, 6, 6, 2, 6, 6, 6, 2, 5]


@pytest.mark.parametrize(
    "level, scale",
    [("instance", "linear"), ("batch", "linear"), ("instance", "log_rank"), ("instance", "quadratic_rank")],
)
@pytest.mark.parametrize("width", [20, 15])  # last batches of 6 and 3; of 1 (no step at all) and 5
def test_beta_rule_lockstep_equals_reference(level, width, scale):
    cache, image, text = make_cache(50, seed=2)
    rule = toy_policy
    g1, g2 = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
    spaces = QuantileSpaces(
        cache.pair_ids, cache, search_space_size=width, batch_size=7, generator=g1, level=level, scale=scale
    )
    got = spaces.compose_all(rule, g1)
    shuffled = cache.pair_ids[torch.randperm(50, generator=g2)]
    parts = [shuffled[s * width : (s + 1) * width] for s in range(math.ceil(50 / width))]
    expected = [
        b
        for space in reference(parts, *space_features(parts, image, text), 7, rule, g2, level=level, scale=scale)
        for b in space
    ]
    same(expected, [batch_tuples(b) for b in got])
    if level == "batch":
        for b in got:
            qs = b.q[1:]
            assert len(b) == 1 or torch.all(qs == qs[0])


@pytest.mark.parametrize("q", [1.0, 0.0])
def test_q_one_is_the_argmax_chain_and_q_zero_the_argmin(q):
    """Independent of the reference: each slot is the (lowest-index) most similar remaining pair for
    q = 1 (GRIT's rule on S), the least similar for q = 0; 'remaining' spans the whole epoch."""
    cache, image, text = make_cache(24, seed=4)
    g = torch.Generator().manual_seed(0)
    spaces = QuantileSpaces(cache.pair_ids, cache, search_space_size=24, batch_size=8, generator=g)
    used: set[int] = set()
    for batch in spaces.compose_all(q, g):
        local = [int(p) - 100 for p in batch.pair_ids]
        used.add(local[0])
        for k in range(1, len(local)):
            prev = local[k - 1]
            assert int(batch.anchor_pair_id[k]) - 100 == prev
            remaining = [j for j in range(24) if j not in used]
            row = (image[prev] @ text.T + text[prev] @ image.T)[remaining]
            best = int(torch.argmax(row)) if q == 1.0 else None
            if q == 1.0:
                assert local[k] == remaining[best]
            else:
                assert float(image[prev] @ text[local[k]] + text[prev] @ image[local[k]]) == float(row.min())
            assert float(batch.quantile_rank[k]) == (q if len(remaining) > 1 else 1.0)
            used.add(local[k])


def test_one_space_epoch_batches_cover_everything_and_drop_last():
    cache, _, _ = make_cache(50)
    g = torch.Generator().manual_seed(0)
    spaces = QuantileSpaces(cache.pair_ids, cache, search_space_size=50, batch_size=8, generator=g, drop_last=True)
    batches = spaces.compose_all(0.5, g)
    assert len(batches) == len(spaces) == 6 and all(len(b) == 8 for b in batches)
    ids = torch.cat([b.pair_ids for b in batches])
    assert len(set(ids.tolist())) == 48


@pytest.mark.parametrize(
    "n,width,batch,drop_last",
    [(160, 24, 16, False), (160, 24, 16, True), (50, 20, 8, False), (50, 64, 8, True), (7, 3, 2, False)],
)
def test_batch_count_of_a_spaced_epoch(n, width, batch, drop_last):
    """The count the pretrain stage plans an epoch with (num_space_batches) is the count the composer makes:
    every pair once, each space ending in its own short batch (or dropping it)."""
    from falcon_cli.sampling.composers import num_space_batches

    cache, _, _ = make_cache(n, seed=n)
    g = torch.Generator().manual_seed(1)
    spaces = QuantileSpaces(
        cache.pair_ids, cache, search_space_size=width, batch_size=batch, generator=g, drop_last=drop_last
    )
    batches = spaces.compose_all(0.5, g)
    assert len(batches) == len(spaces) == num_space_batches(n, width, batch, drop_last)
    ids = torch.cat([b.pair_ids for b in batches]).tolist()
    assert len(ids) == len(set(ids))
    full, rest = divmod(n, min(width, n))
    assert len(ids) == (n if not drop_last else full * (min(width, n) // batch * batch) + rest // batch * batch)


def test_resume_mid_epoch_recomposes_the_same_batches():
    cache, _, _ = make_cache(40, seed=6)
    rule = toy_policy
    g = torch.Generator().manual_seed(3)
    spaces = QuantileSpaces(cache.pair_ids, cache, search_space_size=20, batch_size=6, generator=g)
    uninterrupted = []
    state = None
    while spaces.has_next():
        if len(uninterrupted) == 2:
            state, g_state = spaces.state_dict(), g.get_state()
        uninterrupted.append(batch_tuples(spaces.next_batch(rule, g)[0]))
    # the cache moves on (this epoch's features) but the snapshot keeps the space as composed
    cache.update(cache.pair_ids, *exact_features(40, seed=99))
    resumed = QuantileSpaces(
        cache.pair_ids, cache, search_space_size=20, batch_size=6, generator=torch.Generator().manual_seed(123)
    )
    resumed.load_state_dict(state)
    g.set_state(g_state)
    rest = []
    while resumed.has_next() and len(rest) < 2:  # the current space is finished from its snapshot
        rest.append(batch_tuples(resumed.next_batch(rule, g)[0]))
    same(uninterrupted[2:4], rest)


def test_record_holds_the_rows_and_qs_the_policy_used():
    cache, _, _ = make_cache(30, seed=7)
    rule = toy_policy
    g = torch.Generator().manual_seed(0)
    spaces = QuantileSpaces(cache.pair_ids, cache, search_space_size=30, batch_size=5, generator=g)
    batch, record = spaces.next_batch(rule, g)
    ids = spaces.space_ids(0).tolist()
    positions = torch.tensor([ids.index(int(a)) for a in batch.anchor_pair_id[1:]])
    assert torch.equal(record["s_hat"], spaces.tables.s_hat[0, positions])
    assert torch.allclose(record["q"].float(), batch.q[1:])


def test_level_record_is_what_every_level_would_have_picked_from_the_same_candidates():
    """``scheduler_credit: levels``: at each step the record holds, for every q of the grid, the pick a chain at
    that q would have made for the same anchor among the candidates still available (ascending S, equal values by
    descending index, the nearest rank), its S to the anchor, the anchor's own 2 I·T and the oracle's verdict on it;
    written out plainly here. The chain's own choices and randomness are those of a composer without the grid."""
    cache, image, text = make_cache(36, seed=5)
    truth_table = torch.rand(36, 36, generator=torch.Generator().manual_seed(9)) < 0.3
    index = {int(p): i for i, p in enumerate(cache.pair_ids)}

    def truth(ids):
        local = torch.tensor([index[int(i)] for i in ids])
        return truth_table[local][:, local]

    grid = [0.05, 0.35, 0.65, 0.95]
    plain = QuantileSpaces(cache.pair_ids, cache, 36, 9, torch.Generator().manual_seed(2), truth=truth)
    spaces = QuantileSpaces(
        cache.pair_ids, cache, 36, 9, torch.Generator().manual_seed(2), truth=truth, credit_levels=grid
    )
    s = image @ text.T + text @ image.T
    g_plain, g = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    chosen: set[int] = set()
    steps = 0
    while spaces.has_next():
        expected_batch, expected_record = plain.next_batch(toy_policy, g_plain)
        batch, record = spaces.next_batch(toy_policy, g)
        assert torch.equal(batch.pair_ids, expected_batch.pair_ids)
        assert torch.equal(batch.q.nan_to_num(-1), expected_batch.q.nan_to_num(-1))
        assert torch.equal(record["q"].nan_to_num(-1), expected_record["q"].nan_to_num(-1))
        assert "level_hardness" not in expected_record
        ids = [index[int(p)] for p in batch.pair_ids]
        local = {index[int(p)]: i for i, p in enumerate(spaces.space_ids(0))}  # ties: by descending space position
        chosen.add(ids[0])
        for t in range(1, len(ids)):
            a = ids[t - 1]
            candidates = sorted(
                (j for j in range(36) if j not in chosen and j != a), key=lambda j: (float(s[a, j]), -local[j])
            )
            for k, q in enumerate(grid):
                pick = candidates[quantile.nearest_rank(q, len(candidates))]
                assert float(record["level_hardness"][t - 1, k]) == pytest.approx(float(s[a, pick]), abs=1e-5)
                fn = bool(truth_table[a, pick] or truth_table[pick, a])
                assert float(record["level_fn"][t - 1, k]) == float(fn)
            assert float(record["level_own"][t - 1]) == pytest.approx(float(2 * image[a] @ text[a]), abs=1e-5)
            chosen.add(ids[t])
            steps += 1
        taken = len(ids) - 1
        assert torch.isnan(record["level_hardness"][taken:]).all() and torch.isnan(record["level_own"][taken:]).all()
    assert steps == 36 - 4  # four batches of a 36-pair space, each with a first pair that no level chose


@pytest.mark.parametrize("level", ["instance", "batch"])
def test_every_logged_column_is_what_it_says(level):
    """The columns a batch carries into the batch log, recomputed plainly from the features and the policy:
    each pick's similarity to its anchor (the unified S / 2), the Beta its q came from (its anchor's row, or the
    batch's first pair's at batch level), its rank among the candidates left; slot 0 has none of them."""
    cache, image, text = make_cache(40, seed=3)
    g = torch.Generator().manual_seed(1)
    spaces = QuantileSpaces(cache.pair_ids, cache, search_space_size=40, batch_size=7, generator=g, level=level)
    index = {int(p): i for i, p in enumerate(cache.pair_ids)}
    seen = 0
    while spaces.has_next():
        batch, _ = spaces.next_batch(toy_policy, g)
        rows = spaces.tables.s_hat[0]
        ids = spaces.space_ids(spaces.current).tolist()
        for name in ("q", "alpha", "beta", "similarity_to_anchor", "quantile_rank"):
            assert math.isnan(float(getattr(batch, name)[0])), name
        for t in range(1, len(batch.pair_ids)):
            a, c = index[int(batch.anchor_pair_id[t])], index[int(batch.pair_ids[t])]
            expected = (float(image[a] @ text[c]) + float(text[a] @ image[c])) / 2
            assert float(batch.similarity_to_anchor[t]) == pytest.approx(expected, abs=1e-6)
            source = ids.index(int(batch.anchor_pair_id[t] if level == "instance" else batch.pair_ids[0]))
            alpha, beta = toy_policy(rows[source])
            assert float(batch.alpha[t]) == pytest.approx(float(alpha), rel=1e-6)
            assert float(batch.beta[t]) == pytest.approx(float(beta), rel=1e-6)
            left = len(ids) - seen - t  # candidates when slot t was chosen
            r = quantile.nearest_rank(float(batch.q[t]), left)
            assert float(batch.quantile_rank[t]) == pytest.approx(r / (left - 1) if left > 1 else 1.0, abs=1e-6)
        seen += len(batch.pair_ids)
    assert seen == 40


# --- the quantile composers behind the one composer protocol ---------------------------------------------------


def _composer(name, **kwargs):
    from falcon_cli.sampling.quantile_composer import QuantileComposer

    return QuantileComposer(name, 6, 20, quantile=0.5, progressive=(0.2, 0.8, 4), **kwargs)


@pytest.mark.parametrize("name", ["quantile", "progressive", "falcon"])
def test_quantile_composers_keep_the_composer_protocol(name):
    from falcon_cli.sampling.composers import BatchComposer

    composer = _composer(name, source=toy_policy)
    assert isinstance(composer, BatchComposer) and composer.on_demand == (name == "falcon")
    cache, _, _ = make_cache(40, seed=2)
    for epoch in (0, 1, 3):
        batches = composer.compose_epoch(epoch, cache.pair_ids, cache, torch.Generator().manual_seed(epoch))
        assert len(batches) == composer.num_epoch_batches(epoch, 40)
        assert sorted(torch.cat([b.pair_ids for b in batches]).tolist()) == sorted(cache.pair_ids.tolist())
        assert {b.sampler for b in batches} == ({"uniform"} if epoch == 0 else {name})


def test_a_quantile_composers_epoch_is_its_spaces_composed_at_its_q():
    """Epoch 0 is the uniform composer's epoch; later epochs are QuantileSpaces at q (fixed) or the progressive q."""
    from falcon_cli.sampling.composers import UniformComposer
    from falcon_cli.sampling.scheduler import progressive_q

    cache, _, _ = make_cache(40, seed=4)
    zero = _composer("quantile").compose_epoch(0, cache.pair_ids, cache, torch.Generator().manual_seed(5))
    uniform = UniformComposer(6).compose_epoch(0, cache.pair_ids, None, torch.Generator().manual_seed(5))
    same([batch_tuples(b) for b in uniform], [batch_tuples(b) for b in zero])
    for name, epoch, q in (("quantile", 2, 0.5), ("progressive", 2, progressive_q(2, 4, 0.2, 0.8))):
        got = _composer(name).compose_epoch(epoch, cache.pair_ids, cache, torch.Generator().manual_seed(7))
        g = torch.Generator().manual_seed(7)
        expected = QuantileSpaces(
            cache.pair_ids, cache, search_space_size=20, batch_size=6, generator=g, sampler=name
        ).compose_all(q, g)
        same([batch_tuples(b) for b in expected], [batch_tuples(b) for b in got])


def test_a_quantile_composer_refuses_the_state_of_another():
    from falcon_cli.errors import FalconError

    state = _composer("quantile").state_dict()
    _composer("quantile").load_state_dict(state)
    with pytest.raises(FalconError, match="progressive composer state does not match"):
        _composer("progressive").load_state_dict(state)


def test_the_log_rank_position_counts_from_the_most_similar():
    """``quantile_position(q, n, "log_rank")``: the k-th most similar of n with k = n^(1 - q) rounded, against a plain
    loop; q = 1 the most similar, q = 0 the least, NaN or no candidate 0; ``linear`` is the nearest rank."""
    for n in (1, 2, 3, 7, 20, 500):
        for q in (0.0, 0.1, 0.5, 0.8, 0.94, 0.99, 1.0):
            k = math.floor(n ** (1 - q) + 0.5)
            assert quantile.quantile_position(q, n, "log_rank") == n - k, (n, q)
            assert quantile.quantile_position(q, n, "linear") == quantile.nearest_rank(q, n)
    assert (
        quantile.quantile_position(1.0, 500, "log_rank") == 499
        and quantile.quantile_position(0.0, 500, "log_rank") == 0
    )
    assert quantile.quantile_position(0.94, 500, "log_rank") == 499  # the most similar (500^0.06 = 1.45)
    assert quantile.quantile_position(0.9, 500, "log_rank") == 498  # the 2nd (500^0.1 = 1.86)
    assert quantile.nearest_rank(0.94, 500) == 469  # linearly: the 31st
    assert quantile.quantile_position(float("nan"), 30, "log_rank") == 0
    assert list(quantile.quantile_position([0.5, 0.5], [0, -3], "log_rank")) == [0, 0]
    with pytest.raises(ValueError, match="scale must be one of"):
        quantile.quantile_position(0.5, 10, "log")


def test_the_log_rank_recipe_reaches_the_composer(tmp_path):
    """`shapes-falcon-margin-top` end to end (tiny): every chained pick's logged rank is the log-rank scale's rank of
    the pick its q made among some number of candidates left (1 − ln k / ln n, k = round(n^(1 − q))), which a linear
    quantile's rank is not."""
    import yaml

    from falcon_cli.sampling.batch_log import read_batch_log
    from tests.conftest import TINY_FRAMEWORK_RUN, run_cli

    run = tmp_path / "run"
    proc = run_cli(
        "pretrain",
        "--recipe",
        "shapes-falcon-margin-top",
        "--run-dir",
        run,
        f"data.dataset={tmp_path / 'world'}",
        *TINY_FRAMEWORK_RUN,
        "pretrain.epochs=2",
        # (the batch log is all it reads: no test-split scoring, no loader process, 32 px)
        "pretrain.eval.split=null",
        "pretrain.loader.num_workers=0",
        "data.shapes.size=32",
        "pretrain.encoders.image_size=32",
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    log = read_batch_log(run / "batches.parquet")
    chained = log[(log["epoch"] == 1) & log["q"].notna()]
    assert len(chained) > 20
    width = yaml.safe_load((run / "config.yaml").read_text())["pretrain"]["composer"]["search_space_size"]

    def made_at(q, rank, scale):  # some n of candidates left at which q's pick has this rank on this scale
        n = np.arange(1, width + 1)  # (a lone candidate, the last pick of a space, is the hardest: 1.0)
        ranks = quantile.scale_rank(quantile.quantile_position(np.full(len(n), q), n, scale), n, scale)
        return bool(np.isclose(ranks, rank, atol=1e-5).any())

    pairs = list(zip(chained["q"].astype(float), chained["quantile_rank"].astype(float)))
    assert all(made_at(q, rank, "log_rank") for q, rank in pairs)
    assert not all(made_at(q, rank, "linear") for q, rank in pairs)


def test_scale_rank_inverts_the_position_on_either_scale():
    """``scale_rank`` is the q whose pick is at a position: ``quantile_position(scale_rank(p, n), n) == p`` for every
    position, on both scales; under ``log_rank`` the 1st and the 15th most similar of 500 are 0.44 apart, where the
    linear rank puts them 0.028 apart (issue 70's question about the rank a pick is worth)."""
    for scale in ("linear", "log_rank", "quadratic_rank"):
        for n in (2, 3, 7, 48, 500):
            positions = np.arange(n)
            assert (quantile.quantile_position(quantile.scale_rank(positions, n, scale), n, scale) == positions).all()
    assert quantile.scale_rank(0, 1, "log_rank") == 1.0 and np.isnan(quantile.scale_rank(np.nan, 5, "log_rank"))
    first, fifteenth = quantile.scale_rank([499, 485], 500, "log_rank")
    assert first == 1.0 and first - fifteenth == pytest.approx(math.log(15) / math.log(500))
    assert np.diff(quantile.scale_rank([485, 499], 500, "linear"))[0] == pytest.approx(14 / 499)
    # quadratic_rank, written out: of 500, q = 0.98 the most similar, 0.9 the 6th, 0.5 the 126th, 0 the least
    picks = quantile.quantile_position(np.array([1.0, 0.98, 0.9, 0.5, 0.0, np.nan]), 500, "quadratic_rank")
    assert picks.tolist() == [499, 499, 494, 374, 0, 0]


@pytest.mark.parametrize("scale", ["linear", "log_rank", "quadratic_rank"])
def test_a_picks_rank_and_safe_q_are_on_the_chains_q_scale(scale):
    """Each pick's ``quantile_rank`` (what ``reward.hardness: rank`` pays under ``credit: chosen``) and the oracle's
    ``safe_q`` are on the scale the chain picked with: a chain at a fixed q logs, for every pick, the rank whose pick
    is the one q made, the very q the levels path scores that pick at when the grid holds it."""
    cache, image, text = make_cache(60, seed=4)
    truth_table = torch.rand(60, 60, generator=torch.Generator().manual_seed(3)) < 0.2
    index = {int(p): i for i, p in enumerate(cache.pair_ids)}

    def truth(ids):
        local = torch.tensor([index[int(i)] for i in ids])
        return truth_table[local][:, local]

    g = torch.Generator().manual_seed(1)
    spaces = QuantileSpaces(cache.pair_ids, cache, 60, 12, g, truth=truth, scale=scale)
    q, seen = 0.5, 0
    while spaces.has_next():
        batch, _ = spaces.next_batch(q, g)
        for t in range(1, len(batch.pair_ids)):
            left = 60 - seen - t  # candidates when slot t was chosen
            position = quantile.quantile_position(q, left, scale)
            assert float(batch.quantile_rank[t]) == pytest.approx(float(quantile.scale_rank(position, left, scale)))
            assert quantile.quantile_position(float(batch.quantile_rank[t]), left, scale) == position
            safe = float(batch.safe_q[t])
            if not math.isnan(safe):  # a rank on the chain's scale, at or above every true negative's pick
                back = quantile.scale_rank(quantile.quantile_position(safe, left, scale), left, scale)
                assert float(back) == pytest.approx(safe, abs=1e-6)
                if float(batch.chosen_is_fn[t]) == 0.0:
                    assert safe >= float(batch.quantile_rank[t]) - 1e-6
        seen += len(batch.pair_ids)
    if scale == "log_rank":  # of 59 candidates, q = 0.5 is the 8th most similar: its linear rank would be 0.88
        assert float(quantile.scale_rank(quantile.quantile_position(0.5, 59, scale), 59, scale)) == pytest.approx(
            1 - math.log(8) / math.log(59)
        )
