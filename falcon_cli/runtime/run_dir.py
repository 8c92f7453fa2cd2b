"""The run directory: ``manifest.json``, ``config.yaml``, ``log.txt`` and the artifacts.

A :class:`RunDirectory` records what produced a run (command line, resolved config, git
SHA and dirty flag, package versions, seed, host, world size, start/end), every
artifact with its schema, version and sha256, and per stage the pretrained sources it
loaded (hub ids with the commit they resolved to, local files with their sha256). The
manifest is rewritten atomically after each change, so it is always complete on disk.
Only rank 0 writes.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import socket
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import yaml

from falcon_cli.artifacts.atomic import write_bytes, write_json, write_text
from falcon_cli.artifacts.config_diff import config_differences
from falcon_cli.artifacts.provenance import git_state, host_info, package_versions
from falcon_cli.artifacts.renamed_keys import upgrade_stored
from falcon_cli.errors import FalconError
from falcon_cli.runtime.distributed import is_main_process, on_rank_zero, world_size
from falcon_cli.runtime.hub import forget_sources, take_sources

MANIFEST_SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
CONFIG = "config.yaml"
LOG = "log.txt"
LOCK = ".lock"


def now() -> str:
    """The current UTC time, ISO 8601 with seconds."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def sha256_path(path: Path) -> dict[str, Any]:
    """``sha256`` and ``bytes`` of a file; of a directory, a sha256 over its files' relative paths and sha256s in
    order, their total ``bytes`` and the number of ``files``."""
    if not path.is_dir():
        return {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    files = sorted(p for p in path.rglob("*") if p.is_file())
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.relative_to(path).as_posix().encode())
        digest.update(sha256_file(f).encode())
    return {"sha256": digest.hexdigest(), "bytes": sum(f.stat().st_size for f in files), "files": len(files)}


def loaded_sources() -> list[dict[str, Any]]:
    """The pretrained sources this process loaded since the last call (:func:`~falcon_cli.runtime.hub.take_sources`):
    hub ids as noted (repository, revision, resolved commit), local files and directories with :func:`sha256_path`."""
    sources = take_sources()
    for entry in sources:
        path = Path(entry["path"]) if "path" in entry else None
        if path is not None and path.exists() and is_main_process():
            entry.update(sha256_path(path))
    return sources


