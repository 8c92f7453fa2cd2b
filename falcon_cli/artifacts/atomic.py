"""Atomic file writes: write a temporary file beside the target, then rename.

A killed process therefore never leaves a half-written artifact: readers see either the
old file or the complete new one.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any, Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path in the target's directory; rename it onto ``path`` on success.

    Use it for writers that want a file name rather than a handle (h5py, pyarrow, PIL).
    On any exception the temporary file is removed and ``path`` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        # mkstemp creates 0600 files; give artifacts the usual umask-based permissions.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_path, 0o666 & ~umask)
        os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary file for writing that replaces ``path`` atomically when closed."""
    if "b" in mode:
        encoding = None
    with atomic_path(path) as tmp:
        with open(tmp, mode, encoding=encoding) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Atomically write ``text`` to ``path``."""
    with atomic_open(path, "w") as handle:
        handle.write(text)
    return Path(path)


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Atomically write ``data`` to ``path``."""
    with atomic_open(path, "wb") as handle:
        handle.write(data)
    return Path(path)


def write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2) -> Path:
    """Atomically write ``obj`` as JSON (UTF-8, keys in insertion order, trailing newline)."""
    text = json.dumps(obj, indent=indent, ensure_ascii=False)
    return write_text(path, text + "\n")
