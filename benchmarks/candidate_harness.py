"""Can each of issue 70's candidate schedulers learn? Two worlds with a known optimum, the model frozen.

    PYTHONPATH=. .venv/bin/python benchmarks/candidate_harness.py --seeds 0 1 2 --out runs/candidate-harness \\
        --report docs/results.md                        # the synthetic concept world's anchors (a few minutes)
    PYTHONPATH=. .venv/bin/python benchmarks/candidate_harness.py --run RUN --epoch 8 --seeds 0 1 2   # a run's

The anchors are the frontier harness's (``benchmarks/frontier_harness.py``): pairs split into search spaces of |M|,
each anchor with the scheduler's input row and its candidates in the composer's order; q picks among them on the
log-rank scale (``composer.quantile_scale: log_rank``, as the pilots run). Two worlds replace the oracle's verdicts:

* ``safe-top``: no candidate is a false negative (``coco-like``'s density is 0.0002): the best pick is the top one,
  q → 1, for every anchor. A candidate passes if its held-out anchors' mean E[q] is at least 0.85 and at least 20%
  of its picks are the top candidate.
* ``false-top``: each anchor's t most similar candidates are false negatives, t uniform in 1…8: q = 1 always picks
  a false one, and the best pick is the hardest below the first false one. A candidate passes if at most 30% of its
  picks are false (q = 1: 100%).

What each candidate is paid, per pick at rank ρ (its q on the log-rank scale) that is false (f = 1) or not:

* ``paper`` (candidate A: ``scheduler.init_q: 0.9``, the paper's reward and credit): one reward per update,
  Δ = 0.006 + 0.0012·(mean ρ − 0.5) − 0.0024·(mean f) + noise N(0, 0.017²): the measured MLM decrease (+0.006, spread
  0.017), with the issue's supposition that moving every q from 0.5 to 1 changes it by 10% and a false pick costs
  twice that; the scheduler lr of the paper mapped to the testbed (1.144e-3, docs/methods.md), no baseline.
* ``rank-oracle`` (candidate B, the oracle as the judge): each pick worth (1 − f)·ρ − 2f, credited to the q that
  chose it, with a leave-one-out baseline, normalised advantages, entropy 0.01 and α + β ≤ 50 (``shapes-falcon-plus``'s
  settings, as the frontier harness).
* ``rank-judge`` (candidate B with a judge that errs, as the run's ITM head does): B's worth with the judge's
  match probability p in place of f, (1 − p)·ρ − 2p (``reward.itm_charge: expected``), p = sigmoid(z), z ~ N(−d, 1)
  for a true negative and N(0, 1) for a false one, d = √2·Φ⁻¹(AUROC) for each of ``--judge-auc`` (default 0.6, 0.75,
  0.9): how well the judge must separate false picks from true ones for B to learn. Its errors here do not depend
  on a pick's rank; a real head's may (it confuses near misses more often), which the pilot measures and this does
  not. A pilot's ``itm_fn_auc`` (its epoch summaries) places its ITM head on this scale.
* ``itm-progress`` (candidate C): each pick worth a·ρ − c·f + noise N(0, σ²), credited as B's; a and c are
  ``--progress a c`` (default 0.02 0.04), σ each of ``--noise`` (default 0.2: a per-pick signal a tenth of its
  noise). What a training run's reward really carries is unknown here; the table's corr(reward, false) in training is
  the bridge: a pilot measures the same correlation (``reward_fn_corr`` in its epoch summaries), which places the
  real reward on this scale.

Every candidate takes the testbed's 2,500 updates of 63 picks. Writes ``candidates.csv`` to OUT and prints a table;
``--report`` rewrites the block of docs/results.md between ``candidate-harness:begin`` / ``:end``.
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
from falcon_cli.sampling.quantile import quantile_position, scale_rank, space_tables  # noqa: E402
from falcon_cli.sampling.scheduler import NegativeScheduler  # noqa: E402

BEGIN, END = "<!-- candidate-harness:begin -->", "<!-- candidate-harness:end -->"
FEATURES = ("positive", "spread")
SCALE = "log_rank"
WORLDS = ("safe-top", "false-top")
STEADY = dict(credit="chosen", baseline="batch_mean", lr=1e-3, normalize=True, entropy=1e-2, max_concentration=50.0)
CANDIDATES = {
    "paper": dict(credit="batch", lr=1.144e-3, init_q=0.9),
    "rank-oracle": STEADY,
    "rank-judge": STEADY,
    "itm-progress": STEADY,
}
"""Candidate -> :class:`NegativeScheduler` options."""
PASS = {"safe-top": "mean E[q] ≥ 0.85 and ≥ 20% of picks the top candidate", "false-top": "≤ 30% of picks false"}


@dataclass
class HarnessAnchors:
    """Every anchor's input row and, per candidate position (ascending similarity), whether it is false."""

    rows: torch.Tensor  # [N, d]
    false: np.ndarray  # [N, n] bool, n = |M| − 1 candidates in the composer's order (the last the most similar)
    held_out: np.ndarray  # [N] bool


