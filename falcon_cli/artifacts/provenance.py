"""What produced a run: git state, package versions, host. Recorded in every manifest."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

import falcon_cli

PACKAGES = (
    "torch",
    "torchvision",
    "transformers",
    "tokenizers",
    "timm",
    "open_clip_torch",
    "faiss-cpu",
    "numpy",
    "pandas",
    "pyarrow",
    "h5py",
    "pillow",
    "pydantic",
    "pyyaml",
    "typer",
    "rich",
    "matplotlib",
)
"""Distributions whose installed versions every manifest records."""

SOURCE_DIR = Path(falcon_cli.__file__).resolve().parents[1]


def git_state(directory: Path = SOURCE_DIR) -> dict:
    """``{"sha": ..., "dirty": bool}`` of the falcon checkout, or nulls when it is not a git checkout."""

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=directory, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    if sha is None:
        return {"sha": None, "dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"sha": sha, "dirty": bool(status)}


def package_versions() -> dict[str, str | None]:
    """Installed version of each package in :data:`PACKAGES` (None when absent)."""
    versions: dict[str, str | None] = {"falcon": falcon_cli.__version__, "python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    torch = sys.modules.get("torch")  # only if already imported: importing torch costs seconds
    if torch is not None:
        versions["cuda"] = torch.version.cuda
    return versions


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (``/proc/cpuinfo``'s first ``model name``; the platform's processor field elsewhere, or
    ``unknown``). Another CPU model can train other numbers from the same commit, seed and config (its kernels take
    other code paths), so a CPU run records it."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def host_info() -> dict:
    """Host name, platform, CPU count and model (:func:`cpu_model`), the names of the visible GPUs (empty without
    CUDA, or where torch is not imported yet: importing it costs seconds) and the libraries preloaded into the process
    (``LD_PRELOAD``'s file names: a memory allocator such as tcmalloc changes a CPU run's speed, not its numbers)."""
    torch = sys.modules.get("torch")
    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch is not None and torch.cuda.is_available()
        else []
    )
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "cpu": cpu_model(),
        "gpus": gpus,
        "preloaded": [Path(lib).name for lib in os.environ.get("LD_PRELOAD", "").replace(":", " ").split()],
    }
