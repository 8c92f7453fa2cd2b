"""The shapes-world method comparison: every method × seed on one world, one budget, one evaluation.

    PYTHONPATH=. .venv/bin/python benchmarks/shapes_sweep.py --out runs/sweep --report docs/results.md  # the full sweep
    PYTHONPATH=. .venv/bin/python benchmarks/shapes_sweep.py --out /tmp/sweep --quick                 # ~8-minute smoke
    PYTHONPATH=. .venv/bin/python benchmarks/shapes_sweep.py --out runs/sweep --only falcon grit --seeds 0 1 2

Each (method, seed) is a shipped shapes recipe run with the same world and budget overrides
(``falcon run``), then scored the same way: zero-shot ITC retrieval with the oracle's
false-negative-aware metrics (``falcon evaluate retrieval --itc-only``) and the oracle's
false-negative rate of the negatives the run actually used (``falcon audit-false-negatives
--judge oracle``). GRIT and FALCON also run at a small and a large search space |M| (the paper's
Table 4 / Table 7). Runs go ``--jobs`` at a time (default 2, one torch thread each on the 2-core
machine: 1.3x the throughput of one two-thread run), SRCL after its seed's uniform run (its
auxiliary model). The sweep is resumable and can run in the background: a run whose three parts
are complete is skipped, so running the command again after a stop continues it.

Writes to OUT: ``results.csv`` (one row per run), ``summary.csv``/``summary.md`` (mean ± std over
seeds), ``space_sweep.md`` and the figures ``r1_vs_time.png``, ``fn_rate_by_step.png``,
``q_distribution.png``, ``space_sweep.png``. ``--report docs/results.md`` also rewrites the generated
part of that page (between its ``sweep:begin``/``sweep:end`` markers, keeping the hand-written
analysis around it) and copies the tables and figures to ``docs/results/``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

METHODS: dict[str, str] = {
    "uniform": "shapes-uniform",
    "grit": "shapes-grit",
    "q0": "shapes-q0",
    "q05": "shapes-q05",
    "hardening": "shapes-hardening",
    "softening": "shapes-softening",
    "mafa": "shapes-mafa",
    "srcl": "shapes-srcl",  # its auxiliary model is this seed's uniform run
    "diht": "shapes-diht",
    "glofnd": "shapes-glofnd",
    "falcon": "shapes-falcon",
    "falcon-batch": "shapes-falcon-batch-level",
    "falcon-itc-itm": "shapes-falcon-reward-itc-itm",
    "falcon-baseline": "shapes-falcon-ema",
}
"""Method name -> its shipped shapes recipe (every method the issue lists)."""

FIXES: dict[str, tuple[str, list[str]]] = {
    "falcon-ema-lr1e-2": ("shapes-falcon-ema", ["pretrain.scheduler.lr=1e-2"]),
    "falcon-itc-itm-ema-lr1e-2": (
        "shapes-falcon-reward-itc-itm",
        ["pretrain.scheduler.update.baseline=ema", "pretrain.scheduler.lr=1e-2"],
    ),
}
"""Variants that the analysis pointed to (docs/results.md). First: FALCON's q distribution did not move in its
164 scheduler steps and its reward was positive at most steps, so REINFORCE without a baseline reinforces
whatever q was drawn; the fix is the EMA reward baseline (centred advantages) and a 10x larger scheduler step.
Second: with that fix the scheduler learns, but from the MLM reward, which does not see false negatives (on
seed 0 it drifted towards q = 1, GRIT's schedule); the same fix with the ITC+ITM reward, the loss that false
negatives enter."""

SPACE_SWEEP = ("grit", "falcon")
"""Methods also run at the small and large |M| (Table 4 top, Table 7)."""

FIXED_Q = {"uniform": "uniform (no chain)", "q0": "q = 0", "q05": "q = 0.5", "grit": "q = 1 (GRIT)"}
"""Runs of Figure 2 (top left): FN rate of the used negatives against the step, per quantile."""


SPLITS = {"train": 0.5, "val": 0.05, "test": 0.45}
"""The world's split fractions: a large zero-shot test split (the test images cost no training)."""


@dataclass(frozen=True)
class Budget:
    """One world and compute budget for every run of a sweep."""

    images: int
    """Images of the generated world (split by :data:`SPLITS`)."""
    epochs: int
    batch: int
    spaces: dict[str, int] = field(default_factory=dict)
    """|M| by label; ``medium`` is the main runs' (the others: GRIT and FALCON only)."""
    size: int = 32
    """Image side in pixels, of the world and of the model's input (32: 16 patches of albef-tiny's 8-pixel grid)."""
    extra_seeds: int = 1
    """The |M| sweep and the fix variants run at this many of the sweep's seeds (the first ones)."""
    warmup: int = 10
    audit_pairs: int = 20000
    step_windows: int = 10
    """Training-step windows of the audit (the x axis of the FN-rate-by-step figure)."""

    def world_args(self, out: Path) -> list[str]:
        """``falcon data shapes`` arguments for the sweep's world (made once, before the runs start)."""
        return [
            "data",
            "shapes",
            "--out",
            str(out / "world"),
            "--images",
            str(self.images),
            "--size",
            str(self.size),
            *(f"splits.{split}={fraction}" for split, fraction in SPLITS.items()),
        ]

    def overrides(self, out: Path) -> list[str]:
        """The overrides every run of the sweep gets (world, budget, audit windows)."""
        return [
            f"data.dataset={out / 'world'}",
            f"data.shapes.images={self.images}",
            f"data.shapes.size={self.size}",
            *(f"data.shapes.splits.{split}={fraction}" for split, fraction in SPLITS.items()),
            f"pretrain.encoders.image_size={self.size}",
            f"pretrain.epochs={self.epochs}",
            f"pretrain.batch_size={self.batch}",
            f"pretrain.composer.search_space_size={self.spaces['medium']}",
            f"pretrain.optim.warmup_steps={self.warmup}",
            "pretrain.loader.num_workers=0",
            "pretrain.eval.split=test",
            f"audit.step_windows={self.step_windows}",
        ]


FULL = Budget(images=700, epochs=4, batch=32, spaces={"small": 64, "medium": 350, "large": 1750})
"""The full sweep: 350 training images (1,750 pairs) of 32 pixels, 4 epochs (219 steps: a from-scratch albef-tiny
needs about 200 to leave the uniform-ITC plateau; 3 epochs of 1,000 pairs never did), |M| 64 / 350 / 1,750 (one
space per epoch) and the two fix variants at the first seed: 48 runs at 3 seeds, under 2 hours on 2 cores (64-pixel
images cost 1.4x more per run and made the sweep of 60 runs, everything at 3 seeds, 3 hours)."""
QUICK = Budget(images=200, epochs=3, batch=16, spaces={"medium": 100}, warmup=5, audit_pairs=2000, step_windows=6)
"""--quick: 100 training images, 3 short epochs, one seed, no |M| sweep (about 8 minutes on 2 cores): a smoke
test of the whole pipeline; its models stay near chance."""


@dataclass(frozen=True)
class Variant:
    """One trained configuration: a method at one |M|."""

    method: str
    space: str = "medium"

    @property
    def name(self) -> str:
        return self.method if self.space == "medium" else f"{self.method}@M-{self.space}"


def plan(budget: Budget, seeds: list[int], only: list[str] | None) -> list[tuple[Variant, int]]:
    """The sweep's (configuration, seed) pairs in run order: the methods at every seed (a seed's uniform run before
    its SRCL run), then the |M| sweep and the fixes (not with --quick) at the first ``budget.extra_seeds`` seeds."""
    methods = list(only or [*METHODS, *FIXES])
    if "srcl" in methods and "uniform" not in methods:
        methods.insert(0, "uniform")  # SRCL's auxiliary model
    out = [(Variant(m), seed) for seed in seeds for m in METHODS if m in methods]
    out += [
        (Variant(m, s), seed)
        for seed in seeds[: budget.extra_seeds]
        for m in SPACE_SWEEP
        if m in methods
        for s in budget.spaces
        if s != "medium"
    ]
    if budget is not QUICK:
        out += [(Variant(m), seed) for seed in seeds[: budget.extra_seeds] for m in FIXES if m in methods]
    return out


def falcon_env(threads: int, preload: str | None = None) -> dict[str, str]:
    """The whole environment of a sweep's ``falcon`` process: nothing of the caller's but ``PATH``, ``HOME`` and the
    libraries preloaded (``preload``, else the caller's ``LD_PRELOAD``): a memory allocator such as tcmalloc changes a
    CPU run's speed, never its numbers (benchmarks/cpu_allocator.py)."""
    env = {
        "PYTHONPATH": str(REPO),
        "FALCON_PROGRESS": "0",
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "HOME": os.environ.get("HOME", "/tmp"),
    }
    preload = os.environ.get("LD_PRELOAD", "") if preload is None else preload
    if preload:
        env["LD_PRELOAD"] = preload
    return env


def falcon(*args: str, log: Path, threads: int, preload: str | None = None) -> None:
    """Run ``falcon ARGS`` (appending its output to ``log``) in :func:`falcon_env`; raise with the log's tail on
    failure."""
    env = falcon_env(threads, preload)
    with log.open("a") as out:
        out.write(f"\n$ falcon {' '.join(args)}\n")
        out.flush()
        proc = subprocess.run(
            [sys.executable, "-m", "falcon_cli", *args], cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env
        )
    if proc.returncode != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-15:])
        raise RuntimeError(f"falcon {' '.join(args)} failed (exit {proc.returncode}); {log}:\n{tail}")


