"""Weights in and out of an ALBEF model.

In: :func:`load_vision_weights` (timm model name or a local ViT state-dict file, position
embeddings resized to the model's image size) and :func:`load_bert_weights` (a transformers
BERT checkpoint: hub id or ``save_pretrained`` directory). Out and back:
:func:`save_weights` / :func:`load_weights` / :func:`model_from_weights` (safetensors, the
model config in the file's metadata), and :func:`clean_state_dict` for state dicts taken
from DDP- or ``torch.compile``-wrapped models. ``save_weights``, ``load_weights``, ``clean_state_dict`` and
``read_state_dict`` live in :mod:`falcon_cli.artifacts.state_dicts` (below models and checkpoints alike) and
are re-exported here.

Nothing here unpickles arbitrary objects: ``.pth``/``.bin`` files are read with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from falcon_cli.artifacts.state_dicts import (
    CONFIG_METADATA_KEY,
    _first_line,
    _names,
    clean_state_dict,  # noqa: F401
    load_weights,  # noqa: F401 (re-exported: the weights' public names live here too)
    read_state_dict,
    save_weights,  # noqa: F401
)
from falcon_cli.errors import FalconError
from falcon_cli.models.config import AlbefConfig, make_config
from falcon_cli.models.vision import resize_pos_embed

log = logging.getLogger("falcon.models")


# ---------------------------------------------------------------------------------------------
# Image encoder.


def _timm_hub_repo(name: str) -> tuple[str | None, str]:
    """(the hub repository timm takes pretrained ``name``'s weights from, or None; its download URL, or "")."""
    import timm

    try:
        cfg = timm.models.get_pretrained_cfg(name)
    except RuntimeError:  # an unknown tag: create_model says so
        cfg = None
    repo = (getattr(cfg, "hf_hub_id", None) or "").split("@")[0].rstrip("/") or None
    return repo, getattr(cfg, "url", None) or ""


def _timm_state_dict(source: str, what: str) -> dict[str, torch.Tensor]:
    """The pretrained weights of ``source`` (``timm:NAME`` or ``timm:NAME@REVISION``, the revision of the hub
    repository timm takes NAME's weights from), noted for the run's manifest."""
    import timm

    # (lazy: huggingface_hub, only to download)
    from falcon_cli.runtime.hub import HubRef, hub_hint, note_hub, note_url, prepare_hub

    ref = HubRef.parse(source, what)
    repo, url = _timm_hub_repo(ref.repo)
    if ref.revision is not None and repo is None:
        raise FalconError(
            f"{what} '{source}': timm takes {ref.repo}'s weights from {url or 'no hub repository'}, not "
            f"the Hugging Face hub, so no revision can be pinned; drop '@{ref.revision}'"
        )
    overlay = {"hf_hub_id": f"{repo}@{ref.revision}"} if ref.revision is not None else None
    prepare_hub()  # timm takes its weights from the Hugging Face hub (or its cache)
    try:
        model = timm.create_model(ref.repo, pretrained=True, num_classes=0, pretrained_cfg_overlay=overlay)
    except Exception as exc:  # unknown name, offline without cache, ...
        why = hub_hint(str(ref)) or "check the name with timm.list_pretrained()"
        raise FalconError(
            f"{what} '{source}': cannot load pretrained timm weights ({_first_line(exc)}); "
            f"{why}; or give a local .safetensors/.pth file"
        ) from None
    if repo is not None:
        note_hub(ref, what, repo=repo)
    else:
        note_url(str(ref), url, what)
    return model.state_dict()


def load_vision_weights(encoder: nn.Module, source: str, what: str = "vision_weights") -> None:
    """Load ViT weights into ``encoder`` (a timm VisionTransformer) from ``source``.

    ``source`` is ``timm:<model name>`` (pretrained weights via timm: hub or its cache; ``@REVISION`` pins
    the hub repository's revision) or a local file/directory (see :func:`read_state_dict`); checkpoints
    with a ``visual_encoder.`` prefix (ALBEF) are accepted. Position embeddings are resampled to the encoder's grid as
    ALBEF does (:func:`~falcon_cli.models.vision.resize_pos_embed`), patch embeddings to its patch size by
    timm's checkpoint filter; the classifier head is dropped.
    Missing/unexpected keys are logged on one line; an incompatible source is a FalconError.
    """
    from timm.models.vision_transformer import checkpoint_filter_fn

    from falcon_cli.runtime.hub import note_local  # (lazy: with the hub helpers above)

    if source.startswith("timm:"):
        sd = _timm_state_dict(source, what)
    else:
        sd = read_state_dict(source, what)
        note_local(source, what)
    if any(k.startswith("visual_encoder.") for k in sd):
        sd = {k[len("visual_encoder.") :]: v for k, v in sd.items() if k.startswith("visual_encoder.")}
    sd = _pos_embed_to_grid(sd, encoder)
    try:
        sd = checkpoint_filter_fn(sd, encoder)
    except Exception as exc:
        raise FalconError(f"{what} '{source}': not a compatible ViT checkpoint ({_first_line(exc)})") from None
    target = encoder.state_dict()
    dropped = sorted(k for k in sd if k.startswith(("head.", "head_dist.", "fc_norm.")) and k not in target)
    sd = {k: v for k, v in sd.items() if k not in dropped}
    mismatched = [
        f"{k} {tuple(v.shape)} vs {tuple(target[k].shape)}"
        for k, v in sd.items()
        if k in target and v.shape != target[k].shape
    ]
    if mismatched:
        raise FalconError(
            f"{what} '{source}': shapes do not match the model's image encoder "
            f"(checkpoint vs model: {mismatched[0]}); set vision_width/vision_layers/vision_heads/"
            "patch_size to the checkpoint's architecture"
        )
    if not any(k in target for k in sd):
        raise FalconError(f"{what} '{source}': no ViT parameter names found (first keys: {_names(sd)})")
    result = encoder.load_state_dict(sd, strict=False)
    level = logging.WARNING if result.missing_keys or result.unexpected_keys else logging.INFO
    log.log(
        level,
        "vision weights from %s: loaded %d tensors; missing %s; unexpected %s; dropped head %s",
        source,
        len(sd) - len(result.unexpected_keys),
        _names(result.missing_keys),
        _names(result.unexpected_keys),
        _names(dropped),
    )


def _pos_embed_to_grid(sd: dict[str, torch.Tensor], encoder: nn.Module) -> dict[str, torch.Tensor]:
    """``sd`` with its ``pos_embed`` resized to ``encoder``'s patch grid by our (ALBEF's) resize, so timm's
    checkpoint filter, which would resample with antialiasing, finds nothing left to resize. Tables that
    are not one [CLS] row plus a square grid (distilled DeiT, ...) are left to timm."""
    pos = sd.get("pos_embed")
    target = getattr(encoder, "pos_embed", None)
    if pos is None or target is None or pos.shape == target.shape or pos.dim() != 3:
        return sd
    grid = encoder.patch_embed.grid_size[0]
    patches = pos.shape[1] - 1
    if math.isqrt(patches) ** 2 != patches or encoder.patch_embed.grid_size[1] != grid:
        return sd
    return {**sd, "pos_embed": resize_pos_embed(pos, grid)}


# ---------------------------------------------------------------------------------------------
# Text and fusion encoders.


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' load report and progress bars (we log our own one line)."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def _read_bert(source: str, what: str):
    """``(state_dict, bert_config, missing_keys)`` of a transformers BERT checkpoint."""
    from transformers import BertForMaskedLM

    # (lazy: huggingface_hub, only to download)
    from falcon_cli.runtime.hub import HubRef, hub_hint, is_local, note_hub, note_local, prepare_hub

    path = Path(source).expanduser()
    looks_local = is_local(source)
    if path.is_file():
        raise FalconError(
            f"{what} '{source}': a file, but {what} takes a BERT hub id or a save_pretrained directory; "
            "to start from a whole ALBEF/GRIT-VLP/MAFA checkpoint (.pth) set pretrain.encoders.init to it instead"
        )
    if looks_local and not path.is_dir():
        raise FalconError(
            f"{what} '{source}': no such directory (give a hub id like bert-base-uncased or a "
            "directory written by save_pretrained)"
        )
    ref = None if looks_local else HubRef.parse(source, what)
    if ref is not None:
        prepare_hub()
    try:
        with quiet_transformers():
            model, info = BertForMaskedLM.from_pretrained(
                str(path) if ref is None else ref.repo,
                revision=None if ref is None else ref.revision,
                output_loading_info=True,
            )
    except Exception as exc:  # offline and not cached, unknown id, bad files, ...
        why = "" if looks_local else hub_hint(source)
        raise FalconError(
            f"{what} '{source}': cannot load BERT weights ({_first_line(exc)}); "
            + (
                why
                or "offline, give a local directory saved with BertForMaskedLM.save_pretrained or fill the hub "
                "cache while online"
            )
        ) from None
    if ref is None:
        note_local(path, what)
    else:
        note_hub(ref, what)
    return model.state_dict(), model.config, set(info.get("missing_keys", ()))


def bert_name_mapping(config: AlbefConfig, cross_attention: bool = False) -> dict[str, str]:
    """Our parameter name -> the transformers/ALBEF BERT name (``bert.…`` or ``cls.predictions.…``).

    Embeddings and layers ``0 .. text_layers-1`` are the text encoder, the next ``fusion_layers``
    layers the fusion encoder, ``cls.predictions`` the MLM head (its decoder is tied to the word
    embeddings, so it has no name of ours). With ``cross_attention`` the fusion layers' cross-attention
    is named too, as ALBEF's ``xbert`` saves it (``crossattention.self.*``, ``crossattention.output.*``);
    a plain BERT checkpoint has none.
    """
    emb = {
        "word": "word_embeddings",
        "position": "position_embeddings",
        "token_type": "token_type_embeddings",
        "norm": "LayerNorm",
    }
    mapping = {}
    for ours, theirs in emb.items():
        for p in ("weight", "bias") if ours == "norm" else ("weight",):
            mapping[f"text_encoder.embeddings.{ours}.{p}"] = f"bert.embeddings.{theirs}.{p}"
    layer = {
        "self_attn.query": "attention.self.query",
        "self_attn.key": "attention.self.key",
        "self_attn.value": "attention.self.value",
        "self_attn.out": "attention.output.dense",
        "self_attn_norm": "attention.output.LayerNorm",
        "ffn_in": "intermediate.dense",
        "ffn_out": "output.dense",
        "ffn_norm": "output.LayerNorm",
    }
    cross = {
        "cross_attn.query": "crossattention.self.query",
        "cross_attn.key": "crossattention.self.key",
        "cross_attn.value": "crossattention.self.value",
        "cross_attn.out": "crossattention.output.dense",
        "cross_attn_norm": "crossattention.output.LayerNorm",
    }
    stacks = [("text_encoder", i, i, layer) for i in range(config.text_layers)]
    fusion = {**layer, **cross} if cross_attention else layer
    stacks += [("fusion_encoder", i, config.text_layers + i, fusion) for i in range(config.fusion_layers)]
    for stack, ours_i, bert_i, names in stacks:
        for ours, theirs in names.items():
            for p in ("weight", "bias"):
                mapping[f"{stack}.layers.{ours_i}.{ours}.{p}"] = f"bert.encoder.layer.{bert_i}.{theirs}.{p}"
    for ours, theirs in {"dense": "transform.dense", "norm": "transform.LayerNorm"}.items():
        for p in ("weight", "bias"):
            mapping[f"mlm_head.{ours}.{p}"] = f"cls.predictions.{theirs}.{p}"
    mapping["mlm_head.bias"] = "cls.predictions.bias"
    return mapping


_BERT_CONFIG_FIELDS = {
    "hidden_size": "text_width",
    "num_attention_heads": "text_heads",
    "intermediate_size": "intermediate_size",
    "vocab_size": "vocab_size",
    "max_position_embeddings": "max_position_embeddings",
    "type_vocab_size": "type_vocab_size",
}


def load_bert_weights(model: nn.Module, source: str, what: str = "text_weights") -> None:
    """Map a transformers BERT checkpoint onto ``model`` (an :class:`~falcon_cli.models.albef.ALBEF`).

    Embeddings and layers ``0 .. text_layers-1`` go to the text encoder; the self-attention and
    feed-forward of the next ``fusion_layers`` layers go to the fusion layers (their
    cross-attention keeps its fresh BERT init); ``cls.predictions`` goes to the MLM head (its
    decoder is tied to the word embeddings). ``source``: a hub id (``NAME@REVISION`` pins a revision) or a
    ``save_pretrained`` directory of ``BertForMaskedLM`` or ``BertModel`` (then the MLM head stays newly initialised).
    """
    config: AlbefConfig = model.config
    sd, bert_config, missing = _read_bert(source, what)
    for theirs, ours in _BERT_CONFIG_FIELDS.items():
        value = getattr(bert_config, theirs, None)
        if value is not None and value != getattr(config, ours):
            raise FalconError(
                f"{what} '{source}': the checkpoint has {theirs}={value} but the model config has "
                f"{ours}={getattr(config, ours)}; set {ours}={value}"
                + (" and use the checkpoint's tokenizer" if ours == "vocab_size" else "")
            )
    needed = config.text_layers + config.fusion_layers
    if bert_config.num_hidden_layers < needed:
        raise FalconError(
            f"{what} '{source}': the checkpoint has {bert_config.num_hidden_layers} layers but "
            f"text_layers + fusion_layers = {needed}; lower them to fit"
        )
    if getattr(bert_config, "hidden_act", "gelu") != "gelu":
        raise FalconError(f"{what} '{source}': hidden_act '{bert_config.hidden_act}' is not supported (need gelu)")
    if getattr(bert_config, "layer_norm_eps", config.layer_norm_eps) != config.layer_norm_eps:
        log.warning(
            "text weights from %s: checkpoint layer_norm_eps %s differs from the model's %s",
            source,
            bert_config.layer_norm_eps,
            config.layer_norm_eps,
        )
    mapping = bert_name_mapping(config)
    skipped_head = sorted(k for k, v in mapping.items() if v in missing)  # e.g. a BertModel: no MLM head
    mapped = {ours: sd[theirs] for ours, theirs in mapping.items() if ours not in skipped_head}
    result = model.load_state_dict(mapped, strict=False)
    assert not result.unexpected_keys, result.unexpected_keys  # mapping targets are our own names
    unused_layers = list(range(needed, bert_config.num_hidden_layers))
    log.log(
        logging.WARNING if skipped_head else logging.INFO,
        "text weights from %s: loaded %d tensors (BERT layers 0-%d -> text, %d-%d -> fusion, cross-attention "
        "newly initialised); not in checkpoint, kept fresh: %s; unused BERT layers: %s",
        source,
        len(mapped),
        config.text_layers - 1,
        config.text_layers,
        needed - 1,
        _names(skipped_head),
        unused_layers or "none",
    )


# ---------------------------------------------------------------------------------------------
# Saving and loading whole models.


def read_weights_config(path: str | os.PathLike) -> AlbefConfig:
    """The :class:`AlbefConfig` stored by :func:`save_weights` in a safetensors file's metadata."""
    from safetensors import safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
    except Exception as exc:
        raise FalconError(f"model weights '{path}': cannot read safetensors header ({_first_line(exc)})") from None
    if CONFIG_METADATA_KEY not in metadata:
        raise FalconError(
            f"model weights '{path}': no model config in the metadata (not written by save_weights); "
            "build the model with create_model and use load_weights"
        )
    try:
        values = json.loads(metadata[CONFIG_METADATA_KEY])
    except json.JSONDecodeError as exc:
        raise FalconError(f"model weights '{path}': model config metadata is not JSON ({exc})") from None
    return make_config(values, f"model weights '{path}'")


def without_weight_sources(config):
    """``config`` with its pretrained weight sources cleared (a checkpoint holds every weight itself)."""
    sources = [name for name in type(config).model_fields if name.endswith("_weights")]
    return config.model_copy(update=dict.fromkeys(sources))


def check_vocabulary(checkpoint_vocab: int, vocab_size: int | None, source: str, official: bool = False) -> None:
    """A one-line FalconError when the checkpoint's vocabulary size is not the run tokenizer's ``vocab_size``
    (None: not checked); ``official``: an ALBEF/GRIT-VLP/MAFA file (the fix is their tokenizer)."""
    if vocab_size is None or vocab_size == checkpoint_vocab:
        return
    fix = (
        "ALBEF, GRIT-VLP and MAFA use bert-base-uncased: run the data stage with data.tokenizer=bert-base-uncased "
        "(or a local copy of it)"
        if official
        else "it was trained with another run's tokenizer; evaluate it in that run"
    )
    raise FalconError(
        f"{source}: the checkpoint's vocabulary has {checkpoint_vocab} tokens but the run's tokenizer "
        f"has {vocab_size}; {fix}"
    )
