"""``falcon run``: run a recipe's stages in order into one run directory."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from falcon_cli.runtime.console import make_console

console = make_console()


def run_recipe(
    recipe: str = typer.Option(..., "--recipe", "-r", help="Recipe name (e.g. shapes-demo) or path to a YAML file."),
    run_dir: Optional[Path] = typer.Option(
        None, "--run-dir", "-o", help="Run directory (default: runs/<recipe name>)."
    ),
    overwrite: bool = typer.Option(
        False,
        "--overwrite",
        help="Reuse a run directory that holds a run with a different config, or train again over its checkpoints.",
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue the stages from their latest checkpoints (same config)."
    ),
    overrides: Optional[List[str]] = typer.Argument(
        None, help="key=value overrides, e.g. data.shapes.images=500", show_default=False
    ),
) -> None:
    """Run a recipe: every stage it lists, in order, into one run directory.

    Example: falcon run --recipe shapes-demo --run-dir runs/demo
    """
    # (lazy: the config schema, the run directory, and the stages' heavy libraries; keep `falcon --help` fast)
    from falcon_cli.config.recipes import as_current_config, load_recipe, place_dataset
    from falcon_cli.runtime.distributed import is_main_process
    from falcon_cli.runtime.run_dir import RunDirectory
    from stages import join_processes, run_stages

    config, path = load_recipe(recipe, overrides or [])
    run_dir = run_dir or Path("runs") / config.name
    place_dataset(config, run_dir)
    join_processes(config, run_dir, "run", resume=resume, overwrite=overwrite)  # (torchrun: every node the same launch)
    run = RunDirectory.open(
        run_dir,
        config=config.model_dump(mode="json"),
        seed=config.seed,
        command=["falcon", *sys.argv[1:]],
        overwrite=overwrite,
        as_current=as_current_config,
    )
    if is_main_process():
        console.print(
            f"[bold]falcon run[/] {escape(f'{config.name} ({path}) → {run_dir}')}  stages: {' → '.join(config.stages)}"
        )
    run_stages(config, run, resume=resume, overwrite=overwrite)
    if is_main_process():
        console.print(f"[green]done[/]: {escape(str(run_dir))}/manifest.json")
