"""``falcon embed``: the embed stage on its own (after the data stage, if the run lacks it)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from falcon_cli.cli.single_stage import run_single_stage


def embed(
    recipe: str = typer.Option(..., "--recipe", "-r", help="Recipe name (e.g. shapes-demo) or path to a YAML file."),
    run_dir: Optional[Path] = typer.Option(
        None, "--run-dir", "-o", help="Run directory (default: runs/<recipe name>)."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Keep the chunks an interrupted embed of the same job completed."
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Reuse a run directory that holds a run with a different config."
    ),
    overrides: Optional[List[str]] = typer.Argument(
        None, help="key=value overrides, e.g. embed.encoder=falcon:runs/demo", show_default=False
    ),
) -> None:
    """Embed every image-caption pair of a dataset split into embeddings/embeddings.h5.

    Encoders: open_clip:<model> with embed.pretrained (a tag or a local checkpoint file), or falcon:<run or checkpoint directory> (its projected ITC features).

    Writes in chunks of embed.chunk_size pairs; after a kill, --resume continues from the last completed chunk.

    Runs the data stage first when the run directory has not done it.

    Example: falcon embed --recipe shapes-demo embed.encoder=falcon:runs/demo
    """  # noqa: E501 (Rich keeps a line break in help text: one line per paragraph)
    run_single_stage(
        "embed", recipe, run_dir, overrides, overwrite=overwrite, output="embeddings/embeddings.h5", resume=resume
    )