def train(run: Path, recipe: str, *overrides: str, log: Path, threads: int) -> None:
    """``falcon run --recipe RECIPE --run-dir RUN OVERRIDES``: continued from its latest checkpoint where an interrupted
    sweep left one (``--resume``: a sweep stopped after 30 of a run's 36 epochs loses one epoch, not 30), from the
    start otherwise or when the resume is refused, e.g. because the run in RUN had another config (``--overwrite``)."""
    args = ("run", "--recipe", recipe, "--run-dir", str(run), *overrides)
    if (run / "checkpoints" / "latest").exists():
        try:
            return falcon(*args, "--resume", log=log, threads=threads)
        except RuntimeError:
            with log.open("a") as out:
                out.write("\n(the resume failed: training again from the start)\n")
    falcon(*args, "--overwrite", log=log, threads=threads)


EVALUATED, AUDITED = Path("results/retrieval.json"), Path("audit/summary.json")
"""What `falcon evaluate retrieval` and `falcon audit-false-negatives` leave in a run when done."""


def finished(run: Path) -> bool:
    """All three parts of a run are done (trained, evaluated, audited)."""
    return completed(run, "pretrain") and (run / EVALUATED).exists() and (run / AUDITED).exists()


def completed(run: Path, stage: str) -> bool:
    """The run's manifest records ``stage`` as completed."""
    manifest = run / "manifest.json"
    return (
        manifest.exists()
        and json.loads(manifest.read_text()).get("stages", {}).get(stage, {}).get("status") == "completed"
    )


