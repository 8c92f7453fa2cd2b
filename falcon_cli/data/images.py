"""Image paths: resolving them against a root, opening them, and scanning many at once.

Retrieval and VQA files name the same image many times, so scans take the distinct
paths, probe each once (in a thread pool: the work is file-system latency) and show a
progress bar.
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor
from enum import Enum
from pathlib import Path
from typing import Iterable, Iterator

from PIL import Image

from falcon_cli.errors import FalconError
from falcon_cli.runtime.progress import track


class ImageStatus(str, Enum):
    """What a probe found at an image path."""

    OK = "ok"
    MISSING = "missing"
    UNREADABLE = "unreadable"


@functools.lru_cache(maxsize=1 << 18)
def resolve_image_path(ref: str, root: Path) -> Path:
    """An image path from an annotation file: absolute paths as they are, others under ``root``.

    Memoised: annotation files name each image many times (5 captions, several questions),
    and building ``Path`` objects dominated loading and checking large files.
    """
    path = Path(ref).expanduser()
    return path if path.is_absolute() else root / path


def load_image(path: str | Path) -> Image.Image:
    """Open an image as RGB; a file that cannot be decoded raises a one-line :class:`FalconError`."""
    try:
        with Image.open(path) as img:
            return img.convert("RGB")
    except FileNotFoundError:
        raise FalconError(f"{path}: image not found (it was present when the dataset was loaded)") from None
    except Exception as exc:  # PIL raises many types for corrupt files
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise FalconError(
            f"{path}: cannot decode image ({reason}); run `falcon data check` to list unreadable images"
        ) from None


def probe_image(path: Path, verify: bool = True) -> ImageStatus:
    """Whether ``path`` is a regular file and (with ``verify``) decodes.

    ``verify`` runs PIL ``verify()`` (container and chunk checksums) and then decodes every
    pixel (``load()``): a PNG whose compressed data is scrambled under valid CRCs passes
    ``verify()`` alone but fails to decode, as it would in training.
    """
    if not os.path.isfile(path):
        return ImageStatus.MISSING
    if not verify:
        return ImageStatus.OK
    try:
        with Image.open(path) as img:
            img.verify()
        with Image.open(path) as img:
            img.load()
    except Exception:
        return ImageStatus.UNREADABLE
    return ImageStatus.OK


def _probe_all(paths: list[Path], verify: bool, workers: int, chunk: int = 2048) -> Iterator[ImageStatus]:
    if len(paths) < 64 or workers <= 1:
        for path in paths:
            yield probe_image(path, verify)
        return
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for start in range(0, len(paths), chunk):
            yield from pool.map(lambda p: probe_image(p, verify), paths[start:start + chunk])


def scan_images(
    paths: Iterable[Path],
    *,
    verify: bool = False,
    description: str = "checking images",
    cache: dict[Path, ImageStatus] | None = None,
    workers: int | None = None,
) -> dict[Path, ImageStatus]:
    """Probe each distinct path once and return ``{path: status}``.

    ``cache`` (optional) holds earlier results: paths in it are not probed again, and new
    results are added to it. A progress bar is drawn when progress is enabled.
    """
    cache = {} if cache is None else cache
    todo = [p for p in dict.fromkeys(paths) if p not in cache]
    workers = workers if workers is not None else min(16, 4 * (os.cpu_count() or 1))
    statuses = _probe_all(todo, verify, workers)
    for path, status in zip(todo, track(statuses, description, total=len(todo))):
        cache[path] = status
    return cache
