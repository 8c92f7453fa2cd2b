"""Checkpoints: weights as safetensors, training state beside them, a ``latest`` pointer.

Layout::

    checkpoints/
      latest                  # text file: the name of the newest complete checkpoint
      000120/
        model.safetensors     # weights only (plain keys, no module./_orig_mod. prefixes)
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
from safetensors.torch import load_file, save_file

from falcon_cli.artifacts.atomic import atomic_dir, write_json, write_text
from falcon_cli.errors import FalconError

WEIGHTS = "model.safetensors"
STATE = "training_state.pt"
META = "meta.json"
LATEST = "latest"


def clean_key(key: str) -> str:
    """Strip wrapper prefixes (``module.`` from DDP, ``_orig_mod.`` from torch.compile)."""
    for prefix in ("module.", "_orig_mod."):
        while key.startswith(prefix):
            key = key[len(prefix):]
        key = key.replace(f".{prefix}", ".")
    return key


def model_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict with clean keys, shared (tied) tensors stored once, contiguous on CPU."""
    weights: dict[str, torch.Tensor] = {}
    seen: dict[int, str] = {}
    for key, tensor in model.state_dict().items():
        ptr = tensor.data_ptr() if tensor.numel() else id(tensor)
        if ptr in seen and tensor.numel():
            continue  # tied weight: saved under its first name, re-tied by the module on load
        seen[ptr] = key
        weights[clean_key(key)] = tensor.detach().to("cpu").contiguous()
    return weights


def save_checkpoint(directory: str | Path, step: int, model: torch.nn.Module, state: dict[str, Any],
                    meta: dict[str, Any], keep_last: int = 3) -> Path:
    """Write ``checkpoints/<step>/`` atomically, point ``latest`` at it, keep the newest ``keep_last``."""
    root = Path(directory)
    target = root / f"{step:08d}"
    with atomic_dir(target) as tmp:
        save_file(model_weights(model), str(tmp / WEIGHTS))
        torch.save(state, tmp / STATE)
        write_json(tmp / META, {"step": step, **meta})
    write_text(root / LATEST, target.name + "\n")
    if keep_last > 0:
        for old in sorted(p for p in root.iterdir() if p.is_dir() and p.name.isdigit())[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return target


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The checkpoint ``latest`` points to, or None when there is none."""
    root = Path(directory)
    pointer = root / LATEST
    if not pointer.exists():
        return None
    target = root / pointer.read_text().strip()
    if not (target / WEIGHTS).exists():
        raise FalconError(f"{pointer} points to {target.name}, which has no {WEIGHTS}; remove the pointer or restore the checkpoint")
    return target


def load_weights(model: torch.nn.Module, checkpoint: str | Path, strict: bool = True) -> None:
    """Load ``model.safetensors`` from a checkpoint directory (or a .safetensors file) into ``model``."""
    path = Path(checkpoint)
    path = path / WEIGHTS if path.is_dir() else path
    if not path.exists():
        raise FalconError(f"{path}: checkpoint weights not found")
    weights = load_file(str(path))
    own = {clean_key(k) for k in model.state_dict()}
    missing = own - set(weights)
    # Tied weights are stored once; their other names are legitimately absent.
    tied = {k for k in missing if _is_tied(model, k, weights)}
    missing -= tied
    unexpected = set(weights) - own
    if strict and (missing or unexpected):
        raise FalconError(f"{path}: weights do not fit the model (missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}); "
                          "was it saved from another model config?")
    model.load_state_dict(weights, strict=False)


def _is_tied(model: torch.nn.Module, key: str, weights: dict) -> bool:
    state = model.state_dict()
    for name, tensor in state.items():
        if clean_key(name) == key:
            ptr = tensor.data_ptr()
            return any(clean_key(other) in weights and t.data_ptr() == ptr for other, t in state.items() if other != name)
    return False


def load_training_state(checkpoint: str | Path) -> dict[str, Any]:
    """Load ``training_state.pt`` safely (``weights_only=True``: tensors and plain values only)."""
    path = Path(checkpoint) / STATE
    if not path.exists():
        raise FalconError(f"{path}: training state not found; cannot resume from {checkpoint}")
    return torch.load(path, map_location="cpu", weights_only=True)
