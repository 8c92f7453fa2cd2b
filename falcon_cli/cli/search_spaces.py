"""``falcon build-search-spaces``: the build-search-spaces stage on its own (after the data stage, if the run lacks it)."""

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


def build_search_spaces(
    recipe: str = typer.Option(..., "--recipe", "-r", help="Recipe name (e.g. shapes-demo) or path to a YAML file."),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", "-o", help="Run directory (default: runs/<recipe name>)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Reuse a run directory that holds a run with a different config."),
    overrides: Optional[List[str]] = typer.Argument(None, help="key=value overrides, e.g. search_spaces.method=random",
                                                    show_default=False),
) -> None:
    """Group the pairs of an embeddings.h5 into search spaces of |M| (search_spaces.parquet).

    Methods: random (GRIT-VLP's shuffled spaces) or kmeans (balanced spherical k-means on the joint embedding).

    Every space holds exactly |M| pairs, the last one the remainder.

    Input: the run's embeddings/embeddings.h5, or the file named by search_spaces.embeddings.

    |M| defaults to pretrain.search_space_size.

    Summary: space sizes, mean within-space similarity, and on the shapes world the oracle's false negatives.

    Runs the data stage first when the run directory has not done it.

    Example: falcon build-search-spaces --recipe shapes-demo --run-dir runs/demo search_spaces.embeddings=emb.h5
    """
    from falcon_cli.artifacts.run_dir import read_manifest
    from stages import run_stages

    config, _ = load_recipe(recipe, overrides or [])
    run_dir = run_dir or Path("runs") / config.name
    stages = ["build_search_spaces"]
    done = (run_dir / "manifest.json").exists() and \
        read_manifest(run_dir).get("stages", {}).get("data", {}).get("status") == "completed"
    if not done:
        stages.insert(0, "data")
    run = RunDirectory.open(run_dir, config=config.model_dump(mode="json"), seed=config.seed,
                            command=["falcon", *sys.argv[1:]], overwrite=overwrite)
    run_stages(config, run, stages)
    if is_main_process():
        console.print(f"[green]done[/]: {run_dir}/search_spaces.parquet")
