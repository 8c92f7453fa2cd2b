"""FalconFeed: FALCON's on-demand batch sampler, its lag settings and its checkpointed look-ahead."""

from __future__ import annotations

import pytest
import torch

from falcon_cli.sampling.cache import EmbeddingCache
from falcon_cli.sampling.feed import FalconFeed, loader_settings
from falcon_cli.sampling.quantile import QuantileSpaces


@pytest.mark.parametrize(
    "lag, workers, expected",
    [
        (0, 4, {"num_workers": 0}),
        (1, 4, {"num_workers": 1, "prefetch_factor": 1}),
        (2, 2, {"num_workers": 2, "prefetch_factor": 1}),
        (3, 2, {"num_workers": 1, "prefetch_factor": 3}),
        (4, 2, {"num_workers": 2, "prefetch_factor": 2}),
        (2, 0, {"num_workers": 1, "prefetch_factor": 2}),
    ],
)
def test_loader_settings_prefetch_exactly_lag_batches(lag, workers, expected):
    settings = loader_settings(lag, workers)
    assert settings == expected
    assert settings.get("num_workers", 0) * settings.get("prefetch_factor", 0) == lag


def make_feed(ahead=None, start=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.arange(30)
    cache = EmbeddingCache(ids, dim=4, dtype=torch.float32)
    cache.update(ids, *torch.nn.functional.normalize(torch.randn(2, 30, 4, generator=g), dim=-1))
    spaces = QuantileSpaces(ids, cache, search_space_size=15, batch_size=4, generator=g)
    composed = []
    feed = FalconFeed(
        spaces,
        0.5,
        lambda pair_id: 100 + pair_id,
        g,
        lambda i, b: composed.append(i),
        start=start,
        stop=len(spaces),
        ahead=ahead,
    )
    return feed, spaces, composed, g


def test_feed_composes_on_demand_and_hands_batches_back_in_order():
    feed, spaces, composed, _ = make_feed()
    it = iter(feed)
    first, second = next(it), next(it)
    assert composed == [0, 1], "two batches composed: only as many as were asked for"
    batch, record = feed.take(torch.tensor(first) - 100)
    assert batch.pair_ids.tolist() == [i - 100 for i in first] and set(record) == {"s_hat", "q"}
    with pytest.raises(RuntimeError, match="order"):
        feed.take(torch.tensor(first) - 100)  # the oldest pending is now the second batch
    rest = list(it)
    assert len(rest) + 2 == len(feed) == 8
    assert sorted(i for b in [first, second, *rest] for i in b) == list(range(100, 130))


def test_ahead_state_resumes_with_the_same_batches():
    feed, spaces, _, g = make_feed(seed=3)
    it = iter(feed)
    trained = next(it)
    feed.take(torch.tensor(trained) - 100)
    ahead_batches = [next(it), next(it)]  # composed ahead, not trained: the checkpoint keeps them
    state, spaces_state, g_state = feed.ahead_state(), spaces.state_dict(), g.get_state()
    expected = list(it)

    resumed, spaces2, composed, g2 = make_feed(ahead=state, start=1, seed=3)
    spaces2.load_state_dict(spaces_state)
    g2.set_state(g_state)
    got = list(resumed)
    assert got == ahead_batches + expected
    assert composed == list(range(3, 8)), "the restored batches are not composed (or logged) again"
