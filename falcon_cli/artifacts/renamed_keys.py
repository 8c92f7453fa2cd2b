"""The config keys renamed in 0.3.0, and how a config written with them is read.

0.3.0 split the flat ``pretrain`` section (85 fields) into typed sections: ``pretrain.scheduler_lr`` is now
``pretrain.scheduler.lr``, ``pretrain.composer: falcon`` is ``pretrain.composer.name: falcon``, and so on
(:data:`RENAMED`, and the CHANGELOG). The old keys keep working for one release wherever a config comes from:

- a recipe file (each file of a ``base:`` chain on its own, before the merge) and a ``key=value`` override:
  the key is read under its new name, with one line on stderr naming it (:func:`upgrade_mapping`,
  :func:`upgrade_override`);
- a run directory's ``config.yaml`` and ``manifest.json`` written by 0.2.0 (resume, compare, audit, evaluate
  read them): read under the new names, with one line per process saying so (:func:`upgrade_stored`).

This module sits low in the layers (beside the files it reads) so that the run directory's reader can use it.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

RENAMED_IN = "0.3.0"
"""The release that renamed the keys below; the old names are read until the next one."""

_SECTIONS: dict[str, dict[str, str]] = {
    "encoders": {
        "image_size": "image_size",
        "max_text_length": "max_text_length",
        "vision_weights": "vision_weights",
        "text_weights": "text_weights",
        "vision_trainable_epochs": "vision_trainable_epochs",
        "init": "init",
    },
    "losses": {
        "itc": "itc",
        "itc_consistency_weight": "itc_consistency_weight",
        "momentum": "momentum",
        "queue_size": "queue_size",
        "distill_alpha": "distill_alpha",
        "caption_weight": "caption_weight",
        "itm_negatives": "itm_negatives",
        "mlm_probability": "mlm_probability",
    },
    "composer": {
        "composer": "name",
        "search_space_size": "search_space_size",
        "search_spaces": "search_spaces",
        "drop_last": "drop_last",
        "quantile": "quantile",
        "progressive_start": "progressive_start",
        "progressive_end": "progressive_end",
        "quantile_scale": "quantile_scale",
    },
    "scheduler": {
        "scheduler_level": "level",
        "quantile_levels": "quantile_levels",
        "quantile_temperature": "quantile_temperature",
        "scheduler_features": "features",
        "scheduler_hidden": "hidden",
        "scheduler_blocks": "blocks",
        "scheduler_lr": "lr",
        "scheduler_weight_decay": "weight_decay",
        "scheduler_grad_clip": "grad_clip",
        "scheduler_max_concentration": "max_concentration",
        "scheduler_lag": "lag",
        "scheduler_overlap": "overlap",
    },
    "scheduler.reward": {
        "reward": "name",
        "reward_overshoot": "overshoot",
        "reward_margin": "margin",
        "reward_itm_weight": "itm_weight",
        "reward_hardness": "hardness",
        "reward_itm_charge": "itm_charge",
        "reward_mode": "mode",
        "reward_images": "images",
    },
    "scheduler.update": {
        "scheduler_credit": "credit",
        "scheduler_levels": "levels",
        "scheduler_advantage_norm": "advantage_norm",
        "scheduler_entropy": "entropy",
        "reward_baseline": "baseline",
        "reward_baseline_decay": "baseline_decay",
    },
    "false_negatives": {
        "false_negatives": "method",
        "same_image": "same_image",
        "oracle_negatives": "oracle",
        "mafa": "mafa",
        "srcl": "srcl",
        "diht": "diht",
        "glofnd": "glofnd",
    },
    "optim": {
        "lr": "lr",
        "min_lr": "min_lr",
        "warmup_lr": "warmup_lr",
        "warmup_steps": "warmup_steps",
        "cosine_epochs": "cosine_epochs",
        "weight_decay": "weight_decay",
        "grad_clip": "grad_clip",
    },
    "loader": {
        "num_workers": "num_workers",
        "augment": "augment",
        "hflip": "hflip",
        "preload_images": "preload_images",
    },
    "runtime": {
        "device": "device",
        "precision": "precision",
        "compile": "compile",
        "compile_mode": "compile_mode",
        "graph_step": "graph_step",
        "graph_backend": "graph_backend",
        "profile_steps": "profile_steps",
        "dist_timeout": "dist_timeout",
        "preempt_grace_s": "preempt_grace_s",
    },
    "logging": {"log_every": "every", "loggers": "loggers"},
    "checkpoints": {"checkpoint_every": "every", "keep_last": "keep_last"},
    "eval": {"eval_split": "split", "eval_every": "every"},
}

RENAMED: dict[str, str] = {
    f"pretrain.{old}": f"pretrain.{section}.{new}"
    for section, fields in _SECTIONS.items()
    for old, new in fields.items()
}
"""Every key renamed in 0.3.0, old dotted key -> new dotted key (``pretrain.scheduler_lr`` ->
``pretrain.scheduler.lr``). A renamed section moves whole: ``pretrain.mafa.high`` ->
``pretrain.false_negatives.mafa.high``."""

_SECTION_NAMES = {"composer", "false_negatives"}
"""Old keys that are also the name of a new section: old only when their value is not a mapping
(``composer: falcon`` is old, ``composer: {name: falcon}`` is new)."""

_TOLD: set[str] = set()
"""Lines already printed in this process (each once)."""


def _tell(line: str, once: str | None = None) -> None:
    """Print ``line`` on stderr, once per process (or once per ``once`` key: one line for every stored run)."""
    key = once or line
    if key not in _TOLD:
        _TOLD.add(key)
        print(f"falcon: deprecated: {line}", file=sys.stderr)


def renamed_key(key: str, value: Any = None) -> str | None:
    """The new dotted key of an old one (``pretrain.mafa.high`` -> ``pretrain.false_negatives.mafa.high``), or
    None when ``key`` was not renamed. ``value`` is what the key is set to: ``pretrain.composer`` is old only when
    set to a name, not to a mapping."""
    if key in RENAMED:
        old = key.removeprefix("pretrain.")
        return None if old in _SECTION_NAMES and isinstance(value, dict) else RENAMED[key]
    head = key.rpartition(".")[0]
    while head:  # a key inside a renamed section (pretrain.mafa.high); not inside a new one that kept its name
        if head in RENAMED and head.removeprefix("pretrain.") not in _SECTION_NAMES:
            return f"{RENAMED[head]}.{key[len(head) + 1 :]}"
        head = head.rpartition(".")[0]
    return None


def _tell_renamed(source: str, old: str, new: str) -> None:
    _tell(f"{source}: '{old}' is '{new}' since {RENAMED_IN} (the old key is read until the next release)")


def upgrade_override(key: str, value: Any, source: str) -> str:
    """The key an override ``key=value`` sets: its new name if it was renamed (with one line on stderr)."""
    new = renamed_key(key, value)
    if new is None:
        return key
    _tell_renamed(source, key, new)
    return new


def _moved(pretrain: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """A ``pretrain`` mapping with its old keys moved to their new places, and the ``(old, new)`` pairs moved."""
    out: dict[str, Any] = {}
    moves: list[tuple[str, str]] = []
    pending: list[tuple[str, str, Any]] = []
    for name, value in pretrain.items():
        new = renamed_key(f"pretrain.{name}", value)
        if new is None:
            out[name] = copy.deepcopy(value)
        else:
            pending.append((f"pretrain.{name}", new, value))
    for old, new, value in pending:
        node = out
        parts = new.split(".")[1:]
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                if child is not None:  # (an old name beside the new section, e.g. composer: {..} and quantile)
                    raise ValueError(f"'{old}' moves into '{part}', which is set to {child!r}")
                child = node[part] = {}
            node = child
        if parts[-1] in node:
            raise ValueError(f"both '{old}' and its new name '{new}' are set: keep '{new}'")
        node[parts[-1]] = copy.deepcopy(value)
        moves.append((old, new))
    return out, moves


def renamed_mapping(raw: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """A recipe mapping (one file, or a whole config) with every old ``pretrain`` key under its new name, and the
    ``(old, new)`` keys moved; nothing printed. Raises ValueError when a key is set under both names."""
    pretrain = raw.get("pretrain")
    if not isinstance(pretrain, dict):
        return raw, []
    moved, moves = _moved(pretrain)
    return ({**raw, "pretrain": moved} if moves else raw), moves


def upgrade_mapping(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """:func:`renamed_mapping`, with one line on stderr per old key, naming the new one."""
    upgraded, moves = renamed_mapping(raw)
    for old, new in moves:
        _tell_renamed(source, old, new)
    return upgraded


def upgrade_stored(config: dict[str, Any], source: str) -> dict[str, Any]:
    """A config a run recorded (its ``config.yaml``, its manifest's ``config``) under today's keys. Runs written
    before 0.3.0 get one line per process (not one per run: `falcon compare` reads dozens) saying so."""
    pretrain = config.get("pretrain") if isinstance(config, dict) else None
    if not isinstance(pretrain, dict):
        return config
    try:
        moved, moves = _moved(pretrain)
    except ValueError:
        return config  # (not a config falcon wrote: left for the schema to report)
    if not moves:
        return config
    old, new = moves[0]
    _tell(
        f"{source} was written before {RENAMED_IN}: its keys are read under their new names ('{old}' is '{new}', "
        f"and {len(moves) - 1} more: CHANGELOG.md lists them)",
        once="stored",
    )
    return {**config, "pretrain": moved}
