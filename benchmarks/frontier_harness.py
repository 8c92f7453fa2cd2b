"""Can a scheduler's picks go below the fixed-q frontier? Real anchors, a perfect judge, no training of the model.

    PYTHONPATH=. .venv/bin/python benchmarks/frontier_harness.py \\
        --run runs/scheduler-itm/runs/falcon-plus-margin-0.5-s0 \\
        --epoch 5 --weights 1 2 4 --credits chosen levels --seeds 0 1 2     # a trained run's anchors (~10 min)
    PYTHONPATH=. .venv/bin/python benchmarks/frontier_harness.py --synthetic --updates 300 --seeds 0   # a minute

The anchors are a shapes run's pairs at one epoch (``--run``, its embeddings and its world's oracle), split into
search spaces of |M| as the composer splits them, each with the scheduler's input row (``[positive, spread]``, as
``shapes-falcon-plus``) and, from the oracle, whether the pick each q would make (every other pair of its space
available) is a false negative. The reward is the one of ``reward: positive_margin+oracle`` with
``scheduler.reward.hardness: rank`` and ``scheduler.reward.itm_charge: expected``: a true pick is worth its q, a false
one −w. The model is frozen, so the only thing learned is the policy, and the measurement is the issue's: the
false-negative rate of the policy's picks on held-out anchors (q drawn from each anchor's Beta) against the fixed-q
frontier at the same mean q on the same anchors (the line through the FN rates of 21 fixed q's), in points (below 0:
fewer false negatives than one q for every anchor).

``--credits``: ``chosen`` (REINFORCE on each anchor's drawn q, the reward of its pick, a leave-one-out baseline:
``shapes-falcon-oracle`` with ``scheduler.reward.hardness: rank``) and ``levels`` (every level of a 10-q grid scored for
each anchor: ``scheduler.update.credit: levels``), both with ``shapes-falcon-plus``'s normalisation, entropy and cap.
Each update takes B − 1 = 15 anchors drawn from the training spaces. Writes ``frontier.csv`` to OUT and prints a
table; ``--report`` rewrites the block of docs/results.md between ``frontier-harness:begin`` / ``:end``.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scheduler_bandit  # noqa: E402

from falcon_cli.sampling.policy import sample_q  # noqa: E402
from falcon_cli.sampling.quantile import nearest_rank, space_tables  # noqa: E402
from falcon_cli.sampling.scheduler import NegativeScheduler, level_grid  # noqa: E402

BEGIN, END = "<!-- frontier-harness:begin -->", "<!-- frontier-harness:end -->"
FIXED = np.linspace(0, 1, 21)
"""The fixed q's whose FN rates draw the frontier (and whose picks score a drawn q: the nearest of them)."""
FEATURES = ("positive", "spread")
STEADY = dict(lr=1e-3, normalize=True, entropy=1e-2, max_concentration=50.0)
CREDITS = {"chosen": dict(credit="chosen", baseline="batch_mean", **STEADY), "levels": dict(credit="levels", **STEADY)}
"""Credit -> :class:`NegativeScheduler` options (``shapes-falcon-plus``'s, with the credit named)."""


@dataclass
class FrontierAnchors:
    """Every anchor's input row, whether each grid level's and each fixed q's pick is a false negative, its density."""

    rows: torch.Tensor  # [N, d]
    level_fn: torch.Tensor  # [N, L] float64 (1: the level's pick is a false negative)
    fixed_fn: torch.Tensor  # [N, len(FIXED)]
    density: torch.Tensor  # [N]
    held_out: torch.Tensor  # [N] bool: anchors of held-out spaces


