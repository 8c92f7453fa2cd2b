"""Issue 70's candidate changes, each against a plain reference: where the scheduler starts (``scheduler.init_q``) and
the per-pick ITM progress reward (``reward: itm_progress``); each refused in one line where it cannot run."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from falcon_cli.config.schema import PretrainConfig
from falcon_cli.registry import REWARDS, PickScoring
from falcon_cli.sampling.policy import SchedulerPolicy
from falcon_cli.sampling.scheduler import NegativeScheduler


@pytest.mark.parametrize("init_q", [0.05, 0.5, 0.9, 0.99])
def test_init_q_starts_every_anchor_at_that_mean_with_the_papers_concentration(init_q):
    rows = torch.randn(7, 12)
    paper_alpha, paper_beta = SchedulerPolicy(quantiles=12, hidden=8)(rows)
    alpha, beta = SchedulerPolicy(quantiles=12, hidden=8, init_q=init_q)(rows)
    assert torch.allclose(alpha / (alpha + beta), torch.full((7,), init_q), atol=1e-6)
    assert torch.allclose(alpha + beta, paper_alpha + paper_beta, atol=1e-5)
    total = 2 * (math.log1p(math.exp(0.5)) + 1e-5)  # the paper's start: softplus(0.5) + eps each, mean 0.5
    assert float(paper_alpha[0]) == pytest.approx(total / 2) and float(paper_beta[0]) == pytest.approx(total / 2)
    scheduler = NegativeScheduler(quantiles=12, hidden=8, init_q=init_q)
    alpha, beta = scheduler.alpha_beta(rows)
    assert torch.allclose(alpha / (alpha + beta), torch.full((7,), init_q), atol=1e-6)


def test_without_init_q_the_policy_is_the_papers_bit_for_bit():
    torch.manual_seed(0)
    plain = SchedulerPolicy(quantiles=5, hidden=4)
    torch.manual_seed(0)
    unset = SchedulerPolicy(quantiles=5, hidden=4, init_q=None)
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), unset.state_dict().values()))


def test_init_q_and_itm_progress_are_refused_where_they_cannot_run():
    falcon = {"composer": {"name": "falcon"}}
    assert PretrainConfig(**falcon, scheduler={"init_q": 0.9}).scheduler.init_q == 0.9
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="init_q"):
            PretrainConfig(**falcon, scheduler={"init_q": bad})
    with pytest.raises(ValueError, match="scheduler.init_q=0.9 is a setting of FALCON's scheduler"):
        PretrainConfig(composer={"name": "grit"}, scheduler={"init_q": 0.9})
    itm_progress = {"reward": {"name": "itm_progress"}, "update": {"credit": "chosen"}}
    assert PretrainConfig(**falcon, scheduler=itm_progress).scheduler.reward.name == "itm_progress"
    with pytest.raises(ValueError, match="scheduler.reward.name=itm_progress is a setting of FALCON's scheduler"):
        PretrainConfig(composer={"name": "grit"}, scheduler=itm_progress)
    with pytest.raises(ValueError, match="it has no ITM head"):
        PretrainConfig(model="dual-tiny-clip", **falcon, scheduler=itm_progress)
    with pytest.raises(ValueError, match="cannot credit reward.name=itm_progress"):
        PretrainConfig(**falcon, scheduler={"reward": {"name": "itm_progress"}})


class ToyJudge:
    """An objective's side the reward reaches: image tokens are the images, and a pair's ITM match probability is
    sigmoid(w · image + 0.1 · (caption's token sum)); ``w`` is the 'model' an update changes."""

    def __init__(self, w: torch.Tensor):
        self.w, self.modes = w, []
        self.model = SimpleNamespace(encode_image=lambda images: (images * 1.0, None))

    def eval(self):
        self.modes.append("eval")

    def train(self):
        self.modes.append("train")

    def match_probability(self, state, input_ids, attention_mask, image_index, text_index):
        assert self.modes[-1] == "eval", "judged in eval mode"
        logit = state.image_tokens[image_index] @ self.w + 0.1 * input_ids[text_index].float().sum(-1)
        return torch.sigmoid(logit)


def plain_itm_loss(w, images, captions, pick):
    """The reference: the ITM loss of pick (slot k) as its anchor's (slot k − 1) negative, both directions, plus the
    anchor's own pair's, written out."""

    def p(i, t):
        return torch.sigmoid(images[i] @ w + 0.1 * captions[t].float().sum()).clamp(1e-6, 1 - 1e-6)

    a = pick - 1
    negative = (-torch.log(1 - p(a, pick)) - torch.log(1 - p(pick, a))) / 2
    return float(negative - torch.log(p(a, a)))


@pytest.mark.parametrize("images_setting", ["recompute", "reuse"])
def test_itm_progress_pays_each_pick_the_fall_of_its_itm_losses_over_the_update(images_setting):
    g = torch.Generator().manual_seed(0)
    b, d = 6, 4
    images, captions = torch.randn(b, d, generator=g), torch.randint(0, 5, (b, 3), generator=g)
    w_before, w_after = torch.randn(d, generator=g), torch.randn(d, generator=g)
    settings = SimpleNamespace(images=images_setting)
    reward = REWARDS.get("itm_progress")
    judge = ToyJudge(w_before)
    inputs = (images, captions, torch.ones_like(captions))
    prepared = reward.prepare(PickScoring(judge, None, inputs, None, settings, "fp32", torch.device("cpu")))
    judge.w = w_after  # the model's update
    if images_setting == "recompute":
        images_after = images
    else:  # (θ_k's tokens reused: changing the images now must not change the reward)
        images_after = images + 100.0
    out = SimpleNamespace(image_feat=torch.zeros(b, 2))
    worth, judged = reward.score(
        PickScoring(judge, out, (images_after, *inputs[1:]), None, settings, "fp32", torch.device("cpu"), prepared)
    )
    assert judged is None and float(worth[0]) == 0.0
    for k in range(1, b):
        want = plain_itm_loss(w_before, images, captions, k) - plain_itm_loss(w_after, images, captions, k)
        assert float(worth[k]) == pytest.approx(want, abs=1e-5), k
    assert judge.modes[-1] == "train", "the objective is back in train mode"


@pytest.mark.slow  # (two tiny FALCON trainings, about two minutes: `make test-all`)
def test_the_candidates_recipes_train_through_the_cli(tmp_path):
    """`shapes-falcon-start-top` composes its first FALCON epoch near q 0.9 (the paper's start would be 0.5), and
    `shapes-falcon-itm-progress` pays the scheduler a finite reward every step, both through `falcon run`."""
    import json

    from falcon_cli.sampling.batch_log import read_batch_log
    from tests.conftest import TINY_SHAPES_RUN, run_cli

    world = tmp_path / "world"
    for recipe in ("shapes-falcon-start-top", "shapes-falcon-itm-progress"):
        run = tmp_path / recipe
        proc = run_cli(
            "run", "--recipe", recipe, "--run-dir", run, f"data.dataset={world}", "stages=[data,pretrain]",
            *TINY_SHAPES_RUN,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        rewards = [
            r["reward"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "reward" in r
        ]
        paid = [r for r in rewards if r is not None]
        assert paid and all(math.isfinite(r) for r in paid), rewards
        log = read_batch_log(run / "batches.parquet")
        q = log.loc[(log["epoch"] == 1) & log["q"].notna(), "q"]
        if recipe.endswith("start-top"):
            assert len(q) > 10 and q.mean() > 0.75, q.describe()
