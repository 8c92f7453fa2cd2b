"""The oracle's view of quantile composition (safe q, anchor FN density, FN picks) against a plain replay."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from falcon_cli.artifacts.tables import BATCHES, TableSchema, read_table, write_table
from falcon_cli.sampling.batch_log import BatchLog, read_batch_log
from falcon_cli.sampling.composers import FIXED_Q_FIELDS, FIXED_Q_LEVELS, Batch, batches_from_state, batches_state
from falcon_cli.sampling.oracle_view import composition_summary, pearson
from falcon_cli.sampling.quantile import QuantileSpaces
from tests.sampling.test_quantile import batch_tuples, make_cache, same, toy_policy

FIRST_ID, N = 100, 45


def random_truth(seed: int = 0, density: float = 0.3):
    """A fixed random oracle over pair ids 100..144: ``truth(ids)[i, j]`` = caption j describes image i."""
    g = torch.Generator().manual_seed(seed)
    world = torch.rand(N, N, generator=g) < density

    def truth(ids: torch.Tensor) -> torch.Tensor:
        local = ids - FIRST_ID
        return world[local][:, local] & ~torch.eye(len(ids), dtype=torch.bool)

    return truth, world


def replay(batches, shuffled, width, image, text, world):
    """Per chained slot, what the oracle says, one candidate at a time: (safe q, density, is FN, and whether each
    fixed q's nearest-rank pick among the same candidates would have been one)."""
    spaces = [shuffled[s : s + width].tolist() for s in range(0, len(shuffled), width)]
    used: set[int] = set()
    out = []
    for batch in batches:
        ids = batch.pair_ids.tolist()
        space = next(s for s in spaces if ids[0] in s)
        used.add(ids[0])
        for t in range(1, len(ids)):
            anchor, chosen = int(batch.anchor_pair_id[t]), ids[t]

            def fn(j):
                return bool(world[anchor - FIRST_ID, j - FIRST_ID] or world[j - FIRST_ID, anchor - FIRST_ID])

            left = [j for j in space if j not in used]
            sim = {
                j: float(image[anchor - FIRST_ID] @ text[j - FIRST_ID] + text[anchor - FIRST_ID] @ image[j - FIRST_ID])
                for j in left
            }
            # ascending similarity, equal values by descending position in the space
            left.sort(key=lambda j: (sim[j], -space.index(j)))
            safe = [i for i, j in enumerate(left) if not fn(j)]
            n = len(left)
            safe_q = math.nan if not safe else (safe[-1] / (n - 1) if n > 1 else 1.0)
            density = sum(fn(j) for j in space if j != anchor) / (len(space) - 1)
            fixed = [float(fn(left[math.floor(level * (n - 1) + 0.5)])) for level in FIXED_Q_LEVELS]
            out.append((safe_q, density, float(fn(chosen)), *fixed))
            used.add(chosen)
    return out


def logged(batches):
    return [
        (
            float(b.safe_q[t]),
            float(b.anchor_fn_density[t]),
            float(b.chosen_is_fn[t]),
            *(float(getattr(b, name)[t]) for name in FIXED_Q_FIELDS),
        )
        for b in batches
        for t in range(1, len(b))
    ]


def close(expected, got):
    assert len(expected) == len(got)
    for e, g in zip(expected, got):
        for x, y in zip(e, g):
            assert (math.isnan(x) and math.isnan(y)) or abs(x - y) < 1e-5, (e, g)


@pytest.mark.parametrize("source", [0.5, 1.0, 0.0, "policy"])
def test_oracle_view_equals_a_plain_replay_and_changes_no_choice(source):
    cache, image, text = make_cache(N, seed=3)
    truth, world = random_truth()
    rule = toy_policy if source == "policy" else source
    composed = {}
    for name, oracle in (("with", truth), ("without", None)):
        g = torch.Generator().manual_seed(7)
        spaces = QuantileSpaces(cache.pair_ids, cache, search_space_size=20, batch_size=6, generator=g, truth=oracle)
        composed[name] = (spaces.compose_all(rule, g), spaces.shuffled)
    batches, shuffled = composed["with"]
    same([batch_tuples(b) for b in composed["without"][0]], [batch_tuples(b) for b in batches])
    close(replay(batches, shuffled, 20, image, text, world), logged(batches))
    assert all(torch.isnan(b.safe_q[0]) for b in batches), "a batch's first slot is not chained"
    assert all(torch.isnan(b.chosen_is_fn).all() for b in composed["without"][0])
    if source != "policy":  # a fixed q's own pick is its counterfactual one
        own = FIXED_Q_FIELDS[FIXED_Q_LEVELS.index(source)]
        assert all(torch.equal(b.chosen_is_fn[1:], getattr(b, own)[1:]) for b in batches)


def test_oracle_view_one_space_at_a_time_and_through_checkpoints():
    cache, image, text = make_cache(N, seed=4)
    truth, world = random_truth(seed=1, density=0.5)
    g = torch.Generator().manual_seed(2)
    spaces = QuantileSpaces(cache.pair_ids, cache, search_space_size=15, batch_size=4, generator=g, truth=truth)
    batches = []
    while spaces.has_next():
        batches.append(spaces.next_batch(toy_policy, g)[0])
    close(replay(batches, spaces.shuffled, 15, image, text, world), logged(batches))
    close(logged(batches), logged(batches_from_state(batches_state(batches))))
    old = batches_state(batches)  # a checkpoint from before the oracle view: its slots come back NaN
    for key in Batch.ORACLE_FIELDS:
        del old[key]
    assert all(math.isnan(v) for row in logged(batches_from_state(old)) for v in row)


def test_batch_log_keeps_the_oracle_view_and_reads_version_1_logs(tmp_path):
    cache, _, _ = make_cache(N)
    truth, _ = random_truth()
    g = torch.Generator().manual_seed(0)
    batches = QuantileSpaces(
        cache.pair_ids, cache, search_space_size=20, batch_size=6, generator=g, truth=truth
    ).compose_all(0.5, g)
    log = BatchLog(tmp_path / "batches.parquet")
    log.extend(1, batches)
    log.write(1)
    rows = read_batch_log(tmp_path / "batches.parquet")
    assert np.allclose(rows["chosen_is_fn"].dropna(), [row[2] for row in logged(batches)])
    # a version-1 part (before the oracle columns): read, the new columns NaN; a newer version is refused
    v1 = TableSchema("batches", 1, BATCHES.columns[:12], unique=BATCHES.unique)
    write_table(tmp_path / "v1.parquet", rows[v1.names], v1)
    old = read_table(tmp_path / "v1.parquet", BATCHES)
    assert list(old.columns) == BATCHES.names and old["safe_q"].isna().all()
    assert (old["q"].fillna(-1) == rows["q"].fillna(-1)).all()
    assert np.allclose(rows["fn_at_q50"].dropna(), rows["chosen_is_fn"].dropna())  # q = 0.5's own pick
    # a version-2 part (before the fixed-q columns): read, those columns NaN
    v2 = TableSchema("batches", 2, BATCHES.columns[:15], unique=BATCHES.unique)
    write_table(tmp_path / "v2.parquet", rows[v2.names], v2)
    older = read_table(tmp_path / "v2.parquet", BATCHES)
    assert older["fn_at_q0"].isna().all() and np.allclose(older["chosen_is_fn"].dropna(), rows["chosen_is_fn"].dropna())
    v4 = TableSchema("batches", 4, BATCHES.columns, unique=BATCHES.unique)
    write_table(tmp_path / "v4.parquet", rows, v4)
    with pytest.raises(Exception, match="schema version 4"):
        read_table(tmp_path / "v4.parquet", BATCHES)


def plain_pearson(x, y):
    mx, my = sum(x) / len(x), sum(y) / len(y)
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))