def frontier_anchors(
    image: torch.Tensor,
    text: torch.Tensor,
    truth,
    width: int,
    levels: int = 10,
    *,
    held_out: float = 0.3,
    seed: int = 0,
) -> FrontierAnchors:
    """Split the pairs (shuffled) into full spaces of ``width`` and tabulate every anchor's picks at each q
    (nearest rank among all of its space's other pairs, as the composer orders them)."""
    spaces = scheduler_bandit.full_spaces(len(image), width, seed)
    grid_ranks = torch.from_numpy(nearest_rank(level_grid(levels), width - 1))
    fixed_ranks = torch.from_numpy(nearest_rank(FIXED, width - 1))
    rows, level_fn, fixed_fn, density = [], [], [], []
    for members in spaces:
        tables = space_tables(image[members][None], text[members][None], torch.tensor([width]), features=FEATURES)
        fn = scheduler_bandit.space_false_negatives(truth, members)
        order = tables.order[0].long()[:, : width - 1]  # ascending similarity; the anchor itself last
        rows.append(tables.s_hat[0])
        level_fn.append(fn.gather(1, order[:, grid_ranks]))
        fixed_fn.append(fn.gather(1, order[:, fixed_ranks]))
        density.append(fn.double().sum(1) / (width - 1))
    space = torch.cat([torch.full((width,), s) for s in range(len(spaces))])
    return FrontierAnchors(
        torch.cat(rows),
        torch.cat(level_fn).double(),
        torch.cat(fixed_fn).double(),
        torch.cat(density),
        space >= round(len(spaces) * (1 - held_out)),
    )


