"""The scheduler's learning options (inputs, per-step credit, baselines, entropy, the α + β cap) and the
bandit harness that shows they can learn (benchmarks/scheduler_bandit.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks import scheduler_bandit as bandit
from falcon_cli.sampling.policy import SchedulerPolicy
from falcon_cli.sampling.quantile import space_tables
from falcon_cli.sampling.scheduler import NegativeScheduler, step_rewards
from falcon_cli.sampling.scheduler_features import SchedulerFeatures


def _space(n: int = 30, dim: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    image = torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=1)
    text = torch.nn.functional.normalize(image + 0.8 * torch.randn(n, dim, generator=g), dim=1)
    return image, text


def test_input_rows_match_a_plain_reference():
    image, text = _space()
    n, m = len(image), 7
    tables = space_tables(
        image[None],
        text[None],
        torch.tensor([n]),
        quantiles=m,
        temperature=0.5,
        features=("softmax", "zscore", "positive", "spread"),
    )
    s = image @ text.T + text @ image.T
    for a in (0, 13, 29):
        row = torch.cat([s[a, :a], s[a, a + 1 :]])
        q = torch.quantile(row, torch.linspace(0, 1, m))
        mean, std = q.mean(), q.std(unbiased=False)
        above = float((row > s[a, a]).sum())
        expected = torch.cat(
            [
                torch.softmax(q / 0.5, 0),
                (q - mean) / std,
                torch.tensor([above / (n - 1), np.log1p(above) / np.log1p(n - 1), (s[a, a] - mean) / std]),
                torch.stack([std, q[-1] - q[0]]),
            ]
        )
        assert torch.allclose(tables.s_hat[0, a], expected.float(), atol=1e-4), a
    assert SchedulerFeatures(["softmax", "zscore", "positive", "spread"], m).dim == tables.s_hat.shape[-1] == 2 * m + 5


def test_paper_input_is_unchanged_by_default():
    image, text = _space()
    default = space_tables(image[None], text[None], torch.tensor([30]), quantiles=9).s_hat[0]
    s = image @ text.T + text @ image.T
    row = torch.cat([s[4, :4], s[4, 5:]])
    assert torch.allclose(default[4], torch.softmax(torch.quantile(row, torch.linspace(0, 1, 9)), 0), atol=1e-6)


def test_bad_feature_names_are_refused():
    with pytest.raises(ValueError, match="distinct names"):
        SchedulerFeatures(["softmax", "shape"])
    from falcon_cli.config.schema import PretrainConfig

    with pytest.raises(ValueError, match="batch_mean needs a per-step"):
        PretrainConfig(reward_baseline="batch_mean")
    with pytest.raises(ValueError, match="cannot credit reward.name=itc\\+itm.*it needs a per-pair reward"):
        PretrainConfig(scheduler_credit="chosen", reward="itc+itm")
    assert PretrainConfig(scheduler_credit="pair", reward="alignment").scheduler.reward.name == "alignment"
    with pytest.raises(ValueError, match="reward.name=positive_margin, which can be credited by chosen or levels"):
        PretrainConfig(scheduler_credit="pair", reward="positive_margin")
    assert PretrainConfig(scheduler_credit="chosen", reward="positive_margin").scheduler.reward.overshoot == 1.0


def test_positive_margin_rewards_match_a_plain_loop():
    """Slot k's pick, chosen for the anchor in slot k − 1: its unified similarity to the anchor, charged
    (1 + overshoot) times for what exceeds the anchor's own pair; slot 0 scores 0."""
    from falcon_cli.sampling.scheduler import positive_margin_rewards

    torch.manual_seed(0)
    image = torch.nn.functional.normalize(torch.randn(9, 16), dim=-1)
    text = torch.nn.functional.normalize(image + 0.8 * torch.randn(9, 16), dim=-1)
    image[4] = text[4] = image[
        3
    ]  # slot 4 shows slot 3's image, and says exactly what it shows: above anchor 3's own pair
    for overshoot, margin in [(0.0, 0.0), (1.0, 0.0), (3.0, 0.0), (1.0, 0.4)]:
        got = positive_margin_rewards(image, text, overshoot, margin)
        want = [0.0]
        for k in range(1, 9):
            s = float(image[k - 1] @ text[k] + text[k - 1] @ image[k])
            own = float(2 * image[k - 1] @ text[k - 1]) - margin
            want.append(s if s <= own else own - overshoot * (s - own))
        assert got.tolist() == pytest.approx(want, abs=1e-5)
    above = positive_margin_rewards(image, text, 1.0)[4]
    assert above < float(image[3] @ text[4] + text[3] @ image[4]) - 1e-3  # the false negative was charged
    assert positive_margin_rewards(image[:1], text[:1]).tolist() == [0.0]


