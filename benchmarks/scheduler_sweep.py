"""Does FALCON's scheduler learn, and does it win? The seeded comparison at a budget where learning can happen.

    PYTHONPATH=. .venv/bin/python benchmarks/scheduler_sweep.py --out runs/scheduler --report docs/results.md  # ~75 min
    PYTHONPATH=. .venv/bin/python benchmarks/scheduler_sweep.py --out /tmp/scheduler --budget quick  # ~6-minute smoke
    PYTHONPATH=. .venv/bin/python benchmarks/scheduler_sweep.py --out runs/scheduler-gpu --budget gpu --jobs 1  # a GPU

Paper-exact FALCON (``shapes-falcon``) and the improved scheduler (``shapes-falcon-plus``) against GRIT,
uniform and q = 0.5, every method at every seed, on one shapes world and one budget. The ``learning``
budget gives every FALCON run more than 1,000 scheduler updates (batch 16 on the 1,750 pairs of the
shapes sweep's world: 110 steps per epoch, 10 FALCON epochs), where the main sweep
(``benchmarks/shapes_sweep.py``) gives 164; the world is the main sweep's, so the false-negative
density is the same (a random in-batch negative is a false negative 18% of the time).

Each run is trained, evaluated (zero-shot ITC retrieval with the oracle's false-negative-aware metrics)
and audited (``--judge oracle``) exactly as in the main sweep (its ``run_one``); the sweep is resumable
(a run whose three parts are done is skipped). Besides retrieval, each run's ``metrics.jsonl`` says per
epoch what the composer chose against the oracle (:mod:`falcon_cli.sampling.oracle_view`): the
correlation of each anchor's E[q] with its false-negative density, the spread of E[q], the safe q, the
false-negative rate of the picks, and the correlation of the reward with false-negative picks.

Writes to OUT: ``results.csv`` (one row per run), ``epochs.csv`` (one row per run and epoch),
``summary.md`` and ``scheduler_sweep.png``; ``--report docs/results.md`` rewrites the block between
``<!-- scheduler:begin -->`` and ``<!-- scheduler:end -->`` and copies the CSVs and figure to ``docs/results/``.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.shapes_sweep import (
    SPLITS,
    Budget,
    Variant,
    falcon,
    finished,
    finished_futures,
    replace_block,
    run_one,
    seeds_phrase,
    sweep_parser,
)
from falcon_cli.evaluation.intervals import PairedDifference, paired_by_seed

METHODS: dict[str, tuple[str, list[str]]] = {
    "falcon": ("shapes-falcon", []),
    "falcon-plus": ("shapes-falcon-plus", []),
    "falcon-plus-alignment": (
        "shapes-falcon-plus",
        [
            "pretrain.scheduler.reward.name=alignment",
            "pretrain.scheduler.update.credit=pair",
            "pretrain.scheduler.reward.mode=eval",
        ],
    ),
    "falcon-plus-margin-0": ("shapes-falcon-plus", ["pretrain.scheduler.reward.name=positive_margin"]),
    "falcon-plus-margin-0.25": (
        "shapes-falcon-plus",
        ["pretrain.scheduler.reward.name=positive_margin", "pretrain.scheduler.reward.margin=0.25"],
    ),
    "falcon-plus-margin-0.5": (
        "shapes-falcon-plus",
        ["pretrain.scheduler.reward.name=positive_margin", "pretrain.scheduler.reward.margin=0.5"],
    ),
    "falcon-plus-margin-0.5-itm": (
        "shapes-falcon-plus",
        ["pretrain.scheduler.reward.name=positive_margin+itm", "pretrain.scheduler.reward.margin=0.5"],
    ),
    "falcon-plus-margin-0.5-itm-w6": (
        "shapes-falcon-plus",
        [
            "pretrain.scheduler.reward.name=positive_margin+itm",
            "pretrain.scheduler.reward.margin=0.5",
            "pretrain.scheduler.reward.itm_weight=6",
        ],
    ),
    "falcon-plus-margin-0.5-itm-excess": ("shapes-falcon-itm-excess", []),
    "falcon-plus-margin-0.5-itm-expected": ("shapes-falcon-itm-expected", []),
    "falcon-plus-margin-0.5-oracle-expected": ("shapes-falcon-oracle", []),
    "falcon-plus-margin-0.5-oracle-expected-w0.5": (
        "shapes-falcon-oracle",
        ["pretrain.scheduler.reward.itm_weight=0.5"],
    ),
    "falcon-plus-margin-0.5-levels": ("shapes-falcon-levels", []),
    "falcon-plus-margin-0.5-oracle-levels": (
        "shapes-falcon-levels",
        ["pretrain.scheduler.reward.name=positive_margin+oracle", "pretrain.scheduler.reward.itm_charge=expected"],
    ),
    "falcon-plus-rank-oracle": ("shapes-falcon-oracle", ["pretrain.scheduler.reward.hardness=rank"]),
    "falcon-plus-rank-oracle-levels": (
        "shapes-falcon-levels",
        [
            "pretrain.scheduler.reward.name=positive_margin+oracle",
            "pretrain.scheduler.reward.itm_charge=expected",
            "pretrain.scheduler.reward.hardness=rank",
        ],
    ),
    "grit": ("shapes-grit", []),
    "uniform": ("shapes-uniform", []),
    "q05": ("shapes-q05", []),
    "q0": ("shapes-q05", ["pretrain.composer.quantile=0"]),
    "q025": ("shapes-q05", ["pretrain.composer.quantile=0.25"]),
    "q075": ("shapes-q05", ["pretrain.composer.quantile=0.75"]),
    "q1": ("shapes-q05", ["pretrain.composer.quantile=1"]),
}
"""Method -> (shipped recipe, extra overrides). FALCON paper-exact, the improved scheduler with its MLM reward
credited per caption and with the alignment reward (each pair's own image-text cosine, eval mode, credited to
the q whose pick sat next to it) and with the positive-margin reward (each pick's similarity to its anchor,
charged once it comes within a margin of 0, 0.25 or 0.5 of the anchor's own pair; credited to the q that chose
it), the same at margin 0.5 less twice the model's own ITM match probability of each pick with its anchor
(``positive_margin+itm``: a reward that sees which picks the model believes are matches; ``-w6`` charges six times
the probability; ``-excess`` six times its excess over the batch's picks of the same hardness,
``scheduler.reward.itm_charge: excess``; ``-expected`` the margin paid only as far as the head calls the pick a true
negative, a match worth -2, ``scheduler.reward.itm_charge: expected``; ``-oracle-expected`` the same with the world's
oracle as the judge, a diagnostic: the ceiling of any judge; ``-w0.5`` a false pick worth -0.5, so that the scheduler
trades at harder q; ``-levels`` the margin scored at every q of a 10-level grid per anchor, ``scheduler.update.credit:
levels``, and ``-oracle-levels`` the same with the oracle's charge, expected, w = 2; ``-rank-oracle`` a pick worth its
rank among the anchor's candidates when the oracle calls it a true negative and -2 when not,
``scheduler.reward.hardness: rank``, REINFORCE on the drawn q, and ``-rank-oracle-levels`` the same scored at every
level), and the baselines the issue names (GRIT, uniform = no chain, q = 0.5); q = 0, 0.25, 0.75 and 1 (the quantile
composer, q = 1 GRIT's chain with the oracle's view) draw the fixed-q frontier with q = 0.5."""

BASELINES = ("grit", "uniform", "q05")
"""What the improved scheduler must beat."""

IMPROVED = (
    "falcon-plus",
    "falcon-plus-alignment",
    "falcon-plus-margin-0",
    "falcon-plus-margin-0.25",
    "falcon-plus-margin-0.5",
    "falcon-plus-margin-0.5-itm",
    "falcon-plus-margin-0.5-itm-w6",
    "falcon-plus-margin-0.5-itm-excess",
    "falcon-plus-margin-0.5-itm-expected",
    "falcon-plus-margin-0.5-oracle-expected",
    "falcon-plus-margin-0.5-oracle-expected-w0.5",
    "falcon-plus-margin-0.5-levels",
    "falcon-plus-margin-0.5-oracle-levels",
    "falcon-plus-rank-oracle",
    "falcon-plus-rank-oracle-levels",
)
"""The improved schedulers the issue's targets are checked for."""