def run_one(
    variant: Variant,
    seed: int,
    out: Path,
    budget: Budget,
    threads: int,
    waits: dict,
    recipe: tuple[str, list[str]] | None = None,
) -> dict:
    """Train, evaluate and audit one (variant, seed), skipping the parts already done; its row of numbers.
    ``recipe``: (recipe name, extra overrides) of a method outside :data:`METHODS` and :data:`FIXES`."""
    run = out / "runs" / f"{variant.name}-s{seed}"
    log = out / "logs" / f"{variant.name}-s{seed}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    recipe, extra = recipe or FIXES.get(variant.method, (METHODS.get(variant.method), []))
    overrides = [f"seed={seed}", *budget.overrides(out), *extra]
    if variant.space != "medium":
        overrides.append(f"pretrain.composer.search_space_size={budget.spaces[variant.space]}")
    if variant.method == "srcl":
        waits[("uniform", seed)].result()  # the auxiliary model must be trained first
        overrides.append(f"embed.encoder=falcon:{out / 'runs' / f'uniform-s{seed}'}")
    if not completed(run, "pretrain"):
        train(run, recipe, *overrides, log=log, threads=threads)
    if not (run / EVALUATED).exists():
        falcon("evaluate", "retrieval", str(run), "--itc-only", log=log, threads=threads)
    if not (run / AUDITED).exists():
        falcon(
            "audit-false-negatives",
            str(run),
            "--judge",
            "oracle",
            "--max-pairs",
            str(budget.audit_pairs),
            log=log,
            threads=threads,
        )
    return collect(variant, seed, run)


def collect(variant: Variant, seed: int, run: Path) -> dict:
    """One run's numbers: retrieval (standard and oracle), FN rate of the used negatives, time per epoch."""
    from falcon_cli.artifacts.renamed_keys import upgrade_stored  # (lazy, as this script's other falcon imports)

    manifest = json.loads((run / "manifest.json").read_text())
    stage = manifest["stages"]["pretrain"]
    seconds = _seconds(stage["start"], stage["end"])
    config = upgrade_stored(manifest["config"], "a run's manifest")["pretrain"]
    retrieval = json.loads((run / EVALUATED).read_text())["rows"][0]
    audit = {row["kind"]: row for row in json.loads((run / AUDITED).read_text())["overall"]}
    row = {
        "method": variant.name,
        "base_method": variant.method,
        "space": variant.space,
        "search_space_size": config["composer"]["search_space_size"],
        "seed": seed,
        "pretrain_seconds": seconds,
        "seconds_per_epoch": seconds / config["epochs"],
    }
    for key in (
        "i2t_R@1",
        "i2t_R@5",
        "i2t_R@10",
        "t2i_R@1",
        "t2i_R@5",
        "t2i_R@10",
        "mean_R",
        "oracle_i2t_R@1",
        "oracle_i2t_R@5",
        "oracle_i2t_R@10",
        "oracle_t2i_R@1",
        "oracle_t2i_R@5",
        "oracle_t2i_R@10",
        "oracle_i2t_R-P",
        "oracle_t2i_R-P",
        "oracle_i2t_mAP@R",
        "oracle_t2i_mAP@R",
    ):
        row[key] = retrieval.get(key, float("nan"))
    for kind in ("chain", "itm", "all"):
        if kind in audit:
            row[f"fn_rate_{kind}"] = 100.0 * audit[kind]["oracle_rate"]
    row["R@1"] = (row["i2t_R@1"] + row["t2i_R@1"]) / 2
    row["oracle_R@1"] = (row["oracle_i2t_R@1"] + row["oracle_t2i_R@1"]) / 2
    return row