def test_excess_over_hardness_is_the_residual_of_a_least_squares_line():
    """``reward_itm_charge: excess``: each pick's match probability less the line of probability on hardness fitted
    through the batch's picks (numpy's polyfit as the reference); slot 0 has no pick; the charge is orthogonal
    to hardness (it does not price hardness again) and keeps what the line cannot explain."""
    from falcon_cli.sampling.scheduler import chain_hardness, excess_over_hardness, positive_margin_rewards

    g = torch.Generator().manual_seed(3)
    image = torch.nn.functional.normalize(torch.randn(12, 8, generator=g), dim=-1)
    text = torch.nn.functional.normalize(torch.randn(12, 8, generator=g), dim=-1)
    hardness, own = chain_hardness(image, text)
    for k in range(1, 12):
        assert hardness[k].item() == pytest.approx(float(image[k - 1] @ text[k] + text[k - 1] @ image[k]), abs=1e-6)
        assert own[k].item() == pytest.approx(2 * float(image[k - 1] @ text[k - 1]), abs=1e-6)
    assert hardness[0] == own[0] == 0
    assert torch.allclose(positive_margin_rewards(image, text, 1.0, -10.0)[1:], hardness[1:])  # (never charged)
    match = torch.rand(12, generator=g)
    excess = excess_over_hardness(match, hardness)
    x, y = hardness[1:].double().numpy(), match[1:].double().numpy()
    slope, intercept = np.polyfit(x, y, 1)
    np.testing.assert_allclose(excess[1:].numpy(), y - (slope * x + intercept), atol=1e-5)
    assert excess[0] == 0 and abs(float(excess[1:] @ (hardness[1:] - hardness[1:].mean()))) < 1e-4
    # a probability that is a line of hardness is charged nothing; one pick above the line is charged most
    lifted = 0.3 + 0.2 * hardness
    lifted[5] += 0.25
    charged = excess_over_hardness(lifted, hardness)
    assert int(charged.argmax()) == 5 and charged[1:].abs().sum() < 0.25 * 2 + 1e-5
    assert excess_over_hardness(0.3 + 0.2 * hardness, hardness).abs().max() < 1e-5
    # one hardness for every pick: no slope, the charge is the probability less its mean
    flat = excess_over_hardness(match, torch.ones(12))
    np.testing.assert_allclose(flat[1:].numpy(), (match[1:] - match[1:].mean()).numpy(), atol=1e-6)
    assert excess_over_hardness(match[:1], hardness[:1]).tolist() == [0.0]


def test_expected_worth_stops_paying_for_hardness_where_the_judge_starts_charging():
    """``reward_itm_charge: expected``: (1 - p)·margin - w·p per pick; a pick the judge is sure of is worth -w at
    any hardness, one it calls a true negative its whole margin; between, harder picks pay less the more the judge
    believes them; slot 0 has no pick."""
    from falcon_cli.sampling.scheduler import expected_worth

    margin = torch.tensor([0.7, -0.5, 0.2, 1.5, 1.5, 1.5])
    match = torch.tensor([0.9, 0.0, 1.0, 0.0, 0.5, 1.0])
    worth = expected_worth(margin, match, 2.0)
    np.testing.assert_allclose(worth.numpy(), [0.0, -0.5, -2.0, 1.5, 0.5 * 1.5 - 1.0, -2.0], atol=1e-6)
    # the hardness a pick pays for shrinks with the judge's belief: d worth / d margin = 1 - p
    harder = expected_worth(margin + 0.4, match, 2.0)
    np.testing.assert_allclose((harder - worth)[1:].numpy(), 0.4 * (1 - match[1:]).numpy(), atol=1e-6)
    assert expected_worth(margin[:1], match[:1], 2.0).tolist() == [0.0]


