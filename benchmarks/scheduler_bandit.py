"""Can FALCON's scheduler learn an anchor-dependent hardness? A contextual bandit with a known optimum.

    PYTHONPATH=. .venv/bin/python benchmarks/same_image.py --out runs/same-image \\
        --only uniform --seeds 0   # the run (~5 min)
    PYTHONPATH=. .venv/bin/python benchmarks/scheduler_bandit.py --run runs/same-image/runs/uniform-s0 \\
        --out runs/bandit --report docs/results.md          # real shapes embeddings, the full grid (~15 min)
    PYTHONPATH=. .venv/bin/python benchmarks/scheduler_bandit.py --synthetic --updates 600   # a minute

The anchors are real: every pair of a trained shapes run's embeddings (``--run``, its last epoch)
is an anchor of a search space of |M| pairs, with the scheduler input row the composer would
build (``pretrain.scheduler.features``) and, from the world's oracle, its **safe quantile** q*:
the highest q whose nearest-rank pick among all of the space's other pairs is a true negative
(what the scheduler should choose if hard negatives help until they are false ones). The reward
is made, so its optimum is known: an anchor's reward for q is ``−(q − q*)²`` (scaled to unit
standard deviation under uniform q), plus what makes the real reward hard:

* ``noise``: independent per-anchor noise (σ in units of the signal's standard deviation);
* ``common``: a shock every anchor of a batch shares (a training step lowers every caption's loss
  at once; in a batch reward it swamps the anchors' differences).

Each update draws a batch of B − 1 anchors of one training space (the q's of one composed batch),
draws their q from the policy, and calls :meth:`NegativeScheduler.update` with what training would
pass: the batch's mean reward (the paper's ``credit: batch``) or the per-anchor rewards (``credit:
anchor``). Every ``--every`` updates the policy's mean E[q] = α / (α + β) on held-out spaces is
scored against q*: the Pearson correlation (the anchor dependence), ``r2`` = 1 − MSE(E[q], q*) /
Var(q*) (≤ 0: no closer than the best constant; 1: exact), the spread of E[q] across anchors (a
correlation without spread is no dependence) and the mean concentration α + β.
The ceiling is what the input carries: the held-out r2 of a ridge regression of q* on it.

The settings (:data:`SETTINGS`) are the paper's scheduler and the options of
``pretrain.scheduler_*``, one at a time and together; the grid crosses them with noise levels and
batch sizes. Writes ``bandit.csv`` (one row per setting × noise × batch × checkpoint) and
``bandit.md`` to OUT; ``--report`` also rewrites the block of docs/results.md between
``scheduler-bandit:begin`` / ``scheduler-bandit:end``.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from falcon_cli.sampling.policy import sample_q
from falcon_cli.sampling.quantile import space_tables
from falcon_cli.sampling.scheduler import NegativeScheduler

BEGIN, END = "<!-- scheduler-bandit:begin -->", "<!-- scheduler-bandit:end -->"


@dataclass(frozen=True)
class Setting:
    """One scheduler configuration: its input features and :class:`NegativeScheduler` options."""

    features: tuple[str, ...] = ("softmax",)
    temperature: float = 1.0
    options: dict = field(default_factory=dict)


PAPER = dict(lr=1e-3)  # the shapes recipes' scheduler lr (the paper's 1e-4 moves it less still)
ANCHOR = dict(credit="anchor", baseline="batch_mean", normalize=True)
PLUS_FEATURES = ("positive", "spread")
STEADY = dict(entropy=1e-2, max_concentration=50.0)
SETTINGS: dict[str, Setting] = {
    "paper": Setting(options=PAPER),
    "paper + ema baseline": Setting(options={**PAPER, "baseline": "ema"}),
    "positive+spread, batch credit": Setting(PLUS_FEATURES, options={**PAPER, "baseline": "ema", "normalize": True}),
    "positive+spread, anchor credit": Setting(PLUS_FEATURES, options={**PAPER, **ANCHOR}),
    "plus, batch credit": Setting(PLUS_FEATURES, options={**PAPER, "baseline": "ema", "normalize": True, **STEADY}),
    "plus, softmax input": Setting(options={**PAPER, **ANCHOR, **STEADY}),
    "plus": Setting(PLUS_FEATURES, options={**PAPER, **ANCHOR, **STEADY}),
    "levels, softmax input": Setting(options={**PAPER, "credit": "levels"}),
    "levels": Setting(PLUS_FEATURES, options={**PAPER, "credit": "levels", "normalize": True, **STEADY}),
}
"""Name -> setting: the paper's scheduler, each change alone, and ``plus`` (every change: ``shapes-falcon-plus``)
with one part taken back at a time; ``levels`` (``scheduler.update.credit: levels``): every anchor's reward known at
each q of a grid (noise drawn apart per level, the batch's shock the same for all), not only at the q it drew."""


# --- the anchors --------------------------------------------------------------------------------
TARGETS = ("density", "safe")
"""The known optimum q* of an anchor: ``density`` 1 − its oracle false-negative density (the more of its
space are false negatives, the easier its negatives should be; the quantity FALCON's diagnostics
correlate E[q] with); ``safe`` its safe quantile (:func:`safe_quantile`)."""


@dataclass
class Anchors:
    """Every anchor's input row (per feature set), its optimum and its space, split train / held out."""

    rows: dict[tuple, torch.Tensor]  # (features, temperature) -> [N, d]
    safe: torch.Tensor  # [N] the safe quantile
    density: torch.Tensor  # [N] share of the anchor's space that are its false negatives
    space: torch.Tensor  # [N] space index
    held_out: torch.Tensor  # [N] bool: anchors of held-out spaces (scored, never trained on)
    target: str = "density"  # which q* the bandit rewards (TARGETS)

    @property
    def q_star(self) -> torch.Tensor:
        """The optimum the bandit rewards, ``[N]``."""
        return 1.0 - self.density if self.target == "density" else self.safe


def safe_quantile(order: torch.Tensor, false_negative: torch.Tensor, size: int) -> torch.Tensor:
    """q* ``[size]`` of every anchor of a space with all its pairs available: the nearest-rank q of the
    most similar candidate that is a true negative (``order`` [W, W] from :func:`space_tables`,
    ``false_negative`` [W, W] bool, either direction); NaN where every candidate is a false negative."""
    n = size - 1  # candidates per anchor
    candidates = order[:size, :n].long()  # ascending similarity
    true_negative = ~false_negative[:size].gather(1, candidates)  # [size, n]
    position = torch.arange(n).expand(size, n)
    last = torch.where(true_negative, position, torch.full_like(position, -1)).max(1).values
    q = last.double() / max(n - 1, 1)
    return torch.where(last >= 0, q, torch.full_like(q, float("nan"))).float()


def full_spaces(n: int, width: int, seed: int) -> list[torch.Tensor]:
    """The pairs 0 … n − 1, shuffled with ``seed``, split into spaces of ``width`` (full spaces only)."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return [perm[s : s + width] for s in range(0, n - width + 1, width)]


def space_false_negatives(truth, members: torch.Tensor) -> torch.Tensor:
    """``[W, W]`` bool of a space: pair j is a false negative of anchor a when either's caption truly describes the
    other's image (the unified similarity is symmetric); never the diagonal."""
    fn = truth(members).bool()
    return (fn | fn.T) & ~torch.eye(len(members), dtype=torch.bool)


def build_anchors(
    image: torch.Tensor,
    text: torch.Tensor,
    truth,
    width: int,
    feature_sets: list[tuple],
    *,
    quantiles: int = 100,
    held_out: float = 0.25,
    seed: int = 0,
) -> Anchors:
    """Split the pairs (shuffled) into spaces of ``width``, and tabulate every anchor.

    ``truth(indices [W]) -> bool [W, W]``: entry [i, j] says caption j describes image i.
    """
    spaces = full_spaces(len(image), width, seed)
    rows = {key: [] for key in feature_sets}
    q_star, density, space_of = [], [], []
    for s, members in enumerate(spaces):
        fn = space_false_negatives(truth, members)
        size = torch.tensor([width])
        for key in feature_sets:
            tables = space_tables(
                image[members][None],
                text[members][None],
                size,
                quantiles=quantiles,
                temperature=key[1],
                features=key[0],
            )
            rows[key].append(tables.s_hat[0])
        q_star.append(safe_quantile(tables.order[0], fn, width))
        density.append(fn.float().sum(1) / (width - 1))
        space_of.append(torch.full((width,), s))
    q_star, density, space_of = torch.cat(q_star), torch.cat(density), torch.cat(space_of)
    keep = ~torch.isnan(q_star)  # (an anchor whose every candidate is a false negative has no safe q)
    held = space_of >= round(len(spaces) * (1 - held_out))
    return Anchors(
        {k: torch.cat(v)[keep] for k, v in rows.items()}, q_star[keep], density[keep], space_of[keep], held[keep]
    )


def shapes_run_anchors(
    run: Path, width: int, feature_sets: list[tuple], epoch: int | None = None, seed: int = 0
) -> Anchors:
    """Anchors from a shapes run: its embeddings of ``epoch`` (default the last) and its world's oracle."""
    image, text, truth = shapes_run_world(run, epoch)
    return build_anchors(image, text, truth, width, feature_sets, seed=seed)


def shapes_run_world(run: Path, epoch: int | None = None):
    """A shapes run's embeddings of ``epoch`` (default the last) as (image, text) ``[N, D]`` and its world's oracle,
    ``truth(indices) -> bool [n, n]`` (entry [i, j]: caption j describes image i)."""
    from falcon_cli.artifacts.embeddings import read_embeddings
    from falcon_cli.data.datasets import pretrain_dataset
    from falcon_cli.data.spec import load_spec
    from falcon_cli.judges.oracle import in_batch_truth
    from falcon_cli.runtime.run_dir import read_manifest

    files = sorted((run / "embeddings").glob("epoch_*.h5"))
    if not files:
        raise SystemExit(
            f"{run}/embeddings: no epoch_*.h5; pass a pretraining run of a shapes world (the published "
            f"one: benchmarks/same_image.py --out runs/same-image --only uniform --seeds 0), or --synthetic"
        )
    path = files[-1] if epoch is None else run / "embeddings" / f"epoch_{epoch:03d}.h5"
    emb = read_embeddings(path)
    spec = load_spec(read_manifest(run)["config"]["data"]["dataset"])
    truth_of = in_batch_truth(spec.resolve(spec.shapes_world), pretrain_dataset(spec, transform=None).records)
    pair_ids = torch.from_numpy(emb.pair_id)
    image, text = torch.from_numpy(emb.image).float(), torch.from_numpy(emb.text).float()
    return image, text, lambda idx: truth_of(pair_ids[idx])


def synthetic_anchors(
    feature_sets: list[tuple], *, pairs: int = 1200, width: int = 200, dim: int = 32, seed: int = 0
) -> Anchors:
    """The anchors of :func:`synthetic_world`, in spaces of ``width``."""
    image, text, truth = synthetic_world(pairs=pairs, dim=dim, seed=seed)
    return build_anchors(image, text, truth, width, feature_sets, seed=seed)


def synthetic_world(*, pairs: int = 1200, dim: int = 32, seed: int = 0):
    """A world with a known structure: pairs belong to concepts of very different sizes (1 to 300 pairs);
    pairs of one concept are each other's false negatives and each other's nearest neighbours, so an
    anchor's FN density grows with its concept's size, which its row shows (how many pairs beat its own).
    Returns (image, text) features ``[pairs, dim]`` and ``truth(indices) -> bool [n, n]``."""
    g = torch.Generator().manual_seed(seed)
    sizes, total = [], 0
    while total < pairs:
        sizes.append(int(torch.randint(1, 301, (1,), generator=g)))
        total += sizes[-1]
    concept = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))[:pairs]
    centres = torch.nn.functional.normalize(torch.randn(len(sizes), dim, generator=g), dim=1)

    def view() -> torch.Tensor:
        return torch.nn.functional.normalize(
            centres[concept] + 0.6 / dim**0.5 * torch.randn(pairs, dim, generator=g), dim=1
        )

    image, text = view(), view()
    return image, text, lambda idx: concept[idx][:, None] == concept[idx][None, :]


