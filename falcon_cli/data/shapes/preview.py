"""A contact sheet of a world: a grid of images, each upscaled with its captions beneath."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pyarrow.parquet as pq
from PIL import Image, ImageDraw, ImageFont

from falcon_cli.artifacts.atomic import atomic_path

TILE = 192
"""Pixel size of each upscaled image."""
TEXT_WIDTH = 34
"""Characters per caption line (PIL's default bitmap font is about 6 px per character)."""


def _font():
    # load_default(size) gives a scalable font in Pillow >= 10.1; the bitmap fallback is fine too.
    try:
        return ImageFont.load_default(size=11)
    except TypeError:
        return ImageFont.load_default()


def make_contact_sheet(world_dir: Path, *, rows: int = 4, cols: int = 4) -> Image.Image:
    """The first ``rows * cols`` images of a world (by image id) with their captions."""
    world_dir = Path(world_dir)
    scenes = pq.read_table(world_dir / "scenes.parquet", columns=["image_id", "file"]).to_pylist()
    captions = pq.read_table(world_dir / "captions.parquet", columns=["image_id", "text"]).to_pylist()
    chosen = sorted(scenes, key=lambda s: s["image_id"])[: rows * cols]
    by_image: dict[int, list[str]] = {}
    for caption in captions:
        by_image.setdefault(caption["image_id"], []).append(caption["text"])
    font = _font()
    line_height = 13
    wrapped = {
        s["image_id"]: [textwrap.wrap(f"- {t}", TEXT_WIDTH) for t in by_image.get(s["image_id"], [])] for s in chosen
    }
    text_lines = max((sum(len(lines) for lines in w) for w in wrapped.values()), default=0)
    pad = 8
    cell_w = max(TILE, TEXT_WIDTH * 6) + 2 * pad
    cell_h = TILE + text_lines * line_height + 3 * pad
    sheet = Image.new("RGB", (cols * cell_w, rows * cell_h), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    for k, scene in enumerate(chosen):
        x0, y0 = (k % cols) * cell_w + pad, (k // cols) * cell_h + pad
        with Image.open(world_dir / scene["file"]) as image:
            tile = image.convert("RGB").resize((TILE, TILE), Image.Resampling.NEAREST)
        sheet.paste(tile, (x0 + (cell_w - 2 * pad - TILE) // 2, y0))
        y = y0 + TILE + pad
        for lines in wrapped[scene["image_id"]]:
            for line in lines:
                draw.text((x0, y), line, fill=(20, 20, 20), font=font)
                y += line_height
    return sheet


def write_preview(world_dir: Path, out_path: Path | None = None, *, rows: int = 4, cols: int = 4) -> Path:
    """Write the contact sheet (default ``world_dir/preview.png``) atomically."""
    out_path = Path(out_path) if out_path is not None else Path(world_dir) / "preview.png"
    sheet = make_contact_sheet(world_dir, rows=rows, cols=cols)
    with atomic_path(out_path) as tmp:
        sheet.save(tmp, format="PNG", optimize=True)
    return out_path