def _seconds(start: str, end: str) -> float:
    from datetime import datetime

    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


# --- tables ----------------------------------------------------------------------------------------

TABLES: dict[str, list[tuple[str, str]]] = {
    "Standard zero-shot retrieval (ITC; %)": [
        ("R@1", "R@1 (mean)"),
        ("i2t_R@1", "i2t R@1"),
        ("i2t_R@5", "i2t R@5"),
        ("i2t_R@10", "i2t R@10"),
        ("t2i_R@1", "t2i R@1"),
        ("t2i_R@5", "t2i R@5"),
        ("t2i_R@10", "t2i R@10"),
    ],
    "False-negative-aware retrieval (every item the oracle says truly matches is a positive; %)": [
        ("oracle_R@1", "R@1 (mean)"),
        ("oracle_i2t_R@1", "i2t R@1"),
        ("oracle_i2t_R@5", "i2t R@5"),
        ("oracle_i2t_R@10", "i2t R@10"),
        ("oracle_t2i_R@1", "t2i R@1"),
        ("oracle_t2i_R@5", "t2i R@5"),
        ("oracle_t2i_R@10", "t2i R@10"),
        ("oracle_i2t_R-P", "i2t R-P"),
        ("oracle_t2i_R-P", "t2i R-P"),
    ],
    "Negatives actually used, and time": [
        ("fn_rate_chain", "FN % (chain)"),
        ("fn_rate_itm", "FN % (ITM)"),
        ("seconds_per_epoch", "s / epoch"),
    ],
}
"""The summary tables: title -> [(results.csv key, header)]."""


def seeds_phrase(seeds) -> str:
    """``seed 0`` or ``seeds 0, 1``: the seeds a table, figure or report line averages, sorted and distinct."""
    seeds = sorted({int(s) for s in seeds})
    return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(map(str, seeds))


def space_sweep_rows(table):
    """The |M| sweep's runs: GRIT and FALCON at every |M|, at the seeds where the small or large |M| ran (so that
    every |M| averages the same seeds)."""
    rows = table[table["base_method"].isin(SPACE_SWEEP)]
    return rows[rows["seed"].isin(rows.loc[rows["space"] != "medium", "seed"].unique())]


