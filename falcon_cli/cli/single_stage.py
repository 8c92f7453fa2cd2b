"""One stage as its own command (``falcon pretrain``, ``falcon embed``, ``falcon build-search-spaces``)."""

from __future__ import annotations

import sys
from pathlib import Path

from falcon_cli.artifacts.run_dir import RunDirectory, read_manifest
from falcon_cli.config.recipes import load_recipe
from falcon_cli.runtime.console import make_console
from falcon_cli.runtime.distributed import is_main_process

console = make_console()


def run_single_stage(stage: str, recipe: str, run_dir: Path | None, overrides: list[str] | None, *, overwrite: bool,
                     output: str, **options) -> None:
    """Run ``stage`` of ``recipe`` in ``run_dir`` (default ``runs/<recipe name>``), after the data stage
    when the run has not completed it; ``options`` (e.g. ``resume``) go to the stages; prints ``output``."""
    from stages import run_stages

    config, _ = load_recipe(recipe, overrides or [])
    run_dir = run_dir or Path("runs") / config.name
    data_done = (run_dir / "manifest.json").exists() and \
        read_manifest(run_dir).get("stages", {}).get("data", {}).get("status") == "completed"
    run = RunDirectory.open(run_dir, config=config.model_dump(mode="json"), seed=config.seed,
                            command=["falcon", *sys.argv[1:]], overwrite=overwrite)
    run_stages(config, run, [stage] if data_done else ["data", stage], **options)
    if is_main_process():
        console.print(f"[green]done[/]: {run_dir}/{output}")