def test_chain_pairs_and_pick_match_fold_both_directions_back_to_the_pick():
    """Slot k's pick is judged with its anchor in slot k − 1 both ways (anchor image with pick caption, pick image
    with anchor caption); its per-slot match probability is the mean of the two; slot 0 has no pick."""
    from falcon_cli.sampling.scheduler import chain_pairs, pick_match

    image_index, text_index = chain_pairs(4)
    assert list(zip(image_index.tolist(), text_index.tolist())) == [(0, 1), (1, 2), (2, 3), (1, 0), (2, 1), (3, 2)]
    judged = {pair: 0.1 * (i + 1) for i, pair in enumerate(zip(image_index.tolist(), text_index.tolist()))}
    got = pick_match(torch.tensor(list(judged.values())), 4)
    want = [0.0] + [(judged[(k - 1, k)] + judged[(k, k - 1)]) / 2 for k in range(1, 4)]
    assert got.tolist() == pytest.approx(want)
    assert chain_pairs(1)[0].numel() == 0 and pick_match(torch.zeros(0), 1).tolist() == [0.0]


def test_the_itm_charged_margin_needs_an_itm_head_and_per_pick_credit():
    from falcon_cli.config.schema import PretrainConfig

    assert PretrainConfig(scheduler_credit="chosen", reward="positive_margin+itm").scheduler.reward.itm_weight == 2.0
    with pytest.raises(ValueError, match=r"reward.name=positive_margin\+itm, which can be credited by chosen \("):
        PretrainConfig(scheduler_credit="pair", reward="positive_margin+itm")
    with pytest.raises(ValueError, match="no ITM head to judge a pick: positive_margin stands in"):
        PretrainConfig(
            model="dual-tiny-clip", composer="falcon", scheduler_credit="chosen", reward="positive_margin+itm"
        )
    # the oracle needs no head: every framework takes it (the shapes world is checked when the run starts)
    for model, extra in (("dual-tiny-clip", {"caption_weight": 0}), ("albef-tiny", {}), ("blip2-tiny", {})):
        assert (
            PretrainConfig(
                model=model, composer="falcon", scheduler_credit="chosen", reward="positive_margin+oracle", **extra
            ).scheduler.reward.name
            == "positive_margin+oracle"
        )
    with pytest.raises(ValueError, match=r"reward.name=positive_margin\+oracle, which can be credited by chosen or"):
        PretrainConfig(scheduler_credit="pair", reward="positive_margin+oracle")


def test_step_rewards_give_each_q_the_right_caption():
    per_slot = torch.tensor([1.0, 2.0, 4.0, 8.0])  # slot t+1 was chosen by step t's q, drawn for slot t
    assert step_rewards(per_slot, 3, "anchor").tolist() == [1, 2, 4]
    assert step_rewards(per_slot, 3, "chosen").tolist() == [2, 4, 8]
    assert step_rewards(per_slot, 3, "pair").tolist() == [1.5, 3, 6]
    assert step_rewards(per_slot, 3, "batch").tolist() == [3.75] * 3
    assert step_rewards(per_slot[:2], 3, "chosen").tolist() == [2, 0, 0], "steps a short batch did not take get 0"


def test_leave_one_out_baseline_and_normalisation():
    scheduler = NegativeScheduler(quantiles=4, hidden=8, credit="anchor", baseline="batch_mean")
    advantage = scheduler.advantages(torch.tensor([1.0, 2.0, 6.0]))
    assert torch.allclose(advantage, torch.tensor([1 - 4.0, 2 - 3.5, 6 - 1.5], dtype=torch.float64))
    normed = NegativeScheduler(quantiles=4, hidden=8, credit="anchor", baseline="batch_mean", normalize=True)
    out = normed.advantages(torch.tensor([1.0, 2.0, 6.0]))
    assert torch.allclose(out, advantage / advantage.pow(2).mean().sqrt())  # first update: its own RMS
    with pytest.raises(ValueError, match="per-step credit"):
        NegativeScheduler(quantiles=4, baseline="batch_mean")