DEFAULT = (
    "falcon",
    "falcon-plus",
    "falcon-plus-alignment",
    "falcon-plus-margin-0",
    "falcon-plus-margin-0.25",
    "falcon-plus-margin-0.5",
    "grit",
    "uniform",
    "q05",
)
"""What the sweep runs without ``--only`` (issue 20's comparison); the rest run when named."""

FRONTIER: dict[str, float] = {"q0": 0.0, "q025": 0.25, "q05": 0.5, "q075": 0.75, "q1": 1.0}
"""The fixed-q runs whose chain false-negative rates, against their q, are the frontier a scheduler is judged by."""

BUDGETS: dict[str, Budget] = {
    "learning": Budget(
        images=700, epochs=11, batch=16, spaces={"medium": 350}, warmup=10, audit_pairs=20000, step_windows=10
    ),
    "quick": Budget(images=200, epochs=4, batch=8, spaces={"medium": 50}, warmup=5, audit_pairs=2000, step_windows=4),
    "gpu": Budget(
        images=4000,
        epochs=21,
        batch=32,
        spaces={"medium": 1000},
        size=64,
        warmup=50,
        audit_pairs=50000,
        step_windows=20,
    ),
}
"""``learning``: 1,100 scheduler updates per FALCON run, 15 runs in about 75 minutes at 2 jobs on 2 cores.
``quick``: a smoke test of the pipeline (one seed; nothing learns). ``gpu``: 2,000 training images of 64 pixels,
batch 32: 320 steps per epoch, 6,400 scheduler updates per FALCON run (for a GPU; untimed here)."""