def summarise(table, out: Path):
    """``results.csv``, ``summary.csv`` / ``summary.md`` (mean ± std over seeds), ``space_sweep.md``."""
    table.to_csv(out / "results.csv", index=False, float_format="%.4f")
    columns = [key for group in TABLES.values() for key, _ in group if key in table]
    grouped = table.groupby("method", sort=False)[columns]
    mean, std, seeds = grouped.mean(), grouped.std().fillna(0.0), grouped.size()
    summary = mean.join(std.add_suffix("_std")).assign(seeds=seeds)
    summary.to_csv(out / "summary.csv", float_format="%.4f")
    main = [m for m in mean.index if "@M-" not in m]
    (out / "summary.md").write_text(
        "\n".join(f"**{title}**\n\n" + _markdown(mean, std, seeds, main, group) for title, group in TABLES.items())
    )

    sweep = space_sweep_rows(table)
    lines = [
        "| method | |M| | seeds | R@1 | FN-aware i2t R@1 | FN-aware t2i R@1 | FN % (chain) | s / epoch |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (method, size), rows in sweep.groupby(["base_method", "search_space_size"]):
        cells = [
            _cell(rows[c].mean(), rows[c].std())
            for c in ("R@1", "oracle_i2t_R@1", "oracle_t2i_R@1", "fn_rate_chain", "seconds_per_epoch")
        ]
        lines.append(f"| {method} | {size} | {len(rows)} | " + " | ".join(cells) + " |")
    (out / "space_sweep.md").write_text("\n".join(lines) + "\n")
    return mean, std, seeds


def _cell(mean: float, std: float) -> str:
    if mean != mean:
        return "—"  # the method has no such negatives (no chain without a quantile composer)
    return f"{mean:.1f} ± {0.0 if std != std else std:.1f}"


def _markdown(mean, std, seeds, methods, group: list[tuple[str, str]]) -> str:
    group = [(key, header) for key, header in group if key in mean]
    lines = [
        "| method | seeds | " + " | ".join(header for _, header in group) + " |",
        "|---|---|" + "---|" * len(group),
    ]
    for method in methods:
        lines.append(
            f"| {method} | {seeds[method]} | "
            + " | ".join(_cell(mean.loc[method, key], std.loc[method, key]) for key, _ in group)
            + " |"
        )
    return "\n".join(lines) + "\n"


# --- figures ---------------------------------------------------------------------------------------


def figures(table, out: Path, mean, std) -> list[Path]:
    """R@1 vs time (Fig. 6), FN rate vs step per quantile (Fig. 2), FALCON's q over training, the |M| sweep."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    import pandas as pd

    from falcon_cli.reporting.figures import _save_png as save_png  # atomic PNG writer
    from falcon_cli.sampling.batch_log import read_batch_log

    paths = []
    main = [m for m in mean.index if "@M-" not in m]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, method in enumerate(main):  # 14 methods: colours repeat after 10, markers tell them apart
        ax.errorbar(
            mean.loc[method, "seconds_per_epoch"],
            mean.loc[method, "R@1"],
            yerr=std.loc[method, "R@1"],
            xerr=std.loc[method, "seconds_per_epoch"],
            fmt="osD^vP*Xhp<>d8"[i % 14],
            color=f"C{i % 10}",
            capsize=3,
            label=method,
        )
    ax.set(
        xlabel="seconds per pretraining epoch",
        ylabel="zero-shot R@1 (mean of i2t, t2i; %)",
        title="R@1 against training time (mean ± std over seeds)",
    )
    ax.legend(fontsize=7, ncol=2)
    paths.append(save_png(fig, out / "r1_vs_time.png"))
    plt.close(fig)

    # Figure 2 (top left): the oracle FN rate of the used negatives against the step, per fixed quantile.
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    world = out / "world" / "world.json"
    density = json.loads(world.read_text())["statistics"]["false_negative_density"]["train"] if world.exists() else None
    for ax, kind, title in zip(
        axes, ("chain", "itm"), ("negatives the composer chose (chain)", "hardest in-batch ITM negatives")
    ):
        if density is not None:
            ax.axhline(
                100 * density["mean_fraction_of_split"], color="grey", linestyle=":", label="a random negative (world)"
            )
        for color, (method, label) in enumerate(FIXED_Q.items()):
            frames = [
                pd.read_csv(path) for path in sorted((out / "runs").glob(f"{method}-s*/audit/fn_rate_by_step.csv"))
            ]
            frames = [f[f["kind"] == kind] for f in frames]
            frames = [f for f in frames if len(f)]
            if not frames:
                continue
            both = (
                pd.concat(frames)
                .groupby("window")
                .agg(step=("last_step", "mean"), rate=("rate", "mean"), sd=("rate", "std"))
            )
            ax.errorbar(
                both["step"],
                100 * both["rate"],
                yerr=100 * both["sd"].fillna(0),
                marker="o",
                capsize=2,
                label=label,
                color=f"C{color}",
            )
        ax.set(xlabel="training step (end of window)", title=title)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("oracle false-negative rate (%)")
    paths.append(save_png(fig, out / "fn_rate_by_step.png"))
    plt.close(fig)

    # FALCON's q distribution over training: per step, the median and 10-90% band of the q it drew.
    falcon_methods = [m for m in main if m.startswith("falcon")]
    if falcon_methods:
        fig, axes = plt.subplots(
            1, len(falcon_methods), figsize=(3.2 * len(falcon_methods), 3.4), sharey=True, squeeze=False
        )
        for ax, method in zip(axes[0], falcon_methods):
            logs = [read_batch_log(p) for p in sorted((out / "runs").glob(f"{method}-s*/batches.parquet"))]
            q = pd.concat([log[log["sampler"] == "falcon"][["epoch", "step", "q"]] for log in logs]).dropna()
            if len(q):  # (epoch, step) in order: the batch log's step counts within an epoch
                by_step = q.groupby(["epoch", "step"])["q"]
                per_step = by_step.quantile([0.1, 0.5, 0.9]).unstack()
                x = np.arange(len(per_step))
                ax.fill_between(x, per_step[0.1], per_step[0.9], alpha=0.3, label="10–90%")
                ax.plot(x, per_step[0.5], label="median")
                ax.plot(x, by_step.mean().to_numpy(), "--", label="mean")
                for start in np.flatnonzero(np.diff(per_step.index.get_level_values("epoch"))) + 1:
                    ax.axvline(start, color="grey", linewidth=0.5)  # epoch boundaries
            ax.set(title=method, xlabel="FALCON step (epochs 1–3)", ylim=(0, 1))
        axes[0][0].set_ylabel("q drawn per anchor (all seeds)")
        axes[0][0].legend(fontsize=7, loc="upper right")
        fig.tight_layout()
        paths.append(save_png(fig, out / "q_distribution.png"))
        plt.close(fig)

    sweep = space_sweep_rows(table)
    if sweep["space"].nunique() > 1:
        fig, ax = plt.subplots(figsize=(5, 3.6))
        for method, rows in sweep.groupby("base_method"):
            stats = rows.groupby("search_space_size")["R@1"].agg(["mean", "std"])
            ax.errorbar(stats.index, stats["mean"], yerr=stats["std"].fillna(0), marker="o", capsize=3, label=method)
        ax.set(
            xscale="log",
            xlabel="search space size |M| (pairs)",
            ylabel="zero-shot R@1 (%)",
            title=f"search-space size sweep ({seeds_phrase(sweep['seed'])})",
        )
        ax.set_xticks(
            sorted(sweep["search_space_size"].unique()), [str(v) for v in sorted(sweep["search_space_size"].unique())]
        )
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(save_png(fig, out / "space_sweep.png"))
        plt.close(fig)
    return paths


REWARD_HEADER = (
    "| variant | seeds | reward mean | reward std | reward > 0 | corr(batch mean q, reward) | "
    "mean q, first FALCON epoch | mean q, last epoch |\n|---|---|---|---|---|---|---|---|\n"
)


def reward_table(out: Path) -> str:
    """Why FALCON learns what it learns: its reward signal and how far its q moved, per FALCON variant (all seeds).

    From each run's last checkpoint (the last epoch's per-step rewards Δ) and ``batches.parquet``
    (the q drawn per anchor); see :func:`reward_row` for the columns.
    """
    rows = []
    for method in [m for m in [*METHODS, *FIXES] if m.startswith("falcon")]:
        records = [
            r for r in (_reward_record(run) for run in sorted((out / "runs").glob(f"{method}-s*"))) if r is not None
        ]
        if records:
            rows.append(reward_row(method, records))
    return REWARD_HEADER + "".join(rows)


def _reward_record(run: Path) -> dict | None:
    """One FALCON run's last-epoch rewards and per-step mean q, and its mean q in the first and last FALCON epoch."""
    from falcon_cli.runtime.checkpoint import load_rank_state
    from falcon_cli.sampling.batch_log import read_batch_log

    latest = run / "checkpoints" / "latest"
    if not latest.exists() or not (run / "batches.parquet").exists():
        return None
    mine = load_rank_state(run / "checkpoints" / latest.read_text().strip(), 0)
    rewards = mine["falcon"]["rewards"] if "falcon" in mine else mine["rewards"]  # (checkpoints before TrainState)
    log = read_batch_log(run / "batches.parquet")
    log = log[log["sampler"] == "falcon"]
    epochs = sorted(log["epoch"].unique())
    if not len(rewards) or not epochs:
        return None
    last = log[log["epoch"] == epochs[-1]]
    return {
        "rewards": rewards,
        "step_q": last.groupby("step")["q"].mean().to_numpy()[-len(rewards) :],
        "first_q": float(log[log["epoch"] == epochs[0]]["q"].mean()),
        "last_q": float(last["q"].mean()),
    }


