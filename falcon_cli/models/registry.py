"""Model registry: named configurations stored as JSON files (like open_clip's).

Every ``configs/<name>.json`` beside this module is a model; :func:`add_model_config`
registers more (a file or a directory of files). A JSON file holds the fields of
:class:`~falcon_cli.models.config.AlbefConfig`; fields left out take their defaults.

Reading the configs imports no network and no torch: the config schema checks model names here, and
``falcon recipes validate`` must not wait for torch. Each family's builder is imported when a model is built
(:mod:`falcon_cli.models.families`), as are the weight readers of :func:`model_from_weights`.

>>> model = create_model("albef-tiny", vocab_size=len(tokenizer))            # doctest: +SKIP
>>> model = create_model("albef-base", vision_weights="timm:deit_base_patch16_224.fb_in1k",
...                      text_weights="bert-base-uncased")                    # doctest: +SKIP
"""

from __future__ import annotations

import difflib
import json
import os
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from falcon_cli.errors import FalconError
from falcon_cli.models.config import AlbefConfig, apply_overrides, make_config
from falcon_cli.models.families import model_family

if TYPE_CHECKING:
    from torch import nn

_CONFIGS: dict[str, AlbefConfig] = {}
_LOADED_BUILTINS = False


def _builtin_dir():
    return resources.files("falcon_cli.models") / "configs"


def _read_config_file(path) -> AlbefConfig:
    source = f"model config '{path}'"
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise FalconError(f"{source}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except OSError as exc:
        raise FalconError(f"{source}: cannot read ({exc.strerror or exc})") from None
    if not isinstance(values, dict):
        raise FalconError(f"{source}: expected a JSON object of config fields, got {type(values).__name__}")
    return make_config(values, source)


def _registry() -> dict[str, AlbefConfig]:
    global _LOADED_BUILTINS
    if not _LOADED_BUILTINS:
        for entry in _builtin_dir().iterdir():
            if entry.name.endswith(".json"):
                _CONFIGS.setdefault(entry.name[: -len(".json")], _read_config_file(entry))
        _LOADED_BUILTINS = True
    return _CONFIGS


def list_models() -> list[str]:
    """Names of the registered models, sorted."""
    return sorted(_registry())


def add_model_config(path: str | os.PathLike) -> list[str]:
    """Register ``path`` (a ``<name>.json`` file, or a directory of them) and return the names added.

    A name already registered is replaced by the new file.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        files = sorted(path.glob("*.json"))
        if not files:
            raise FalconError(f"model config directory '{path}': no *.json files in it")
    elif path.is_file():
        if path.suffix != ".json":
            raise FalconError(f"model config '{path}': expected a .json file")
        files = [path]
    else:
        raise FalconError(f"model config '{path}': no such file or directory")
    configs = {f.stem: _read_config_file(f) for f in files}  # validate all before registering any
    _registry().update(configs)
    return list(configs)


def get_model_config(name: str) -> AlbefConfig:
    """A fresh copy of the registered config ``name``."""
    registry = _registry()
    if name not in registry:
        near = difflib.get_close_matches(name, list(registry), n=1, cutoff=0.5)
        hint = f"did you mean '{near[0]}'? " if near else ""
        raise FalconError(
            f"unknown model '{name}': {hint}valid models: {', '.join(sorted(registry))} "
            "(or register a JSON config with add_model_config)"
        )
    return registry[name].model_copy(deep=True)


def build_model(config: AlbefConfig):
    """The model of ``config``'s framework (an :class:`ALBEF`, a BLIP-2 ``Blip2QFormer`` or a ``DualEncoder``, as
    its family's record says): random init, then the pretrained sources it names are loaded."""
    return model_family(config).build(config)


def resolve_model_config(name: str, **overrides: Any) -> AlbefConfig:
    """The registered config ``name`` with ``overrides`` (config fields) applied and validated."""
    return apply_overrides(get_model_config(name), overrides, f"model '{name}'")


def create_model(name: str, **overrides: Any):
    """Build the registered model ``name``; ``overrides`` are config fields (``image_size=64``,
    ``vocab_size=len(tokenizer)``, ``vision_weights=...``, ``text_weights=...``).

    Unknown names or keys raise :class:`FalconError` naming the valid ones / the nearest key.
    """
    return build_model(resolve_model_config(name, **overrides))


def model_from_weights(path: str | os.PathLike) -> nn.Module:
    """Rebuild the model saved by :func:`~falcon_cli.artifacts.state_dicts.save_weights` (config from the
    metadata; no pretrained sources read)."""
    # (lazy: torch; the config schema reads this module's names and configs)
    from falcon_cli.models.weights import load_weights, read_weights_config, without_weight_sources

    model = build_model(without_weight_sources(read_weights_config(path)))
    load_weights(model, path)
    return model