def run_policy(
    anchors: FrontierAnchors,
    credit: str,
    weight: float,
    *,
    updates: int,
    batch: int = 16,
    seed: int = 0,
    draws: int = 20,
) -> dict:
    """Train a fresh scheduler with ``credit`` on the training anchors; its picks on the held-out ones."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    scheduler = NegativeScheduler(quantiles=anchors.rows.shape[1], **CREDITS[credit])
    if credit == "levels":
        level_reward = scheduler.grid.double()[None] * (1 - anchors.level_fn) - weight * anchors.level_fn
    fixed_reward = torch.from_numpy(FIXED)[None] * (1 - anchors.fixed_fn) - weight * anchors.fixed_fn
    train = (~anchors.held_out).nonzero().flatten()
    for _ in range(updates):
        pick = train[torch.from_numpy(rng.choice(len(train), min(batch - 1, len(train)), replace=False))]
        if credit == "levels":
            scheduler.update({"s_hat": anchors.rows[pick], "q": torch.full((len(pick),), 0.5)}, level_reward[pick])
            continue
        alpha, beta = scheduler.alpha_beta(anchors.rows[pick])
        q = sample_q(alpha.double(), beta.double(), rng)
        reward = fixed_reward[pick].gather(1, nearest_fixed(q)[:, None])[:, 0]
        scheduler.update(
            {"s_hat": anchors.rows[pick], "q": q}, torch.cat([torch.zeros(1, dtype=torch.float64), reward])
        )
    held = anchors.held_out
    alpha, beta = scheduler.alpha_beta(anchors.rows[held])
    q = sample_q(alpha.double().expand(draws, -1), beta.double().expand(draws, -1), rng)  # [draws, held-out anchors]
    fn = float(anchors.fixed_fn[held].gather(1, nearest_fixed(q).T).mean())
    mean_q, expected = float(q.mean()), (alpha / (alpha + beta)).double()
    frontier = float(np.interp(mean_q, FIXED, anchors.fixed_fn[held].mean(0).numpy()))
    corr = (
        float(np.corrcoef(expected.numpy(), anchors.density[held].numpy())[0, 1])
        if float(expected.std()) > 1e-9
        else 0.0
    )
    return {
        "credit": credit,
        "weight": weight,
        "seed": seed,
        "mean_q": mean_q,
        "std_expected_q": float(expected.std()),
        "q_fn_density_corr": corr,
        "fn_rate": fn,
        "frontier_fn_rate": frontier,
        "gap_points": 100 * (fn - frontier),
    }


def nearest_fixed(q: torch.Tensor) -> torch.Tensor:
    """Index of the nearest of :data:`FIXED` to each q (int64, same shape)."""
    return (q * (len(FIXED) - 1)).round().long().clamp(0, len(FIXED) - 1)


def markdown(frame, command: str, source: str, seconds: float, anchors: FrontierAnchors) -> list[str]:
    """The report block: per (credit, weight) the gap to the frontier per seed and its mean ± std."""
    held = anchors.held_out
    frontier = anchors.fixed_fn[held].mean(0).numpy()
    lines = [
        f"Generated by `{command}` ({seconds / 60:.0f} min on {source}).",
        "",
        f"Anchors: {len(held):,} ({int(held.sum()):,} held out, scored); FN density mean "
        f"{float(anchors.density.mean()):.3f}; the frontier's FN % at q = 0, 0.25, 0.5, 0.75, 1: "
        + ", ".join(f"{100 * frontier[i]:.1f}" for i in (0, 5, 10, 15, 20))
        + ".",
        "",
        "| credit | w | seeds | mean q | std E[q] | corr(E[q], FN density) | FN % of the picks | frontier FN %, same "
        "mean q | gap (points), per seed | gap, mean ± std |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (credit, weight), sub in frame.groupby(["credit", "weight"], sort=False):
        gap = sub["gap_points"]
        lines.append(
            f"| {credit} | {weight:g} | {len(sub)} | {sub.mean_q.mean():.2f} | {sub.std_expected_q.mean():.2f} | "
            f"{sub.q_fn_density_corr.mean():+.2f} | {100 * sub.fn_rate.mean():.1f} | "
            f"{100 * sub.frontier_fn_rate.mean():.1f} | "
            + ", ".join(f"{g:+.1f}" for g in gap)
            + f" | {gap.mean():+.1f} ± {gap.std(ddof=0):.1f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    import pandas as pd

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", type=Path, help="a shapes pretraining run (its embeddings and its world)")
    source.add_argument("--synthetic", action="store_true", help="the bandit's synthetic concept world")
    parser.add_argument("--epoch", type=int, default=None, help="the embeddings' epoch (default the last)")
    parser.add_argument("--width", type=int, default=350, help="|M| (default 350: the scheduler sweep's)")
    parser.add_argument("--weights", type=float, nargs="+", default=[2.0], help="what a false pick costs, w")
    parser.add_argument("--credits", nargs="+", default=list(CREDITS), choices=list(CREDITS))
    parser.add_argument("--updates", type=int, default=1100, help="scheduler updates (the sweep's FALCON runs: ~1,100)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--report", type=Path, default=None)
    args = parser.parse_args(argv)

    start = time.time()
    image, text, truth = (
        scheduler_bandit.synthetic_world()
        if args.synthetic
        else scheduler_bandit.shapes_run_world(args.run, args.epoch)
    )
    width = min(args.width, len(image) // 4)
    anchors = frontier_anchors(image, text, truth, width)
    rows = []
    for weight in args.weights:
        for credit in args.credits:
            for seed in args.seeds:
                row = run_policy(anchors, credit, weight, updates=args.updates, seed=seed)
                rows.append(row)
                print(
                    f"{credit:7s} w {weight:<4g} seed {seed}: mean q {row['mean_q']:.3f}, std E[q] "
                    f"{row['std_expected_q']:.3f}, FN {100 * row['fn_rate']:.1f}% vs frontier "
                    f"{100 * row['frontier_fn_rate']:.1f}%: gap {row['gap_points']:+.1f} points",
                    flush=True,
                )
    frame = pd.DataFrame(rows)
    command = scheduler_bandit.command_line("frontier_harness.py", argv)
    lines = markdown(frame, command, f"{torch.get_num_threads()} CPU threads", time.time() - start, anchors)
    scheduler_bandit.publish(frame, lines, out=args.out, csv="frontier.csv", report=args.report, begin=BEGIN, end=END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
