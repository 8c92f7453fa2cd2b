"""``falcon pretrain``: the pretraining stage on its own (after the data stage, if the run lacks it)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from falcon_cli.cli.single_stage import run_single_stage


def pretrain(
    recipe: str = typer.Option(..., "--recipe", "-r", help="Recipe name (e.g. shapes-demo) or path to a YAML file."),
    run_dir: Optional[Path] = typer.Option(
        None, "--run-dir", "-o", help="Run directory (default: runs/<recipe name>)."
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue from the run's latest checkpoint (same config)."),
    overwrite: bool = typer.Option(
        False,
        "--overwrite",
        help="Reuse a run directory that holds a run with a different config, or train again over its checkpoints.",
    ),
    overrides: Optional[List[str]] = typer.Argument(
        None, help="key=value overrides, e.g. pretrain.epochs=3", show_default=False
    ),
) -> None:
    """Pretrain a model (ALBEF, BLIP-2 stage 1 or a dual encoder: the recipe's) with its batch composer.

    Runs the data stage first when the run directory has not done it. Works the same under torchrun, where the batch size is per process.

    Example: falcon pretrain --recipe shapes-demo pretrain.epochs=2
    Example: torchrun --nproc_per_node 2 -m falcon_cli pretrain -r shapes-demo
    """  # noqa: E501 (Rich keeps a line break in help text: one line per paragraph)
    run_single_stage("pretrain", recipe, run_dir, overrides, overwrite=overwrite, output="manifest.json", resume=resume)
