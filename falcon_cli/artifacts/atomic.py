"""Atomic file writes: write a temporary file beside the target, then rename.

A killed process therefore never leaves a half-written artifact: readers see either the
old file or the complete new one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Any, Iterator

from falcon_cli.errors import FalconError, storage_error


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path in the target's directory; rename it onto ``path`` on success.

    Use it for writers that want a file name rather than a handle (h5py, pyarrow, PIL).
    On any exception the temporary file is removed and ``path`` is left untouched.
    """
    path = Path(path)
    with _storage_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
    tmp_path = Path(tmp)
    try:
        with _storage_errors(path):
            yield tmp_path
            os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp creates 0600 files
            os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


@contextlib.contextmanager
def _storage_errors(path: Path) -> Iterator[None]:
    """Turn a write that failed for want of space or permission into one line naming ``path``."""
    try:
        yield
    except FalconError as exc:
        inner = getattr(exc, "storage", None)  # a writer nested in this one: name this one's target
        if inner is None:
            raise
        raise storage_error(inner, path) from inner
    except Exception as exc:
        problem = storage_error(exc, path)
        if problem is None:
            raise
        raise problem from exc


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory beside ``path``; on success it replaces ``path`` whole.

    For artifacts that are directories (a shapes world, a tokenizer): readers see the old
    directory or the complete new one, never a mix. Whatever was at ``path`` is set aside
    and removed only after the new directory is in place. On any exception the temporary
    directory is removed and ``path`` is left untouched.
    """
    path = Path(path)
    with _storage_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        with _storage_errors(path):
            yield tmp
            os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700 directories
            if path.exists() or path.is_symlink():
                old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
                os.replace(path, old / "previous")
                os.replace(tmp, path)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
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