def reward_row(method: str, records: list[dict]) -> str:
    """The reward's mean and std over all steps, the share of positive rewards (without a baseline
    REINFORCE raises the probability of whatever q was drawn whenever Δ > 0), the mean over runs of the
    correlation across steps between a batch's mean q and its reward, and the mean q in the first and
    last FALCON epoch (has the scheduler moved?)."""
    import numpy as np

    rewards = np.concatenate([np.asarray(r["rewards"], dtype=float) for r in records])
    corrs = [
        float(np.corrcoef(r["step_q"], r["rewards"])[0, 1])
        for r in records
        if len(r["step_q"]) == len(r["rewards"]) and np.std(r["rewards"]) > 0 and np.std(r["step_q"]) > 0
    ]
    corr = f"{np.mean(corrs):+.2f}" if corrs else "—"
    return (
        f"| {method} | {len(records)} | {rewards.mean():.4f} | {rewards.std():.4f} | "
        f"{100 * (rewards > 0).mean():.0f}% | "
        f"{corr} | {np.mean([r['first_q'] for r in records]):.3f} | {np.mean([r['last_q'] for r in records]):.3f} |\n"
    )


# --- the report ------------------------------------------------------------------------------------

BEGIN, END = "<!-- sweep:begin -->", "<!-- sweep:end -->"
CODE = ("falcon_cli", "stages", "recipes")
"""What trains a run: the report says whether the runs' commits agree on these."""