def harness_anchors(image: torch.Tensor, text: torch.Tensor, width: int, world: str, *, seed: int = 0,
                    held_out: float = 0.3) -> HarnessAnchors:  # fmt: skip
    """The anchors of spaces of ``width`` and ``world``'s verdicts on their candidates."""
    if world not in WORLDS:
        raise ValueError(f"world must be one of {WORLDS}, got {world!r}")
    spaces = scheduler_bandit.full_spaces(len(image), width, seed)
    rows = [
        space_tables(image[m][None], text[m][None], torch.tensor([width]), features=FEATURES).s_hat[0] for m in spaces
    ]
    n = width - 1
    false = np.zeros((len(spaces) * width, n), dtype=bool)
    if world == "false-top":
        top = np.random.default_rng(seed).integers(1, 9, size=len(false))  # t, uniform in 1…8
        false[np.arange(n)[None, :] >= n - top[:, None]] = True
    space = np.repeat(np.arange(len(spaces)), width)
    return HarnessAnchors(torch.cat(rows), false, space >= round(len(spaces) * (1 - held_out)))


def picks(anchors: HarnessAnchors, index: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each q's pick for its anchor: (position, rank ρ on the log-rank scale, whether it is false)."""
    n = anchors.false.shape[1]
    position = quantile_position(q, n, SCALE)
    return position, scale_rank(position, n, SCALE), anchors.false[index, position]


def judge_match(false: np.ndarray, auc: float, rng: np.random.Generator) -> np.ndarray:
    """A judge's match probability for picks that are ``false`` or not, its AUROC ``auc`` (``rank-judge``):
    sigmoid(z), z ~ N(−d, 1) for a true negative and N(0, 1) for a false one, d = √2·Φ⁻¹(auc)."""
    from statistics import NormalDist

    if not 0.5 <= auc < 1:
        raise ValueError(f"a judge's AUROC must lie in [0.5, 1), got {auc}")
    d = 2**0.5 * NormalDist().inv_cdf(auc)
    z = rng.normal(0.0, 1.0, false.shape) - d * (1 - false.astype(np.float64))
    return 1 / (1 + np.exp(-z))


def run_candidate(anchors: HarnessAnchors, candidate: str, *, updates: int = 2500, batch: int = 64, seed: int = 0,
                  progress: tuple[float, float, float] = (0.02, 0.04, 0.2), judge_auc: float = 0.9,
                  draws: int = 10) -> dict:  # fmt: skip
    """Train a fresh scheduler with ``candidate``'s reward on the training anchors; score its picks on the held-out.
    ``progress`` is ``itm-progress``'s (a, c, σ), ``judge_auc`` ``rank-judge``'s judge."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    scheduler = NegativeScheduler(quantiles=anchors.rows.shape[1], **CANDIDATES[candidate])
    train = np.flatnonzero(~anchors.held_out)
    paid, was_false = [], []  # what each credit was, and whether its pick (its batch's share, for `paper`) was false
    for _ in range(updates):
        index = rng.choice(train, batch - 1, replace=False)
        alpha, beta = scheduler.alpha_beta(anchors.rows[index])
        q = sample_q(alpha.double(), beta.double(), rng)
        _, rank, false = picks(anchors, index, q.numpy())
        if candidate == "paper":
            reward = 0.006 + 0.0012 * (rank.mean() - 0.5) - 0.0024 * false.mean() + rng.normal(0, 0.017)
            paid.append([reward]), was_false.append([false.mean()])
        else:
            if candidate.startswith("rank-"):  # B: (1 − p)·ρ − 2p, p the oracle's verdict or an erring judge's
                p = false.astype(np.float64) if candidate == "rank-oracle" else judge_match(false, judge_auc, rng)
                worth = (1 - p) * rank - 2.0 * p
            else:
                a, c, sigma = progress
                worth = a * rank - c * false + rng.normal(0, sigma, len(index))
            reward = torch.cat([torch.zeros(1, dtype=torch.float64), torch.from_numpy(worth.astype(np.float64))])
            paid.append(worth), was_false.append(false)
        scheduler.update({"s_hat": anchors.rows[index], "q": q}, reward)
    held = np.flatnonzero(anchors.held_out)
    alpha, beta = scheduler.alpha_beta(anchors.rows[held])
    q = sample_q(alpha.double().expand(draws, -1), beta.double().expand(draws, -1), rng).numpy()  # [draws, held]
    n = anchors.false.shape[1]
    position, _, false = picks(anchors, np.broadcast_to(held, q.shape), q)
    paid, was_false = np.concatenate(paid).astype(np.float64), np.concatenate(was_false).astype(np.float64)
    together = paid.std() > 0 and was_false.std() > 0
    return {
        "candidate": candidate,
        "seed": seed,
        "reward_false_corr": float(np.corrcoef(paid, was_false)[0, 1]) if together else float("nan"),
        "mean_expected_q": float((alpha / (alpha + beta)).mean()),
        "top_share": float((position == n - 1).mean()),
        "false_share": float(false.mean()),
    }


def _signed(value: float) -> str:
    """``+0.12``, or — where there is nothing to correlate (no false pick in the world)."""
    return "—" if value != value else f"{value:+.2f}"


def verdict(world: str, row: dict) -> bool:
    """Whether one run passes its world (:data:`PASS`)."""
    if world == "safe-top":
        return row["mean_expected_q"] >= 0.85 and row["top_share"] >= 0.2
    return row["false_share"] <= 0.3


def markdown(frame, command: str, seconds: float) -> list[str]:
    """The report block: per world and candidate, each seed's numbers and the verdict."""
    lines = [
        f"Generated by `{command}` ({seconds / 60:.0f} min on {torch.get_num_threads()} CPU threads).",
        "",
        "| world | candidate | seeds | mean E[q] | top candidate, % of picks | false, % of picks | corr(reward, false) "
        "in training | passes (seeds) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (world, candidate), sub in frame.groupby(["world", "candidate"], sort=False):
        lines.append(
            f"| {world} | {candidate} | {len(sub)} | {sub.mean_expected_q.mean():.2f} | "
            f"{100 * sub.top_share.mean():.1f} | {100 * sub.false_share.mean():.1f} | "
            f"{_signed(sub.reward_false_corr.mean())} | "
            f"{'yes' if sub.passes.all() else 'no'} ({int(sub.passes.sum())}/{len(sub)}) |"
        )
    lines += ["", "Pass: " + "; ".join(f"`{w}`: {rule}" for w, rule in PASS.items()) + "."]
    return lines


def variants(candidate: str, args: argparse.Namespace) -> list[dict]:
    """The settings a candidate runs at, each in turn: C at each ``--noise``, B's judge at each ``--judge-auc``."""
    if candidate == "itm-progress":
        return [{"progress": (*args.progress, sigma)} for sigma in args.noise]
    if candidate == "rank-judge":
        return [{"judge_auc": auc} for auc in args.judge_auc]
    return [{}]


def main(argv: list[str] | None = None) -> int:
    import pandas as pd

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, help="a shapes pretraining run's embeddings (default: the synthetic world)")
    parser.add_argument("--epoch", type=int, default=None, help="the embeddings' epoch (default the last)")
    parser.add_argument("--width", type=int, default=350, help="|M| (default 350)")
    parser.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES))
    parser.add_argument("--worlds", nargs="+", default=list(WORLDS), choices=WORLDS)
    parser.add_argument("--updates", type=int, default=2500, help="scheduler updates (the testbed's: ~2,500)")
    parser.add_argument("--progress", type=float, nargs=2, default=[0.02, 0.04], metavar=("A", "C"))
    parser.add_argument("--noise", type=float, nargs="+", default=[0.2], help="itm-progress's σ, each in turn")
    parser.add_argument(
        "--judge-auc", type=float, nargs="+", default=[0.6, 0.75, 0.9], help="rank-judge's judge AUROC, each in turn"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--report", type=Path, default=None)
    args = parser.parse_args(argv)
    if any(not 0.5 <= auc < 1 for auc in args.judge_auc):
        parser.error(f"--judge-auc: each AUROC must lie in [0.5, 1) (a judge at 0.5 is a coin), got {args.judge_auc}")

    start = time.time()
    image, text, _ = (
        scheduler_bandit.shapes_run_world(args.run, args.epoch) if args.run else scheduler_bandit.synthetic_world()
    )
    width = min(args.width, len(image) // 4)
    rows = []
    for world in args.worlds:
        anchors = harness_anchors(image, text, width, world)
        for candidate in args.candidates:
            for setting in variants(candidate, args):
                for seed in args.seeds:
                    row = run_candidate(anchors, candidate, updates=args.updates, seed=seed, **setting)
                    row.update(world=world, passes=verdict(world, row))
                    if "progress" in setting:
                        row["candidate"] = f"itm-progress, σ {setting['progress'][2]:g}"
                    elif "judge_auc" in setting:
                        row["candidate"] = f"rank-judge, AUROC {setting['judge_auc']:g}"
                    rows.append(row)
                    print(
                        f"{world:9s} {row['candidate']:20s} seed {seed}: E[q] {row['mean_expected_q']:.3f}, top "
                        f"{100 * row['top_share']:.1f}%, false {100 * row['false_share']:.1f}%: "
                        f"{'passes' if row['passes'] else 'fails'}",
                        flush=True,
                    )
    frame = pd.DataFrame(rows)
    lines = markdown(frame, scheduler_bandit.command_line("candidate_harness.py", argv), time.time() - start)
    scheduler_bandit.publish(frame, lines, out=args.out, csv="candidates.csv", report=args.report, begin=BEGIN, end=END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
