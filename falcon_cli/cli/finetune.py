"""``falcon finetune``: fine-tune a pretrained run on retrieval, VQA or NLVR2."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from falcon_cli.cli.single_stage import run_config, run_single_stage, run_stage_in
from falcon_cli.errors import FalconError
from falcon_cli.runtime.console import make_console

console = make_console()


def finetune(
    task: Optional[List[str]] = typer.Option(
        None,
        "--task",
        "-t",
        help="retrieval, vqa or nlvr2 (repeat for several) [default: the config's finetune.tasks].",
    ),
    recipe: Optional[str] = typer.Option(
        None, "--recipe", "-r", help="Recipe name or YAML file; without it the config is the one recorded in --run-dir."
    ),
    run_dir: Optional[Path] = typer.Option(
        None, "--run-dir", "-o", help="Run directory (default: runs/<recipe name>)."
    ),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Continue each task from its last checkpoint (an epoch's end, or the step a preemption stopped it at).",
    ),
    overwrite: bool = typer.Option(
        False,
        "--overwrite",
        help="Train a task again over its checkpoints; with --recipe "
        "also reuse a run directory that holds a run with a different config.",
    ),
    overrides: Optional[List[str]] = typer.Argument(
        None, help="key=value overrides, e.g. finetune.vqa.epochs=2", show_default=False
    ),
) -> None:
    """Fine-tune the run's pretrained model on retrieval, VQA or NLVR2.

    Retrieval: ITC with a momentum queue + ITM; VQA: an answer decoder from the fusion layers; NLVR2: text-assignment pretraining, then the classifier.

    Writes RUN_DIR/finetune/<task>/: checkpoints/, best/ (the kept weights) and metrics.jsonl. A task that already has checkpoints is refused unless --resume (continue it) or --overwrite (train it again). Under torchrun the batch size is per process.

    Example: falcon finetune --run-dir runs/demo --task vqa finetune.vqa.epochs=2
    """  # noqa: E501 (Rich keeps a line break in help text: one line per paragraph)
    tasks = _tasks(task)
    settings = list(overrides or []) + ([f"finetune.tasks=[{', '.join(tasks)}]"] if tasks else [])
    if recipe is not None:
        run_single_stage("finetune", recipe, run_dir, settings, overwrite=overwrite, output="finetune", resume=resume)
        return
    if run_dir is None:
        raise FalconError(
            "give --run-dir (a pretrained run) or --recipe; e.g. falcon finetune --run-dir runs/shapes-demo --task vqa"
        )
    config = run_config(run_dir, settings, ("finetune",))
    run_stage_in(run_dir, config, "finetune", resume=resume, overwrite=overwrite)
    console.print(f"[green]done[/]: {escape(str(run_dir))}/finetune")


def _tasks(names: list[str] | None) -> list[str]:
    names = [n.strip() for value in names or [] for n in value.split(",") if n.strip()]
    bad = [n for n in names if n not in ("retrieval", "vqa", "nlvr2")]
    if bad:
        raise FalconError(f"--task {bad[0]}: unknown task; use retrieval, vqa or nlvr2")
    return list(dict.fromkeys(names))
