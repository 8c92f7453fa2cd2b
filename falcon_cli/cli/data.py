"""``falcon data shapes`` and ``falcon data check``: make the shapes world, check any dataset."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from falcon_cli.runtime.console import make_console

from falcon_cli.artifacts.atomic import write_json
from falcon_cli.config.recipes import apply_overrides, validate_config
from falcon_cli.data.shapes import ShapesConfig, generate_world
from falcon_cli.errors import FalconError

app = typer.Typer(help="Generate the shapes world; check a dataset.\n\nExample: falcon data shapes --out data/shapes --images 300 --seed 1",
                  no_args_is_help=True)
console = make_console()


@app.command("shapes")
def shapes(
    out: Path = typer.Option(..., "--out", help="Directory to write the world into (created atomically)."),
    images: int = typer.Option(2000, "--images", help="Number of images (split into train/val/test)."),
    seed: int = typer.Option(0, "--seed", help="Seed: the same seed and settings give byte-identical files."),
    size: int = typer.Option(64, "--size", help="Image side in pixels."),
    preset: Optional[str] = typer.Option(None, "--preset", help="A false-negative regime: coco-like, medium or dense (docs/shapes.md); knobs given as key=value win."),
    preview: bool = typer.Option(False, "--preview", help="Also write preview.png, a contact sheet of images and captions."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing world made with other settings."),
    overrides: Optional[List[str]] = typer.Argument(None, help="More knobs as key=value, e.g. max_objects=3 num_colors=8", show_default=False),
) -> None:
    """Generate the shapes world: images, scene graphs, captions with logical forms, the oracle's
    compatibility table, and retrieval / pretraining / VQA / NLVR2 files in the real formats.

    Example: falcon data shapes --out data/shapes --images 300 --seed 1 --preview
    Example: falcon data shapes --out data/coco-like --preset coco-like --images 4000 --size 32
    """
    raw = {"images": images, "seed": seed, "size": size} | ({"preset": preset} if preset else {})
    raw, given = apply_overrides(raw, overrides or [], model=ShapesConfig)
    config = validate_config(raw, "falcon data shapes", given, model=ShapesConfig)
    summary = generate_world(config, out, preview=preview, overwrite=overwrite)
    summary.render(console)
    console.print(f"[green]wrote[/] {out}  (check it with: falcon data check {out})")


@app.command("check")
def check(
    spec: Path = typer.Argument(..., help="A dataset.yaml, or the directory holding one (e.g. a shapes world)."),
    images: bool = typer.Option(True, "--images/--no-images", help="Open every image once to find unreadable files."),
    on_missing: Optional[str] = typer.Option(None, "--on-missing", help="fail (default) or skip: how missing images count."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the report as JSON to this file."),
) -> None:
    """Check a dataset: entries, images found / missing / unreadable, empty captions, duplicate ids,
    bad labels, per source. Exits 1 when a problem is found.

    Example: falcon data check data/shapes
    """
    # (lazy: the dataset readers import torch and PIL; keep `falcon --help` fast)
    from falcon_cli.data.check import check_dataset
    from falcon_cli.data.spec import load_spec

    dataset = load_spec(spec)
    if on_missing is not None:
        if on_missing not in ("fail", "skip"):
            raise FalconError(f"--on-missing: expected fail or skip, got {on_missing!r}")
        dataset.on_missing = on_missing
    report = check_dataset(dataset, verify_images=images)
    report.render(console)
    if json_out is not None:
        write_json(json_out, report.to_dict())
    if not report.ok:
        raise FalconError(f"{spec}: {len(report.problems)} problem(s): {report.problems[0]}", exit_code=1)
    console.print(f"[green]ok[/]: {spec} has no problems")
