"""Generate a whole shapes world on disk: images, scene graphs, captions, oracle tables, and
the pretraining / retrieval / VQA / NLVR2 files, plus ``dataset.yaml`` and ``world.json``.

``generation.py`` samples the content (deterministically, see ``seeding.py``) and
``writing.py`` writes it; this module decides *whether* to generate (reuse / refuse /
overwrite) and makes it atomic: the world is built in a hidden sibling directory and
renamed onto ``out_dir`` at the end, so a killed run never leaves a half-written world.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from falcon_cli.artifacts.atomic import atomic_dir
from falcon_cli.artifacts.config_diff import config_differences
from falcon_cli.data.shapes.config import ShapesConfig
from falcon_cli.data.shapes.generation import generate_content
from falcon_cli.data.shapes.writing import WORLD_FILE, WORLD_SCHEMA_VERSION, write_world
from falcon_cli.errors import FalconError

__all__ = ["WORLD_SCHEMA_VERSION", "WorldSummary", "generate_world", "load_world_summary"]


@dataclass
class WorldSummary:
    """What a generated (or reused) world holds: counts per split and false-negative density."""

    out_dir: Path
    counts: dict
    false_negative_density: dict
    config: dict = field(default_factory=dict)
    duplicate_captions: dict = field(default_factory=dict)
    """Captions repeating another caption of their image (``world.json`` → ``statistics.duplicate_captions``)."""
    reused: bool = False
    """True when an existing world with the same config was returned instead of regenerating."""

    @classmethod
    def from_world_json(cls, out_dir: Path, world: dict, *, reused: bool) -> "WorldSummary":
        """The summary of a world from the content of its ``world.json``."""
        return cls(
            out_dir=out_dir,
            counts=world["counts"],
            false_negative_density=world["statistics"]["false_negative_density"],
            duplicate_captions=world["statistics"].get("duplicate_captions", {}),
            config=world["config"],
            reused=reused,
        )

    @property
    def splits(self) -> dict[str, dict[str, int]]:
        """Per split (train / val / test): images, captions, VQA questions, NLVR2 statements."""
        nlvr2 = {"train": "train", "val": "dev", "test": "test"}
        return {
            split: {
                "images": self.counts["images"][split],
                "captions": self.counts["captions"][split],
                "vqa_questions": self.counts["vqa_questions"][split],
                "nlvr2_statements": self.counts["nlvr2_statements"][nlvr2[split]],
            }
            for split in ("train", "val", "test")
        }

    def render(self, console) -> None:
        """Print split sizes and the false-negative density (per split, and per caption kind on test)."""
        from rich.table import Table

        def percent(d: dict, key: str) -> str:
            return f"{100 * d[key]:.2f}%" if key in d else "—"  # worlds written before the key existed

        def row(d: dict) -> list[str]:
            pair = percent(d, "pair_negative_fn_rate")
            if "same_image_pair_rate" in d:
                pair += f" ({percent(d, 'same_image_pair_rate')})"
            return [
                f"{d['mean']:.1f}",
                f"{d['median']:g}",
                f"{100 * d['fraction_with_false_negatives']:.0f}%",
                percent(d, "random_negative_fn_rate"),
                pair,
            ]

        density = (
            "images a caption describes: mean",
            "median",
            "captions with FNs",
            "random negative is FN",
            "random pair is FN (same image)",
        )
        table = Table(
            "split",
            "images",
            "captions",
            *density,
            box=None,
            header_style="bold",
            title=f"shapes world {self.out_dir}" + (" (reused)" if self.reused else ""),
        )
        for split, counts in self.splits.items():
            table.add_row(
                split, f"{counts['images']:,}", f"{counts['captions']:,}", *row(self.false_negative_density[split])
            )
        for column in table.columns[1:]:
            column.justify = "right"
        console.print(table)
        kinds = Table("test captions by kind", "captions", *density, box=None, header_style="bold")
        for kind, d in self.false_negative_density["test"].get("by_kind", {}).items():
            kinds.add_row(kind, f"{d['captions']:,}", *row(d))
        for column in kinds.columns[1:]:
            column.justify = "right"
        console.print(kinds)
        train = self.false_negative_density["train"]
        if train.get("near_miss_fn_rate") is not None:
            console.print(
                f"near misses (train): a near miss of a caption's image is a false negative "
                f"{100 * train['near_miss_fn_rate']:.1f}% of the time, a random pair "
                f"{100 * train['pair_negative_fn_rate']:.2f}%"
            )
        repeats = self.duplicate_captions.get("same_logical_form", 0)
        if repeats:
            console.print(
                f"[yellow]note[/]: {repeats:,} caption(s) on {self.duplicate_captions['images']:,} image(s) "
                f"repeat another caption of the same image in meaning "
                f"({self.duplicate_captions['same_text']:,} word for word); "
                "each such pair is the other's false negative (see docs/shapes.md, Duplicate captions)"
            )

    def to_dict(self) -> dict:
        """JSON-ready form: ``out_dir``, ``reused``, ``splits`` (per-split counts), ``fn_density``
        (per split: mean / median / max images described per caption, the random-negative rates, and ``by_kind``),
        ``duplicate_captions``,
        ``counts`` (all counts, as in world.json) and ``config``."""
        return {
            "out_dir": str(self.out_dir),
            "reused": self.reused,
            "splits": self.splits,
            "fn_density": self.false_negative_density,
            "duplicate_captions": self.duplicate_captions,
            "counts": self.counts,
            "config": self.config,
        }


# --- reading an existing world ----------------------------------------------------------


def _read_world_json(out_dir: Path) -> dict:
    path = out_dir / WORLD_FILE
    if not path.exists():
        raise FalconError(
            f"{path}: not found; {out_dir} is not a shapes world (make one with `falcon data shapes --out DIR`)"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise FalconError(f"{path}: cannot be read as JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("schema_version") != WORLD_SCHEMA_VERSION:
        found = data.get("schema_version") if isinstance(data, dict) else None
        raise FalconError(
            f"{path}: schema_version {found!r} is not {WORLD_SCHEMA_VERSION}; regenerate the world with --overwrite"
        )
    for key in ("config", "counts", "statistics"):
        if key not in data:
            raise FalconError(f"{path}: missing key '{key}'; regenerate the world with --overwrite")
    return data


def load_world_summary(out_dir: str | Path) -> WorldSummary:
    """The summary of an existing world, read from its ``world.json``."""
    out_dir = Path(out_dir)
    data = _read_world_json(out_dir)
    return WorldSummary.from_world_json(out_dir, data, reused=True)


def _as_current_config(stored: dict) -> dict:
    """A stored world config with the knobs added since it was written filled by their defaults (which
    generate the same files), so an older world of the same settings is still recognised."""
    try:
        return ShapesConfig.model_validate(stored).model_dump(mode="json")
    except ValueError:
        return stored


def _repeats_captions(out_dir: Path, summary: WorldSummary) -> bool:
    """Whether a world written before ``duplicate_captions`` was recorded repeats a caption of one image
    (such a world differs from what this version generates for its config; newer ones never do)."""
    if summary.duplicate_captions:
        return False
    table = pq.read_table(out_dir / "captions.parquet", columns=["image_id", "logical_form"]).to_pydict()
    pairs = list(zip(table["image_id"], table["logical_form"]))
    return len(set(pairs)) < len(pairs)


def _check_target(out_dir: Path, config: ShapesConfig, overwrite: bool) -> WorldSummary | None:
    """Return the existing world's summary if it matches ``config``; raise if it is something else.

    With ``overwrite`` nothing is checked: the world is always regenerated.
    """
    if overwrite or not out_dir.exists():
        return None
    if out_dir.is_dir() and not any(out_dir.iterdir()):
        return None
    wanted = config.model_dump(mode="json")
    reason = None
    if (out_dir / WORLD_FILE).is_file():
        try:
            summary = load_world_summary(out_dir)
        except FalconError as exc:
            reason = str(exc)
        else:
            stored = _as_current_config(summary.config)
            if stored == wanted and not _repeats_captions(out_dir, summary):
                return summary
            if stored == wanted:
                reason = (
                    "it was made by an older falcon that repeated captions of one image where this one "
                    "draws another caption kind instead (same config, other captions)"
                )
            else:
                diffs = config_differences(stored, wanted)
                reason = f"it holds a shapes world with a different config ({'; '.join(diffs[:4])})"
    if reason is None:
        reason = "it exists and is not a shapes world"
    raise FalconError(f"{out_dir}: {reason}; pass overwrite=True (--overwrite) to replace it, or choose another --out")


# --- generation -------------------------------------------------------------------------


def _build(config: ShapesConfig, root: Path, workers: int) -> dict:
    """Generate every file of a world into ``root``; return the world.json content."""
    return write_world(generate_content(config, root, workers), root)


def generate_world(
    config: ShapesConfig,
    out_dir: str | Path,
    *,
    preview: bool = False,
    overwrite: bool = False,
    workers: int | None = None,
) -> WorldSummary:
    """Generate the shapes world described by ``config`` into ``out_dir``.

    If ``out_dir`` already holds a world with the same config (and schema version), its
    summary is returned without regenerating (``reused=True``; a missing ``preview.png`` is
    added when asked). If it holds anything else, FalconError is raised. ``overwrite=True``
    always regenerates and replaces whatever is there.
    ``workers`` processes render images (default: up to 2); the output does not depend on it.
    """
    out_dir = Path(out_dir).expanduser().absolute()
    existing = _check_target(out_dir, config, overwrite)
    if existing is not None:
        if preview and not (out_dir / "preview.png").exists():
            from falcon_cli.data.shapes.preview import write_preview  # (lazy: matplotlib, only for a preview)

            write_preview(out_dir)
        return existing
    if workers is None:
        workers = min(2, os.cpu_count() or 1)
    with atomic_dir(out_dir) as building:
        world = _build(config, building, workers)
        if preview:
            from falcon_cli.data.shapes.preview import write_preview  # (lazy: matplotlib, only for a preview)

            write_preview(building)
    return WorldSummary.from_world_json(out_dir, world, reused=False)