def test_composition_summary_against_plain_arithmetic():
    rng = np.random.default_rng(0)
    n = 40
    alpha, beta = rng.uniform(0.5, 5, n), rng.uniform(0.5, 5, n)
    density = rng.uniform(0, 0.6, n)
    safe = np.where(rng.uniform(size=n) < 0.1, np.nan, rng.uniform(0, 1, n))
    q = rng.uniform(0, 1, n)
    fn = (rng.uniform(size=n) < 0.3).astype(float)
    chained = pd.DataFrame(
        {"q": q, "alpha": alpha, "beta": beta, "anchor_fn_density": density, "safe_q": safe, "chosen_is_fn": fn}
    )
    first = pd.DataFrame({c: [np.nan] * 5 for c in chained.columns})  # first slots: not chained, left out
    summary = composition_summary(pd.concat([first, chained], ignore_index=True), rewards=[0.1, -0.3, 0.2])
    mean_q = alpha / (alpha + beta)
    assert summary["q_fn_density_corr"] == pytest.approx(plain_pearson(list(mean_q), list(density)))
    keep = ~np.isnan(safe)
    assert summary["q_safe_corr"] == pytest.approx(plain_pearson(list(mean_q[keep]), list(safe[keep])))
    assert summary["safe_q_mean"] == pytest.approx(safe[keep].mean())
    assert summary["q_above_safe_share"] == pytest.approx(sum(math.isnan(s) or a > s for a, s in zip(q, safe)) / n)
    assert summary["chain_fn_rate"] == pytest.approx(fn.mean())
    assert summary["expected_q_std"] == pytest.approx(float(np.std(mean_q)))
    assert summary["q_mean"] == pytest.approx(q.mean())
    assert summary["reward_mean"] == pytest.approx(0.0) and summary["reward_count"] == 3
    assert summary["itm_fn_corr"] is None and summary["itm_fn_auc"] is None  # no judge
    # the ITM judge of each pick: its correlation with a false pick, and how often a false pick outscores a true one
    judged = [[0.9, 1.0], [0.2, 0.0], [0.6, 1.0], [0.6, 0.0], [0.1, 0.0], [float("nan"), 1.0]]
    seen = composition_summary(chained, judged=judged)
    kept = judged[:5]
    assert seen["itm_fn_corr"] == pytest.approx(plain_pearson([p for p, _ in kept], [f for _, f in kept]))
    pairs = [(a, b) for a, fa in kept if fa for b, fb in kept if not fb]
    assert seen["itm_fn_auc"] == pytest.approx(
        sum(1.0 if a > b else 0.5 if a == b else 0.0 for a, b in pairs) / len(pairs)
    )
    assert (
        seen["charge_fn_auc"] == seen["itm_fn_auc"]
    )  # (two columns: an older checkpoint, the charge was the probability)
    # a third column: the charge paid (reward_itm_charge: excess), judged the same way and apart from the probability
    charged = composition_summary(
        chained, judged=[[p, f, c] for (p, f), c in zip(judged, (0.1, 0.3, -0.2, 0.4, 0.0, 0.2))]
    )
    assert charged["itm_fn_auc"] == seen["itm_fn_auc"] and charged["charge_fn_auc"] == pytest.approx(1 / 6)
    assert charged["charge_fn_corr"] == pytest.approx(plain_pearson([0.1, 0.3, -0.2, 0.4, 0.0], [f for _, f in kept]))
    # hardness alone as a judge: the pick's similarity to its anchor against the oracle (slots without one left out)
    assert summary["hardness_fn_auc"] is None  # (no similarity column)
    similarity = rng.uniform(-1, 2, n)
    similarity[3] = np.nan
    hard = composition_summary(chained.assign(similarity_to_anchor=similarity))
    keep = ~np.isnan(similarity)
    assert hard["hardness_fn_corr"] == pytest.approx(plain_pearson(list(similarity[keep]), list(fn[keep])))
    pairs = [
        (a, b) for a, fa in zip(similarity[keep], fn[keep]) if fa for b, fb in zip(similarity[keep], fn[keep]) if not fb
    ]
    assert hard["hardness_fn_auc"] == pytest.approx(
        sum(1.0 if a > b else 0.5 if a == b else 0.0 for a, b in pairs) / len(pairs)
    )
    # a fixed q (no Beta): no correlation; no oracle columns: the oracle keys are None
    fixed = chained.assign(q=0.5, alpha=np.nan, beta=np.nan)
    assert composition_summary(fixed)["q_fn_density_corr"] is None
    assert composition_summary(fixed)["chain_fn_rate"] == pytest.approx(fn.mean())
    assert summary["frontier_fn_rate"] is None, "no counterfactual picks: no frontier"
    # the fixed-q frontier on the same slots: each level's FN rate, the curve at the epoch's mean q
    picks = {
        name: (rng.uniform(size=n) < rate).astype(float)
        for name, rate in zip(FIXED_Q_FIELDS, (0.1, 0.15, 0.2, 0.3, 0.5))
    }
    scored = composition_summary(chained.assign(**picks))
    rates = [picks[name].mean() for name in FIXED_Q_FIELDS]
    assert [scored[f"fn_rate_at_{name[6:]}"] for name in FIXED_Q_FIELDS] == pytest.approx(rates)
    low = max(i for i, level in enumerate(FIXED_Q_LEVELS) if level <= q.mean())
    weight = (q.mean() - FIXED_Q_LEVELS[low]) / (FIXED_Q_LEVELS[low + 1] - FIXED_Q_LEVELS[low])
    curve = rates[low] + weight * (rates[low + 1] - rates[low])
    assert scored["frontier_fn_rate"] == pytest.approx(curve)
    assert scored["frontier_gap"] == pytest.approx(fn.mean() - curve)
    blind = chained.assign(anchor_fn_density=np.nan, safe_q=np.nan, chosen_is_fn=np.nan)
    assert composition_summary(blind)["chain_fn_rate"] is None
    assert pearson(np.ones(5), np.arange(5)) is None
    # what more knowledge could reach at the same mean q: per density decile, per anchor, against a brute force
    verdicts = np.stack([picks[name] for name in FIXED_Q_FIELDS], 1)
    decile = np.argsort(np.argsort(density)) * 10 // n
    by_decile = np.stack([verdicts[decile == d].mean(0) for d in range(10)])
    assert scored["best_by_density_fn_rate"] == pytest.approx(brute_best(by_decile, np.full(10, 4), q.mean()))
    assert scored["best_by_anchor_fn_rate"] == pytest.approx(brute_best(verdicts, np.ones(n), q.mean()))
    assert scored["best_by_anchor_fn_rate"] <= scored["best_by_density_fn_rate"] <= scored["frontier_fn_rate"] + 1e-12


