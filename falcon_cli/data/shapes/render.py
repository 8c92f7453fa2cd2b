"""Draw a scene as a PNG: coloured shapes on a 3x3 grid over a plain or lightly noisy background.

Each (shape, size, image size) is drawn once at 4x resolution and box-filtered down into an
anti-aliased alpha "sprite" (cached), so small triangles and diamonds stay recognisable at
64 px and rendering an image is a few numpy blends. Each object stays inside its own cell
(a random offset keeps it off the exact cell centre), so objects never overlap.
"""

from __future__ import annotations

import functools
import io
import math

import numpy as np
from PIL import Image, ImageDraw

from falcon_cli.data.shapes.scene import EMPTY
from falcon_cli.data.shapes.vocabulary import COLOR_RGB, COLORS, GRID, NUM_CELLS, SHAPES

BACKGROUND_RGB = (70, 70, 78)
"""Background colour: a neutral dark grey on which every palette colour stands out."""

RADIUS = {0: 0.22, 1: 0.40}
"""Object radius as a fraction of the cell size, by size code (small, large)."""

_SUPERSAMPLE = 4


def _regular_polygon(
    cx: float, cy: float, r: float, sides: int, rotation: float = -math.pi / 2
) -> list[tuple[float, float]]:
    return [
        (cx + r * math.cos(rotation + 2 * math.pi * k / sides), cy + r * math.sin(rotation + 2 * math.pi * k / sides))
        for k in range(sides)
    ]


def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, r: float, fill) -> None:
    if shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif shape == "square":
        h = r * 0.85
        draw.rectangle([cx - h, cy - h, cx + h, cy + h], fill=fill)
    elif shape == "triangle":
        draw.polygon([(cx, cy - r), (cx + r * 0.95, cy + r * 0.8), (cx - r * 0.95, cy + r * 0.8)], fill=fill)
    elif shape == "diamond":
        draw.polygon([(cx, cy - r), (cx + r * 0.7, cy), (cx, cy + r), (cx - r * 0.7, cy)], fill=fill)
    elif shape == "star":
        points = []
        for k in range(10):
            radius = r if k % 2 == 0 else r * 0.45
            angle = -math.pi / 2 + math.pi * k / 5
            points.append((cx + radius * math.cos(angle), cy + radius * math.sin(angle)))
        draw.polygon(points, fill=fill)
    elif shape == "hexagon":
        draw.polygon(_regular_polygon(cx, cy, r, 6, rotation=0.0), fill=fill)
    elif shape == "cross":
        w = r * 0.33
        draw.rectangle([cx - r, cy - w, cx + r, cy + w], fill=fill)
        draw.rectangle([cx - w, cy - r, cx + w, cy + r], fill=fill)
    elif shape == "pentagon":
        draw.polygon(_regular_polygon(cx, cy, r, 5), fill=fill)
    else:
        raise ValueError(f"no drawing for shape {shape!r}")


@functools.lru_cache(maxsize=None)
def sprite(shape: str, size_code: int, image_size: int) -> np.ndarray:
    """Anti-aliased coverage (float32 in [0, 1], square) of one shape at one size, centred."""
    radius = RADIUS[size_code] * image_size / GRID
    side = int(math.ceil(2 * radius)) + 2
    big = Image.new("L", (side * _SUPERSAMPLE, side * _SUPERSAMPLE), 0)
    centre = side * _SUPERSAMPLE / 2
    _draw_shape(ImageDraw.Draw(big), shape, centre, centre, radius * _SUPERSAMPLE, 255)
    small = big.resize((side, side), Image.Resampling.BOX)
    return np.asarray(small, dtype=np.float32) / 255.0


_COLOR_VALUES = np.array([COLOR_RGB[name] for name in COLORS], dtype=np.float32)


def render_scene(
    shape_row: np.ndarray,
    color_row: np.ndarray,
    size_row: np.ndarray,
    rng: np.random.Generator,
    *,
    image_size: int,
    background_noise: float,
) -> Image.Image:
    """An RGB image of one scene (codes per cell, -1 = empty); ``rng`` drives offsets and noise."""
    cell = image_size / GRID
    offsets = rng.uniform(-1.0, 1.0, size=(NUM_CELLS, 2))
    pixels = np.empty((image_size, image_size, 3), dtype=np.float32)
    pixels[:] = BACKGROUND_RGB
    if background_noise > 0:
        # Noise under the shapes is blended away below, so it only shows on the background.
        pixels += (rng.standard_normal((image_size, image_size), dtype=np.float32) * (background_noise * 255.0))[
            :, :, None
        ]
    for c in range(NUM_CELLS):
        if shape_row[c] == EMPTY:
            continue
        size_code = int(size_row[c])
        alpha = sprite(SHAPES[int(shape_row[c])], size_code, image_size)
        radius = RADIUS[size_code] * cell
        slack = max(cell / 2 - radius - cell * 0.06, 0.0)  # keep a margin to the cell border
        cx = (c % GRID + 0.5) * cell + offsets[c, 0] * slack
        cy = (c // GRID + 0.5) * cell + offsets[c, 1] * slack
        side = alpha.shape[0]
        x0, y0 = int(round(cx - side / 2)), int(round(cy - side / 2))
        # Clip to the canvas (only matters for tiny images where a sprite's padding overhangs).
        ax0, ay0 = max(0, -x0), max(0, -y0)
        x0, y0 = max(0, x0), max(0, y0)
        x1, y1 = min(image_size, x0 + side - ax0), min(image_size, y0 + side - ay0)
        a = alpha[ay0 : ay0 + (y1 - y0), ax0 : ax0 + (x1 - x0), None]
        region = pixels[y0:y1, x0:x1]
        region += (_COLOR_VALUES[int(color_row[c])] - region) * a
    return Image.fromarray(np.clip(np.rint(pixels), 0, 255).astype(np.uint8), "RGB")


def png_bytes(image: Image.Image) -> bytes:
    """PNG encoding of an image (deterministic for identical pixels).

    zlib level 1: on noisy 64 px images it is twice as fast as the default and no larger.
    """
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()
