"""Image paths: resolving them against a root, opening them, and scanning many at once.

Retrieval and VQA files name the same image many times, so scans take the distinct
paths, probe each once (in a thread pool: the work is file-system latency) and show a
progress bar.
"""

from __future__ import annotations

import collections
import functools
import io
import os
import tarfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
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


OPEN_SHARDS = 64
"""Shard files a thread keeps open (least recently used closed first: 14M pairs are ~1,400 shards)."""
_THREAD = threading.local()  # per thread: one thread never closes a descriptor another is reading


class _OpenShards(collections.OrderedDict):
    """A thread's open shard descriptors; closed when the thread (a scan's pool worker) ends."""

    def __del__(self):
        for fd in self.values():
            try:
                os.close(fd)
            except OSError:
                pass


def _shard_fd(path: Path) -> int:
    cache = getattr(_THREAD, "shards", None)
    if cache is None:
        cache = _THREAD.shards = _OpenShards()
    fd = cache.get(path)
    if fd is None:
        fd = cache[path] = os.open(path, os.O_RDONLY)
        while len(cache) > OPEN_SHARDS:
            os.close(cache.popitem(last=False)[1])
    else:
        cache.move_to_end(path)
    return fd


@dataclass(frozen=True)
class ShardImage:
    """An image stored inside a tar shard, addressed by byte range (from the shard index,
    :mod:`falcon_cli.data.shards`).

    It stands where an image path stands: ``str()`` / ``os.fspath()`` give ``shard.tar#member`` (what manifests,
    fingerprints and audit tables record), :func:`load_image` and :func:`probe_image` read it.
    """

    shard: Path
    """The tar file."""
    member: str
    """The image member's name inside the tar."""
    offset: int
    """Byte offset of the member's data in the tar."""
    size: int
    """Its size in bytes."""

    def __fspath__(self) -> str:
        return f"{self.shard}#{self.member}"

    __str__ = __fspath__

    @property
    def suffix(self) -> str:
        """The member's extension, as ``Path.suffix`` gives it."""
        return Path(self.member).suffix

    def read_bytes(self) -> bytes:
        """The image's encoded bytes: one ``pread`` (no tar parsing; the descriptor is kept open, and a forked
        DataLoader worker can share it since ``pread`` does not move a file offset)."""
        try:
            data = os.pread(_shard_fd(self.shard), self.size, self.offset)
        except FileNotFoundError:
            raise FalconError(f"{self.shard}: shard not found (it was present when the dataset was loaded)") from None
        if len(data) != self.size:
            raise FalconError(
                f"{self}: the shard ends before the image does ({len(data):,} of {self.size:,} bytes); "
                f"the shard is truncated: re-download it and rebuild the index (falcon data index)"
            )
        return data


def _open_source(path) -> str | Path | io.BytesIO:
    """What ``Image.open`` reads for an image reference: a path, or the bytes of a shard member."""
    if isinstance(path, ShardImage):
        return io.BytesIO(path.read_bytes())
    text = os.fspath(path)
    shard, sep, member = text.partition(".tar#")
    if sep and not os.path.exists(text):  # a ShardImage written out as text (an audit table): find the member
        try:
            with tarfile.open(shard + ".tar", mode="r:") as tar:
                handle = tar.extractfile(member)
                return io.BytesIO(handle.read()) if handle is not None else text
        except (OSError, KeyError, tarfile.TarError):
            return text
    return path


def load_image(path: str | Path | ShardImage) -> Image.Image:
    """Open an image as RGB; a file that cannot be decoded raises a one-line :class:`FalconError`."""
    try:
        with Image.open(_open_source(path)) as img:
            return img.convert("RGB")
    except FalconError:
        raise
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
    if isinstance(path, ShardImage):
        try:
            data = path.read_bytes()
        except (FalconError, OSError):
            return ImageStatus.MISSING
        if not verify:
            return ImageStatus.OK
        path = io.BytesIO(data)  # type: ignore[assignment]
    elif not os.path.isfile(path):
        return ImageStatus.MISSING
    elif not verify:
        return ImageStatus.OK
    try:
        with Image.open(path) as img:
            img.verify()
        if isinstance(path, io.BytesIO):
            path.seek(0)
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
            yield from pool.map(lambda p: probe_image(p, verify), paths[start : start + chunk])


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