# --- the bandit ---------------------------------------------------------------------------------
def score(scheduler: NegativeScheduler, rows: torch.Tensor, q_star: torch.Tensor) -> dict:
    """The policy's E[q] on ``rows`` against q*: r2, correlation, mean |gap|, mean concentration."""
    alpha, beta = scheduler.alpha_beta(rows)
    mean = (alpha / (alpha + beta)).double()
    target = q_star.double()
    r2 = 1.0 - float(((mean - target) ** 2).mean() / target.var(unbiased=False).clamp(min=1e-12))
    corr = float(torch.corrcoef(torch.stack([mean, target]))[0, 1]) if float(mean.std()) > 1e-9 else 0.0
    return {
        "r2": r2,
        "corr": corr,
        "gap": float((mean - target).abs().mean()),
        "spread": float(mean.std()),
        "concentration": float((alpha + beta).mean()),
    }


def run_bandit(
    anchors: Anchors,
    setting: Setting,
    *,
    updates: int,
    batch: int,
    noise: float,
    common: float,
    every: int,
    seed: int = 0,
    hidden: int = 256,
) -> list[dict]:
    """Train a fresh scheduler of ``setting`` for ``updates`` bandit updates; its scores every ``every``."""
    torch.manual_seed(seed)
    key = (setting.features, setting.temperature)
    rows = anchors.rows[key]
    train = (~anchors.held_out).nonzero().flatten()
    test = anchors.held_out.nonzero().flatten()
    spaces = [train[anchors.space[train] == s] for s in anchors.space[train].unique()]
    scheduler = NegativeScheduler(quantiles=rows.shape[1], hidden=hidden, **setting.options)
    rng = np.random.default_rng(seed)
    # the signal's scale: std of −(q − q*)² under uniform q over the training anchors
    u = torch.from_numpy(rng.random(len(train)))
    scale = float((-((u - anchors.q_star[train].double()) ** 2)).std())
    out = []
    for update in range(updates + 1):
        if update % every == 0:
            out.append({"update": update, **score(scheduler, rows[test], anchors.q_star[test])})
        if update == updates:
            break
        space = spaces[rng.integers(len(spaces))]
        pick = space[torch.from_numpy(rng.choice(len(space), size=min(batch - 1, len(space)), replace=False))]
        alpha, beta = scheduler.alpha_beta(rows[pick])
        q = sample_q(alpha, beta, rng).double()
        record = {"s_hat": rows[pick], "q": q}
        if scheduler.grid is not None:  # every level of the grid scored for each anchor: [anchors, levels]
            grid = scheduler.grid.double()
            level = -((grid[None, :] - anchors.q_star[pick].double()[:, None]) ** 2) / scale
            level = (
                level
                + noise * torch.from_numpy(rng.standard_normal(level.shape))
                + common * float(rng.standard_normal())
            )
            scheduler.update(record, level)
            continue
        reward = -((q - anchors.q_star[pick].double()) ** 2) / scale
        reward = (
            reward + noise * torch.from_numpy(rng.standard_normal(len(pick))) + common * float(rng.standard_normal())
        )
        # what training passes: the batch's one Δ (paper), or per slot (anchor t's reward in slot t)
        scheduler.update(record, torch.cat([reward, reward[-1:]]) if scheduler.per_step else float(reward.mean()))
    return out


