"""The config of a dual encoder (``framework: dual``): its sizes, losses and weight sources, below the model
(:mod:`falcon_cli.models.dual`) so that reading a config needs no model code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

from falcon_cli.data.normalization import CLIP_MEAN, CLIP_STD
from falcon_cli.models.open_clip_names import LOCAL_DIR


class DualConfig(BaseModel):
    """Sizes, losses and weight sources of a dual encoder (``framework: dual``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    framework: Literal["dual"] = "dual"
    """The model family (:mod:`falcon_cli.frameworks`)."""

    open_clip_model: str | None = None
    """An open_clip architecture (``ViT-B-16``, ``ViT-B-16-SigLIP``, ``ViT-B-16-SigLIP2``; ``open_clip.list_models()``),
    or ``local-dir:DIR`` (a directory with ``open_clip_config.json`` and weights) or ``hf-hub:ORG/REPO``. None: the
    towers below are built with open_clip's own modules (``dual-tiny``)."""
    open_clip_weights: str | None = None
    """The open_clip model's weights: a pretrained tag (``openai``, ``webli``; fetched by open_clip or taken from its
    cache) or a checkpoint file. None: random init (``local-dir:``/``hf-hub:`` models hold their own weights).
    ``pretrain.encoders.vision_weights`` sets it."""

    # --- towers built here (open_clip_model unset) ---------------------------------------------------
    image_size: int = 224
    """Input image side in pixels (square)."""
    patch_size: int = 16
    """ViT patch side; ``image_size`` must be a multiple of it."""
    vision_width: int = 768
    """ViT width."""
    vision_layers: int = 12
    """ViT blocks."""
    vision_head_width: int = 64
    """Width of one ViT attention head (open_clip's ``head_width``); must divide ``vision_width``."""
    vision_pool: Literal["tok", "avg"] = "tok"
    """What the image feature pools: the class token (``tok``, CLIP) or the mean of the patch tokens (``avg``:
    a small tower trained from scratch leaves the uniform-ITC plateau sooner)."""
    vocab_size: int = 49408
    """Token vocabulary; for a built text tower the run tokenizer's length (the stage sets it)."""
    context_length: int = 77
    """Longest caption in tokens (position embeddings)."""
    text_width: int = 512
    """Text transformer width."""
    text_layers: int = 12
    """Text transformer blocks."""
    text_heads: int = 8
    """Text attention heads; must divide ``text_width``."""
    text_pool: Literal["first", "last", "argmax", "eos"] = "first"
    """Which token the text feature reads: ``first`` ([CLS] of a BERT-style tokenizer, with bidirectional
    attention that ignores padding), ``last`` (SigLIP, over captions padded to ``context_length``), ``argmax``
    (CLIP's end-of-text token, causal attention)."""
    pad_token_id: int = 0
    """The tokenizer's padding id (the built text tower masks it out)."""
    embed_dim: int = 512
    """Width of the L2-normalised image/text features (the contrastive space, the embedding cache)."""
    image_mean: tuple[float, float, float] = CLIP_MEAN
    """Per-channel mean the model was trained with (SigLIP: 0.5); images are re-normalised from CLIP's."""
    image_std: tuple[float, float, float] = CLIP_STD
    """Per-channel std the model was trained with (SigLIP: 0.5)."""

    # --- contrastive loss ----------------------------------------------------------------------------
    contrastive: Literal["softmax", "sigmoid"] = "sigmoid"
    """``softmax``: CLIP's symmetric InfoNCE; ``sigmoid``: SigLIP's pairwise sigmoid loss with a learnable bias."""
    logit_scale_init: float = 10.0
    """Initial logit scale ``t`` (learned as ``log t``): SigLIP 10, CLIP 1 / 0.07. A pretrained model keeps its own."""
    logit_bias_init: float = -10.0
    """Initial logit bias ``b`` of the sigmoid loss (SigLIP: -10). A pretrained SigLIP keeps its own."""
    logit_scale_max: float = 100.0
    """Upper clamp of the logit scale ``t`` (CLIP and open_clip: 100)."""

    # --- captioning decoder on the image tower -------------------------------------------------------
    decoder_layers: int = 0
    """Decoder blocks (each: causal self-attention, cross-attention to the image tokens, MLP); 0: no decoder."""
    decoder_width: int = 512
    """Decoder width."""
    decoder_heads: int = 8
    """Decoder attention heads; must divide ``decoder_width``."""

    @model_validator(mode="after")
    def _consistent(self) -> "DualConfig":
        problems = []
        if self.open_clip_model is None:
            if self.image_size % self.patch_size:
                problems.append(f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")
            if self.vision_width % self.vision_head_width:
                problems.append(
                    f"vision_head_width {self.vision_head_width} does not divide vision_width {self.vision_width}"
                )
            if self.text_width % self.text_heads:
                problems.append(f"text_heads {self.text_heads} does not divide text_width {self.text_width}")
        if self.decoder_layers and self.is_coca:
            problems.append(
                f"{self.open_clip_model} is a CoCa, which has its own captioning decoder: set decoder_layers: 0"
            )
        if self.decoder_layers and self.decoder_width % self.decoder_heads:
            problems.append(f"decoder_heads {self.decoder_heads} does not divide decoder_width {self.decoder_width}")
        if self.logit_scale_init <= 0 or self.logit_scale_init > self.logit_scale_max:
            problems.append(f"logit_scale_init {self.logit_scale_init} must lie in (0, logit_scale_max]")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def is_coca(self) -> bool:
        """Whether ``open_clip_model`` names an open_clip CoCa (a built-in ``coca_*`` architecture, a ``local-dir:``
        whose config has a ``multimodal_cfg``, or an ``hf-hub:`` repository named like one)."""
        return is_coca_name(self.open_clip_model)

    @property
    def has_decoder(self) -> bool:
        """Whether the model has a captioning decoder: one built here (``decoder_layers`` > 0) or CoCa's own."""
        return self.decoder_layers > 0 or self.is_coca


def is_coca_name(name: str | None) -> bool:
    """Whether the open_clip model ``name`` is a CoCa, read without importing open_clip (see
    :attr:`DualConfig.is_coca`)."""
    if not name:
        return False
    if name.startswith(LOCAL_DIR):
        try:
            config = json.loads((Path(name[len(LOCAL_DIR) :]).expanduser() / "open_clip_config.json").read_text())
        except (OSError, ValueError):
            return False  # building the model reports the unreadable directory
        return "multimodal_cfg" in config.get("model_cfg", {})
    return "coca" in name.lower()