def test_concentration_cap_keeps_the_mean():
    torch.manual_seed(0)
    free, capped = SchedulerPolicy(quantiles=5, hidden=8), SchedulerPolicy(quantiles=5, hidden=8, max_concentration=3.0)
    capped.load_state_dict(free.state_dict())
    with torch.no_grad():
        for p in (free.head.weight, capped.head.weight):
            p.copy_(torch.linspace(-3, 3, p.numel()).view_as(p))
        free.head.bias.fill_(4.0)
        capped.head.bias.fill_(4.0)
    x = torch.randn(6, 5)
    (a, b), (ca, cb) = free(x), capped(x)
    assert ((a + b) > 3).all() and torch.allclose(ca + cb, torch.full_like(ca, 3.0))
    assert torch.allclose(ca / (ca + cb), a / (a + b), atol=1e-6)


def test_entropy_bonus_keeps_the_beta_wider():
    """The same rewards sharpen the Beta less with an entropy bonus."""

    def concentration(entropy: float) -> float:
        torch.manual_seed(0)
        rng = np.random.default_rng(0)
        scheduler = NegativeScheduler(quantiles=3, hidden=16, lr=1e-2, credit="anchor", entropy=entropy)
        x = torch.randn(31, 3)
        for _ in range(60):
            a, b = scheduler.alpha_beta(x)
            q = torch.from_numpy(rng.beta(a.double().numpy(), b.double().numpy()))
            r = -((q - 0.5) ** 2)
            scheduler.update({"s_hat": x, "q": q}, torch.cat([r, r[-1:]]))
        a, b = scheduler.alpha_beta(x)
        return float((a + b).mean())

    assert concentration(0.1) < 0.8 * concentration(0.0)


def test_safe_quantile_matches_a_walk_over_the_sorted_row():
    image, text = _space(20)
    tables = space_tables(image[None], text[None], torch.tensor([20]), quantiles=5)
    g = torch.Generator().manual_seed(1)
    fn = torch.rand(20, 20, generator=g) < 0.3
    fn = (fn | fn.T) & ~torch.eye(20, dtype=torch.bool)
    got = bandit.safe_quantile(tables.order[0], fn, 20)
    s = image @ text.T + text @ image.T
    for a in range(20):
        candidates = sorted((j for j in range(20) if j != a), key=lambda j: (float(s[a, j]), -j))  # ascending
        safe = [i for i, j in enumerate(candidates) if not fn[a, j]]
        assert got[a].item() == pytest.approx(safe[-1] / 18 if safe else float("nan"), nan_ok=True)


def test_the_improved_scheduler_learns_the_noise_free_bandit_and_the_papers_does_not():
    """The harness's known optimum on the synthetic concept world: within 600 updates the improved
    scheduler's E[q] tracks q* on held-out anchors; the paper's (one reward per batch) stays far from it."""
    plus, paper = bandit.SETTINGS["plus"], bandit.SETTINGS["paper"]
    anchors = bandit.synthetic_anchors([(plus.features, 1.0), (paper.features, 1.0)])
    assert bandit.supervised_ceiling(anchors, (plus.features, 1.0)) > 0.8, "the input carries the optimum"
    learned = bandit.run_bandit(anchors, plus, updates=600, batch=32, noise=0.0, common=3.0, every=600)[-1]
    assert learned["corr"] > 0.8 and learned["r2"] > 0.5, learned
    assert learned["concentration"] <= 50 + 1e-3
    baseline = bandit.run_bandit(anchors, paper, updates=600, batch=32, noise=0.0, common=3.0, every=600)[-1]
    assert baseline["r2"] < 0.2, baseline