class RunDirectory:
    """One run's directory and its manifest.

    Use :meth:`open` to start (or continue) a run; :meth:`add_artifact` for every file a
    stage writes; :meth:`stage` as a context manager around each stage; :meth:`close` at the end.
    """

    def __init__(self, path: str | Path):
        # Absolute from the start: every path a stage builds from ``run.path`` then means the same
        # file whatever the working directory, and never joins the run directory onto itself.
        self.path = Path(os.path.abspath(path))
        self.manifest: dict[str, Any] = {}
        self._log_handler: logging.Handler | None = None
        self._before: dict[str, Any] | None = None

    # -- life cycle ------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | Path,
        *,
        config: dict,
        seed: int,
        command: list[str] | None = None,
        overwrite: bool = False,
        as_current: Callable[[dict], dict] | None = None,
    ) -> "RunDirectory":
        """Create the run directory (or continue one made with the same config) and write its manifest.

        A directory that already holds a run with a different resolved config is refused
        (with the keys that differ) unless ``overwrite`` is set, so two experiments never
        mix their artifacts. ``as_current`` maps the stored config to the schema of today
        (:func:`falcon_cli.config.recipes.as_current_config`), so a field added since the run
        was made, whose default is the behaviour it had, does not count as a difference.
        """
        run = cls(path)
        forget_sources()  # what this process loaded before the run opened is not the run's

        def lock_and_check() -> dict:
            existed = run.path.exists()
            run.path.mkdir(parents=True, exist_ok=True)
            created_lock = not (run.path / LOCK).exists()
            acquire_lock(run.path)  # one writer at a time; dies with the process
            try:
                previous = run._check_reusable(config, overwrite, as_current)
            except BaseException:
                release_lock(run.path)
                if created_lock:
                    (run.path / LOCK).unlink(missing_ok=True)
                if not existed:
                    run.path.rmdir()
                raise
            run._before = run._record_files()
            run._before["existed"] = existed
            return {"previous": previous, "stale": remove_stale_temporaries(run.path)}

        # Rank 0 alone locks, checks and writes the run directory; other ranks keep an unsaved copy. Under torchrun
        # they wait for rank 0's verdict and stop with its line when it refuses (a held lock, another run's config).
        opened = on_rank_zero(lock_and_check)
        previous, stale = opened.get("previous", {}), opened.get("stale", [])
        command = list(command if command is not None else sys.argv)
        run.manifest = {
            "schema_version": MANIFEST_SCHEMA_VERSION,
            "name": run.path.name,
            "status": "running",
            "command": command,
            "config": config,
            "seed": seed,
            "world_size": world_size(),
            "git": git_state(),
            "packages": package_versions(),
            "host": host_info(),
            "cwd": os.getcwd(),  # what relative paths on the command line were relative to
            "created": previous.get("created", now()),
            "start": now(),
            "end": None,
            "stages": previous.get("stages", {}),
            "artifacts": previous.get("artifacts", {}),
            "history": previous.get("history", []),
        }
        if is_main_process():
            run.path.mkdir(parents=True, exist_ok=True)
            write_text(run.path / CONFIG, yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
            run._attach_log()
            if stale:
                logging.getLogger("falcon").info(
                    "removed %d temporary file(s) an interrupted writer left: %s",
                    len(stale),
                    ", ".join(str(p.relative_to(run.path)) for p in stale[:5]),
                )
            run.save()
        else:  # (the run's log is rank 0's log.txt; without a handler the others' stage log would reach stderr through
            # logging's last resort, beside each error line they print: "stage pretrain failed: <the same line>")
            run._log_handler = logging.NullHandler()
            logging.getLogger("falcon").addHandler(run._log_handler)
        return run

    def _check_reusable(
        self, config: dict, overwrite: bool, as_current: Callable[[dict], dict] | None = None
    ) -> dict[str, Any]:
        """The previous manifest of this directory ({} if new); refuse a different config or a foreign directory."""
        if (self.path / MANIFEST).exists():
            previous = read_manifest(self.path)
            stored = previous.get("config", {})
            diffs = config_differences(as_current(stored) if as_current else stored, config)
            if diffs and not overwrite:
                shown = "; ".join(diffs[:3]) + (f"; and {len(diffs) - 3} more" if len(diffs) > 3 else "")
                raise FalconError(
                    f"{self.path} holds a run with a different config ({shown}); "
                    "use another --run-dir, or pass --overwrite to replace its config"
                )
            return previous
        if self.path.exists() and any(p.name != LOCK for p in self.path.iterdir()) and not overwrite:
            raise FalconError(f"{self.path} exists, is not empty and is not a falcon run; choose another --run-dir")
        return {}

    def _record_files(self) -> dict[str, Any]:
        """What the run's record (manifest, config, log) holds now: bytes, the log's length, or None
        where absent; :meth:`restore` puts it back."""

        def read(name: str) -> bytes | None:
            path = self.path / name
            return path.read_bytes() if path.is_file() else None

        log = self.path / LOG
        return {
            "existed": self.path.exists(),
            MANIFEST: read(MANIFEST),
            CONFIG: read(CONFIG),
            LOG: log.stat().st_size if log.is_file() else None,
        }

    def restore(self) -> None:
        """Put the run's record back as :meth:`open` found it (a refused command changes nothing on disk)."""
        self._detach_log()
        before = getattr(self, "_before", None)
        if before is None:  # (other ranks never wrote)
            return
        for name in (MANIFEST, CONFIG):
            if before[name] is None:
                (self.path / name).unlink(missing_ok=True)
            else:
                write_bytes(self.path / name, before[name])
        log = self.path / LOG
        if before[LOG] is None:
            log.unlink(missing_ok=True)
        elif log.is_file():
            os.truncate(log, before[LOG])
        release_lock(self.path)
        if not before["existed"]:
            (self.path / LOCK).unlink(missing_ok=True)
            if self.path.is_dir() and not any(self.path.iterdir()):
                self.path.rmdir()

    def _detach_log(self) -> None:
        if self._log_handler is not None:
            logging.getLogger("falcon").removeHandler(self._log_handler)
            self._log_handler.close()
            self._log_handler = None

    def close(self, status: str = "completed") -> None:
        """Record the end time and final status (``completed`` or ``failed``)."""
        self.manifest["status"] = status
        self.manifest["end"] = now()
        self.manifest["history"].append(
            {
                "command": self.manifest["command"],
                "start": self.manifest["start"],
                "end": self.manifest["end"],
                "status": status,
            }
        )
        self.save()
        self._detach_log()
        if is_main_process():
            release_lock(self.path)

    def save(self) -> None:
        """Rewrite ``manifest.json`` atomically (rank 0 only)."""
        if is_main_process():
            write_json(self.path / MANIFEST, self.manifest)

    def _attach_log(self) -> None:
        handler = logging.FileHandler(self.path / LOG, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger = logging.getLogger("falcon")
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
        self._log_handler = handler

    # -- stages and artifacts ----------------------------------------------------------------

    def record_stage(self, name: str, *, start: str, status: str, result: dict | None = None) -> None:
        """Record one stage's start, end, status, result summary, and the code and machine it ran on (this
        invocation's ``git`` and ``host``: the manifest's top-level ones are the latest command's, which an evaluation
        after training, perhaps on another machine, replaces)."""
        self.manifest["stages"][name] = {
            "start": start,
            "end": now(),
            "status": status,
            "result": result or {},
            "git": self.manifest.get("git"),
            "host": self.manifest.get("host"),
        }
        sources = loaded_sources()
        if sources:  # hub ids (repo, revision, resolved sha) and local weights (path, sha256) the stage loaded
            self.manifest["stages"][name]["sources"] = sources
        self.save()

    def add_artifact(self, path: str | Path, *, schema: str, schema_version: int, meta: dict | None = None) -> None:
        """Record a written file with its schema, version, size and sha256.

        ``path`` is absolute (e.g. built from :attr:`path`) or relative to the run directory
        (``"metrics.jsonl"``), never relative to the working directory.
        """
        if not is_main_process():
            return
        path = Path(path)
        full = path if path.is_absolute() else self.path / path
        try:
            rel = full.resolve().relative_to(self.path.resolve()).as_posix()
        except ValueError:
            rel = str(full.resolve())
        entry = {"schema": schema, "schema_version": schema_version, **sha256_path(full)}
        if meta:
            entry["meta"] = meta
        self.manifest["artifacts"][rel] = entry
        self.save()


_HELD_LOCKS: dict[str, list[int]] = {}
"""Run directory -> [file descriptor, depth] of the locks this process holds (re-entrant: a process
may open the same run directory again, as the tests and nested stages do)."""


def acquire_lock(run_dir: Path) -> None:
    """Lock ``run_dir`` for this process: an exclusive record lock on ``run_dir/.lock``, which the OS
    drops when the process ends (a kill never leaves a stale lock) and forked children do not inherit. A second writer
    gets one line naming the holder's pid and command."""
    key = str(Path(run_dir).resolve())
    if key in _HELD_LOCKS:
        _HELD_LOCKS[key][1] += 1
        return
    fd = os.open(Path(run_dir) / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        # A POSIX record lock, not flock: it belongs to this process alone, so data-loader workers forked
        # from it do not hold it on after a kill -9 (flock would be shared with them).
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno == errno.ENOLCK:  # a network filesystem mounted without locking (NFS without lockd, `nolock`)
            os.close(fd)
            raise FalconError(
                f"{run_dir}: its filesystem does not support POSIX locks (ENOLCK), which keep one writer "
                "per run directory; mount it with locking (NFS: lockd or NFSv4) or use a --run-dir on a "
                "filesystem that has them (docs/cluster.md)"
            ) from None
        if exc.errno not in (errno.EACCES, errno.EAGAIN):
            os.close(fd)
            raise
        holder = os.pread(fd, 4096, 0).decode("utf-8", errors="replace").strip()
        os.close(fd)
        raise FalconError(
            f"{run_dir} is being written by another falcon process ({holder or 'pid unknown'}); "
            "wait for it to finish or stop it, or use another --run-dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}: {' '.join(sys.argv)}\n".encode(), 0)
    _HELD_LOCKS[key] = [fd, 1]


def release_lock(run_dir: Path) -> None:
    """Undo one :func:`acquire_lock` of this process (the lock goes with the last one)."""
    key = str(Path(run_dir).resolve())
    held = _HELD_LOCKS.get(key)
    if held is None:
        return
    held[1] -= 1
    if held[1] == 0:
        fcntl.lockf(held[0], fcntl.LOCK_UN)
        os.close(held[0])
        del _HELD_LOCKS[key]


def remove_stale_temporaries(run_dir: Path) -> list[Path]:
    """Remove the hidden ``.NAME.*.tmp`` files and directories an interrupted atomic write left in
    ``run_dir`` (a kill while a checkpoint or embeddings file was written). Only call it while holding
    the run's lock: then no live writer owns them. Returns what was removed."""
    removed = []
    for path in sorted({*Path(run_dir).rglob(".*.tmp"), *Path(run_dir).rglob(".*.old-*")}):
        if not path.exists():  # (inside one removed already)
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def read_manifest(run_dir: str | Path) -> dict[str, Any]:
    """Read and check a run's ``manifest.json`` (one-line error if missing, malformed or of another version); its
    ``config`` under today's keys (:func:`~falcon_cli.artifacts.renamed_keys.upgrade_stored`)."""
    path = Path(run_dir) / MANIFEST
    if not path.exists():
        raise FalconError(f"{path}: not found; is {run_dir} a falcon run directory?")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise FalconError(f"{path}: line {exc.lineno}, column {exc.colno}: invalid JSON ({exc.msg})") from None
    version = manifest.get("schema_version") if isinstance(manifest, dict) else None
    if version != MANIFEST_SCHEMA_VERSION:
        raise FalconError(f"{path}: manifest schema_version {version!r}, this falcon reads {MANIFEST_SCHEMA_VERSION}")
    if isinstance(manifest.get("config"), dict):  # (a run written before 0.3.0: its keys under their new names)
        manifest["config"] = upgrade_stored(manifest["config"], str(path))
    return manifest
