"""Checkpoints: weights as safetensors, training state beside them, a ``latest`` pointer.

Layout::

    checkpoints/
      latest                  # text file: the name of the newest complete checkpoint
      000120/
        model.safetensors     # the model's weights (plain keys) + its config in the metadata
        momentum.safetensors  # momentum encoders and queue (only with itc: momentum)
        training_state.pt     # optimizer, scaler, schedule position, RNG states, composer,
                              # pending batches, embedding cache, epoch/step (tensors + plain values)
        meta.json             # step, epoch, what produced it

A checkpoint directory is written atomically (temporary directory, then rename) and the
``latest`` pointer is updated only afterwards, so a kill at any moment leaves the previous
checkpoint usable. Loading never unpickles code: weights through safetensors, state
through ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from falcon_cli.artifacts.atomic import atomic_dir, write_json, write_text
# the layout and the weight files are below models and this module alike (re-exported here: one import for callers)
from falcon_cli.artifacts.checkpoints import LATEST, META, STATE, WEIGHTS, latest_checkpoint  # noqa: F401
from falcon_cli.artifacts.state_dicts import load_weights, save_weights
from falcon_cli.errors import FalconError, Refused


def save_checkpoint(directory: str | Path, step: int, modules: dict[str, torch.nn.Module], state: dict[str, Any],
                    meta: dict[str, Any], keep_last: int = 3) -> Path:
    """Write ``checkpoints/<step>/`` atomically, point ``latest`` at it, keep the newest ``keep_last``.

    ``modules`` maps a file stem to a module: ``{"model": albef}`` gives ``model.safetensors``
    (with the model config in its metadata, so :func:`falcon_cli.models.model_from_weights`
    rebuilds it), and e.g. ``"momentum"`` for the momentum encoders and queue.
    """
    root = Path(directory)
    target = root / f"{step:08d}"
    with atomic_dir(target) as tmp:
        for name, module in modules.items():
            save_weights(module, tmp / f"{name}.safetensors")
        torch.save(state, tmp / STATE)
        write_json(tmp / META, {"step": step, **meta})
    write_text(root / LATEST, target.name + "\n")
    if keep_last > 0:
        for old in sorted(p for p in root.iterdir() if p.is_dir() and p.name.isdigit())[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return target


def rewind_latest(directory: str | Path, before_step: int) -> Path | None:
    """Point ``latest`` at the newest kept checkpoint saved before ``before_step`` (removing the
    pointer when there is none, so ``--resume`` starts from scratch); returns it. For weights known
    to fail: a resume from them would only fail again."""
    root = Path(directory)
    earlier = sorted(p for p in root.iterdir() if p.is_dir() and p.name.isdigit() and int(p.name) < before_step
                     and (p / WEIGHTS).exists()) if root.is_dir() else []
    if earlier:
        write_text(root / LATEST, earlier[-1].name + "\n")
        return earlier[-1]
    (root / LATEST).unlink(missing_ok=True)
    return None


def load_checkpoint_weights(checkpoint: str | Path, modules: dict[str, torch.nn.Module]) -> None:
    """Load each ``<name>.safetensors`` of a checkpoint directory into ``modules[name]`` (strict)."""
    for name, module in modules.items():
        path = Path(checkpoint) / f"{name}.safetensors"
        if not path.exists():
            raise FalconError(f"{path}: not found; the checkpoint was saved by another configuration")
        load_weights(module, path)


def load_training_state(checkpoint: str | Path) -> dict[str, Any]:
    """Load ``training_state.pt`` safely (``weights_only=True``: tensors and plain values only)."""
    path = Path(checkpoint) / STATE
    if not path.exists():
        raise FalconError(f"{path}: training state not found; cannot resume from {checkpoint}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated, overwritten or not a checkpoint: never retry it unsafely
        if "unsupported global" in str(exc).lower():  # a pickled object, not a damaged file
            raise FalconError(f"{path}: holds more than tensors and plain values; refused (falcon never loads "
                              "checkpoints in a way that could run code from them)") from None
        raise FalconError(f"{path}: damaged, cannot be read ({type(exc).__name__})") from None


def resume_point(directory: str | Path, modules: dict[str, torch.nn.Module]) -> tuple[Path, dict[str, Any], list[str]] | None:
    """What ``--resume`` continues from: the checkpoint ``latest`` points to or, when it is damaged
    (a kill or a full disk while it was copied, a truncated file), the newest intact one kept before it.
    Loads its weights into ``modules`` and returns (checkpoint, training state, the damaged ones passed
    over, each with why); None when there is no checkpoint. Nothing on disk changes."""
    root = Path(directory)
    if not (root / LATEST).exists():
        return None
    named = root / (root / LATEST).read_text().strip()
    kept = sorted((p for p in root.iterdir() if p.is_dir() and p.name.isdigit()), reverse=True)
    candidates = ([named] if named.is_dir() else []) + [p for p in kept if p.name < named.name]
    damaged = [] if named.is_dir() else [f"{named.name} (missing)"]
    for checkpoint in candidates:
        try:
            if not (checkpoint / WEIGHTS).exists():
                raise FalconError(f"{checkpoint / WEIGHTS}: missing")
            state = load_training_state(checkpoint)
            load_checkpoint_weights(checkpoint, modules)
        except FalconError as exc:
            damaged.append(f"{checkpoint.name} ({exc})")
            continue
        return checkpoint, state, damaged
    raise Refused(f"{root}: no intact checkpoint to resume from ({'; '.join(damaged)}); "
                      "start again without --resume (add --overwrite to replace the run)")
