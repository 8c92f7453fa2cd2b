"""``falcon build-search-spaces``: the build-search-spaces stage on its own (after the data stage, if the run lacks
it)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from falcon_cli.cli.single_stage import run_single_stage


def build_search_spaces(
    recipe: str = typer.Option(..., "--recipe", "-r", help="Recipe name (e.g. shapes-demo) or path to a YAML file."),
    run_dir: Optional[Path] = typer.Option(
        None, "--run-dir", "-o", help="Run directory (default: runs/<recipe name>)."
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Reuse a run directory that holds a run with a different config."
    ),
    overrides: Optional[List[str]] = typer.Argument(
        None, help="key=value overrides, e.g. search_spaces.method=random", show_default=False
    ),
) -> None:
    """Group the pairs of an embeddings.h5 into search spaces of |M| (search_spaces.parquet).

    Methods: random (GRIT-VLP's shuffled spaces) or kmeans (balanced spherical k-means on the joint embedding).

    Every space holds exactly |M| pairs, the last one the remainder.

    Input: the run's embeddings/embeddings.h5, or the file named by search_spaces.embeddings.

    |M| defaults to pretrain.composer.search_space_size.

    Summary: space sizes, mean within-space similarity, and on the shapes world the oracle's false negatives.

    Runs the data stage first when the run directory has not done it.

    Example: falcon build-search-spaces --recipe shapes-warmstart   (k-means)
    """
    run_single_stage(
        "build_search_spaces", recipe, run_dir, overrides, overwrite=overwrite, output="search_spaces.parquet"
    )
