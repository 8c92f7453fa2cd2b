"""``falcon compare``: finished runs side by side, each method's mean over seeds and its paired difference from a
baseline, with 95% intervals (the library: ``falcon_cli/evaluation/compare.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from falcon_cli.errors import FalconError
from falcon_cli.runtime.console import make_console

console = make_console()

DEFAULT_METRICS = ("rerank:R@1", "itc:R@1")
"""Tried in order when no ``--metric`` is given: ALBEF's protocol (ITC's top k re-ranked by the ITM head) where every
run was evaluated with it, else the ITC ranking."""


def compare(
    run_dirs: List[Path] = typer.Argument(
        ...,
        metavar="RUN_DIR",
        show_default=False,
        help="Finished, evaluated runs: several methods, several seeds each.",
    ),
    metric: Optional[List[str]] = typer.Option(
        None,
        "--metric",
        "-m",
        help="A number the runs' results give, e.g. "
        "rerank:R@1, itc:R@1, itc:oracle_R@1, itc:t2i_R@5, vqa:accuracy, "
        "nlvr2:test, audit:chain_fn_oracle; repeat for several "
        "[default: rerank:R@1 where every run has it, else itc:R@1].",
    ),
    baseline: Optional[str] = typer.Option(
        None, "--baseline", "-b", help="The method every other is paired with [default: the first run's]."
    ),
    label: Optional[List[str]] = typer.Option(
        None,
        "--label",
        help="NAME=GLOB: runs whose path matches GLOB "
        "belong to method NAME (default: the recipe, plus the settings that "
        "tell its runs apart).",
    ),
    out: Optional[Path] = typer.Option(
        None,
        "--out",
        "-o",
        help="Where comparison.md, comparison.csv, per_seed.csv "
        "and comparison.png go [default: comparison/ beside the first run].",
    ),
    allow_mismatch: bool = typer.Option(
        False,
        "--allow-mismatch",
        help="Compare runs of other data, budgets or "
        "evaluation settings anyway, each difference flagged in the report.",
    ),
    list_metrics: bool = typer.Option(False, "--list-metrics", help="Print the metrics every run has, and exit."),
) -> None:
    """Compare methods over paired seeds: means and differences from a baseline, with 95% intervals.

    Runs are grouped into methods by their resolved configs (or --label) and paired by seed. Differences from the baseline get paired-t 95% intervals.

    A verdict (higher, lower) is given only where the paired interval excludes zero; a method with one seed gets its binomial interval and no verdict.

    Writes comparison.md, comparison.csv, per_seed.csv and comparison.png (docs/compare.md).

    Example: falcon compare runs/uniform-s* runs/falcon-s* --metric rerank:R@1
    Example: falcon compare runs/*-s* --baseline shapes-uniform
    """  # noqa: E501 (Rich keeps a line break in help text: one line per paragraph)
    # (lazy: pandas and matplotlib; keep `falcon --help` fast)
    from falcon_cli.evaluation.compare import compare_runs, label_runs, metric_names, read_run, write_comparison

    runs = [read_run(path) for path in dict.fromkeys(run_dirs)]  # every run read before anything is written
    if list_metrics:
        for name in metric_names(runs):
            typer.echo(name)
        return
    label_runs(runs, label or [])
    metrics = list(dict.fromkeys(metric or []))
    if not metrics:
        common = metric_names(runs)
        metrics = [next((m for m in DEFAULT_METRICS if m in common), None)]
        if metrics[0] is None:
            raise FalconError(
                f"the runs share none of {', '.join(DEFAULT_METRICS)}; name one with --metric "
                f"(--list-metrics lists what they share)"
            )
    result = compare_runs(runs, metrics, baseline=baseline, allow_mismatch=allow_mismatch)
    target = out if out is not None else Path(run_dirs[0]).parent / "comparison"
    write_comparison(result, target)
    _print(result)
    for warning in result.warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}")
    console.print(f"[green]done[/]: {escape(str(target))}/comparison.md")


def _print(result) -> None:
    from rich.table import Table

    for metric in result.metrics:
        view = Table(title=escape(f"{metric}: mean over seeds, and − {result.baseline} paired by seed (95% intervals)"))
        for column in ("method", "seeds", "mean [95% CI]", "difference [95% CI]", "positive", "verdict"):
            view.add_column(column, justify="left" if column in ("method", "verdict") else "right")
        for row in (r for r in result.summary if r["metric"] == metric):
            mean = f"{row['mean']:.2f}" + ("" if row["lo"] != row["lo"] else f" [{row['lo']:.2f}, {row['hi']:.2f}]")
            if row["method"] == result.baseline:
                diff, positive, verdict = "baseline", "", ""
            elif row.get("paired_seeds"):
                lo, hi = row["difference_lo"], row["difference_hi"]
                diff = f"{row['difference']:+.2f}" + ("" if lo != lo else f" [{lo:+.2f}, {hi:+.2f}]")
                positive, verdict = f"{row['positive']}/{row['paired_seeds']}", row["verdict"]
            else:
                diff, positive, verdict = "", "", row["verdict"]
            view.add_row(escape(row["method"]), str(row["seeds"]), mean, diff, positive, verdict)
        console.print(view)
