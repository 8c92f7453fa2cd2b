"""``falcon embed``: the embed stage on its own (after the data stage, if the run lacks it)."""

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


def embed(
    recipe: str = typer.Option(..., "--recipe", "-r", help="Recipe name (e.g. shapes-demo) or path to a YAML file."),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", "-o", help="Run directory (default: runs/<recipe name>)."),
    resume: bool = typer.Option(False, "--resume", help="Keep the chunks an interrupted embed of the same job completed."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Reuse a run directory that holds a run with a different config."),
    overrides: Optional[List[str]] = typer.Argument(None, help="key=value overrides, e.g. embed.encoder=falcon:runs/demo",
                                                    show_default=False),
) -> None:
    """Embed every image-caption pair of a dataset split into embeddings/embeddings.h5.

    Encoders: open_clip:<model> with embed.pretrained (a tag or a local checkpoint file), or
    falcon:<run or checkpoint directory> (its projected ITC features).

    Writes in chunks of embed.chunk_size pairs; after a kill, --resume continues from the last completed chunk.

    Runs the data stage first when the run directory has not done it.

    Example: falcon embed --recipe shapes-demo --run-dir runs/emb embed.encoder=falcon:runs/demo embed.split=pretrain
    """
    from falcon_cli.artifacts.run_dir import read_manifest
    from stages import run_stages

    config, _ = load_recipe(recipe, overrides or [])
    run_dir = run_dir or Path("runs") / config.name
    stages = ["embed"]
    done = (run_dir / "manifest.json").exists() and \
        read_manifest(run_dir).get("stages", {}).get("data", {}).get("status") == "completed"
    if not done:
        stages.insert(0, "data")
    run = RunDirectory.open(run_dir, config=config.model_dump(mode="json"), seed=config.seed,
                            command=["falcon", *sys.argv[1:]], overwrite=overwrite)
    run_stages(config, run, stages, resume=resume)
    if is_main_process():
        console.print(f"[green]done[/]: {run_dir}/embeddings/embeddings.h5")
