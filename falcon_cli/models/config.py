"""The ALBEF model configuration: every size, dropout rate and weight source, as data.

A registered model (``albef-base``, ``albef-tiny``, see :mod:`falcon_cli.models.registry`)
is one JSON file holding an :class:`AlbefConfig`. Any field can be overridden when the
model is created: ``create_model("albef-tiny", vocab_size=len(tokenizer))``.
"""

from __future__ import annotations

import difflib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from falcon_cli.errors import FalconError
from falcon_cli.models.families import model_family


class AlbefConfig(BaseModel):
    """Sizes and weight sources of an ALBEF model (no momentum encoder: FALCON/GRIT-VLP style).

    The image encoder is a timm ViT; the text encoder is the first ``text_layers`` BERT
    layers; the fusion encoder is ``fusion_layers`` BERT layers, each with bidirectional
    self-attention, cross-attention to all image tokens, and a feed-forward block.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    framework: Literal["albef"] = "albef"
    """The model family (:mod:`falcon_cli.frameworks`); a JSON config with ``"framework": "blip2"`` is a
    :class:`~falcon_cli.models.qformer.Blip2Config` instead."""

    # --- image encoder (timm VisionTransformer) ---------------------------------------------
    image_size: int = 256
    """Input image side in pixels (square); ALBEF pretrains at 256 and fine-tunes at 384."""

    patch_size: int = 16
    """ViT patch side in pixels; ``image_size`` must be a multiple of it."""

    vision_width: int = 768
    """ViT embedding width (768 for ViT-B)."""

    vision_layers: int = 12
    """Number of ViT blocks."""

    vision_heads: int = 12
    """Attention heads per ViT block; must divide ``vision_width``."""

    vision_mlp_ratio: float = 4.0
    """ViT MLP hidden width as a multiple of ``vision_width``."""

    vision_drop_path_rate: float = 0.0
    """Stochastic-depth rate of the ViT (ALBEF uses 0)."""

    # --- text and fusion encoders (BERT) -----------------------------------------------------
    vocab_size: int = 30522
    """Token vocabulary size; must equal ``len(tokenizer)`` (30522 for bert-base-uncased)."""

    text_width: int = 768
    """BERT hidden width, shared by the text and fusion encoders."""

    text_layers: int = 6
    """BERT layers in the text-only encoder (BERT layers ``0 .. text_layers-1``)."""

    fusion_layers: int = 6
    """BERT layers in the fusion encoder (BERT layers ``text_layers ..``), each with cross-attention."""

    text_heads: int = 12
    """Attention heads per BERT layer (self- and cross-attention); must divide ``text_width``."""

    intermediate_size: int = 3072
    """Hidden width of the BERT feed-forward block."""

    max_position_embeddings: int = 512
    """Longest text sequence (learned absolute positions)."""

    type_vocab_size: int = 2
    """BERT token-type vocabulary (ALBEF always uses type 0; kept so BERT weights load unchanged)."""

    pad_token_id: int = 0
    """Id of ``[PAD]``; its word embedding gets no gradient, as in BERT."""

    hidden_dropout: float = 0.1
    """Dropout on BERT embeddings and after each attention/feed-forward block (BERT: 0.1)."""

    attention_dropout: float = 0.1
    """Dropout on BERT attention probabilities (BERT: 0.1)."""

    layer_norm_eps: float = 1e-12
    """Epsilon of the BERT LayerNorms (BERT: 1e-12; the ViT uses 1e-6)."""

    # --- heads --------------------------------------------------------------------------------
    embed_dim: int = 256
    """Width of the L2-normalised image/text features used by ITC, the embedding cache and the composers."""

    pooling: Literal["cls", "mean"] = "cls"
    """What the ITC projections read: ``cls`` (ALBEF: the [CLS] token of each encoder) or ``mean``
    (the mean of the ViT patch tokens and of the non-padding text tokens). A randomly initialised
    tower's [CLS] output hardly depends on its input (cosine ~0.999 between any two captions),
    so a small model trained from scratch sits on the uniform-ITC plateau for hundreds of steps;
    mean pooling starts from features that already differ (``albef-tiny`` uses it)."""

    temp_init: float = 0.07
    """Initial ITC temperature."""

    temp_min: float = 0.001
    """Lower clamp of the ITC temperature."""

    temp_max: float = 0.5
    """Upper clamp of the ITC temperature."""

    # --- weight sources -----------------------------------------------------------------------
    vision_weights: str | None = None
    """Image-encoder weights: ``timm:<model name>`` (e.g. ``timm:deit_base_patch16_224.fb_in1k``,
    downloaded or taken from the hub cache), a ``.safetensors``/``.pth``/``.bin`` file or a directory
    holding ``model.safetensors``/``pytorch_model.bin``; position embeddings are resized to
    ``image_size``. None: random init."""

    text_weights: str | None = None
    """BERT weights for the text and fusion encoders and the MLM head: a hub id (``bert-base-uncased``)
    or a local ``save_pretrained`` directory, loaded with transformers. Cross-attention is always
    newly initialised. None: random init."""

    @model_validator(mode="after")
    def _consistent(self) -> "AlbefConfig":
        problems = []
        if self.image_size % self.patch_size:
            problems.append(f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")
        if self.vision_width % self.vision_heads:
            problems.append(f"vision_heads {self.vision_heads} does not divide vision_width {self.vision_width}")
        if self.text_width % self.text_heads:
            problems.append(f"text_heads {self.text_heads} does not divide text_width {self.text_width}")
        if not 0 < self.temp_min <= self.temp_init <= self.temp_max:
            problems.append(
                f"need 0 < temp_min <= temp_init <= temp_max, got {self.temp_min}, {self.temp_init}, {self.temp_max}"
            )
        for name in (
            "image_size",
            "patch_size",
            "vision_width",
            "vision_layers",
            "vision_heads",
            "vocab_size",
            "text_width",
            "text_heads",
            "intermediate_size",
            "max_position_embeddings",
            "embed_dim",
        ):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.text_layers < 0 or self.fusion_layers < 1:
            problems.append("need text_layers >= 0 and fusion_layers >= 1")
        if problems:
            raise ValueError("; ".join(problems))
        return self


def _validation_message(exc: ValidationError) -> str:
    """One line out of a pydantic error: ``field: message`` for each problem."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