def brute_best(rates, weights, q_mean):
    """The lowest FN rate at mean q ``q_mean`` over every mix of per-group fixed-q choices, by another route than
    the code's: the achievable (mean q, rate) set is the weighted Minkowski sum of each group's five points, mixed;
    its lower convex hull, read at ``q_mean``."""
    share = np.asarray(weights, float) / np.sum(weights)
    points = np.zeros((1, 2))
    for row, w in zip(rates, share):  # Minkowski sum of the groups' (q, rate) point sets, pruned to its hull
        candidates = (points[:, None, :] + w * np.stack([FIXED_Q_LEVELS, row], 1)[None]).reshape(-1, 2)
        points = lower_hull(candidates)
    return float(np.interp(q_mean, points[:, 0], points[:, 1]))


def cross(u, v):
    return u[0] * v[1] - u[1] * v[0]


def lower_hull(points):
    points = np.unique(np.round(points, 12), axis=0)  # sorted by q, then rate
    hull = []
    for p in points:
        while len(hull) >= 2 and cross(hull[-1] - hull[-2], p - hull[-2]) <= 0:
            hull.pop()
        hull.append(p)
    return np.array(hull)


def test_the_best_mix_gives_each_group_its_cheap_hardness():
    """Two halves of the anchors: one whose picks are never false, one whose are false at every q above 0. At mean
    q 0.5 the best mix gives the first half q = 1 and the second q = 0: no false pick, where one q for all (0.5) has
    half of them false; with one group it is that group's lower hull."""
    from falcon_cli.sampling.oracle_view import best_mix_fn_rate

    rates = np.array([[0.0, 0, 0, 0, 0], [0.0, 1, 1, 1, 1]])
    assert best_mix_fn_rate(rates, np.array([5, 5]), 0.5) == pytest.approx(0.0)
    # at 0.75 the second half must average q 0.5: half of it at q 1 (false), half at q 0 (true), not all at q 0.5
    assert best_mix_fn_rate(rates, np.array([5, 5]), 0.75) == pytest.approx(0.25)
    assert best_mix_fn_rate(np.array([[0.1, 0.4, 0.45, 0.5, 0.6]]), np.array([1]), 0.25) == pytest.approx(
        0.1 + 0.25 * (0.6 - 0.1) / 1.0
    )  # (0.25, 0.4) lies above the chord from q 0 to q 1: the mix of those two wins
    rng = np.random.default_rng(3)
    for _ in range(20):
        rates, weights, q_mean = rng.uniform(size=(4, 5)), rng.integers(1, 9, 4), rng.uniform()
        assert best_mix_fn_rate(rates, weights, q_mean) == pytest.approx(brute_best(rates, weights, q_mean))
