"""Rank and world size from the environment (torchrun sets RANK / WORLD_SIZE / LOCAL_RANK)."""

from __future__ import annotations

import os


def rank() -> int:
    """Global rank of this process (0 when not launched by torchrun)."""
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    """Number of processes in the job (1 when not launched by torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    """True on rank 0, the only rank that draws progress bars and writes artifacts."""
    return rank() == 0
