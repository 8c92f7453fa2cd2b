"""Official ALBEF, GRIT-VLP and MAFA checkpoints (``.pth``) loaded into falcon's ALBEF.

The three repositories save one layout: ``{"model": state_dict, ...}`` with the image encoder as
``visual_encoder.*`` (timm ViT names, which ours shares), the text and fusion encoders as one
12-layer ``xbert`` BERT under ``text_encoder.bert.*`` (layers ``text_layers ..`` carry
``crossattention``), the MLM head as ``text_encoder.cls.predictions.*``, the projections, ITM head
and temperature under our own names, and, in ALBEF's, the momentum copies (``*_m.*``) and the
feature queues. Fine-tuned retrieval checkpoints keep BERT without the ``bert.`` level
(``text_encoder.embeddings.*``, ``text_encoder.encoder.*``) and have no MLM head; both are read.

Every key of a file is either mapped (:func:`albef_key_mapping`) or skipped for a stated reason
(:data:`SKIPPED`); anything else, and any of our weights the file lacks, is a one-line
:class:`~falcon_cli.errors.FalconError` naming the file and the first keys. docs/pretraining.md
has the table.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import torch
from torch import nn

from falcon_cli.errors import FalconError
from falcon_cli.models.albef import ALBEF
from falcon_cli.models.config import AlbefConfig, apply_overrides
from falcon_cli.models.registry import get_model_config
from falcon_cli.models.vision import resize_pos_embed
from falcon_cli.models.weights import bert_name_mapping, check_vocabulary, read_state_dict

log = logging.getLogger("falcon.models")

SKIPPED: tuple[tuple[str, str], ...] = (
    ("visual_encoder_m.", "momentum copies"),
    ("text_encoder_m.", "momentum copies"),
    ("vision_proj_m.", "momentum copies"),
    ("text_proj_m.", "momentum copies"),
    ("image_queue", "feature queues"),
    ("text_queue", "feature queues"),
    ("idx_queue", "feature queues"),
    ("queue_ptr", "feature queues"),
    ("text_encoder.bert.embeddings.position_ids", "BERT position ids (a buffer 0..N-1, rebuilt)"),
    ("text_encoder.bert.pooler.", "BERT pooler (unused by ALBEF)"),
    ("text_encoder.cls.predictions.decoder.weight", "MLM decoder weight (tied to the word embeddings)"),
    ("text_encoder.cls.predictions.decoder.bias", "MLM decoder bias (the same tensor as cls.predictions.bias)"),
)
"""Keys of an ALBEF-layout file that are read but not loaded: ``(name or name prefix ending in '.', reason)``.

Momentum copies and queues are dropped on purpose: falcon's momentum encoders (``itc: momentum``
and retrieval fine-tuning) start as copies of the loaded online weights, which is how ALBEF
initialises them and what GRIT-VLP/MAFA checkpoints (saved without ``*_m``) allow anyway, and the
queues hold features of the checkpoint's own last batches, so they are refilled from the new data.
The MLM decoder is tied to the word embeddings in ALBEF and in falcon, so its copy is redundant.
"""

_BERT = "text_encoder.bert."
_HEAD = "text_encoder.cls."


def is_albef_state_dict(sd: dict) -> bool:
    """Whether ``sd`` has ALBEF's layout (a ``visual_encoder`` and an ``xbert`` ``text_encoder``)."""
    return "visual_encoder.pos_embed" in sd and any(k.startswith((_BERT, "text_encoder.encoder.layer.")) for k in sd)


