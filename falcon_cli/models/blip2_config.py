"""The config of a BLIP-2 stage-1 model (``framework: blip2``): image tower, Q-Former and weight sources,
below the model (:mod:`falcon_cli.models.qformer`) so that reading a config needs no model code."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator


class Blip2Config(BaseModel):
    """Sizes and weight sources of a BLIP-2 stage-1 model (frozen image encoder + Q-Former + heads)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    framework: Literal["blip2"] = "blip2"
    """The model family (:mod:`falcon_cli.frameworks`)."""

    # --- frozen image encoder ------------------------------------------------------------------
    vision: Literal["timm", "hf"] = "timm"
    """The image tower: ``timm`` (a timm ViT, for small runs) or ``hf`` (transformers' ``Blip2VisionModel``:
    BLIP-2's EVA ViT-g/14 with ``blip2-base``'s sizes)."""
    image_size: int = 224
    """Input image side in pixels (square; BLIP-2 pretrains at 224)."""
    patch_size: int = 14
    """ViT patch side in pixels; ``image_size`` must be a multiple of it."""
    vision_width: int = 1408
    """ViT width (1408 for EVA ViT-g)."""
    vision_layers: int = 39
    """ViT blocks (BLIP-2 drops ViT-g's last of 40 and reads the second-to-last layer's output)."""
    vision_heads: int = 16
    """Attention heads per ViT block; must divide ``vision_width``."""
    vision_mlp_ratio: float = 6144 / 1408
    """ViT MLP width as a multiple of ``vision_width`` (6144 for ViT-g)."""
    vision_weights: str | None = None
    """Image-tower weights. ``timm``: what ALBEF's ``vision_weights`` take (``timm:<name>``, a file, a directory;
    a falcon checkpoint's ``visual_encoder.*`` too). ``hf``: a HF BLIP-2 checkpoint (local directory or hub
    id, e.g. ``Salesforce/blip2-itm-vit-g``): its ``vision_model.*``. None: random init."""

    # --- Q-Former --------------------------------------------------------------------------------
    qformer_width: int = 768
    """Q-Former (BERT) hidden width."""
    qformer_layers: int = 12
    """Q-Former layers."""
    qformer_heads: int = 12
    """Attention heads per Q-Former layer; must divide ``qformer_width``."""
    qformer_intermediate_size: int = 3072
    """Feed-forward width (the query and the text feed-forward blocks alike)."""
    cross_attention_frequency: int = 2
    """Every this many layers (from layer 0) the queries cross-attend to the image (BLIP-2: 2)."""
    num_query_tokens: int = 32
    """Learned queries (BLIP-2: 32)."""
    vocab_size: int = 30523
    """Token vocabulary including ``[DEC]`` (30,522 BERT ids + [DEC] = 30,523, as the HF checkpoints)."""
    dec_token_id: int | None = None
    """Id of ``[DEC]``, the first input token of image-grounded text generation; None = ``vocab_size - 1``
    (appended after the run tokenizer's vocabulary: 30522 for bert-base-uncased, as LAVIS and HF)."""
    pad_token_id: int = 0
    """Id of ``[PAD]``."""
    max_position_embeddings: int = 512
    """Longest text (learned absolute positions)."""
    hidden_dropout: float = 0.1
    """Dropout on embeddings and after each attention / feed-forward block (BERT: 0.1)."""
    attention_dropout: float = 0.1
    """Dropout on attention probabilities (BERT: 0.1)."""
    layer_norm_eps: float = 1e-12
    """Q-Former LayerNorm epsilon (BERT: 1e-12)."""
    embed_dim: int = 256
    """Width of the L2-normalised ITC features (query and text projections)."""
    pooling: Literal["cls", "mean"] = "cls"
    """What the text projection reads: ``cls`` (BLIP-2: the [CLS] output of the text-only pass) or ``mean`` (the
    mean of its non-padding outputs). A randomly initialised Q-Former's [CLS] output hardly depends on the
    caption, so a tiny model trained from scratch sits on the uniform-ITC plateau (as ALBEF's, see
    ``AlbefConfig.pooling``); ``blip2-tiny`` uses ``mean``."""
    temp_init: float = 0.07
    """Initial ITC temperature (learnable)."""
    temp_min: float = 0.001
    """Lower clamp of the ITC temperature."""
    temp_max: float = 0.5
    """Upper clamp of the ITC temperature."""
    qformer_weights: str | None = None
    """Q-Former weights: a HF BLIP-2 image-text-retrieval checkpoint (directory or hub id, e.g.
    ``Salesforce/blip2-itm-vit-g``: Q-Former, queries, text embeddings, projections, ITM head), or a BERT
    checkpoint (``bert-base-uncased``): a fresh Q-Former initialised from BERT as BLIP-2 stage 1 (every
    layer's self-attention and both feed-forward blocks from BERT's layer, the embeddings, the LM head;
    cross-attention and the rest new). None: random init."""

    @property
    def dec_id(self) -> int:
        """The ``[DEC]`` token id."""
        return self.vocab_size - 1 if self.dec_token_id is None else self.dec_token_id

    @model_validator(mode="after")
    def _consistent(self) -> "Blip2Config":
        problems = []
        for name in (
            "image_size",
            "patch_size",
            "vision_width",
            "vision_layers",
            "vision_heads",
            "qformer_width",
            "qformer_layers",
            "qformer_heads",
            "qformer_intermediate_size",
            "cross_attention_frequency",
            "num_query_tokens",
            "vocab_size",
            "max_position_embeddings",
            "embed_dim",
        ):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.image_size % self.patch_size:
            problems.append(f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")
        if self.vision_width % self.vision_heads:
            problems.append(f"vision_heads {self.vision_heads} does not divide vision_width {self.vision_width}")
        if self.qformer_width % self.qformer_heads:
            problems.append(f"qformer_heads {self.qformer_heads} does not divide qformer_width {self.qformer_width}")
        if self.vision_mlp_ratio <= 0:
            problems.append(f"vision_mlp_ratio must be > 0, got {self.vision_mlp_ratio}")
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0 <= getattr(self, name) < 1:
                problems.append(f"{name} must lie in [0, 1), got {getattr(self, name)}")
        if not 0 < self.temp_min <= self.temp_init <= self.temp_max:
            problems.append(
                f"need 0 < temp_min <= temp_init <= temp_max, got {self.temp_min}, {self.temp_init}, {self.temp_max}"
            )
        if self.dec_token_id is not None and not 0 <= self.dec_token_id < self.vocab_size:
            problems.append(f"dec_token_id {self.dec_token_id} is outside the vocabulary of {self.vocab_size}")
        if problems:
            raise ValueError("; ".join(problems))
        return self
