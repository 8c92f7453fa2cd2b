"""Module weights as files: state dicts read from and written to disk, whatever the model.

:func:`read_state_dict` reads ``.safetensors``, ``.pth``/``.pt``/``.bin`` and directories holding one;
:func:`save_weights` / :func:`load_weights` write and load a module's cleaned state dict (safetensors,
atomically, its config in the metadata when it has one); :func:`clean_state_dict` strips the prefixes
of DDP- or ``torch.compile``-wrapped modules. Below models and checkpoints alike (both use it), so it
knows no model class. Nothing here unpickles arbitrary objects: ``.pth``/``.bin`` files are read with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from pathlib import Path
from typing import Mapping

import torch
from torch import nn

from falcon_cli.artifacts.atomic import atomic_path
from falcon_cli.errors import FalconError

log = logging.getLogger("falcon.models")

CONFIG_METADATA_KEY = "falcon.model_config"
"""safetensors metadata key holding the model's config as JSON."""

_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _names(keys, limit: int = 4) -> str:
    keys = sorted(keys)
    if not keys:
        return "none"
    shown = ", ".join(keys[:limit])
    return f"{len(keys)} ({shown}{', ...' if len(keys) > limit else ''})"


def clean_state_dict(state_dict: Mapping[str, torch.Tensor]) -> "OrderedDict[str, torch.Tensor]":
    """The state dict with wrapper prefixes removed: leading ``module.`` (DDP) and ``_orig_mod.``
    (``torch.compile``) in any order and nesting, and ``_orig_mod.`` of compiled submodules."""
    out: OrderedDict[str, torch.Tensor] = OrderedDict()
    for key, value in state_dict.items():
        stripped = True
        while stripped:
            stripped = False
            for prefix in _WRAPPER_PREFIXES:
                if key.startswith(prefix):
                    key, stripped = key[len(prefix) :], True
        out[key.replace("._orig_mod.", ".")] = value
    return out


def read_state_dict(path: str | os.PathLike, what: str = "weights") -> dict[str, torch.Tensor]:
    """Tensors from a ``.safetensors`` file, a ``.pth``/``.pt``/``.bin`` file (``weights_only`` load,
    unwrapping ``{"model": ...}``/``{"state_dict": ...}``), or a directory holding
    ``model.safetensors`` or ``pytorch_model.bin``."""
    path = Path(path).expanduser()
    if path.is_dir():
        for name in ("model.safetensors", "pytorch_model.bin"):
            if (path / name).is_file():
                path = path / name
                break
        else:
            raise FalconError(f"{what} '{path}': directory holds no model.safetensors or pytorch_model.bin")
    if not path.is_file():
        raise FalconError(f"{what} '{path}': no such file (give a .safetensors/.pth/.bin file or a directory)")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            sd = load_file(str(path), device="cpu")
        elif path.suffix in (".pth", ".pt", ".bin", ".ckpt"):
            sd = torch.load(path, map_location="cpu", weights_only=True)
        else:
            raise FalconError(
                f"{what} '{path}': unknown file type '{path.suffix}' (use .safetensors, .pth, .pt or .bin)"
            )
    except FalconError:
        raise
    except Exception as exc:  # corrupt file, pickled code refused by weights_only, ...
        raise FalconError(f"{what} '{path}': cannot read weights ({_first_line(exc)})") from None
    for wrapper in ("model", "state_dict", "module"):
        if isinstance(sd, dict) and isinstance(sd.get(wrapper), dict):
            sd = sd[wrapper]
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise FalconError(f"{what} '{path}': not a state dict of tensors")
    return dict(clean_state_dict(sd))


def save_weights(model: nn.Module, path: str | os.PathLike) -> Path:
    """Write the model's cleaned state dict to ``path`` (safetensors, atomically) with its config in the metadata."""
    from safetensors.torch import save_file

    sd = {k: v.detach().contiguous() for k, v in clean_state_dict(model.state_dict()).items()}
    config = getattr(model, "config", None)
    metadata = {"format": "pt"}
    if getattr(config, "framework", None) is not None:  # a registered model's config (any framework)
        metadata[CONFIG_METADATA_KEY] = config.model_dump_json()
    path = Path(path)
    with atomic_path(path) as tmp:
        save_file(sd, str(tmp), metadata=metadata)
    return path


def load_weights(model: nn.Module, path: str | os.PathLike, strict: bool = True) -> None:
    """Load a state dict file (see :func:`read_state_dict`) into ``model``; with ``strict`` every key must match."""
    sd = read_state_dict(path, "model weights")
    target = model.state_dict()
    mismatched = [
        f"{k} {tuple(v.shape)} vs {tuple(target[k].shape)}"
        for k, v in sd.items()
        if k in target and v.shape != target[k].shape
    ]
    if mismatched:
        raise FalconError(
            f"model weights '{path}': shapes differ from the model (file vs model: {mismatched[0]}); "
            "build the model with the config the weights were saved with"
        )
    result = model.load_state_dict(sd, strict=False)
    if strict and (result.missing_keys or result.unexpected_keys):
        raise FalconError(
            f"model weights '{path}': keys do not match the model: missing {_names(result.missing_keys)}, "
            f"unexpected {_names(result.unexpected_keys)}"
        )
    if result.missing_keys or result.unexpected_keys:
        log.warning(
            "model weights from %s: missing %s; unexpected %s",
            path,
            _names(result.missing_keys),
            _names(result.unexpected_keys),
        )
