"""Where a run's checkpoints are: the file names inside a checkpoint and the ``latest`` pointer.

The layout (written by :mod:`falcon_cli.runtime.checkpoint`, read by it and by everything that loads a
run's weights, models included), below both so that neither imports the other::

    checkpoints/
      latest                  # text file: the name of the newest complete checkpoint
      000120/
        model.safetensors     # WEIGHTS
        training_state.pt     # STATE
        rank-0.pt             # rank_state_name(0): what rank 0 keeps of its own (RNGs, its cache shards, ...)
        rank-1.pt             # ... one per rank (older checkpoints hold them in training_state.pt's "ranks")
        meta.json             # META
"""

from __future__ import annotations

from pathlib import Path

from falcon_cli.errors import FalconError

WEIGHTS = "model.safetensors"
STATE = "training_state.pt"
META = "meta.json"
LATEST = "latest"


def rank_state_name(rank: int) -> str:
    """The file of a checkpoint that holds rank ``rank``'s own state."""
    return f"rank-{rank}.pt"


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The checkpoint ``latest`` points to, or None when there is none."""
    root = Path(directory)
    pointer = root / LATEST
    if not pointer.exists():
        return None
    target = root / pointer.read_text().strip()
    if not (target / WEIGHTS).exists():
        raise FalconError(
            f"{pointer} points to {target.name}, which has no {WEIGHTS}; remove the pointer or restore the checkpoint"
        )
    return target
