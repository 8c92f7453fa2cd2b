"""``falcon unimodal``: the unimodal stage on its own (after the data stage, if the run lacks it)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from falcon_cli.cli.single_stage import run_single_stage


def unimodal(
    recipe: str = typer.Option(..., "--recipe", "-r", help="Recipe name (e.g. shapes-demo) or path to a YAML file."),
    run_dir: Optional[Path] = typer.Option(
        None, "--run-dir", "-o", help="Run directory (default: runs/<recipe name>)."
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Reuse a run directory that holds a run with a different config."
    ),
    overrides: Optional[List[str]] = typer.Argument(
        None, help="key=value overrides, e.g. unimodal.image_epochs=10", show_default=False
    ),
) -> None:
    """Train the shapes world's DeiT and BERT analogues for pretrain.model, or reuse them.

    The image encoder learns to classify each grid cell's shape, colour and size, the text encoder masked language modelling on the training captions. They are kept once per world, model, tokenizer, settings and seed (<world>/unimodal/<key>/); pretraining starts from them with pretrain.encoders.vision_weights=unimodal pretrain.encoders.text_weights=unimodal.

    Runs the data stage first when the run directory has not done it.

    Example: falcon unimodal --recipe shapes-demo unimodal.image_epochs=10
    """  # noqa: E501 (Rich keeps a line break in help text: one line per paragraph)
    run_single_stage("unimodal", recipe, run_dir, overrides, overwrite=overwrite, output="results/unimodal.md")
