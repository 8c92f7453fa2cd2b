"""Benchmark: per-step wall time of `uniform`, `grit` and `falcon` on albef-tiny, measured in one run.

The training step itself is the same for every composer; `uniform` and `grit` add the time to
compose an epoch (GRIT chains every search space through the embedding cache), amortised over
the epoch's steps. `falcon` adds, per step: the reward's extra no-grad forward (L_after, train
mode: the default), composing its batch on demand (each search space's sorted tables when the
space is entered, the scheduler on the space's remaining rows, the chain) and the scheduler's
REINFORCE update. The positive-margin rewards make no pass (the training forward's features):
`falcon-margin` is the step, composition and update alone; `falcon-margin-itm` adds the ITM head's
judgement of each pick with its anchor (`reward: positive_margin+itm`: the captions through the text
encoder once, the fusion layers and head on 2(B - 1) pairs, no gradient); `falcon-margin-levels`
(`scheduler.update.credit: levels`) composes with the 10 level picks per step and their margins from the cache, and
updates the scheduler from all of them. Everything is timed in the same process; the ratios are printed.

    PYTHONPATH=. .venv/bin/python benchmarks/composer_step_time.py                 # shapes-demo scale
    PYTHONPATH=. .venv/bin/python benchmarks/composer_step_time.py --pairs 566747 --batch 96 --space 1920 --steps 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from falcon_cli.config.schema import RewardConfig  # noqa: E402
from falcon_cli.models.registry import create_model  # noqa: E402
from falcon_cli.objectives.mlm import MlmMask  # noqa: E402
from falcon_cli.objectives.vlp import VlpObjective  # noqa: E402
from falcon_cli.registry import REWARDS  # noqa: E402
from falcon_cli.sampling.cache import EmbeddingCache  # noqa: E402
from falcon_cli.sampling.composers import GritComposer, UniformComposer  # noqa: E402
from falcon_cli.sampling.quantile import QuantileSpaces  # noqa: E402
from falcon_cli.sampling.scheduler import NegativeScheduler, chain_pairs, level_grid  # noqa: E402


def timed(fn, repeats: int) -> float:
    """Median wall seconds of ``repeats`` calls (one warm-up call first)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pairs", type=int, default=4000, help="pairs in the epoch (default: the 1,000-image demo world)"
    )
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--space", type=int, default=320, help="GRIT search-space size |M|")
    parser.add_argument("--steps", type=int, default=8, help="timed training steps")
    parser.add_argument("--tokens", type=int, default=14, help="caption length in tokens")
    args = parser.parse_args()
    torch.manual_seed(0)

    # Composition: one epoch for each composer from the same cache.
    ids = torch.arange(args.pairs)
    cache = EmbeddingCache(ids)
    feats = torch.nn.functional.normalize(torch.randn(args.pairs, 256), dim=1)
    cache.update(ids, feats, feats + 0.1 * torch.randn_like(feats))
    compose = {}
    for composer in (UniformComposer(args.batch), GritComposer(args.batch, args.space)):
        generator = torch.Generator().manual_seed(0)
        compose[composer.name] = timed(lambda c=composer: c.compose_epoch(1, ids, cache, generator), 3)
    steps_per_epoch = -(-args.pairs // args.batch)
    # FALCON: every batch of an epoch on demand, each followed by the scheduler's update
    scheduler = NegativeScheduler(quantiles=100)  # the paper's: its reward (mlm) is the timed reward pass
    falcon_parts: dict[str, float] = {}

    def falcon_epoch(levels: bool = False):
        learner = NegativeScheduler(quantiles=100, credit="levels") if levels else scheduler
        generator = torch.Generator().manual_seed(0)
        spaces = QuantileSpaces(
            ids, cache, args.space, args.batch, generator, credit_levels=level_grid(10) if levels else None
        )
        compose_s = update_s = 0.0
        reward, margin_levels = (
            RewardConfig(name="positive_margin", margin=0.5),
            REWARDS.get("positive_margin").score_levels,
        )
        while spaces.has_next():
            start = time.perf_counter()
            _, record = spaces.next_batch(learner.alpha_beta, generator)
            middle = time.perf_counter()
            learner.update(record, margin_levels(record, reward, learner.grid) if levels else 0.01)
            compose_s, update_s = compose_s + middle - start, update_s + time.perf_counter() - middle
        prefix = "levels_" if levels else ""
        falcon_parts.update({prefix + "compose": compose_s, prefix + "update": update_s})

    for levels in (False, True):
        falcon_epoch(levels)  # warm-up
        falcon_epoch(levels)

    # One training step of albef-tiny on a synthetic batch (identical for both composers).
    vocab = 300
    objective = VlpObjective(create_model("albef-tiny", vocab_size=vocab))
    optimizer = torch.optim.AdamW(objective.parameters(), lr=1e-4)
    images = torch.randn(args.batch, 3, 64, 64)
    input_ids = torch.randint(5, vocab, (args.batch, args.tokens))
    input_ids[:, 0] = 2
    attention = torch.ones_like(input_ids)
    mask = MlmMask.sample(input_ids, attention, vocab_size=vocab, mask_token_id=4, pad_token_id=0, cls_token_id=2)

    def step():
        out = objective(images, input_ids, attention, mask)
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()

    def reward_pass(image=None):  # L_after: the batch again, no gradient, the identical mask
        with torch.no_grad():
            scheduler.loss_value(
                objective.measure(images, input_ids, attention, mask, parts=scheduler.parts, image=image)
            )

    step_time = timed(step, args.steps)
    reward_time = timed(reward_pass, args.steps)
    with torch.no_grad():
        encoding = objective.model.encode_image(images)
    reuse_time = timed(lambda: reward_pass(encoding), args.steps)  # reward_images: reuse
    with torch.no_grad():
        out = objective(images, input_ids, attention, mask)
    pairs = chain_pairs(args.batch)

    def itm_judgement():  # reward: positive_margin+itm, in eval mode as falcon_cli/methods/positive_margin.itm_match
        objective.eval()
        objective.match_probability(out, input_ids, attention, *pairs)
        objective.train()

    itm_time = timed(itm_judgement, args.steps)
    print(
        f"pairs {args.pairs:,}, batch {args.batch}, |M| {args.space}, {steps_per_epoch} steps/epoch, "
        f"torch threads {torch.get_num_threads()}"
    )
    print(f"training step (albef-tiny): {step_time * 1000:.1f} ms")
    per_step = {}
    for name, seconds in compose.items():
        per_step[name] = step_time + seconds / steps_per_epoch
        print(f"{name:8s} compose epoch {seconds * 1000:8.1f} ms -> {per_step[name] * 1000:.1f} ms per step")
    compose_ms, update_ms = (falcon_parts[k] / steps_per_epoch * 1000 for k in ("compose", "update"))
    per_step["falcon"] = step_time + reward_time + (falcon_parts["compose"] + falcon_parts["update"]) / steps_per_epoch
    print(
        f"falcon   reward forward {reward_time * 1000:.1f} ms + compose {compose_ms:.1f} ms + scheduler update "
        f"{update_ms:.1f} ms per step -> {per_step['falcon'] * 1000:.1f} ms per step"
    )
    per_step["falcon-reuse"] = per_step["falcon"] - reward_time + reuse_time
    print(
        f"falcon, reward_images=reuse: reward forward {reuse_time * 1000:.1f} ms -> "
        f"{per_step['falcon-reuse'] * 1000:.1f} ms per step"
    )
    per_step["falcon-margin"] = per_step["falcon"] - reward_time
    per_step["falcon-margin-itm"] = per_step["falcon-margin"] + itm_time
    print(
        f"falcon, reward positive_margin: no pass -> {per_step['falcon-margin'] * 1000:.1f} ms per step; "
        f"positive_margin+itm: ITM judgement {itm_time * 1000:.1f} ms -> {per_step['falcon-margin-itm'] * 1000:.1f} ms"
    )
    levels_ms = (falcon_parts["levels_compose"] + falcon_parts["levels_update"]) / steps_per_epoch * 1000
    per_step["falcon-margin-levels"] = step_time + levels_ms / 1000
    print(
        f"falcon, positive_margin with scheduler_credit=levels (10 levels): compose "
        f"{falcon_parts['levels_compose'] / steps_per_epoch * 1000:.1f} ms + update "
        f"{falcon_parts['levels_update'] / steps_per_epoch * 1000:.1f} ms per step -> "
        f"{per_step['falcon-margin-levels'] * 1000:.1f} ms per step"
    )
    print(f"grit / uniform per-step time: {per_step['grit'] / per_step['uniform']:.4f}")
    print(
        f"falcon / grit per-step time: {per_step['falcon'] / per_step['grit']:.4f} "
        f"(reward_images=reuse: {per_step['falcon-reuse'] / per_step['grit']:.4f}; positive_margin: "
        f"{per_step['falcon-margin'] / per_step['grit']:.4f}; positive_margin+itm: "
        f"{per_step['falcon-margin-itm'] / per_step['grit']:.4f}; positive_margin, levels: "
        f"{per_step['falcon-margin-levels'] / per_step['grit']:.4f})"
    )
    print(f"levels / positive_margin per-step time: {per_step['falcon-margin-levels'] / per_step['falcon-margin']:.4f}")


if __name__ == "__main__":
    main()