def write_report(
    report: Path,
    out: Path,
    table,
    budget: Budget,
    seeds: list[int],
    command: str,
    paths: list[Path],
    planned: int | None = None,
    jobs: int = 2,
) -> None:
    """Rewrite ``report``'s generated block (tables, world, command, commit) and copy artifacts to
    ``report.parent/results/``."""
    assets = report.parent / "results"
    assets.mkdir(parents=True, exist_ok=True)
    for name in ("results.csv", "summary.csv"):
        shutil.copyfile(out / name, assets / name)
    for path in paths:
        shutil.copyfile(path, assets / path.name)
    world = json.loads((out / "world" / "world.json").read_text())
    density, images, captions = (
        world["statistics"]["false_negative_density"],
        world["counts"]["images"],
        world["counts"]["captions"],
    )
    names = [f"{method}-s{seed}" for method, seed in zip(table["method"], table["seed"])]  # the runs in the tables
    manifests = [json.loads((out / "runs" / name / "manifest.json").read_text()) for name in names]
    commits = sorted(
        {
            f"`{(m['git']['sha'] or 'unknown')[:7]}`" + (" (uncommitted changes)" if m["git"]["dirty"] else "")
            for m in manifests
        }
    )
    shas = sorted({m["git"]["sha"] for m in manifests if m["git"]["sha"]})
    # The sweep may span commits that touch only docs, benchmarks or layout (whitespace does not change a number).
    same_code = all(
        subprocess.run(
            ["git", "diff", "--quiet", "--ignore-all-space", "--ignore-blank-lines", shas[0], sha, "--", *CODE],
            cwd=REPO,
        ).returncode
        == 0
        for sha in shas[1:]
    )
    agreement = (
        (
            f" (the same {', '.join(CODE)} at all of them, up to whitespace)"
            if same_code
            else f" ({', '.join(CODE)} differ between them)"
        )
        if len(shas) > 1
        else ""
    )
    # Compute, not the calendar: a resumed sweep's first start to last end would count the pauses between parts.
    compute = sum(_seconds(m["created"], m["end"]) for m in manifests)  # each run: created -> its audit's end
    space = space_sweep_rows(table)
    extra = space[space["space"] != "medium"]  # the small and large |M| runs in the tables
    others, space_seeds = ", ".join(map(str, sorted(extra["search_space_size"].unique()))), extra["seed"]
    fix_seeds = table.loc[table["base_method"].isin(FIXES), "seed"]
    in_progress = (
        f" of the {planned} planned (the sweep is still in progress)" if planned and planned > len(manifests) else ""
    )
    train, test = density["train"], density["test"]
    block = [
        "<!-- Generated by benchmarks/shapes_sweep.py --report; edit outside the markers. -->",
        "",
        f"**Command:** `{command}`  ",
        f"**Commits** (from the runs' manifests): {', '.join(commits)}"
        f"{agreement}; {platform.machine()}, "
        f"{os.cpu_count()} CPU cores, {jobs} runs at a time with {max(1, (os.cpu_count() or 1) // jobs)} "
        "torch thread(s) each; "
        f"{len(manifests)} runs{in_progress}; "
        f"{compute / 3600:.1f} run-hours (each run from its start to its audit's end), "
        f"about {compute / 3600 / jobs:.1f} h of wall-clock at {jobs} at a time.  ",
        f"**World:** {images['total']} shapes images (seed 0): {images['train']} train ({captions['train']} pairs), "
        f"{images['test']} zero-shot test images ({captions['test']} captions).  ",
        f"**False-negative density:** a train caption truly describes {train['mean']:.1f} of the split's images on "
        f"average (median {train['median']:.0f}); a uniformly drawn in-batch negative is a false negative "
        f"{100 * train['mean_fraction_of_split']:.1f}% of the time; "
        f"{100 * train['fraction_with_false_negatives']:.0f}% "
        f"of train captions have at least one. On test: {100 * test['mean_fraction_of_split']:.1f}%.  ",
        f"**Budget (every run):** albef-tiny from scratch on {budget.size}-pixel images, {budget.epochs} epochs, "
        f"batch {budget.batch}, |M| {budget.spaces['medium']}"
        f"{f' (GRIT and FALCON also {others}, at {seeds_phrase(space_seeds)})' if len(space_seeds) else ''}, "
        f"seeds {', '.join(map(str, seeds))}"
        f"{f'; the fix variants at {seeds_phrase(fix_seeds)}' if len(fix_seeds) else ''}; "
        "epoch 0 is uniform for the hard-negative methods, as in the recipes.",
        "",
        "### Every method (mean ± std over seeds)",
        "",
        "R@K in percent on the zero-shot test split, ranked by ITC similarity; *R@1 (mean)* averages i2t and t2i. "
        "*FN % (chain)*: the oracle's false-negative rate among the negatives the composer put next to each anchor "
        "(— for methods without a quantile chain); *FN % (ITM)*: among each anchor's hardest in-batch ITM negative. "
        f"*s / epoch*: pretraining wall-clock per epoch, {jobs} run(s) at a time on the machine above.",
        "",
        (out / "summary.md").read_text().rstrip(),
        "",
    ]
    if table["space"].nunique() > 1:
        block += ["### Search-space size |M| (GRIT and FALCON)", "", (out / "space_sweep.md").read_text().rstrip(), ""]
    if (out / "falcon_rewards.md").exists():
        block += [
            "### FALCON's reward and q (last epoch's steps, all seeds)",
            "",
            (out / "falcon_rewards.md").read_text().rstrip(),
            "",
        ]
    for path in paths:
        block += [f"![{path.stem}](results/{path.name})", ""]
    block += [
        "Per-run numbers: [results/results.csv](results/results.csv); means and standard deviations: "
        "[results/summary.csv](results/summary.csv)."
    ]
    replace_block(report, BEGIN, END, block)