def scheduler_updates(budget: Budget) -> int:
    """Scheduler updates of one FALCON run at ``budget``: every batch of epochs 1.. (epoch 0 is uniform)."""
    from falcon_cli.sampling.composers import num_space_batches

    pairs = round(budget.images * SPLITS["train"]) * 5  # five captions per training image
    return (budget.epochs - 1) * num_space_batches(pairs, budget.spaces["medium"], budget.batch, False)


SUMMARY_KEYS = (
    "q_fn_density_corr",
    "expected_q_std",
    "expected_q_mean",
    "q_mean",
    "safe_q_mean",
    "q_above_safe_share",
    "chain_fn_rate",
    "fn_density_mean",
    "reward_fn_corr",
    "frontier_fn_rate",
    "frontier_gap",
    "itm_fn_auc",
    "charge_fn_auc",
    "hardness_fn_auc",
    "itm_fn_corr",
    "charge_fn_corr",
    "hardness_fn_corr",
    "best_by_density_fn_rate",
    "best_by_anchor_fn_rate",
)
"""The epoch summary keys (``metrics.jsonl``, kind ``epoch_summary``) the sweep keeps per epoch."""


def epoch_rows(method: str, seed: int, run: Path) -> list[dict]:
    """One row per epoch with a composition summary (FALCON, q = 0.5 epochs; none for GRIT and uniform). A key
    the run did not record (it trained before the key existed) is recomputed from its batch log where the log has
    what it needs."""
    from falcon_cli.runtime.metrics import read_metrics
    from falcon_cli.sampling.batch_log import read_batch_log
    from falcon_cli.sampling.oracle_view import SUMMARY_COLUMNS, summary_by_epoch

    rows = [
        {"method": method, "seed": seed, "epoch": r["epoch"], **{k: r.get(k) for k in SUMMARY_KEYS}}
        for r in read_metrics(run / "metrics.jsonl")
        if r.get("kind") == "epoch_summary"
    ]
    from_log = set(SUMMARY_KEYS) & set(SUMMARY_COLUMNS)  # (the reward's and the judge's keys are not in the log)
    if any(row[k] is None for row in rows for k in from_log) and (run / "batches.parquet").exists():
        logged = summary_by_epoch(read_batch_log(run / "batches.parquet")).set_index("epoch").to_dict("index")
        for row in rows:
            row.update({k: v for k, v in logged.get(row["epoch"], {}).items() if k in row and row[k] is None})
    return rows