def supervised_ceiling(anchors: Anchors, key: tuple, *, ridge: float = 1.0) -> float:
    """Held-out r2 of a ridge regression of q* on the standardised input rows: how much of the optimum
    the input carries (linearly; a policy that learns it reaches about this, a network can overfit it)."""
    rows, target = anchors.rows[key].double(), anchors.q_star.double()
    train, test = ~anchors.held_out, anchors.held_out
    mean, std = rows[train].mean(0), rows[train].std(0).clamp(min=1e-9)
    x = torch.cat([(rows - mean) / std, torch.ones(len(rows), 1, dtype=torch.float64)], 1)
    weights = torch.linalg.solve(
        x[train].T @ x[train] + ridge * torch.eye(x.shape[1], dtype=torch.float64), x[train].T @ target[train]
    )
    error = ((x[test] @ weights - target[test]) ** 2).mean()
    return 1.0 - float(error / target[test].var(unbiased=False))


# --- the report ---------------------------------------------------------------------------------
def markdown(
    rows: list[dict], ceilings: dict, anchors: Anchors, command: str, source: str, seconds: float
) -> list[str]:
    """The report block: the data, then per setting the held-out r2 at the checkpoints of each grid cell."""
    import pandas as pd

    frame = pd.DataFrame(rows)
    checkpoints = sorted(frame["update"].unique())
    shown = [
        c
        for c in checkpoints
        if c in (checkpoints[len(checkpoints) // 4], checkpoints[len(checkpoints) // 2], checkpoints[-1])
    ]
    qs = anchors.q_star
    lines = [
        f"Generated by `{command}` ({seconds / 60:.0f} min on {source}).",
        "",
        f"Anchors: {len(qs):,} ({int(anchors.held_out.sum()):,} held out); q* mean {float(qs.mean()):.2f}, "
        f"std {float(qs.std()):.2f}; oracle FN density mean {float(anchors.density.mean()):.3f}; "
        f"corr(q*, FN density) {float(torch.corrcoef(torch.stack([qs, anchors.density]))[0, 1]):+.2f}.",
        "",
        "Supervised ceiling (held-out r2 of a ridge regression of q* on the input): "
        + ", ".join(f"{'+'.join(k[0])}{'' if k[1] == 1 else f' τ={k[1]:g}'} {v:.2f}" for k, v in ceilings.items())
        + ".",
        "",
        "Held-out correlation of E[q] with q* after "
        + " / ".join(f"{c:,}" for c in shown)
        + " updates, and (in brackets) at the end the r2 (≤ 0: E[q] no closer to q* than the best constant) and the "
        f"standard deviation of E[q] across anchors (q*'s: {float(qs[anchors.held_out].std()):.2f}; a correlation "
        "with a spread near 0 is a collapsed policy's rounding, not a learned dependence); last column: α + β at "
        "the end of the first run.",
        "",
    ]
    cells = frame[["noise", "batch"]].drop_duplicates().sort_values(["batch", "noise"]).itertuples(index=False)
    cells = list(cells)
    header = "| setting | " + " | ".join(f"σ={c.noise:g}, B={c.batch}" for c in cells) + " | α+β |"
    lines += [header, "|" + "---|" * (len(cells) + 2)]
    for name in frame["setting"].unique():
        cells_text, last = [], None
        for c in cells:
            sub = frame[(frame.setting == name) & (frame.noise == c.noise) & (frame.batch == c.batch)].set_index(
                "update"
            )
            end = sub.loc[checkpoints[-1]]
            cells_text.append(
                " / ".join(f"{sub.loc[u, 'corr']:+.2f}" for u in shown) + f" ({end['r2']:+.2f}, {end['spread']:.2f})"
            )
            if last is None:
                last = sub.loc[checkpoints[-1], "concentration"]
        lines.append(f"| {name} | " + " | ".join(cells_text) + f" | {last:.0f} |")
    return lines


def replace_block(report: Path, lines: list[str], begin: str = BEGIN, end: str = END) -> None:
    """Rewrite the part of ``report`` between the markers (appending them at the end if absent)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import shapes_sweep

    text = report.read_text()
    if begin not in text:
        report.write_text(text.rstrip() + f"\n\n{begin}\n{end}\n")
    shapes_sweep.replace_block(report, begin, end, lines)


def command_line(script: str, argv: list[str] | None) -> str:
    """How a harness was run, for its report: ``PYTHONPATH=. .venv/bin/python benchmarks/SCRIPT ARGS``."""
    return f"PYTHONPATH=. .venv/bin/python benchmarks/{script} " + " ".join(sys.argv[1:] if argv is None else argv)


def publish(frame, lines: list[str], *, out: Path | None, csv: str, report: Path | None, begin: str, end: str) -> None:
    """A harness's results: ``frame`` as OUT/``csv`` (when ``out``), ``lines`` printed and put between the markers of
    ``report`` (when given)."""
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        frame.to_csv(out / csv, index=False, float_format="%.4f")
    print("\n".join(lines))
    if report is not None:
        replace_block(report, lines, begin, end)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", type=Path, help="a shapes pretraining run (its last epoch's embeddings and its world)")
    source.add_argument("--synthetic", action="store_true", help="the synthetic concept world (no run needed)")
    parser.add_argument("--target", choices=TARGETS, default="density", help="the known optimum q* (default density)")
    parser.add_argument("--width", type=int, default=320, help="|M|: pairs per search space (default 320)")
    parser.add_argument("--updates", type=int, default=3000)
    parser.add_argument("--every", type=int, default=250)
    parser.add_argument("--batches", type=int, nargs="+", default=[32])
    parser.add_argument("--noise", type=float, nargs="+", default=[0.0, 1.0, 3.0])
    parser.add_argument("--common", type=float, default=3.0, help="the batch-wide shock (signal std units)")
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS), metavar="NAME")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--report", type=Path, default=None)
    args = parser.parse_args(argv)

    start = time.time()
    settings = {name: SETTINGS[name] for name in args.settings}
    keys = list(dict.fromkeys((s.features, s.temperature) for s in settings.values()))
    anchors = (
        synthetic_anchors(keys, seed=args.seed)
        if args.synthetic
        else shapes_run_anchors(args.run, args.width, keys, seed=args.seed)
    )
    anchors.target = args.target
    ceilings = {key: supervised_ceiling(anchors, key) for key in keys}
    for key, value in ceilings.items():
        print(f"supervised ceiling {'+'.join(key[0])} τ={key[1]:g}: r2 {value:.3f}", flush=True)
    rows = []
    for name, setting in settings.items():
        for batch in args.batches:
            for noise in args.noise:
                trace = run_bandit(
                    anchors,
                    setting,
                    updates=args.updates,
                    batch=batch,
                    noise=noise,
                    common=args.common,
                    every=args.every,
                    seed=args.seed,
                )
                rows += [{"setting": name, "batch": batch, "noise": noise, **r} for r in trace]
                end = trace[-1]
                print(
                    f"{name:34s} B={batch:3d} σ={noise:<4g} r2 {end['r2']:+.3f} corr {end['corr']:+.3f} "
                    f"gap {end['gap']:.3f} α+β {end['concentration']:.1f}",
                    flush=True,
                )
    seconds = time.time() - start
    command = "PYTHONPATH=. .venv/bin/python benchmarks/scheduler_bandit.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    where = "synthetic concepts" if args.synthetic else f"{args.run}"
    lines = markdown(rows, ceilings, anchors, command, where, seconds)
    if args.out is not None:
        import pandas as pd

        args.out.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).to_csv(args.out / "bandit.csv", index=False)
        (args.out / "bandit.md").write_text("\n".join(lines) + "\n")
    if args.report is not None:
        replace_block(args.report, lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