@pytest.mark.parametrize("charge", ["absolute", "expected"])
def test_falcon_step_charges_the_oracle_verdict_with_no_pass_of_the_model(charge):
    """``reward: positive_margin+oracle``: the judge is the batch's oracle verdict on each pick (``chosen_is_fn``),
    so the model is never asked (the objective here has no ``match_probability``); with ``expected`` a true pick
    is worth its margin and a false one ``-reward_itm_weight``, whatever its hardness. A chained slot without a
    verdict is an error, not a silent zero."""
    from types import SimpleNamespace

    from falcon_cli.config.schema import PretrainConfig
    from falcon_cli.errors import FalconError
    from falcon_cli.methods.positive_margin import oracle_match
    from falcon_cli.sampling.falcon_step import FalconStep
    from falcon_cli.sampling.scheduler import positive_margin_rewards

    b, g = 6, torch.Generator().manual_seed(2)
    image = torch.nn.functional.normalize(torch.randn(b, 8, generator=g), dim=-1)
    text = torch.nn.functional.normalize(torch.randn(b, 8, generator=g), dim=-1)
    p = PretrainConfig(
        scheduler_credit="chosen",
        reward="positive_margin+oracle",
        reward_margin=0.5,
        reward_itm_weight=3.0,
        reward_itm_charge=charge,
    )
    scheduler = NegativeScheduler(quantiles=4, hidden=8, blocks=1, reward="positive_margin+oracle", credit="chosen")
    step = FalconStep(scheduler, p.scheduler, "fp32", torch.device("cpu"))
    fn = torch.tensor([float("nan"), 1, 0, 0, 1, 0])
    record = {"s_hat": torch.rand(b - 1, 4, generator=g), "q": torch.rand(b - 1, generator=g)}
    out = SimpleNamespace(image_feat=image, text_feat=text)
    inputs = (None, torch.zeros(b, 3, dtype=torch.long), torch.ones(b, 3, dtype=torch.long))
    step.after(SimpleNamespace(), out, {}, inputs, None, SimpleNamespace(chosen_is_fn=fn), record)
    margin = positive_margin_rewards(image, text, 1.0, 0.5)[1:]
    false = fn[1:].bool()
    expected = (
        torch.where(false, torch.full_like(margin, -3.0), margin) if charge == "expected" else margin - 3.0 * fn[1:]
    )
    np.testing.assert_allclose([r for r, _ in step.credited], expected.numpy(), atol=1e-5)
    assert [row[:2] for row in step.judged] == [[f, f] for f in fn[1:].tolist()]  # the judge is the truth itself
    assert oracle_match(SimpleNamespace(chosen_is_fn=fn), torch.device("cpu")).tolist() == [0, 1, 0, 0, 1, 0]
    with pytest.raises(FalconError, match="no oracle verdict"):
        oracle_match(SimpleNamespace(chosen_is_fn=torch.full((b,), float("nan"))), torch.device("cpu"))


@pytest.mark.parametrize("charge", ["absolute", "excess", "expected"])
def test_falcon_step_charges_the_itm_judgement_it_is_configured_for(charge):
    """``FalconStep`` with ``reward: positive_margin+itm``: each pick's reward is the positive margin less
    ``reward_itm_weight`` times the charge (the judge's probability, or its excess over hardness), the scheduler is
    credited with it per pick, and the epoch's ``judged`` record keeps [probability, false negative, charge]."""
    from types import SimpleNamespace

    from falcon_cli.config.schema import PretrainConfig
    from falcon_cli.sampling.falcon_step import FalconStep
    from falcon_cli.sampling.scheduler import (
        chain_hardness,
        chain_pairs,
        excess_over_hardness,
        pick_match,
        positive_margin_rewards,
    )

    b, g = 6, torch.Generator().manual_seed(1)
    image = torch.nn.functional.normalize(torch.randn(b, 8, generator=g), dim=-1)
    text = torch.nn.functional.normalize(torch.randn(b, 8, generator=g), dim=-1)
    pair_probability = torch.rand(2 * (b - 1), generator=g)

    class Judge:  # the objective's side FalconStep reaches: eval/train and the ITM head's judgement of pairs
        def eval(self):
            self.mode = "eval"

        def train(self):
            self.mode = "train"

        def match_probability(self, out, input_ids, attention_mask, image_index, text_index):
            assert self.mode == "eval"  # the head judges without dropout
            expected = chain_pairs(b)
            assert torch.equal(image_index, expected[0]) and torch.equal(text_index, expected[1])
            return pair_probability

    p = PretrainConfig(
        scheduler_credit="chosen",
        reward="positive_margin+itm",
        reward_margin=0.5,
        reward_itm_weight=3.0,
        reward_itm_charge=charge,
        reward_baseline="batch_mean",
    )
    scheduler = NegativeScheduler(
        quantiles=4, hidden=8, blocks=1, reward="positive_margin+itm", credit="chosen", baseline="batch_mean"
    )
    step = FalconStep(scheduler, p.scheduler, "fp32", torch.device("cpu"))
    fn = torch.tensor([float("nan"), 1, 0, 0, 1, 0])
    record = {"s_hat": torch.rand(b - 1, 4, generator=g), "q": torch.rand(b - 1, generator=g)}
    out = SimpleNamespace(image_feat=image, text_feat=text)
    inputs = (None, torch.zeros(b, 3, dtype=torch.long), torch.ones(b, 3, dtype=torch.long))
    judge = Judge()
    step.after(judge, out, {}, inputs, None, SimpleNamespace(chosen_is_fn=fn), record)
    match = pick_match(pair_probability, b)
    margin = positive_margin_rewards(image, text, 1.0, 0.5)
    if charge == "expected":  # written out: worth the margin when a true negative (1 - p), -3 when a match (p)
        expected = torch.tensor(
            [0.0] + [(1 - match[k].item()) * margin[k].item() - 3.0 * match[k].item() for k in range(1, b)]
        )
        paid = (margin - expected) / 3.0
    else:
        paid = match if charge == "absolute" else excess_over_hardness(match, chain_hardness(image, text)[0])
        expected = margin - 3.0 * paid
    assert judge.mode == "train"
    np.testing.assert_allclose([r for r, _ in step.credited], expected[1:].numpy(), atol=1e-5)
    np.testing.assert_allclose(np.array(step.judged)[:, [0, 2]], torch.stack([match, paid], 1)[1:].numpy(), atol=1e-6)
    assert [f for _, f, _ in step.judged] == fn[1:].tolist()


