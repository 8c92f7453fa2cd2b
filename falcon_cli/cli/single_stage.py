"""One stage as its own command (``falcon pretrain``, ``falcon embed``, ``falcon build-search-spaces``).

The stage commands import this module at their top, so it imports the config schema (pydantic), the run
directory and the stages inside the functions that use them: ``falcon --help`` and ``falcon COMMAND --help``
need none of them.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rich.markup import escape

from falcon_cli.errors import FalconError
from falcon_cli.runtime.console import make_console

console = make_console()


def run_single_stage(
    stage: str,
    recipe: str,
    run_dir: Path | None,
    overrides: list[str] | None,
    *,
    overwrite: bool,
    output: str,
    **options,
) -> None:
    """Run ``stage`` of ``recipe`` in ``run_dir`` (default ``runs/<recipe name>``), after the data stage
    when the run has not completed it; ``options`` (e.g. ``resume``) go to the stages; prints ``output``."""
    # (lazy: the config schema, the run directory, and the stages' heavy libraries; keep `falcon --help` fast)
    from falcon_cli.config.recipes import as_current_config, load_recipe, place_dataset
    from falcon_cli.runtime.distributed import is_main_process
    from falcon_cli.runtime.run_dir import RunDirectory, read_manifest
    from stages import join_processes, run_stages

    config, _ = load_recipe(recipe, overrides or [])
    run_dir = run_dir or Path("runs") / config.name
    place_dataset(config, run_dir)
    join_processes(config, run_dir, stage, overwrite=overwrite, **options)  # (torchrun: every node the same launch)
    data_done = (run_dir / "manifest.json").exists() and read_manifest(run_dir).get("stages", {}).get("data", {}).get(
        "status"
    ) == "completed"
    run = RunDirectory.open(
        run_dir,
        config=config.model_dump(mode="json"),
        seed=config.seed,
        command=["falcon", *sys.argv[1:]],
        overwrite=overwrite,
        as_current=as_current_config,
    )
    run_stages(config, run, [stage] if data_done else ["data", stage], overwrite=overwrite, **options)
    if is_main_process():
        console.print(f"[green]done[/]: {escape(f'{run_dir}/{output}')}")


def run_config(run_dir: Path, overrides: list[str], sections: tuple[str, ...]):
    """The config recorded in ``run_dir``'s manifest with ``overrides`` applied; only keys of ``sections``
    may change (the rest is what the run was trained with). Validated, nothing run yet."""
    # (lazy: the config schema and the run directory; keep `falcon --help` fast)
    from falcon_cli.config.paths import absolute_input_paths
    from falcon_cli.config.recipes import apply_overrides, validate_config
    from falcon_cli.runtime.run_dir import read_manifest

    for text in overrides:
        if not text.strip().startswith(tuple(f"{s}." for s in sections)):
            allowed = ", ".join(f"{s}.*" for s in sections)
            raise FalconError(
                f"{text}: only {allowed} keys can change on an existing run; the rest of its config is "
                "what it was trained with"
            )
    manifest = read_manifest(run_dir)
    source = f"{run_dir}/manifest.json"
    # Paths the run recorded are relative to the directory it ran in (older runs stored them as
    # given); paths in the overrides are relative to this command's working directory.
    stored = absolute_input_paths(validate_config(manifest.get("config") or {}, source), manifest.get("cwd"))
    raw, given = apply_overrides(stored.model_dump(mode="json"), overrides)
    return absolute_input_paths(validate_config(raw, source, given))


def run_stage_in(run_dir: Path, config, stage: str, **options) -> None:
    """Run ``stage`` in the existing run ``run_dir`` with ``config`` (from :func:`run_config`), recording the
    changed sections and this command line in the manifest."""
    # (lazy: the run directory, and the stages' heavy libraries; keep `falcon --help` fast)
    from falcon_cli.runtime.run_dir import RunDirectory
    from stages import join_processes, run_stages

    join_processes(config, run_dir, stage, **options)  # (torchrun: every node the same launch)
    run = RunDirectory.open(
        run_dir,
        config=config.model_dump(mode="json"),
        seed=config.seed,
        command=["falcon", *sys.argv[1:]],
        overwrite=True,
    )
    run_stages(config, run, [stage], **options)


def yaml_value(value) -> str:
    """An option value as the YAML text of a ``key=value`` override."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)
