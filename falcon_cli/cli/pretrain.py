"""``falcon pretrain``: the pretraining stage on its own (after the data stage, if the run lacks it)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from falcon_cli.artifacts.run_dir import RunDirectory
from falcon_cli.config.recipes import load_recipe
from falcon_cli.runtime.console import make_console
from falcon_cli.runtime.distributed import is_main_process

console = make_console()


def pretrain(
    recipe: str = typer.Option(..., "--recipe", "-r", help="Recipe name (e.g. shapes-demo) or path to a YAML file."),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", "-o", help="Run directory (default: runs/<recipe name>)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the run's latest checkpoint (same config)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Reuse a run directory that holds a run with a different config."),
    overrides: Optional[List[str]] = typer.Argument(None, help="key=value overrides, e.g. pretrain.epochs=3", show_default=False),
) -> None:
    """Pretrain an ALBEF model (ITC + ITM + MLM) with the recipe's batch composer.

    Runs the data stage first when the run directory has not done it. Works the same under
    torchrun (batch size is per process): torchrun --nproc_per_node 2 -m falcon_cli pretrain --recipe shapes-demo

    Example: falcon pretrain --recipe shapes-demo --run-dir runs/demo pretrain.epochs=2
    """
    from falcon_cli.artifacts.run_dir import read_manifest
    from stages import run_stages

    config, _ = load_recipe(recipe, overrides or [])
    run_dir = run_dir or Path("runs") / config.name
    stages = ["pretrain"]
    done = (run_dir / "manifest.json").exists() and \
        read_manifest(run_dir).get("stages", {}).get("data", {}).get("status") == "completed"
    if not done:
        stages.insert(0, "data")
    run = RunDirectory.open(run_dir, config=config.model_dump(mode="json"), seed=config.seed,
                            command=["falcon", *sys.argv[1:]], overwrite=overwrite)
    run_stages(config, run, stages, resume=resume)
    if is_main_process():
        console.print(f"[green]done[/]: {run_dir}/manifest.json")