def test_level_weights_are_the_beta_density_on_the_grid_normalised():
    from falcon_cli.sampling.scheduler import level_grid, level_weights

    grid = torch.from_numpy(level_grid(4))
    assert grid.tolist() == [0.125, 0.375, 0.625, 0.875]
    with pytest.raises(ValueError, match="at least 2"):
        level_grid(1)
    alpha, beta = torch.tensor([2.0, 0.7]), torch.tensor([5.0, 0.7])
    weights = level_weights(alpha, beta, grid)
    for i in range(2):
        density = torch.distributions.Beta(alpha[i].double(), beta[i].double()).log_prob(grid).exp()
        torch.testing.assert_close(weights[i].double(), density / density.sum(), rtol=1e-5, atol=1e-6)


def test_level_credit_moves_each_anchors_beta_toward_its_best_level():
    """Two kinds of anchor whose rewards peak at opposite ends of the grid (the same for every level of the other
    kind plus a shift the batch shares, which the within-anchor mean removes): 150 updates of ``credit: levels`` put
    the first kind's mean q low and the second's high, and scale-free (a reward 1000x larger learns the same)."""
    rows = torch.cat([torch.eye(4)[:1].repeat(8, 1), torch.eye(4)[1:2].repeat(8, 1)])
    means = []
    for scale in (1.0, 1000.0):
        torch.manual_seed(0)
        scheduler = NegativeScheduler(
            quantiles=4, hidden=16, blocks=1, lr=1e-2, credit="levels", levels=5, normalize=True
        )
        grid = scheduler.grid.double()
        best = torch.cat([torch.full((8,), 0.1), torch.full((8,), 0.9)]).double()
        for step in range(150):
            level = scale * (-(grid[None] - best[:, None]).abs() + 3.0 * np.sin(step))
            update = scheduler.update({"s_hat": rows, "q": torch.full((16,), 0.5)}, level)
        alpha, beta = scheduler.alpha_beta(rows)
        mean = alpha / (alpha + beta)
        assert float(mean[:8].max()) < 0.25 and float(mean[8:].min()) > 0.75, mean
        assert update["rewards"].shape == (16,)
        means.append(mean)
    torch.testing.assert_close(means[0], means[1], atol=0.02, rtol=0)
    with pytest.raises(ValueError, match="own baseline"):
        NegativeScheduler(quantiles=4, credit="levels", baseline="ema")
    with pytest.raises(ValueError, match="finite reward per used step and level"):
        scheduler.update({"s_hat": rows, "q": torch.full((16,), 0.5)}, torch.zeros(16, 3))


