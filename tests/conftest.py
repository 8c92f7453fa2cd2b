"""Shared test helpers: run the real CLI in a subprocess, tiny shapes worlds built once per session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None, check: bool = False) -> subprocess.CompletedProcess:
    """Run ``falcon ARGS`` as a user would (a fresh process), capturing output."""
    # One intra-op thread: the suite already keeps both cores busy, and oversubscribed OpenMP
    # threads make tiny CPU steps several times slower.
    full_env = {**os.environ, "FALCON_PROGRESS": "0", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **(env or {})}
    full_env.pop("FALCON_DEBUG", None)
    proc = subprocess.run([sys.executable, "-m", "falcon_cli", *map(str, args)], cwd=cwd or REPO,
                          capture_output=True, text=True, env=full_env, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"falcon {' '.join(map(str, args))} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture
def cli():
    """The :func:`run_cli` helper as a fixture."""
    return run_cli


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def captured(monkeypatch):
    """Every matplotlib Figure handed to falcon's PNG saver, in order (the real saver still runs)."""
    from falcon_cli.reporting import figures

    figs = []
    real = figures._save_png

    def spy(fig, path):
        figs.append(fig)
        return real(fig, path)

    monkeypatch.setattr(figures, "_save_png", spy)
    return figs


def assert_png(path: Path) -> None:
    """``path`` is a real PNG, written atomically (no temporary file left beside it)."""
    data = path.read_bytes()
    assert len(data) > 1000 and data.startswith(PNG_MAGIC)
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def random_captions(rng, n_images: int, max_captions: int) -> tuple[list[list[int]], list[int]]:
    """``(img2txt, txt2img)`` of a retrieval split with 1..``max_captions`` consecutive captions per image."""
    img2txt, txt2img = [], []
    for i in range(n_images):
        caps = list(range(len(txt2img), len(txt2img) + rng.randint(1, max_captions)))
        img2txt.append(caps)
        txt2img.extend([i] * len(caps))
    return img2txt, txt2img