def finished_futures(futures: dict, failures: list[str]):
    """``(key, result)`` of each future, in the dict's order, as each finishes; a failed one is printed and added to
    ``failures`` (``"<key> : <error>"``) so the other runs go on and every failure is reported at the end."""
    for key, future in futures.items():
        try:
            yield key, future.result()
        except Exception as exc:
            name = " ".join(map(str, key)) if isinstance(key, tuple) else str(key)
            failures.append(f"{name}: {exc}")
            print(f"FAILED {name}: {exc}", file=sys.stderr, flush=True)


def replace_block(report: Path, begin: str, end: str, lines: list[str]) -> None:
    """Rewrite the part of ``report`` between the markers ``begin`` and ``end`` with ``lines`` (atomically)."""
    from falcon_cli.artifacts.atomic import atomic_open

    text = report.read_text() if report.exists() else f"# Results\n\n{begin}\n{end}\n"
    if begin not in text or end not in text:
        raise SystemExit(f"{report}: no {begin} ... {end} block to replace; add the two markers where the tables go")
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    with atomic_open(report) as f:
        f.write(head + "\n".join([begin, *lines, end]) + tail)


def sweep_parser(description: str, choices: list[str], block: str) -> argparse.ArgumentParser:
    """The options every sweep script shares: --out, --seeds, --only (one of ``choices``), --jobs, --report (its
    ``block`` of a page)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="Sweep directory (world, runs, logs, tables, figures).")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--only", nargs="+", choices=choices, help="A subset of the methods.")
    parser.add_argument("--jobs", type=int, default=2, help="Runs at a time (each gets cores / jobs torch threads).")
    parser.add_argument("--report", type=Path, help=f"Also rewrite this page's {block} block (e.g. docs/results.md).")
    return parser


def main() -> None:
    import pandas as pd

    parser = sweep_parser(__doc__, [*METHODS, *FIXES], "sweep")
    parser.add_argument(
        "--quick", action="store_true", help="Smoke version: one seed, 100 training images, no |M| sweep."
    )
    parser.add_argument(
        "--tables-only",
        action="store_true",
        help="Train nothing: tables, figures and report from the runs already complete (a sweep in progress).",
    )
    args = parser.parse_args()

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    budget = QUICK if args.quick else FULL
    seeds = args.seeds[:1] if args.quick else args.seeds
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    todo = plan(budget, seeds, args.only)
    planned = len(todo)
    start = time.perf_counter()
    rows, failures = [], []
    if not (out / "world" / "world.json").exists():  # once, so that parallel runs never race to generate it
        falcon(*budget.world_args(out), log=out / "world.log", threads=os.cpu_count() or 1)
    if args.tables_only:
        todo = [(v, seed) for v, seed in todo if finished(out / "runs" / f"{v.name}-s{seed}")]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # FIFO: a seed's uniform run starts before its SRCL run
        waits: dict[tuple[str, int], Future] = {}
        for variant, seed in todo:
            waits[(variant.name, seed)] = pool.submit(run_one, variant, seed, out, budget, threads, waits)
        for (name, seed), row in finished_futures(waits, failures):
            rows.append(row)
            print(
                f"[{time.perf_counter() - start:7.0f} s] {name} seed {seed}: R@1 {row['R@1']:.1f}, FN-aware R@1 "
                f"{row['oracle_R@1']:.1f}, FN rate (chain) {row.get('fn_rate_chain', float('nan')):.1f}%",
                flush=True,
            )
    if rows:
        table = pd.DataFrame(rows)
        mean, std, _ = summarise(table, out)
        print((out / "summary.md").read_text())
        paths = figures(table, out, mean, std)
        (out / "falcon_rewards.md").write_text(reward_table(out))
        if args.report:
            command = "PYTHONPATH=. .venv/bin/python benchmarks/shapes_sweep.py " + " ".join(
                a for a in sys.argv[1:] if a != "--tables-only"
            )
            write_report(
                args.report.resolve(), out, table, budget, seeds, command, paths, planned=planned, jobs=args.jobs
            )
    if failures:
        raise SystemExit(f"{len(failures)} run(s) failed:\n" + "\n".join(failures))


if __name__ == "__main__":
    main()