def test_level_credit_learns_the_noise_free_bandit():
    """The harness's known optimum: ``credit: levels`` (every anchor's reward known on the grid) tracks q* on
    held-out anchors within 400 updates, as the per-caption REINFORCE scheduler does without noise."""
    setting = bandit.SETTINGS["levels"]
    anchors = bandit.synthetic_anchors([(setting.features, 1.0)])
    learned = bandit.run_bandit(anchors, setting, updates=400, batch=32, noise=0.0, common=3.0, every=400, hidden=64)[
        -1
    ]
    assert learned["corr"] > 0.8 and learned["r2"] > 0.5, learned


def test_level_credit_needs_a_reward_it_can_score_on_the_grid():
    from falcon_cli.config.schema import PretrainConfig

    ok = PretrainConfig(scheduler_credit="levels", reward="positive_margin")
    assert ok.scheduler.update.levels == 10
    assert (
        PretrainConfig(
            scheduler_credit="levels", reward="positive_margin+oracle", reward_itm_charge="expected"
        ).scheduler.update.credit
        == "levels"
    )
    for bad, match in [
        ({"reward": "positive_margin+itm"}, "forward of every level's pick"),
        ({"reward": "mlm"}, "rewards it can credit: positive_margin, positive_margin\\+oracle \\["),
        ({"reward": "positive_margin", "reward_baseline": "batch_mean"}, "its own baseline"),
        ({"reward": "positive_margin+oracle", "reward_itm_charge": "excess"}, "not a grid's"),
        ({"reward": "positive_margin", "scheduler_levels": 1}, "greater than or equal to 2"),
    ]:
        with pytest.raises(ValueError, match=match):
            PretrainConfig(scheduler_credit="levels", **bad)


@pytest.mark.parametrize("reward", ["positive_margin", "positive_margin+oracle"])
def test_falcon_step_scores_every_level_and_credits_the_pick_with_its_own_reward(reward):
    """``scheduler_credit: levels``: the scheduler learns from the grid's rewards (the margin of each level's pick
    from the record, charged by the oracle where it judges), written out here; the epoch's ``credited`` record
    keeps what each step's own pick earned in the forward, so ``reward_fn_corr`` means what it means elsewhere."""
    from types import SimpleNamespace

    from falcon_cli.config.schema import PretrainConfig
    from falcon_cli.errors import FalconError
    from falcon_cli.registry import REWARDS
    from falcon_cli.sampling.falcon_step import FalconStep
    from falcon_cli.sampling.scheduler import positive_margin_rewards

    b, levels, g = 6, 3, torch.Generator().manual_seed(3)
    image = torch.nn.functional.normalize(torch.randn(b, 8, generator=g), dim=-1)
    text = torch.nn.functional.normalize(torch.randn(b, 8, generator=g), dim=-1)
    p = PretrainConfig(
        scheduler_credit="levels",
        reward=reward,
        reward_margin=0.5,
        reward_itm_weight=2.0,
        reward_itm_charge="expected",
        scheduler_levels=levels,
    )
    scheduler = NegativeScheduler(quantiles=4, hidden=8, blocks=1, reward=reward, credit="levels", levels=levels)
    step = FalconStep(scheduler, p.scheduler, "fp32", torch.device("cpu"))
    hardness = torch.rand(b - 1, levels, generator=g) * 4 - 2
    own = torch.rand(b - 1, generator=g) * 2
    verdict = (torch.rand(b - 1, levels, generator=g) < 0.4).double()
    record = {
        "s_hat": torch.rand(b - 1, 4, generator=g),
        "q": torch.rand(b - 1, generator=g).double(),
        "level_hardness": hardness,
        "level_own": own,
        "level_fn": verdict,
    }
    record["q"][-1] = float("nan")  # a step the batch did not take
    for name in ("level_hardness", "level_fn"):
        record[name][-1] = float("nan")
    record["level_own"][-1] = float("nan")
    got = REWARDS.get(reward).score_levels(record, p.scheduler.reward, scheduler.grid)
    for t in range(b - 2):
        for k in range(levels):
            s, line = float(hardness[t, k]), float(own[t]) - 0.5
            margin = s if s <= line else line - (s - line)
            want = (-2.0 if verdict[t, k] else margin) if reward.endswith("oracle") else margin
            assert float(got[t, k]) == pytest.approx(want, abs=1e-5)
    assert torch.isnan(got[-1]).all()
    fn = torch.tensor([float("nan"), 1, 0, 0, 1, 0])
    before = [q.detach().clone() for q in scheduler.policy.parameters()]
    step.after(
        SimpleNamespace(),
        SimpleNamespace(image_feat=image, text_feat=text),
        {},
        (None, torch.zeros(b, 3, dtype=torch.long), torch.ones(b, 3, dtype=torch.long)),
        None,
        SimpleNamespace(chosen_is_fn=fn),
        record,
    )
    assert any(not torch.equal(x, y) for x, y in zip(before, scheduler.policy.parameters()))
    own_pick = positive_margin_rewards(image, text, 1.0, 0.5)[1 : b - 1]
    if reward.endswith("oracle"):
        own_pick = torch.where(fn[1 : b - 1].bool(), torch.full_like(own_pick, -2.0), own_pick)
    np.testing.assert_allclose([r for r, _ in step.credited], own_pick.numpy(), atol=1e-5)
    if reward.endswith("oracle"):
        record["level_fn"] = torch.full_like(verdict, float("nan"))
        with pytest.raises(FalconError, match="no oracle verdict"):
            REWARDS.get(reward).score_levels(record, p.scheduler.reward, scheduler.grid)