def unknown_key_hint(key: str, valid: list[str]) -> str:
    """``"; did you mean 'x'?"`` for the nearest valid key, or an empty string."""
    near = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    return f"; did you mean '{near[0]}'?" if near else ""


def config_class(framework: Any, source: str) -> type[BaseModel]:
    """The config class of a model family (:mod:`falcon_cli.models.families`): :class:`AlbefConfig` for
    ``albef``, ``Blip2Config`` for ``blip2``, ``DualConfig`` for ``dual``."""
    return model_family(framework, source).config_class()


def make_config(values: dict[str, Any], source: str) -> AlbefConfig:
    """Validate ``values`` as the config of their ``framework`` (default ``albef``: an :class:`AlbefConfig`;
    ``blip2``: a ``Blip2Config``); any problem is one :class:`FalconError` naming ``source``."""
    cls = config_class(values.get("framework", "albef"), source)
    valid = list(cls.model_fields)
    for key in values:
        if key not in cls.model_fields:
            raise FalconError(
                f"{source}: unknown model config key '{key}'{unknown_key_hint(key, valid)} "
                f"(valid keys: {', '.join(valid)})"
            )
    try:
        return cls.model_validate(values)
    except ValidationError as exc:
        raise FalconError(f"{source}: {_validation_message(exc)}") from None


def apply_overrides(config: AlbefConfig, overrides: dict[str, Any], source: str) -> AlbefConfig:
    """A new config with ``overrides`` (field -> value) applied and validated."""
    return make_config({**config.model_dump(), **overrides}, source)