def run_row(base: dict, epochs: list[dict]) -> dict:
    """A run's row: retrieval and audit (``base``, from the main sweep's ``collect``), and the oracle's view of
    its last epoch, with the correlation also averaged over the second half of its epochs (less noisy)."""
    row = {
        k: base[k]
        for k in (
            "method",
            "seed",
            "R@1",
            "oracle_R@1",
            "i2t_R@1",
            "t2i_R@1",
            "oracle_i2t_R@1",
            "oracle_t2i_R@1",
            "seconds_per_epoch",
        )
        if k in base
    }
    row["fn_rate_chain_audit"] = base.get("fn_rate_chain", float("nan"))
    last = epochs[-1] if epochs else {}
    for key in SUMMARY_KEYS:
        row[key] = _number(last.get(key))
    late = [_number(e.get("q_fn_density_corr")) for e in epochs[len(epochs) // 2 :]]
    late = [v for v in late if v == v]
    row["q_fn_density_corr_late"] = sum(late) / len(late) if late else float("nan")
    return row


def _number(value) -> float:
    return float("nan") if value is None else float(value)


COLUMNS = [
    ("R@1", "R@1"),
    ("oracle_R@1", "FN-aware R@1"),
    ("fn_rate_chain_audit", "chain FN % (audit)"),
    ("chain_fn_rate", "chain FN %"),
    ("fn_density_mean", "FN % of a random pick"),
    ("q_fn_density_corr", "corr(E[q], FN density)"),
    ("q_fn_density_corr_late", "same, late-epoch mean"),
    ("expected_q_std", "std E[q]"),
    ("q_mean", "mean q"),
    ("safe_q_mean", "safe q"),
    ("q_above_safe_share", "q > safe q"),
    ("reward_fn_corr", "corr(reward, FN pick)"),
    ("itm_fn_auc", "ITM AUC, false picks"),
    ("charge_fn_auc", "charge AUC, false picks"),
    ("frontier_fn_rate", "frontier FN %, same anchors and mean q"),
    ("frontier_gap", "gap to the frontier, same anchors"),
    ("best_by_density_fn_rate", "best FN % knowing each anchor's density"),
    ("best_by_anchor_fn_rate", "best FN % knowing each anchor's false picks"),
    ("seconds_per_epoch", "s / epoch"),
]
"""The summary table's columns: results.csv key -> header (percent for R@1 and the FN rates)."""
PERCENT = {
    "chain_fn_rate",
    "fn_density_mean",
    "q_above_safe_share",
    "frontier_fn_rate",
    "frontier_gap",
    "best_by_density_fn_rate",
    "best_by_anchor_fn_rate",
}


def summary_table(table, methods=None, columns=None) -> str:
    """Mean ± std over seeds per method of ``methods`` (default this sweep's, in their order), one column per
    ``columns`` entry (key, header) present in the table (— where a method has no such number: no chain, no Beta)."""
    columns = [(k, h) for k, h in (columns or COLUMNS) if k in table]
    lines = ["| method | seeds | " + " | ".join(h for _, h in columns) + " |", "|---|---|" + "---|" * len(columns)]
    for method in [m for m in (methods or METHODS) if m in set(table["method"])]:
        rows = table[table["method"] == method]
        cells = []
        for key, _ in columns:
            values = rows[key].astype(float) * (100 if key in PERCENT else 1)
            values = values.dropna()
            digits = 1 if key in PERCENT or "R@1" in key or key in ("seconds_per_epoch", "fn_rate_chain_audit") else 2
            cells.append(
                "—"
                if values.empty
                else f"{values.mean():.{digits}f} ± {values.std(ddof=1) if len(values) > 1 else 0:.{digits}f}"
            )
        lines.append(f"| {method} | {len(rows)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def paired_words(d: PairedDifference) -> str:
    """A paired difference in a verdict line: mean [paired-t 95% interval] over n seeds, and what the interval says
    (a direction only where it excludes zero)."""
    if d.n < 2:
        return f"{d.mean:+.1f} on one seed: **no verdict** (one seed)"
    outcome = {"higher": "beats it", "lower": "loses to it"}.get(
        d.verdict, "no difference shown (the interval holds zero)"
    )
    return f"paired over {d.n} seeds {d.mean:+.1f} [{d.lo:+.1f}, {d.hi:+.1f}]: **{outcome}**"


def verdict(table) -> list[str]:
    """The issue's two targets, checked on the numbers: (1) corr(E[q], FN density) ≤ −0.3 on every seed of the
    improved scheduler; (2) its R@1 above every baseline's, seed by seed, the paired-t 95% interval above zero."""
    lines, points = [], frontier_rows(table)
    for improved in IMPROVED:
        plus = table[table["method"] == improved]
        if plus.empty:
            continue
        corr = plus["q_fn_density_corr"].astype(float)
        met = bool((corr <= -0.3).all())
        lines.append(
            f"- **{improved}, anchor dependence:** corr(E[q], FN density) in the last epoch per seed: "
            f"{', '.join(f'{v:+.2f}' for v in corr)} — target ≤ −0.30 on every seed: "
            f"**{'met' if met else 'not met'}**."
        )
        reward = plus["reward_fn_corr"].astype(float) if "reward_fn_corr" in plus else plus["R@1"].iloc[:0]
        if (
            reward.notna().any()
        ):  # issue 35: a reward that can teach the scheduler to avoid false picks pays less for them
            lines.append(
                f"- **{improved}, the reward sees false picks:** corr(reward, FN pick) in the last epoch per "
                f"seed: {', '.join(f'{v:+.2f}' for v in reward)} — target ≤ −0.30 on every seed: "
                f"**{'met' if bool((reward <= -0.3).all()) else 'not met'}**."
            )
        gap = points.loc[points["method"] == improved, "gap"]
        if len(gap):
            lines.append(
                f"- **{improved}, against the fixed-q frontier:** chain FN % minus the frontier's at the same "
                f"mean q, per seed: {', '.join(f'{v:+.1f}' for v in gap)} points — target ≤ −5 on every seed: "
                f"**{'met' if bool((gap.round(6) <= -5).all()) else 'not met'}**."
            )
        same = 100 * plus["frontier_gap"].astype(float) if "frontier_gap" in plus else plus["R@1"].iloc[:0]
        if same.notna().any():
            lines.append(
                f"- **{improved}, against the frontier on its own anchors** (what each fixed q would have "
                f"picked for the same anchors): {', '.join(f'{v:+.1f}' for v in same)} points — target ≤ −5 on "
                f"every seed: **{'met' if bool((same.round(6) <= -5).all()) else 'not met'}**."
            )
        room = (
            100 * (plus["frontier_fn_rate"] - plus["best_by_density_fn_rate"]).astype(float)
            if "best_by_density_fn_rate" in plus
            else plus["R@1"].iloc[:0]
        )
        if room.notna().any():  # how far below the frontier a scheduler that knew each anchor's density could go
            lines.append(
                f"- **{improved}, the room below the frontier:** the best mix of the five fixed q's per density "
                f"decile lies {', '.join(f'{v:.1f}' for v in room)} points below the frontier at the same mean "
                f"q, per seed (knowing each anchor's false picks: "
                f"{', '.join(f'{v:.1f}' for v in 100 * (plus['frontier_fn_rate'] - plus['best_by_anchor_fn_rate']))})."
            )
        for base in BASELINES:
            rows = table[table["method"] == base]
            d = paired_by_seed(plus.set_index("seed")["R@1"].to_dict(), rows.set_index("seed")["R@1"].to_dict())
            if d is None:
                continue
            lines.append(
                f"- **{improved}, R@1 vs {base}:** {plus['R@1'].mean():.1f} vs {rows['R@1'].mean():.1f}; "
                f"{paired_words(d)}."
            )
    return lines or ["No improved scheduler has a finished run yet."]


def frontier_rows(table):
    """Each scheduler run's point against the fixed-q frontier of its own seed: its last epoch's mean q and chain
    FN rate (``q_mean``, ``chain_fn_rate``), the frontier's FN rate at that q (linear between the seed's fixed-q
    runs, :data:`FRONTIER`) and ``gap``, the difference in points (below 0: fewer false negatives than one q for
    every anchor gives at the same mean hardness). Empty where a seed has fewer than two fixed-q runs."""
    import numpy as np
    import pandas as pd

    fixed = table[table["method"].isin(list(FRONTIER))].assign(level=lambda t: t["method"].map(FRONTIER))
    rows = []
    for _, run in table[table["method"].str.startswith("falcon")].iterrows():
        curve = fixed[(fixed["seed"] == run["seed"]) & fixed["chain_fn_rate"].notna()].sort_values("level")
        if len(curve) < 2 or run["q_mean"] != run["q_mean"] or run["chain_fn_rate"] != run["chain_fn_rate"]:
            continue
        at = float(np.interp(run["q_mean"], curve["level"], curve["chain_fn_rate"].astype(float)))
        rows.append(
            {
                "method": run["method"],
                "seed": run["seed"],
                "q_mean": run["q_mean"],
                "chain_fn_rate": run["chain_fn_rate"],
                "frontier_fn_rate": at,
                "gap": 100 * (run["chain_fn_rate"] - at),
                "fixed_runs": len(curve),
            }
        )
    return pd.DataFrame(
        rows, columns=["method", "seed", "q_mean", "chain_fn_rate", "frontier_fn_rate", "gap", "fixed_runs"]
    )


def frontier_table(table) -> str:
    """The fixed-q frontier (chain FN % per q, over seeds) and each scheduler's vertical distance to it, seed by seed
    (:func:`frontier_rows`); the issue's target is a gap of −5 points or less on every seed."""
    fixed = table[table["method"].isin(list(FRONTIER))]
    if fixed.empty:
        return "(no fixed-q run yet)\n"
    lines = ["| fixed q | seeds | chain FN % |", "|---|---|---|"]
    for method, level in FRONTIER.items():
        values = 100 * fixed.loc[fixed["method"] == method, "chain_fn_rate"].astype(float).dropna()
        if len(values):
            lines.append(
                f"| {level:g} | {len(values)} | {values.mean():.1f} ± "
                f"{values.std(ddof=1) if len(values) > 1 else 0:.1f} |"
            )
    points = frontier_rows(table)
    if points.empty:
        return "\n".join(lines) + "\n"
    lines += [
        "",
        "| scheduler | seeds | mean q | chain FN % | the frontier at that q, % | gap, points (per seed) | "
        "below by ≥ 5 |",
        "|---|---|---|---|---|---|---|",
    ]
    for method in [m for m in METHODS if m in set(points["method"])]:
        rows = points[points["method"] == method].sort_values("seed")
        gap = rows["gap"]
        lines.append(
            f"| {method} | {len(rows)} | {rows['q_mean'].mean():.2f} | {100 * rows['chain_fn_rate'].mean():.1f} | "
            f"{100 * rows['frontier_fn_rate'].mean():.1f} | {gap.mean():+.1f} ± "
            f"{gap.std(ddof=1) if len(gap) > 1 else 0:.1f} ({', '.join(f'{v:+.1f}' for v in gap)}) | "
            f"{int((gap.round(6) <= -5).sum())}/{len(gap)} |"
        )
    return "\n".join(lines) + "\n"


Q_BUCKETS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


def fn_rate_by_q(logs) -> str:
    """How much q changes the false-negative risk of a pick, per anchor density: FN % of the chained picks of
    every FALCON run (the second half of their epochs, all seeds; FALCON's q spreads over [0, 1]) by q bucket,
    for all anchors and per tercile of the anchor's FN density. If q barely moves the rate, no scheduler of q
    can avoid false negatives, whatever its reward."""
    import numpy as np
    import pandas as pd

    rows = pd.concat(logs, ignore_index=True) if logs else pd.DataFrame()
    if rows.empty:
        return "(no FALCON batch log with the oracle's view)\n"
    bucket = pd.cut(rows["q"], [*Q_BUCKETS[:-1], 1.0 + 1e-9], right=False)  # the last bucket holds q = 1
    edges = np.quantile(rows["anchor_fn_density"], [0, 1 / 3, 2 / 3, 1])
    tercile = np.clip(np.searchsorted(edges[1:-1], rows["anchor_fn_density"], side="right"), 0, 2)
    names = [f"density {edges[i]:.2f}–{edges[i + 1]:.2f}" for i in range(3)]
    lines = [
        "| q | picks | FN % (all anchors) | " + " | ".join(f"FN %, {n}" for n in names) + " |",
        "|---|---|---|" + "---|" * 3,
    ]
    for label, part in rows.groupby(bucket, observed=True):
        low, high = label.left, min(label.right, 1.0)
        cells = [
            f"{100 * part.loc[tercile[part.index] == t, 'chosen_is_fn'].mean():.1f}"
            if (tercile[part.index] == t).any()
            else "—"
            for t in range(3)
        ]
        lines.append(
            f"| [{low:.1f}, {high:.1f}{']' if high == 1.0 else ')'} | {len(part):,} | "
            f"{100 * part['chosen_is_fn'].mean():.1f} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines) + "\n"


def falcon_logs(out: Path, methods) -> list:
    """The chained slots with the oracle's view of the second half of every finished FALCON run's epochs."""
    from falcon_cli.sampling.batch_log import read_batch_log

    logs = []
    for method in methods:
        for run in sorted((out / "runs").glob(f"{method}-s*")):
            if not (run / "batches.parquet").exists():
                continue
            log = read_batch_log(run / "batches.parquet")
            log = log[log["q"].notna() & log["chosen_is_fn"].notna() & (log["sampler"] == "falcon")]
            if len(log):
                epochs = sorted(log["epoch"].unique())
                logs.append(
                    log[log["epoch"].isin(epochs[len(epochs) // 2 :])][["q", "anchor_fn_density", "chosen_is_fn"]]
                )
    return logs


def figure(epochs, out: Path, methods=None, name: str = "scheduler_sweep.png") -> Path:
    """Per FALCON variant and seed, over epochs: corr(E[q], anchor FN density), the std of E[q] and mean q;
    for every quantile composer the chain FN rate against a random pick's; and the last epoch's chain FN rate against
    mean q, the fixed-q runs as a curve per seed and each scheduler run as a point (the frontier)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from falcon_cli.reporting.figures import _save_png as save_png

    fig, axes = plt.subplots(1, 4, figsize=(19, 4))
    for i, method in enumerate(m for m in (methods or METHODS) if m in set(epochs["method"])):
        for seed, rows in epochs[epochs["method"] == method].groupby("seed"):
            label = method if seed == epochs["seed"].min() else None
            if "falcon" in method:
                axes[0].plot(
                    rows["epoch"],
                    rows["q_fn_density_corr"].astype(float),
                    color=f"C{i}",
                    marker="o",
                    markersize=3,
                    label=label,
                )
                axes[1].plot(rows["epoch"], rows["expected_q_mean"].astype(float), color=f"C{i}", label=label)
                axes[1].plot(rows["epoch"], rows["expected_q_std"].astype(float), color=f"C{i}", linestyle=":")
            axes[2].plot(rows["epoch"], 100 * rows["chain_fn_rate"].astype(float), color=f"C{i}", label=label)
    random_pick = epochs.groupby("epoch")["fn_density_mean"].mean()
    axes[2].plot(
        random_pick.index, 100 * random_pick.astype(float), color="grey", linestyle="--", label="a random pick"
    )
    axes[0].axhline(-0.3, color="grey", linestyle="--", linewidth=0.8)
    axes[0].axhline(0, color="grey", linewidth=0.5)
    axes[0].set(
        xlabel="epoch",
        ylabel="corr(E[q], anchor FN density)",
        ylim=(-1, 1),
        title="anchor dependence (target: below −0.3)",
    )
    axes[1].set(xlabel="epoch", ylabel="q", ylim=(0, 1), title="E[q]: mean (solid), std across anchors (dotted)")
    axes[2].set(xlabel="epoch", ylabel="%", title="false negatives among the composer's picks")
    # the frontier: each run's last epoch, fixed q as one line per seed, every scheduler as its points
    last = epochs.sort_values("epoch").groupby(["method", "seed"], as_index=False).last()
    for seed, rows in last[last["method"].isin(list(FRONTIER))].groupby("seed"):
        rows = rows.assign(level=rows["method"].map(FRONTIER)).sort_values("level")
        axes[3].plot(
            rows["level"],
            100 * rows["chain_fn_rate"].astype(float),
            color="grey",
            marker="s",
            markersize=3,
            label="one q for every anchor" if seed == last["seed"].min() else None,
        )
    for i, method in enumerate(m for m in (methods or METHODS) if m in set(last["method"])):
        if "falcon" in method:
            rows = last[last["method"] == method]
            axes[3].scatter(
                rows["q_mean"].astype(float),
                100 * rows["chain_fn_rate"].astype(float),
                color=f"C{i}",
                label=method,
                zorder=3,
            )
    axes[3].set(
        xlabel="mean q (last epoch)",
        ylabel="chain FN %",
        xlim=(-0.02, 1.02),
        title="the fixed-q frontier (a scheduler's goal: below it)",
    )
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = save_png(fig, out / name)
    plt.close(fig)
    return path


def copy_assets(report: Path, out: Path, prefix: str, figure_path: Path) -> None:
    """Copy a sweep's ``results.csv``, ``epochs.csv`` (as ``<prefix>_results.csv``, ``<prefix>_epochs.csv``) and
    figure next to ``report``, into ``results/``."""
    assets = report.parent / "results"
    assets.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(out / "results.csv", assets / f"{prefix}_results.csv")
    shutil.copyfile(out / "epochs.csv", assets / f"{prefix}_epochs.csv")
    shutil.copyfile(figure_path, assets / figure_path.name)


def run_manifests(out: Path, table) -> tuple[list[dict], list[str]]:
    """The manifests of the table's runs, and the commits they ran at (`sha`, marked where the tree was dirty)."""
    manifests = [
        json.loads((out / "runs" / f"{m}-s{s}" / "manifest.json").read_text())
        for m, s in zip(table["method"], table["seed"])
    ]
    commits = sorted(
        {
            f"`{(m['git']['sha'] or 'unknown')[:7]}`" + (" (uncommitted changes)" if m["git"]["dirty"] else "")
            for m in manifests
        }
    )
    return manifests, commits


def write_report(
    report: Path,
    out: Path,
    table,
    budget: Budget,
    name: str,
    command: str,
    jobs: int,
    planned: int,
    figure_path: Path,
    block_name: str = "scheduler",
) -> None:
    """Rewrite ``report``'s block ``block_name`` (``<!-- NAME:begin -->`` … ``<!-- NAME:end -->``; ``scheduler``
    by default) and copy the tables and figure to ``report.parent/results/`` as ``NAME_*``."""
    copy_assets(report, out, block_name, figure_path)
    if (out / "frontier.csv").exists():
        shutil.copyfile(out / "frontier.csv", report.parent / "results" / f"{block_name}_frontier.csv")
    manifests, commits = run_manifests(out, table)
    hours = sum((_time(m["end"]) - _time(m["created"])) for m in manifests) / 3600
    updates = scheduler_updates(budget)
    block = [
        "<!-- Generated by benchmarks/scheduler_sweep.py --report; edit outside the markers. -->",
        "",
        f"**Command:** `{command}`  ",
        f"**Commits:** {', '.join(commits)}; {platform.machine()}, {os.cpu_count()} CPU cores, {jobs} runs at a time; "
        f"{len(table)} runs{f' of {planned} planned (in progress)' if planned > len(table) else ''}, "
        f"{hours:.1f} run-hours.  ",
        f"**Budget `{name}`:** the shapes sweep's world ({budget.images} images, {budget.size} px), albef-tiny from "
        f"scratch, {budget.epochs} epochs of batch {budget.batch}, |M| {budget.spaces['medium']}: about {updates:,} "
        f"scheduler updates per FALCON run; {seeds_phrase(table['seed'])}.",
        "",
        "Mean ± std over seeds. R@1: zero-shot ITC retrieval on the test split (mean of i2t and t2i, %); FN-aware: "
        "every item the oracle says matches counts as a positive. The rest is the last epoch's composition, scored by "
        "the oracle on every chained slot: *chain FN % (audit)* the false negatives among the chain neighbours the "
        "audit judged (`falcon audit-false-negatives --judge oracle`, every epoch, one direction per pair: the only "
        "chain number GRIT has); *chain FN %* the picks that are false negatives of their anchor, against *FN % of a "
        "random pick* (the anchors' density); *corr(E[q], FN density)* across slots (FALCON's claim: below 0), also "
        "averaged over the second half of the epochs; *std E[q]* how much the scheduler tells anchors apart; *safe q* "
        "the highest q whose pick would have been a true negative, and how often q went past it; *corr(reward, FN "
        "pick)* whether the reward pays less for a false-negative pick (it must, for the scheduler to learn to avoid "
        "them). — where the method has no such number (GRIT and uniform compose no quantile chain; q = 0.5 has no "
        "Beta).",
        "",
        summary_table(table).rstrip(),
        "",
        "**Against the issue's targets** (computed from the table):",
        "",
        *verdict(table),
        "",
        "**The fixed-q frontier.** Chain FN % of each fixed-q run; each scheduler run's last-epoch point (mean q, "
        "chain FN %) against the line through its own seed's fixed-q runs (the gap: below 0, fewer false negatives "
        "at the same mean q; the issue's target is −5 points on every seed):",
        "",
        frontier_table(table).rstrip(),
        "",
        "**Can q avoid false negatives at all?** The oracle's verdict on every pick of the FALCON runs (second half of "
        "their epochs, all variants and seeds), by the q that made it and by the anchor's false-negative density:",
        "",
        fn_rate_by_q(falcon_logs(out, [m for m in METHODS if m.startswith("falcon")])).rstrip(),
        "",
        f"![scheduler sweep](results/{figure_path.name})",
        "",
        f"Per-run numbers: [results/{block_name}_results.csv](results/{block_name}_results.csv); per epoch: "
        f"[results/{block_name}_epochs.csv](results/{block_name}_epochs.csv).",
    ]
    replace_block(report, f"<!-- {block_name}:begin -->", f"<!-- {block_name}:end -->", block)


def _time(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp).timestamp()


def run_sweep(
    methods: dict[str, tuple[str, list[str]]],
    todo: list[tuple[str, int]],
    out: Path,
    budget: Budget,
    jobs: int,
    describe,
) -> tuple[list[dict], list[dict], list[str]]:
    """Train, evaluate and audit every (method, seed) of ``todo`` (``methods``: name -> (recipe, overrides)) on the
    budget's world in ``out``, ``jobs`` at a time, skipping what is done; returns (one row per finished run, one
    row per run and epoch with a composition summary, a line per failed run). ``describe(row)``: what the progress
    line says of a finished run besides its R@1."""
    out.mkdir(parents=True, exist_ok=True)
    threads = max(1, (os.cpu_count() or 1) // jobs)
    if not (out / "world" / "world.json").exists():
        falcon(*budget.world_args(out), log=out / "world.log", threads=os.cpu_count() or 1)
    start, rows, epochs, failures = time.perf_counter(), [], [], []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {
            (m, s): pool.submit(run_one, Variant(m), s, out, budget, threads, {}, recipe=methods[m]) for m, s in todo
        }
        for (method, seed), base in finished_futures(futures, failures):
            per_epoch = epoch_rows(method, seed, out / "runs" / f"{method}-s{seed}")
            epochs += per_epoch
            rows.append(run_row(base, per_epoch))
            print(
                f"[{time.perf_counter() - start:6.0f} s] {method} seed {seed}: R@1 {rows[-1]['R@1']:.1f}, "
                f"{describe(rows[-1])}",
                flush=True,
            )
    return rows, epochs, failures


def finished_runs(out: Path) -> list[tuple[str, int]]:
    """(method, seed) of every run in ``out/runs`` that is trained, evaluated and audited, in :data:`METHODS`'
    order, seeds ascending (``--collect``)."""
    found = []
    for method in METHODS:
        seeds = sorted(
            int(tail)
            for tail in (p.name[len(method) + 2 :] for p in (out / "runs").glob(f"{method}-s*"))
            if tail.isdigit()
        )
        found += [(method, seed) for seed in seeds if finished(out / "runs" / f"{method}-s{seed}")]
    return found


def main() -> None:
    import pandas as pd

    parser = sweep_parser(__doc__, list(METHODS), "scheduler")
    parser.add_argument(
        "--budget",
        choices=list(BUDGETS),
        default="learning",
        help="learning (1,100 scheduler updates per FALCON run), quick (a smoke test), gpu",
    )
    parser.add_argument(
        "--block",
        default="scheduler",
        help="With --report: the page's block to rewrite, <!-- BLOCK:begin --> ... <!-- BLOCK:end --> "
        "(default scheduler, issue 20's; frontier: issue 35's), and the prefix of its files "
        "in results/.",
    )
    parser.add_argument(
        "--collect",
        action="store_true",
        help="Train nothing: tables, figure and report from every finished run in OUT (e.g. the fixed-q "
        "runs of one seed beside the schedulers of three).",
    )
    args = parser.parse_args()

    out = args.out.resolve()
    budget = BUDGETS[args.budget]
    seeds = args.seeds[:1] if args.budget == "quick" else args.seeds
    todo = [(method, seed) for seed in seeds for method in METHODS if method in (args.only or DEFAULT)]
    if args.collect:  # train nothing: every finished run in OUT, whatever --only and --seeds say
        todo = finished_runs(out)
    rows, epochs, failures = run_sweep(
        METHODS, todo, out, budget, args.jobs, lambda row: f"corr(E[q], FN density) {row['q_fn_density_corr']:+.2f}"
    )
    if rows:
        table, per_epoch = pd.DataFrame(rows), pd.DataFrame(epochs)
        table.to_csv(out / "results.csv", index=False, float_format="%.4f")
        per_epoch.to_csv(out / "epochs.csv", index=False, float_format="%.4f")
        (out / "summary.md").write_text(
            summary_table(table)
            + "\n"
            + "\n".join(verdict(table))
            + "\n\n"
            + "The fixed-q frontier:\n\n"
            + frontier_table(table)
        )
        frontier_rows(table).to_csv(out / "frontier.csv", index=False, float_format="%.4f")
        print((out / "summary.md").read_text())
        path = figure(
            per_epoch if len(per_epoch) else pd.DataFrame(columns=["method", "seed", "epoch", *SUMMARY_KEYS]),
            out,
            name=f"{args.block}_sweep.png",
        )
        if args.report:
            command = "PYTHONPATH=. .venv/bin/python benchmarks/scheduler_sweep.py " + " ".join(sys.argv[1:])
            write_report(
                args.report.resolve(),
                out,
                table,
                budget,
                args.budget,
                command,
                args.jobs,
                len(todo),
                path,
                block_name=args.block,
            )
    if failures:
        raise SystemExit(f"{len(failures)} run(s) failed:\n" + "\n".join(failures))


if __name__ == "__main__":
    main()