def _normalise(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Fine-tuned checkpoints save BERT as ``text_encoder.<name>``; give every BERT key its ``bert.`` level."""
    out = {}
    for key, value in sd.items():
        if key.startswith("text_encoder.") and not key.startswith((_BERT, _HEAD)):
            key = _BERT + key[len("text_encoder.") :]
        out[key] = value
    return out


def _skip_reason(key: str) -> str | None:
    for name, reason in SKIPPED:
        if key == name or (name.endswith(".") and key.startswith(name)):
            return reason
    return None


def albef_key_mapping(model: nn.Module) -> dict[str, str]:
    """ALBEF checkpoint key -> our key, for every weight of ``model`` (an :class:`~falcon_cli.models.albef.ALBEF`).

    BERT names come from :func:`~falcon_cli.models.weights.bert_name_mapping` (with cross-attention)
    under ``text_encoder.``; the image encoder, projections, ITM head and ``temp`` keep their names.
    """
    bert = {
        f"text_encoder.{theirs}": ours for ours, theirs in bert_name_mapping(model.config, cross_attention=True).items()
    }
    mapped = set(bert.values())
    same = {key: key for key in model.state_dict() if key not in mapped}
    stray = sorted(
        k for k in same if not k.startswith(("visual_encoder.", "vision_proj.", "text_proj.", "itm_head.", "temp"))
    )
    assert not stray, f"weights of ours with no ALBEF name: {stray[:3]}"  # a new module needs a row in the mapping
    return {**same, **bert}


def _names(keys, limit: int = 3) -> str:
    keys = sorted(keys)
    return ", ".join(keys[:limit]) + (f" (+{len(keys) - limit} more)" if len(keys) > limit else "") if keys else "none"


def _fusion_layers(sd: dict) -> tuple[int, int]:
    """(text layers, fusion layers) of an ALBEF state dict: BERT layers without / with ``crossattention``."""
    layers = {int(m.group(1)) for k in sd if (m := re.match(r"text_encoder\.bert\.encoder\.layer\.(\d+)\.", k))}
    fusion = {
        int(m.group(1))
        for k in sd
        if (m := re.match(r"text_encoder\.bert\.encoder\.layer\.(\d+)\.crossattention\.", k))
    }
    return len(layers - fusion), len(fusion)


def albef_config_from_state(sd: dict[str, torch.Tensor], source: str) -> AlbefConfig:
    """The :class:`AlbefConfig` of an ALBEF-layout state dict, read from its tensor shapes.

    Widths, depths, vocabulary, patch size, image size (from the position-embedding grid) and
    ``embed_dim`` come from the shapes; the rest is ``albef-base``'s (ALBEF's settings: [CLS]
    pooling, LayerNorm eps, temperature bounds). Attention heads cannot be read from shapes: they
    are width / 64, as in ViT-B/16 and BERT-base (12).
    """
    sd = _normalise(sd)
    try:
        vision_width = sd["visual_encoder.cls_token"].shape[-1]
        patch = sd["visual_encoder.patch_embed.proj.weight"].shape[-1]
        grid = int(round((sd["visual_encoder.pos_embed"].shape[1] - 1) ** 0.5))
        vision_layers = len({m.group(1) for k in sd if (m := re.match(r"visual_encoder\.blocks\.(\d+)\.", k))})
        mlp = sd["visual_encoder.blocks.0.mlp.fc1.weight"].shape[0]
        vocab, text_width = sd[_BERT + "embeddings.word_embeddings.weight"].shape
        text_layers, fusion_layers = _fusion_layers(sd)
        values = dict(
            image_size=grid * patch,
            patch_size=patch,
            vision_width=vision_width,
            vision_layers=vision_layers,
            vision_heads=max(1, vision_width // 64),
            vision_mlp_ratio=mlp / vision_width,
            vocab_size=vocab,
            text_width=text_width,
            text_layers=text_layers,
            fusion_layers=fusion_layers,
            text_heads=max(1, text_width // 64),
            intermediate_size=sd[_BERT + "encoder.layer.0.intermediate.dense.weight"].shape[0],
            max_position_embeddings=sd[_BERT + "embeddings.position_embeddings.weight"].shape[0],
            type_vocab_size=sd[_BERT + "embeddings.token_type_embeddings.weight"].shape[0],
            embed_dim=sd["vision_proj.weight"].shape[0],
            pooling="cls",
            vision_weights=None,
            text_weights=None,
        )
    except KeyError as exc:
        raise FalconError(
            f"{source}: not an ALBEF/GRIT-VLP/MAFA checkpoint (no {exc.args[0]}); expected keys "
            "visual_encoder.*, text_encoder.bert.*, vision_proj.* (docs/pretraining.md)"
        ) from None
    return apply_overrides(get_model_config("albef-base"), values, source)


def albef_state_to_ours(
    sd: dict[str, torch.Tensor], model: nn.Module, source: str, hint: str = ""
) -> dict[str, torch.Tensor]:
    """Our state dict for ``model`` out of an ALBEF-layout ``sd`` (see the module docstring).

    The position embeddings are resized to ``model``'s resolution (ALBEF's bicubic,
    :func:`~falcon_cli.models.vision.resize_pos_embed`). Raises a one-line FalconError naming
    ``source`` for unexpected keys, missing keys, a vocabulary of another size or other shapes;
    ``hint`` ends that line (how to make the model fit). A file without an MLM head (fine-tuned
    retrieval checkpoints) leaves ``mlm_head`` out of the result.
    """
    sd = _normalise(sd)
    config: AlbefConfig = model.config
    mapping = albef_key_mapping(model)
    skipped = {k for k in sd if _skip_reason(k) is not None}
    unexpected = [k for k in sd if k not in mapping and k not in skipped]
    has_head = any(k.startswith(_HEAD) for k in sd)
    missing = [k for k, ours in mapping.items() if k not in sd and (has_head or not ours.startswith("mlm_head."))]
    hint = f"; {hint}" if hint else ""
    if unexpected or missing:
        layers = _fusion_layers(sd)
        raise FalconError(
            f"{source}: keys do not match an ALBEF with text_layers={config.text_layers}, fusion_layers="
            f"{config.fusion_layers}, vision_layers={config.vision_layers} (the file has {layers[0]} text "
            f"and {layers[1]} fusion layers): unexpected {_names(unexpected)}; missing {_names(missing)}{hint}"
        )
    word = sd[_BERT + "embeddings.word_embeddings.weight"]
    check_vocabulary(
        word.shape[0], config.vocab_size, source, official=True
    )  # the model was built for the run's tokenizer
    target = model.state_dict()
    ours = {mapping[k]: v for k, v in sd.items() if k in mapping}
    grid = config.image_size // config.patch_size
    old_grid = int(round((ours["visual_encoder.pos_embed"].shape[1] - 1) ** 0.5))
    if ours["visual_encoder.pos_embed"].shape[-1] == target["visual_encoder.pos_embed"].shape[-1]:
        try:
            ours["visual_encoder.pos_embed"] = resize_pos_embed(ours["visual_encoder.pos_embed"], grid)
        except FalconError as exc:
            raise FalconError(f"{source}: visual_encoder.pos_embed: {exc}") from None
    mismatched = [
        f"{theirs} {tuple(sd[theirs].shape)} vs {mapping[theirs]} {tuple(target[mapping[theirs]].shape)}"
        for theirs in sd
        if theirs in mapping and ours[mapping[theirs]].shape != target[mapping[theirs]].shape
    ]
    if mismatched:
        raise FalconError(f"{source}: shapes differ from the model's (file vs model: {mismatched[0]}){hint}")
    decoder = sd.get(_HEAD + "predictions.decoder.weight")
    if decoder is not None and not torch.equal(decoder, word):
        log.warning(
            "%s: cls.predictions.decoder.weight differs from the word embeddings; falcon ties them and uses "
            "the word embeddings",
            source,
        )
    reasons: dict[str, int] = {}
    for k in skipped:
        reasons[_skip_reason(k)] = reasons.get(_skip_reason(k), 0) + 1
    log.info(
        "%s: ALBEF layout, %d tensors mapped; skipped %s; position embeddings %dx%d -> %dx%d%s",
        source,
        len(ours),
        ", ".join(f"{r}: {n}" for r, n in sorted(reasons.items())) or "none",
        old_grid,
        old_grid,
        grid,
        grid,
        "" if has_head else "; no MLM head in the file (kept newly initialised)",
    )
    return ours


def read_albef_checkpoint(path: str | os.PathLike, what: str = "ALBEF checkpoint") -> dict[str, torch.Tensor]:
    """The state dict of an ALBEF/GRIT-VLP/MAFA ``.pth`` file (``weights_only`` load, ``{"model": ...}`` unwrapped);
    a one-line FalconError when it is not one."""
    sd = read_state_dict(path, what)
    if not is_albef_state_dict(sd):
        first = ", ".join(sorted(sd)[:3]) or "none"
        raise FalconError(
            f"{what} '{path}': not in the ALBEF/GRIT-VLP/MAFA layout (needs visual_encoder.pos_embed and "
            f"text_encoder.bert.* keys; first keys: {first}); a falcon checkpoint is a directory with "
            "model.safetensors"
        )
    return sd


def load_albef_checkpoint(model: nn.Module, path: str | os.PathLike, what: str = "pretrain.encoders.init") -> None:
    """Load every weight of ``model`` (an ALBEF built for the run: its size, resolution and vocabulary)
    from an ALBEF/GRIT-VLP/MAFA checkpoint file; ``what`` names the setting in error lines."""
    sd = read_albef_checkpoint(path, what)
    source = f"{what} '{path}'"
    ours = albef_state_to_ours(
        sd,
        model,
        source,
        hint="pretrain.model must have the checkpoint's architecture (albef-base for the official ones)",
    )
    result = model.load_state_dict(ours, strict=False)
    assert not result.unexpected_keys and all(k.startswith("mlm_head.") for k in result.missing_keys), result


def albef_from_file(path: str | os.PathLike, image_size: int | None = None, what: str = "checkpoint") -> nn.Module:
    """An :class:`~falcon_cli.models.albef.ALBEF` shaped like the ALBEF/GRIT-VLP/MAFA file at ``path``
    (:func:`albef_config_from_state`), its weights loaded, built for ``image_size`` pixels (None: the file's)."""
    sd = read_albef_checkpoint(path, what)
    source = f"{what} '{path}'"
    config = albef_config_from_state(sd, source)
    if image_size is not None and image_size != config.image_size:
        if image_size % config.patch_size:
            raise FalconError(
                f"image_size {image_size} is not a multiple of the model's patch size {config.patch_size}"
            )
        config = config.model_copy(update={"image_size": image_size})
    model = ALBEF(config)
    result = model.load_state_dict(albef_state_to_ours(sd, model, source), strict=False)
    assert not result.unexpected_keys and all(k.startswith("mlm_head.") for k in result.missing_keys), result
    return model


def is_albef_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a file that finetune/evaluate read as an ALBEF-layout checkpoint
    (``.pth``/``.pt``/``.bin``)."""
    path = Path(path).expanduser()
    return path.is_file() and path.suffix in (".pth", ".pt", ".bin", ".ckpt")


__all__ = [
    "SKIPPED",
    "albef_config_from_state",
    "albef_from_file",
    "albef_key_mapping",
    "albef_state_to_ours",
    "is_albef_file",
    "is_albef_state_dict",
    "load_albef_checkpoint",
    "read_albef_checkpoint",
]
