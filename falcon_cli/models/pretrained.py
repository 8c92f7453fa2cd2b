"""Start a downstream task from a checkpoint: find it, and rebuild its ALBEF at any resolution.

A checkpoint is a falcon checkpoint directory (``model.safetensors`` with the config in its
metadata) or an official ALBEF / GRIT-VLP / MAFA ``.pth`` file (read by
:mod:`falcon_cli.models.albef_checkpoint`). Fine-tuning runs at a higher resolution than
pretraining (ALBEF: 256 px → 384 px), so the ViT's position embeddings are resampled to the new
patch grid (bicubic, as ALBEF's ``interpolate_pos_embed``); every other weight is loaded as it is.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from falcon_cli.artifacts.checkpoints import META, WEIGHTS, latest_checkpoint
from falcon_cli.artifacts.renamed_keys import upgrade_stored
from falcon_cli.errors import FalconError
from falcon_cli.models.albef import ALBEF
from falcon_cli.models.albef_checkpoint import albef_from_file, is_albef_file
from falcon_cli.models.config import AlbefConfig
from falcon_cli.models.families import model_family
from falcon_cli.models.nlvr2 import AlbefNLVR2
from falcon_cli.models.registry import build_model
from falcon_cli.models.vision import resize_pos_embed
from falcon_cli.models.vqa import AlbefVQA
from falcon_cli.models.weights import (  # noqa: F401
    check_vocabulary,
    load_weights,
    read_state_dict,
    read_weights_config,
    without_weight_sources,
)

POS_EMBED = "visual_encoder.pos_embed"


def find_checkpoint(path: str | Path, what: str) -> Path:
    """The checkpoint a run directory (its latest pretraining checkpoint), a checkpoint directory (or
    its ``model.safetensors``) or an ALBEF/GRIT-VLP/MAFA ``.pth`` file names: a directory, or the
    ``.pth`` file itself; ``what`` says which setting gave the path (for the error line)."""
    path = Path(path).expanduser()
    if (path / WEIGHTS).is_file():
        return path
    if path.is_file() and path.name == WEIGHTS:
        return path.parent
    if is_albef_file(path):
        return path
    if (path / "checkpoints").is_dir():
        checkpoint = latest_checkpoint(path / "checkpoints")
        if checkpoint is not None:
            return checkpoint
        raise FalconError(
            f"{what}: {path / 'checkpoints'} has no checkpoint yet; pretrain first "
            f"(falcon pretrain --run-dir {path}) or give a checkpoint directory"
        )
    if not path.exists():
        raise FalconError(f"{what}: {path} not found; give a falcon run directory or a checkpoint directory")
    raise FalconError(
        f"{what}: {path} is neither a run directory (with checkpoints/), a checkpoint "
        f"directory (with {WEIGHTS}) nor an ALBEF/GRIT-VLP/MAFA .pth file"
    )


def at_resolution(state: dict, config: AlbefConfig, image_size: int | None) -> tuple[dict, AlbefConfig]:
    """``(state, config)`` for ``image_size`` pixels: the position embeddings (``visual_encoder.pos_embed``)
    resampled to the new patch grid by :func:`~falcon_cli.models.vision.resize_pos_embed` (ALBEF's
    ``interpolate_pos_embed``); as given when ``image_size`` is None or unchanged. Works for any model
    whose image encoder is ``visual_encoder``."""
    if image_size is None or image_size == config.image_size:
        return state, config
    if POS_EMBED not in state:
        raise FalconError(
            f"this {config.framework} model's image encoder keeps its resolution "
            f"({config.image_size} px): leave the image size unset"
        )
    if image_size % config.patch_size:
        raise FalconError(f"image_size {image_size} is not a multiple of the model's patch size {config.patch_size}")
    grid = image_size // config.patch_size
    state = dict(state)
    state[POS_EMBED] = resize_pos_embed(state[POS_EMBED], grid)
    return state, config.model_copy(update={"image_size": image_size})


def albef_from_checkpoint(
    checkpoint: str | Path, image_size: int | None = None, *, vocab_size: int | None = None
) -> ALBEF:
    """:func:`model_from_checkpoint` for the stages that need an ALBEF (fine-tuning): another framework's
    checkpoint is refused in one line."""
    family = model_family("albef" if is_albef_file(checkpoint) else read_weights_config(Path(checkpoint) / WEIGHTS))
    if not family.downstream:  # (before building it: its image encoder may not take the fine-tuning resolution)
        raise FalconError(
            f"{checkpoint}: a {family.name} checkpoint; fine-tuning (retrieval, VQA, NLVR2) "
            "is built for ALBEF models: evaluate it with `falcon evaluate retrieval` instead"
        )
    return model_from_checkpoint(checkpoint, image_size, vocab_size=vocab_size)


def model_from_checkpoint(checkpoint: str | Path, image_size: int | None = None, *, vocab_size: int | None = None):
    """The model saved in ``checkpoint`` (a falcon checkpoint directory's ``model.safetensors``, or an
    ALBEF/GRIT-VLP/MAFA ``.pth`` file), built for ``image_size`` pixels (None = as saved).

    Only the image encoder's position embeddings depend on the resolution: they are resampled
    from the saved patch grid to the new one. ``vocab_size`` (the run tokenizer's length) is
    checked against the checkpoint's vocabulary: ids from another tokenizer would be read as
    different words.
    """
    if is_albef_file(checkpoint):
        model = albef_from_file(checkpoint, image_size)
        check_vocabulary(model.config.vocab_size, vocab_size, str(checkpoint), official=True)
        return model
    path = Path(checkpoint) / WEIGHTS
    config = without_weight_sources(read_weights_config(path))
    check_vocabulary(tokenizer_vocabulary(config), vocab_size, str(path))
    state, config = at_resolution(read_state_dict(path, "model weights"), config, image_size)
    model = build_model(config)
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise FalconError(
            f"{path}: not a {config.framework} checkpoint of this version (missing {result.missing_keys[:3]}, "
            f"unexpected {result.unexpected_keys[:3]})"
        )
    return model


def tokenizer_vocabulary(config) -> int:
    """The run tokenizer's length a model config was built for: its ``vocab_size``, less BLIP-2's ``[DEC]``
    where that token was appended after the tokenizer's vocabulary (``dec_token_id`` unset)."""
    return model_family(config).tokenizer_vocabulary(config)


FINETUNED = Path("finetune")
"""Fine-tuning output inside a run: ``finetune/<task>/`` (checkpoints/, best/, metrics.jsonl)."""


UNSTATED_TEXT_LENGTH = 30
"""Token limit for checkpoints that do not say what they were trained with (official ``.pth`` files): ALBEF's."""


def trained_text_length(checkpoint: str | Path) -> int | None:
    """The token limit a checkpoint's captions were cut at in training: its ``meta.json``'s
    ``max_text_length``; for checkpoints written before that key, its run's ``config.yaml``
    (``pretrain.encoders.max_text_length`` for ``<run>/checkpoints/<step>``, ``finetune.max_text_length`` for
    ``<run>/finetune/<task>/best``); None when neither says (an official ``.pth`` file)."""
    path = Path(checkpoint)
    meta = path / META
    if meta.is_file():
        value = json.loads(meta.read_text(encoding="utf-8")).get("max_text_length")
        if value is not None:
            return int(value)
    if path.parent.name == "checkpoints":  # <run>/checkpoints/<step>
        run_dir, section = path.parent.parent, "pretrain"
    elif len(path.parents) > 2 and path.parent.parent.name == FINETUNED.name:  # <run>/finetune/<task>/best
        run_dir, section = path.parents[2], "finetune"
    else:
        return None
    config = run_dir / "config.yaml"
    if not config.is_file():
        return None
    stored = upgrade_stored(yaml.safe_load(config.read_text(encoding="utf-8")) or {}, str(config))
    settings = stored.get(section) or {}
    value = (settings.get("encoders") or {}).get("max_text_length") if section == "pretrain" else None
    value = value if value is not None else settings.get("max_text_length")
    return int(value) if value is not None else None


def finetuned_weights(run_dir: str | Path, task: str) -> Path:
    """``<run>/finetune/<task>/best``: the weights ``falcon finetune`` kept for ``task``."""
    return Path(run_dir) / FINETUNED / task / "best"


def task_model_from_checkpoint(checkpoint: str | Path, task: str):
    """The fine-tuned model of ``task`` (``retrieval``: an ALBEF; ``vqa``: an AlbefVQA; ``nlvr2``: an
    AlbefNLVR2) saved in ``checkpoint/model.safetensors`` (e.g. ``<run>/finetune/<task>/best``)."""
    path = Path(checkpoint) / WEIGHTS
    if not path.is_file():
        raise FalconError(f"{path}: not found; fine-tune first (falcon finetune --task {task} --run-dir RUN_DIR)")
    if task == "retrieval":
        return albef_from_checkpoint(checkpoint)
    config = without_weight_sources(read_weights_config(path))
    if task == "vqa":
        model = AlbefVQA(config)
    elif task == "nlvr2":
        model = AlbefNLVR2(config)
    else:
        raise FalconError(f"unknown task {task!r}; use retrieval, vqa or nlvr2")
    load_weights(model, path)
    return model


__all__ = [
    "FINETUNED",
    "albef_from_checkpoint",
    "at_resolution",
    "model_from_checkpoint",
    "tokenizer_vocabulary",
    "check_vocabulary",
    "find_checkpoint",
    "finetuned_weights",
    "task_model_from_checkpoint",
]
