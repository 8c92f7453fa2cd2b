"""Generate a whole shapes world on disk: images, scene graphs, captions, oracle tables, and
the pretraining / retrieval / VQA / NLVR2 files, plus ``dataset.yaml`` and ``world.json``.

``generation.py`` samples the content (deterministically, see ``seeding.py``) and
``writing.py`` writes it; this module decides *whether* to generate (reuse / refuse /
overwrite) and makes it atomic: the world is built in a hidden sibling directory and
renamed onto ``out_dir`` at the end, so a killed run never leaves a half-written world.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from falcon_cli.errors import FalconError
from falcon_cli.data.shapes.config import ShapesConfig
from falcon_cli.data.shapes.generation import generate_content
from falcon_cli.data.shapes.writing import WORLD_FILE, WORLD_SCHEMA_VERSION, write_world

__all__ = ["WORLD_SCHEMA_VERSION", "WorldSummary", "generate_world", "load_world_summary"]


@dataclass
class WorldSummary:
    """What a generated (or reused) world holds: counts per split and false-negative density."""

    out_dir: Path
    counts: dict
    false_negative_density: dict
    config: dict = field(default_factory=dict)
    reused: bool = False
    """True when an existing world with the same config was returned instead of regenerating."""

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

    def to_dict(self) -> dict:
        """JSON-ready form: ``out_dir``, ``reused``, ``splits`` (per-split counts), ``fn_density``
        (per split: mean / median / max images described per caption, and ``by_kind``),
        ``counts`` (all counts, as in world.json) and ``config``."""
        return {
            "out_dir": str(self.out_dir),
            "reused": self.reused,
            "splits": self.splits,
            "fn_density": self.false_negative_density,
            "counts": self.counts,
            "config": self.config,
        }


# --- reading an existing world ----------------------------------------------------------


def _read_world_json(out_dir: Path) -> dict:
    path = out_dir / WORLD_FILE
    if not path.exists():
        raise FalconError(f"{path}: not found; {out_dir} is not a shapes world (make one with `falcon data shapes --out DIR`)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise FalconError(f"{path}: cannot be read as JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("schema_version") != WORLD_SCHEMA_VERSION:
        found = data.get("schema_version") if isinstance(data, dict) else None
        raise FalconError(f"{path}: schema_version {found!r} is not {WORLD_SCHEMA_VERSION}; regenerate the world with --overwrite")
    for key in ("config", "counts", "statistics"):
        if key not in data:
            raise FalconError(f"{path}: missing key '{key}'; regenerate the world with --overwrite")
    return data


def load_world_summary(out_dir: str | Path) -> WorldSummary:
    """The summary of an existing world, read from its ``world.json``."""
    out_dir = Path(out_dir)
    data = _read_world_json(out_dir)
    return WorldSummary(
        out_dir=out_dir,
        counts=data["counts"],
        false_negative_density=data["statistics"]["false_negative_density"],
        config=data["config"],
        reused=True,
    )


def _config_differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    diffs = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs.extend(_config_differences(a, b, f"{prefix}{key}."))
        elif a != b:
            diffs.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return diffs


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
            if summary.config == wanted:
                return summary
            diffs = _config_differences(summary.config, wanted)
            reason = f"it holds a shapes world with a different config ({'; '.join(diffs[:4])})"
    if reason is None:
        reason = "it exists and is not a shapes world"
    raise FalconError(f"{out_dir}: {reason}; pass overwrite=True (--overwrite) to replace it, or choose another --out")


# --- generation -------------------------------------------------------------------------


def _build(config: ShapesConfig, root: Path, workers: int) -> dict:
    """Generate every file of a world into ``root``; return the world.json content."""
    return write_world(generate_content(config, root, workers), root)


def _replace_dir(new: Path, target: Path) -> None:
    """Move the finished world ``new`` onto ``target`` (setting any old content aside first)."""
    if target.exists() and not (target.is_dir() and not any(target.iterdir())):
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.replace(target, old / "world")
        os.replace(new, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(new, target)


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
            from falcon_cli.data.shapes.preview import write_preview

            write_preview(out_dir)
        return existing
    if workers is None:
        workers = min(2, os.cpu_count() or 1)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        world = _build(config, building, workers)
        if preview:
            from falcon_cli.data.shapes.preview import write_preview

            write_preview(building)
        # mkdtemp makes the directory 0700; give the world the usual permissions.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(building, 0o777 & ~umask)
        _replace_dir(building, out_dir)
    except BaseException:
        with contextlib.suppress(OSError):
            shutil.rmtree(building)
        raise
    return WorldSummary(
        out_dir=out_dir,
        counts=world["counts"],
        false_negative_density=world["statistics"]["false_negative_density"],
        config=world["config"],
        reused=False,
    )
