"""``falcon data shapes`` and ``falcon data check``: make the shapes world, check any dataset."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from falcon_cli.artifacts.atomic import write_json
from falcon_cli.errors import FalconError
from falcon_cli.runtime.console import make_console

app = typer.Typer(
    help="Generate the shapes world; check a dataset.\n\n"
    "Example: falcon data shapes --out data/shapes --images 300 --seed 1",
    no_args_is_help=True,
)
console = make_console()


@app.command("shapes")
def shapes(
    out: Path = typer.Option(..., "--out", help="Directory to write the world into (created atomically)."),
    images: int = typer.Option(2000, "--images", help="Number of images (split into train/val/test)."),
    seed: int = typer.Option(0, "--seed", help="Seed: the same seed and settings give byte-identical files."),
    size: int = typer.Option(64, "--size", help="Image side in pixels."),
    preset: Optional[str] = typer.Option(
        None,
        "--preset",
        help="A false-negative regime: coco-like, medium or dense (docs/shapes.md); knobs given as key=value win.",
    ),
    preview: bool = typer.Option(
        False, "--preview", help="Also write preview.png, a contact sheet of images and captions."
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing world made with other settings."),
    overrides: Optional[List[str]] = typer.Argument(
        None, help="More knobs as key=value, e.g. max_objects=3 num_colors=8", show_default=False
    ),
) -> None:
    """Generate the shapes world: images with exactly known captions, and the oracle that judges them.

    The world holds the images and their scene graphs, captions with logical forms, the oracle's compatibility table, and retrieval / pretraining / VQA / NLVR2 files in the real formats.

    Example: falcon data shapes --out data/shapes --images 300 --seed 1 --preview
    Example: falcon data shapes --out data/coco-like --preset coco-like --size 32
    """  # noqa: E501 (Rich keeps a line break in help text: one line per paragraph)
    # (lazy: the config schema (pydantic), and the world's writers (pandas, PIL); keep `falcon --help` fast)
    from falcon_cli.config.recipes import apply_overrides, validate_config
    from falcon_cli.data.shapes.config import ShapesConfig
    from falcon_cli.data.shapes.world import generate_world

    raw = {"images": images, "seed": seed, "size": size} | ({"preset": preset} if preset else {})
    raw, given = apply_overrides(raw, overrides or [], model=ShapesConfig)
    config = validate_config(raw, "falcon data shapes", given, model=ShapesConfig)
    summary = generate_world(config, out, preview=preview, overwrite=overwrite)
    summary.render(console)
    console.print(f"[green]wrote[/] {escape(f'{out}  (check it with: falcon data check {out})')}")


@app.command("index")
def index(
    spec: Path = typer.Argument(..., help="A dataset.yaml naming pretrain_shards, or the directory holding one."),
    on_missing: Optional[str] = typer.Option(
        None, "--on-missing", help="fail (default: the spec's) or skip: keys without an image or caption."
    ),
) -> None:
    """Index a dataset's webdataset shards once, so that pretraining can read any pair by id.

    Writes shards-index.parquet (offsets of each image inside its tar, captions, pair ids) beside dataset.yaml.

    Example: falcon data index data/cc3m
    """
    # (lazy: the dataset readers import torch and PIL; keep `falcon --help` fast)
    from falcon_cli.data.shards import build_index
    from falcon_cli.data.spec import load_spec

    dataset = load_spec(spec)
    if on_missing not in (None, "fail", "skip"):
        raise FalconError(f"--on-missing: expected fail or skip, got {on_missing!r}")
    built = build_index(dataset, on_missing=on_missing)
    skipped = (
        f", {built.incomplete_count:,} incomplete keys left out (first: {', '.join(built.incomplete)})"
        if built.incomplete_count
        else ""
    )
    console.print(
        f"[green]wrote[/] {escape(str(built.path))}: {built.table.num_rows:,} pairs in {len(built.shards):,} shards"
        f"{skipped}; fingerprint {built.fingerprint[:12]}"
    )


@app.command("shards")
def shards(
    spec: Path = typer.Argument(..., help="A dataset.yaml with pretraining JSON files, or the directory holding one."),
    out: Path = typer.Option(..., "--out", help="Directory for the shards and their dataset.yaml (must not exist)."),
    samples_per_shard: int = typer.Option(1000, "--samples-per-shard", min=1, help="Pairs per tar shard."),
) -> None:
    """Write a dataset's pretraining pairs as webdataset tar shards, with their index.

    Each pair becomes {pair_id}.jpg/.png + .txt + .json, the image bytes unchanged; the new dataset.yaml names the shards, and its other sections point back at the original files. Pair ids are kept.

    Example: falcon data shards data/shapes --out data/shapes-shards
    """  # noqa: E501 (Rich keeps a line break in help text: one line per paragraph)
    # (lazy: the dataset readers import torch and PIL; keep `falcon --help` fast)
    from falcon_cli.data.datasets import pretrain_records
    from falcon_cli.data.shards import convert_to_shards
    from falcon_cli.data.spec import load_spec

    if out.exists():
        raise FalconError(f"{out}: already exists; give --out a new directory")
    source = load_spec(spec)
    built = convert_to_shards(source, pretrain_records(source)[0], out, samples_per_shard=samples_per_shard)
    console.print(
        f"[green]wrote[/] {out}: {built.table.num_rows:,} pairs in {len(built.shards):,} shards, "
        f"indexed (train on it with data.dataset={escape(str(out))})"
    )


@app.command("check")
def check(
    spec: Path = typer.Argument(..., help="A dataset.yaml, or the directory holding one (e.g. a shapes world)."),
    images: bool = typer.Option(True, "--images/--no-images", help="Open every image once to find unreadable files."),
    on_missing: Optional[str] = typer.Option(
        None, "--on-missing", help="fail (default) or skip: how missing images count."
    ),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the report as JSON to this file."),
) -> None:
    """Check a dataset: images found, missing or unreadable, empty captions, duplicate ids, bad labels.

    Counts per source; exits 1 when a problem is found.

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
    console.print(f"[green]ok[/]: {escape(str(spec))} has no problems")
