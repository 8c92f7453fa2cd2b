"""``falcon audit-false-negatives``: judge the negatives one or more finished runs used."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from falcon_cli.cli.single_stage import run_config, run_stage_in, yaml_value
from falcon_cli.runtime.console import make_console

console = make_console()


def audit_false_negatives(
    run_dirs: List[Path] = typer.Argument(
        ..., metavar="RUN_DIR", show_default=False, help="Run directories to audit; several are also put side by side."
    ),
    judge: Optional[str] = typer.Option(
        None,
        "--judge",
        help="auto (the oracle where the data has one, else blip), "
        "oracle, blip or checkpoint. [default: the run's audit.judge, auto]",
    ),
    judge_model: Optional[str] = typer.Option(
        None,
        "--judge-model",
        help="blip: hub id or local directory "
        "(default Salesforce/blip-itm-base-coco); checkpoint: a run or checkpoint "
        "directory (default: the audited run).",
    ),
    threshold: Optional[float] = typer.Option(
        None, "--threshold", help="p(match) above which a negative is a false negative [default: 0.5]."
    ),
    negatives: Optional[str] = typer.Option(None, "--negatives", help="chain, itm or both [default: both]."),
    max_pairs: Optional[int] = typer.Option(
        None,
        "--max-pairs",
        help="Judge at most this many pairs, over whole steps evenly spread over training; 0 = all [default: 20000].",
    ),
    steps: Optional[int] = typer.Option(None, "--steps", help="Audit at most this many training steps, evenly spread."),
    device: Optional[str] = typer.Option(None, "--device", help="Model judges: auto, cpu or cuda[:n]."),
    fp16: Optional[bool] = typer.Option(None, "--fp16/--fp32", help="Model judges: fp16 autocast on CUDA."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Model judges: pairs per forward pass."),
    settings: Optional[List[str]] = typer.Option(
        None, "--set", help="Any audit.KEY=VALUE, e.g. --set audit.step_windows=8."
    ),
    compare_dir: Optional[Path] = typer.Option(
        None,
        "--compare-dir",
        help="Where several runs are put side by side [default: audit-comparison/ beside the first run].",
    ),
) -> None:
    """Judge the negatives a finished run used: false-negative rates by hardness q and training step.

    The negatives: each pair and the anchor a composer chose it for (at q), and each anchor's hardest in-batch ITM negative, both ways.

    Writes RUN_DIR/audit/: audit.parquet, audit.md, CSV tables, fn_rate_by_q.png, fn_after_filter.png, missed_examples.png and summary.json.

    Settings come from the run's own audit section; the options here change it (recorded in the manifest).

    Example: falcon audit-false-negatives runs/q1 runs/q05 runs/q0 --judge oracle
    """  # noqa: E501 (Rich keeps a line break in help text: one line per paragraph)
    from falcon_cli.audit.compare import write_comparison  # (lazy: pandas and figures; keep `falcon --help` fast)

    options = {
        "judge": judge,
        "judge_model": judge_model,
        "threshold": threshold,
        "max_pairs": max_pairs,
        "steps": steps,
        "device": device,
        "fp16": fp16,
        "batch_size": batch_size,
        "negatives": None if negatives is None else (["chain", "itm"] if negatives == "both" else [negatives]),
    }
    if max_pairs == 0:
        options["max_pairs"] = "null"
    overrides = [f"audit.{key}={yaml_value(value)}" for key, value in options.items() if value is not None]
    overrides += list(settings or [])

    # Check every run before auditing any: a typo in the last one should not cost the first one's audit.
    configs = [run_config(run_dir, overrides, ("audit",)) for run_dir in run_dirs]
    for run_dir, config in zip(run_dirs, configs):
        run_stage_in(run_dir, config, "audit_false_negatives")
        console.print(f"[green]done[/]: {escape(str(run_dir))}/audit/audit.md")
    if len(run_dirs) > 1:
        out = compare_dir or Path(run_dirs[0]).parent / "audit-comparison"
        table = write_comparison(run_dirs, out)
        _print_comparison(table)
        console.print(f"[green]done[/]: {escape(str(out))}/comparison.md")


def _print_comparison(table) -> None:
    from rich.table import Table

    view = Table(title="false negatives of the used negatives, per run")
    for column in table.columns:
        view.add_column(column, justify="left" if column in ("run", "judge", "kind") else "right")
    for row in table.to_dict(orient="records"):
        view.add_row(*[f"{100 * v:.1f}%" if k.endswith("rate") else escape(str(v)) for k, v in row.items()])
    console.print(view)