def test_rank_hardness_pays_each_pick_its_rank_until_the_judge_charges_it():
    """``reward_hardness: rank``: a true pick is worth its rank among its anchor's candidates (the batch's
    ``quantile_rank``; on the grid, each level's q), a false one ``-reward_itm_weight`` (``expected``), whatever the
    similarities; without a judge the option is refused (a rank alone pays for harder without end)."""
    from types import SimpleNamespace

    from falcon_cli.config.schema import PretrainConfig
    from falcon_cli.registry import REWARDS
    from falcon_cli.sampling.falcon_step import FalconStep

    with pytest.raises(ValueError, match="needs a judged reward \\(positive_margin\\+itm or positive_margin\\+oracle"):
        PretrainConfig(scheduler_credit="chosen", reward="positive_margin", reward_hardness="rank")
    b, g = 5, torch.Generator().manual_seed(4)
    image = torch.nn.functional.normalize(torch.randn(b, 8, generator=g), dim=-1)
    text = torch.nn.functional.normalize(torch.randn(b, 8, generator=g), dim=-1)
    p = PretrainConfig(
        scheduler_credit="chosen",
        reward="positive_margin+oracle",
        reward_hardness="rank",
        reward_itm_charge="expected",
        reward_itm_weight=1.0,
    )
    step = FalconStep(
        NegativeScheduler(quantiles=4, hidden=8, blocks=1, reward=p.scheduler.reward.name, credit="chosen"),
        p.scheduler,
        "fp32",
        torch.device("cpu"),
    )
    fn = torch.tensor([float("nan"), 0, 1, 0, 0])
    rank = torch.tensor([float("nan"), 0.25, 0.9, 1.0, 0.0])
    record = {"s_hat": torch.rand(b - 1, 4, generator=g), "q": torch.rand(b - 1, generator=g)}
    step.after(
        SimpleNamespace(),
        SimpleNamespace(image_feat=image, text_feat=text),
        {},
        (None, torch.zeros(b, 3, dtype=torch.long), torch.ones(b, 3, dtype=torch.long)),
        None,
        SimpleNamespace(chosen_is_fn=fn, quantile_rank=rank),
        record,
    )
    assert [r for r, _ in step.credited] == pytest.approx([0.25, -1.0, 1.0, 0.0])
    grid = torch.tensor([0.25, 0.75])
    levels = {
        "level_hardness": torch.tensor([[5.0, -5.0], [float("nan")] * 2]),
        "level_own": torch.tensor([0.0, float("nan")]),
        "level_fn": torch.tensor([[0.0, 1.0], [float("nan")] * 2]),
    }
    got = REWARDS.get("positive_margin+oracle").score_levels(levels, p.scheduler.reward, grid)
    assert got[0].tolist() == [0.25, -1.0] and torch.isnan(got[1]).all()
