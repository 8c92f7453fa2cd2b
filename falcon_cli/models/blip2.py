"""BLIP-2 stage 1: a frozen image encoder, a Q-Former of learned queries, and the ITC / ITM / ITG heads.

The Q-Former is transformers' ``Blip2QFormerModel`` (BERT layers; every ``cross_attention_frequency``-th
layer, counted from layer 0, lets the first ``query_length`` positions cross-attend to the image; the
queries and the text have separate feed-forward blocks) fed by ``Blip2TextEmbeddings`` (word + position
embeddings; the embedding LayerNorm is the Q-Former's ``layernorm``, applied to [queries; text]). The
model computes representations and logits only; the losses live in :mod:`falcon_cli.objectives`
(:func:`~falcon_cli.objectives.blip2.itg_loss`, :func:`~falcon_cli.objectives.itm.itm_loss`, the ITC
functions over :func:`~falcon_cli.objectives.common.image_text_similarity`). A stage-1 step, as LAVIS's
``Blip2Qformer.forward``::

    enc = model(images, input_ids, attention_mask)            # clamps the temperature, encodes both sides
    sim = model.similarity(enc.image_feat, enc.text_feat)      # [B, B]: each image's best query per text
    itm = model.itm_logits(enc.image_embeds[img_idx], input_ids[txt_idx], attention_mask[txt_idx])  # [3B, 2]
    itg = model.itg_logits(enc.image_embeds, input_ids, attention_mask)                              # [B, L, V]

Three kinds of Q-Former pass:

* queries alone, cross-attending to the image (:meth:`Blip2QFormer.query_features`): ``[B, Q, E]`` ITC
  features;
* text alone, no queries and no image (:meth:`Blip2QFormer.encode_text`): the projected [CLS] is the
  text's ITC feature;
* queries and text in one sequence ``[queries; text]``, the queries cross-attending to the image: ITM
  lets both attend to each other (padding masked; :meth:`Blip2QFormer.itm_logits`); ITG uses the 4-D
  mask of :func:`itg_attention_mask` (queries see only queries, text sees every query and the text up to
  itself; :meth:`Blip2QFormer.itg_logits`). LAVIS runs ITG's text against the cached keys/values of the
  query pass; one pass under that mask is the same computation.

Attention masks. The Q-Former runs PyTorch's SDPA (``_attn_implementation = "sdpa"``, set explicitly).
transformers' ``create_bidirectional_mask`` turns a 2-D padding mask into a boolean 4-D one and returns a
4-D mask it is given unchanged (``_preprocess_mask_arguments``: "already prepared, or custom"); SDPA
reads a boolean mask as True = may attend. So ITG passes a boolean ``[B, 1, Q + L, Q + L]`` mask, which
reaches every self-attention call as it is (tests/test_blip2_model.py checks the very tensor SDPA
receives, and the causal behaviour). No row is ever fully masked (every token sees the queries), so SDPA
never produces NaN rows. Cross-attention gets no mask: all image tokens are real.

The image encoder is frozen, as in BLIP-2 stage 1: its parameters have ``requires_grad=False``, it runs
under ``torch.no_grad()`` and stays in eval mode when the model is put in train mode. ``ln_vision`` after it
is trained (LAVIS). Image towers: a timm ViT (``vision: timm``, small runs; its ``forward_features``, final
norm included) or transformers' ``Blip2VisionModel`` (``vision: hf``, BLIP-2's EVA ViT-g/14). HF folds
LAVIS's ``ln_vision`` into the vision model as ``post_layernorm``; here the HF tower's ``post_layernorm`` is
an identity and a HF checkpoint's ``vision_model.post_layernorm`` is loaded into ``ln_vision``, so
``image_embeddings`` equals HF's ``vision_model(...).last_hidden_state`` with the same weights, and the
layer keeps LAVIS's role (trainable, outside the frozen tower).

Weight sources (:func:`build_blip2`), mapped onto our names:

=====================================  ===============================================
HF BLIP-2 checkpoint                   ours
=====================================  ===============================================
``vision_model.post_layernorm.*``      ``ln_vision.*`` (read with ``vision_weights``)
``vision_model.*`` (the rest)          ``visual_encoder.*``
``qformer.*``                          ``qformer.*``
``query_tokens``                       ``query_tokens``
``embeddings.*``                       ``embeddings.*`` (``Blip2ForImageTextRetrieval``)
``vision_projection.*``                ``vision_proj.*``
``text_projection.*``                  ``text_proj.*``
``itm_head.*``                         ``itm_head.*``
=====================================  ===============================================

HF's BLIP-2 checkpoints have no LM head (LAVIS's ``Qformer.cls``) and no temperature: ``lm_head`` and
``temp`` keep their initialisation when the Q-Former comes from one. ``Blip2Model`` /
``Blip2ForConditionalGeneration`` checkpoints (stage 2) also lack the text embeddings, the text
feed-forward blocks and the projections; those stay fresh (one warning names them).

From BERT (LAVIS's ``init_Qformer``: ``BertLMHeadModel.from_pretrained("bert-base-uncased")`` with
cross-attention added, then ``*_query`` copied from the text feed-forward): word embeddings (rows beyond
BERT's vocabulary, i.e. ``[DEC]``, keep their initialisation), position embeddings, the embedding
LayerNorm (``qformer.layernorm``), each layer's self-attention and feed-forward block (into the text and
the query copies), and the MLM head's transform and bias (``lm_head``); BERT's token-type embeddings are
dropped (the Q-Former has none, as LAVIS's). Cross-attention, queries, projections and the ITM head stay
new.
"""

from __future__ import annotations

import json
import logging
from functools import partial
from pathlib import Path
from typing import Any, Callable, Literal, NamedTuple

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, model_validator
from torch import nn

from falcon_cli.errors import FalconError

log = logging.getLogger("falcon.models")

__all__ = ["Blip2Config", "Blip2Encodings", "Blip2LMHead", "Blip2QFormer", "build_blip2", "build_image_tower",
           "itg_attention_mask", "load_blip2_qformer_weights", "load_blip2_vision_weights", "load_bert_into_qformer"]


# ---------------------------------------------------------------------------------------------
# Configuration.

class Blip2Config(BaseModel):
    """Sizes and weight sources of a BLIP-2 stage-1 model: a frozen image encoder, a Q-Former of learned
    queries, the ITC projections, the ITM head and the ITG (language-modelling) head."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)

    framework: Literal["blip2"] = "blip2"
    """The model family (:mod:`falcon_cli.frameworks`); the registry dispatches JSON configs on this key."""

    # --- frozen image encoder ------------------------------------------------------------------
    vision: Literal["timm", "hf"] = "timm"
    """The image tower: ``timm`` (a timm ViT built as ALBEF's, for small runs) or ``hf`` (transformers'
    ``Blip2VisionModel``, BLIP-2's EVA ViT-g/14 with ``blip2-base``'s sizes)."""

    image_size: int = 224
    """Input image side in pixels (square; BLIP-2 pretrains at 224)."""

    patch_size: int = 14
    """ViT patch side in pixels; ``image_size`` must be a multiple of it."""

    vision_width: int = 1408
    """ViT width (1408 for EVA ViT-g); the Q-Former's cross-attention reads tokens of this width."""

    vision_layers: int = 39
    """ViT blocks (BLIP-2 drops the last of ViT-g's 40 and reads the second-to-last block's output)."""

    vision_heads: int = 16
    """Attention heads per ViT block; must divide ``vision_width``."""

    vision_mlp_ratio: float = 6144 / 1408
    """ViT MLP width as a multiple of ``vision_width`` (6144 / 1408 for ViT-g)."""

    vision_weights: str | None = None
    """Image-tower weights. ``timm``: what ALBEF's ``vision_weights`` take (``timm:<model name>``, a
    ``.safetensors``/``.pth``/``.bin`` file or a directory). ``hf``: a HF BLIP-2 checkpoint, a local
    ``save_pretrained`` directory or a hub id (e.g. ``Salesforce/blip2-itm-vit-g``): its ``vision_model.*``
    (``post_layernorm`` into ``ln_vision``). None: random init."""

    # --- Q-Former ----------------------------------------------------------------------------
    qformer_width: int = 768
    """Q-Former (BERT) hidden width; also the width of the learned queries."""

    qformer_layers: int = 12
    """Q-Former layers."""

    qformer_heads: int = 12
    """Attention heads per Q-Former layer (self- and cross-attention); must divide ``qformer_width``."""

    qformer_intermediate_size: int = 3072
    """Feed-forward width of the query and the text feed-forward blocks."""

    cross_attention_frequency: int = 2
    """Layers ``0, f, 2f, ...`` let the queries cross-attend to the image (BLIP-2: every second layer)."""

    num_query_tokens: int = 32
    """Learned queries Q (BLIP-2: 32); each image gives Q ITC features."""

    vocab_size: int = 30523
    """Token vocabulary including ``[DEC]``: BERT's 30,522 ids plus [DEC] (as LAVIS and the HF checkpoints).
    Must be ``len(tokenizer) + 1`` when [DEC] is appended after the run tokenizer's vocabulary."""

    dec_token_id: int | None = None
    """Id of ``[DEC]``, the first decoder input token of image-grounded text generation; None: ``vocab_size - 1``
    (appended after the run tokenizer's vocabulary)."""

    pad_token_id: int = 0
    """Id of ``[PAD]``; its word embedding gets no gradient, as in BERT."""

    max_position_embeddings: int = 512
    """Longest text in tokens (learned absolute positions)."""

    hidden_dropout: float = 0.1
    """Dropout on the embeddings and after each attention / feed-forward block (BERT: 0.1)."""

    attention_dropout: float = 0.1
    """Dropout on the Q-Former's attention probabilities (BERT: 0.1)."""

    layer_norm_eps: float = 1e-12
    """Epsilon of the Q-Former LayerNorms (BERT: 1e-12)."""

    # --- heads ----------------------------------------------------------------------------------
    embed_dim: int = 256
    """Width of the L2-normalised ITC features (the query and the text projections)."""

    pooling: Literal["cls", "mean"] = "cls"
    """What the text projection reads: ``cls`` (BLIP-2: the [CLS] output of the text-only pass) or ``mean``
    (the mean of its non-padding outputs: a randomly initialised Q-Former's [CLS] output hardly depends on
    the caption, so a tiny model trained from scratch starts on the uniform-ITC plateau, as ALBEF's; see
    ``AlbefConfig.pooling``)."""

    temp_init: float = 0.07
    """Initial ITC temperature (a learnable parameter, as in BLIP-2)."""

    temp_min: float = 0.001
    """Lower clamp of the ITC temperature."""

    temp_max: float = 0.5
    """Upper clamp of the ITC temperature."""

    qformer_weights: str | None = None
    """Q-Former weights: a local directory or hub id of either a HF BLIP-2 checkpoint
    (``Blip2ForImageTextRetrieval`` / ``Blip2Model`` / ``Blip2ForConditionalGeneration`` format:
    ``qformer.*``, ``query_tokens``, ``embeddings.*``, ``vision_projection``, ``text_projection``,
    ``itm_head``) or a BERT checkpoint (``bert-base-uncased``: a fresh Q-Former initialised from BERT as
    BLIP-2 does). Which kind is read from the checkpoint's ``config.json`` (``model_type``). None: random init."""

    @property
    def dec_id(self) -> int:
        """The resolved ``[DEC]`` token id."""
        return self.vocab_size - 1 if self.dec_token_id is None else self.dec_token_id

    @model_validator(mode="after")
    def _consistent(self) -> "Blip2Config":
        problems = []
        for name in ("image_size", "patch_size", "vision_width", "vision_layers", "vision_heads", "qformer_width",
                     "qformer_layers", "qformer_heads", "qformer_intermediate_size", "cross_attention_frequency",
                     "num_query_tokens", "vocab_size", "max_position_embeddings", "embed_dim"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.patch_size >= 1 and self.image_size % self.patch_size:
            problems.append(f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")
        if self.vision_heads >= 1 and self.vision_width % self.vision_heads:
            problems.append(f"vision_heads {self.vision_heads} does not divide vision_width {self.vision_width}")
        if self.qformer_heads >= 1 and self.qformer_width % self.qformer_heads:
            problems.append(f"qformer_heads {self.qformer_heads} does not divide qformer_width {self.qformer_width}")
        if not self.vision_mlp_ratio > 0:
            problems.append(f"vision_mlp_ratio must be > 0, got {self.vision_mlp_ratio}")
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0 <= getattr(self, name) < 1:
                problems.append(f"{name} must lie in [0, 1), got {getattr(self, name)}")
        if not self.layer_norm_eps > 0:
            problems.append(f"layer_norm_eps must be > 0, got {self.layer_norm_eps}")
        if not 0 < self.temp_min < self.temp_init <= self.temp_max:
            problems.append(f"need 0 < temp_min < temp_init <= temp_max, got {self.temp_min}, {self.temp_init}, "
                            f"{self.temp_max}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            problems.append(f"pad_token_id {self.pad_token_id} is outside the vocabulary of {self.vocab_size}")
        if self.dec_token_id is not None and not 0 <= self.dec_token_id < self.vocab_size:
            problems.append(f"dec_token_id {self.dec_token_id} is outside the vocabulary of {self.vocab_size}")
        elif self.vocab_size >= 1 and self.dec_id == self.pad_token_id:
            problems.append(f"[DEC] and [PAD] share id {self.pad_token_id}; set dec_token_id or vocab_size")
        if problems:
            raise ValueError("; ".join(problems))
        return self


class Blip2Encodings(NamedTuple):
    """What :meth:`Blip2QFormer.forward` returns (a tuple, so DDP and ``torch.compile`` handle it)."""

    image_embeds: torch.Tensor
    """[B, N, vision_width] the frozen tower's tokens after ``ln_vision`` (what the Q-Former cross-attends to)."""
    image_feat: torch.Tensor
    """[B, Q, embed_dim] L2-normalised float32 query features."""
    text_tokens: torch.Tensor
    """[B, L, qformer_width] hidden states of the text-only pass."""
    text_feat: torch.Tensor
    """[B, embed_dim] L2-normalised float32 text features."""
    temperature: torch.Tensor
    """[] the clamped ITC temperature."""


# ---------------------------------------------------------------------------------------------
# Building blocks.

def itg_attention_mask(attention_mask: torch.Tensor, num_queries: int) -> torch.Tensor:
    """The ITG self-attention mask, bool ``[B, 1, Q + L, Q + L]`` (True = may attend), for the sequence
    ``[queries; text]`` with the text's padding mask ``attention_mask`` ``[B, L]`` (1 = token, 0 = padding).

    Queries attend to every query and to no text; text token t attends to every query and to the
    non-padding text tokens ``s <= t`` (LAVIS's ``get_extended_attention_mask`` with ``has_query``). Every
    row allows the queries, so no row is fully masked.
    """
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must be [B, L], got {tuple(attention_mask.shape)}")
    b, length = attention_mask.shape
    device = attention_mask.device
    total = num_queries + length
    is_text = torch.arange(total, device=device) >= num_queries                        # [T]
    position = torch.arange(total, device=device)
    causal = position[None, :] <= position[:, None]                                     # key s <= row t
    # rows: a query row sees query columns only; a text row sees queries and causal text
    allowed = (~is_text[None, :]) | (is_text[:, None] & is_text[None, :] & causal)      # [T, T]
    keys_real = torch.cat([torch.ones(b, num_queries, dtype=torch.bool, device=device),
                           attention_mask.to(device=device).bool()], dim=1)              # [B, T]
    return (allowed[None] & keys_real[:, None, :])[:, None]


class Blip2LMHead(nn.Module):
    """BERT's prediction head for ITG: dense, GELU, LayerNorm, then a decoder tied to the word embeddings
    plus a bias. The decoder weight is not a parameter of this module: :meth:`forward` takes the
    word-embedding matrix, so the tie holds by construction and the state dict holds no aliased tensor
    (safetensors refuses those)."""

    def __init__(self, width: int, vocab_size: int, eps: float):
        super().__init__()
        self.dense = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width, eps=eps)
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, hidden: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(F.gelu(self.dense(hidden))), word_embeddings, self.bias)


def _hf_vision_config(config: Blip2Config):
    from transformers.models.blip_2.configuration_blip_2 import Blip2VisionConfig

    vision_config = Blip2VisionConfig(hidden_size=config.vision_width, num_hidden_layers=config.vision_layers,
                                      num_attention_heads=config.vision_heads, image_size=config.image_size,
                                      patch_size=config.patch_size,
                                      intermediate_size=round(config.vision_width * config.vision_mlp_ratio))
    vision_config._attn_implementation = "sdpa"
    return vision_config


def build_image_tower(config: Blip2Config) -> nn.Module:
    """The image tower of ``config``, randomly initialised.

    ``timm``: a ``VisionTransformer`` with ALBEF's settings (:func:`~falcon_cli.models.vision.build_vision_encoder`:
    qkv bias, LayerNorm eps 1e-6, no classifier), read through ``forward_features``. ``hf``: transformers'
    ``Blip2VisionModel`` whose ``post_layernorm`` is an identity (``ln_vision`` plays that part).
    """
    if config.vision == "hf":
        from transformers.models.blip_2.modeling_blip_2 import Blip2VisionModel

        tower = Blip2VisionModel(_hf_vision_config(config))
        tower.post_layernorm = nn.Identity()
        return tower
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(img_size=config.image_size, patch_size=config.patch_size, embed_dim=config.vision_width,
                             depth=config.vision_layers, num_heads=config.vision_heads,
                             mlp_ratio=config.vision_mlp_ratio, qkv_bias=True,
                             norm_layer=partial(nn.LayerNorm, eps=1e-6), num_classes=0)


@torch.no_grad()
def _init_bert(module: nn.Module, std: float = 0.02) -> None:
    """BERT's initialisation: normal(0, std) Linear/Embedding weights (padding row zero), zero biases,
    LayerNorm 1/0."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            m.weight.normal_(0.0, std)
            if m.bias is not None:
                m.bias.zero_()
        elif isinstance(m, nn.Embedding):
            m.weight.normal_(0.0, std)
            if m.padding_idx is not None:
                m.weight[m.padding_idx].zero_()
        elif isinstance(m, nn.LayerNorm):
            m.weight.fill_(1.0)
            m.bias.zero_()
        elif isinstance(m, Blip2LMHead):
            m.bias.zero_()


# ---------------------------------------------------------------------------------------------
# The model.

class Blip2QFormer(nn.Module):
    """BLIP-2 stage 1 with plain parameter names.

    Submodules and parameters: ``visual_encoder`` (frozen image tower), ``ln_vision`` (trainable LayerNorm
    on the image tokens), ``query_tokens`` ``[1, Q, qformer_width]``, ``embeddings`` (``Blip2TextEmbeddings``:
    word + position), ``qformer`` (``Blip2QFormerModel``, cross-attending to ``vision_width``-wide tokens),
    ``vision_proj`` / ``text_proj`` (width -> ``embed_dim``), ``itm_head`` (Linear(width, 2)), ``lm_head``
    (:class:`Blip2LMHead`, decoder tied to ``embeddings.word_embeddings.weight``) and ``temp`` (the ITC
    temperature).

    Initialisation as LAVIS: the Q-Former, the embeddings and the LM head as BERT (normal 0.02, LayerNorm
    1/0, zero biases), the queries normal 0.02, the projections and the ITM head PyTorch's default
    ``Linear`` init (LAVIS creates them outside BERT), ``ln_vision`` 1/0.

    All methods are device- and dtype-agnostic (CPU, CUDA, ``torch.autocast``) and branch on no tensor
    value; features are returned in float32, normalised after upcasting.
    """

    def __init__(self, config: Blip2Config):
        super().__init__()
        from transformers.models.blip_2.configuration_blip_2 import Blip2QFormerConfig
        from transformers.models.blip_2.modeling_blip_2 import Blip2QFormerModel, Blip2TextEmbeddings

        self.config = config
        self.visual_encoder = build_image_tower(config)
        # HF's post_layernorm (which ln_vision replaces) has the vision config's eps; LAVIS's ln_vision 1e-5.
        vision_eps = self.visual_encoder.config.layer_norm_eps if config.vision == "hf" else 1e-5
        self.ln_vision = nn.LayerNorm(config.vision_width, eps=vision_eps)
        qformer_config = Blip2QFormerConfig(
            vocab_size=config.vocab_size, hidden_size=config.qformer_width, num_hidden_layers=config.qformer_layers,
            num_attention_heads=config.qformer_heads, intermediate_size=config.qformer_intermediate_size,
            hidden_act="gelu", hidden_dropout_prob=config.hidden_dropout,
            attention_probs_dropout_prob=config.attention_dropout,
            max_position_embeddings=config.max_position_embeddings, layer_norm_eps=config.layer_norm_eps,
            pad_token_id=config.pad_token_id, cross_attention_frequency=config.cross_attention_frequency,
            encoder_hidden_size=config.vision_width, use_qformer_text_input=True)
        # SDPA: boolean 4-D masks reach torch's scaled_dot_product_attention unchanged (see the module docstring).
        qformer_config._attn_implementation = "sdpa"
        self.query_tokens = nn.Parameter(torch.zeros(1, config.num_query_tokens, config.qformer_width))
        self.embeddings = Blip2TextEmbeddings(qformer_config)
        self.qformer = Blip2QFormerModel(qformer_config)
        self.vision_proj = nn.Linear(config.qformer_width, config.embed_dim)
        self.text_proj = nn.Linear(config.qformer_width, config.embed_dim)
        self.itm_head = nn.Linear(config.qformer_width, 2)
        self.lm_head = Blip2LMHead(config.qformer_width, config.vocab_size, config.layer_norm_eps)
        self.temp = nn.Parameter(torch.tensor(float(config.temp_init)))
        _init_bert(self.embeddings)
        _init_bert(self.qformer)
        _init_bert(self.lm_head)
        with torch.no_grad():
            self.query_tokens.normal_(0.0, 0.02)
        self.vision_trainable = False
        self.visual_encoder.requires_grad_(False)
        self.visual_encoder.eval()

    # --- frozen image encoder ----------------------------------------------------------------------
    def train(self, mode: bool = True) -> "Blip2QFormer":
        """Train/eval mode for everything but a frozen image encoder, which always stays in eval mode."""
        super().train(mode)
        self.visual_encoder.train(mode and self.vision_trainable)
        return self

    def set_image_encoder_trainable(self, trainable: bool) -> None:
        """Unfreeze (``True``: gradients, train mode with the model) or freeze (BLIP-2's default) the image
        encoder. For runs without a pretrained encoder (``pretrain.vision_trainable_epochs``): a tiny ViT
        learns first and is frozen afterwards."""
        self.vision_trainable = bool(trainable)
        self.visual_encoder.requires_grad_(self.vision_trainable)
        self.visual_encoder.train(self.training and self.vision_trainable)

    # --- temperature (ALBEF's semantics) -----------------------------------------------------------
    def temperature(self) -> torch.Tensor:
        """The ITC temperature clamped to ``[temp_min, temp_max]``; safe to call any number of times.

        The gradient passes straight through to ``temp`` (as ALBEF and LAVIS, which use the in-place clamped
        parameter itself), so a temperature sitting on a bound can still move back.
        """
        clamped = self.temp.clamp(self.config.temp_min, self.config.temp_max)
        return self.temp + (clamped - self.temp).detach()

    @torch.no_grad()
    def clamp_temperature_(self) -> None:
        """Clamp the ``temp`` parameter itself in place, as LAVIS does at the start of each forward.

        Call it once per step, before the temperature is used in the step's graph (or after
        ``optimizer.step()``), so the raw parameter never drifts outside the range.
        """
        self.temp.clamp_(self.config.temp_min, self.config.temp_max)

    # --- passes ------------------------------------------------------------------------------------
    def image_embeddings(self, images: torch.Tensor) -> torch.Tensor:
        """``images`` [B, 3, H, W] -> image tokens [B, N, vision_width]: the frozen tower under ``no_grad``
        (timm: ``forward_features``; hf: ``last_hidden_state`` before HF's ``post_layernorm``), then
        ``ln_vision`` with gradient."""
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.vision_trainable):
            if self.config.vision == "hf":
                tokens = self.visual_encoder(pixel_values=images).last_hidden_state
            else:
                tokens = self.visual_encoder.forward_features(images)
        return self.ln_vision(tokens)

    def _queries(self, batch: int) -> torch.Tensor:
        return self.query_tokens.expand(batch, -1, -1)

    def query_features(self, image_embeds: torch.Tensor) -> torch.Tensor:
        """The queries through the Q-Former alone (no text), cross-attending to ``image_embeds``
        [B, N, vision_width] -> projected, L2-normalised float32 ITC features [B, Q, embed_dim]."""
        hidden = self.qformer(query_embeds=self._queries(image_embeds.shape[0]),
                              query_length=self.config.num_query_tokens,
                              encoder_hidden_states=image_embeds).last_hidden_state
        return F.normalize(self.vision_proj(hidden).float(), dim=-1)

    def encode_image(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``images`` [B, 3, H, W] -> (image tokens [B, N, vision_width], query features [B, Q, embed_dim])."""
        image_embeds = self.image_embeddings(images)
        return image_embeds, self.query_features(image_embeds)

    def encode_text(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Text alone through the Q-Former (no queries, no image; bidirectional, padding masked) ->
        (hidden states [B, L, qformer_width], text features [B, embed_dim]: the projected, L2-normalised
        float32 [CLS] (position 0), or the mean of the non-padding states with ``pooling: mean``)."""
        hidden = self.qformer(query_embeds=self.embeddings(input_ids=input_ids), query_length=0,
                              attention_mask=attention_mask).last_hidden_state
        if self.config.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            keep = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * keep).sum(dim=1) / keep.sum(dim=1).clamp_min(1)
        return hidden, F.normalize(self.text_proj(pooled).float(), dim=-1)

    def similarity(self, image_feat: torch.Tensor, text_feat: torch.Tensor) -> torch.Tensor:
        """ITC similarities ``[N_images, N_texts]``: for ``[N_i, Q, E]`` query features, each image's largest
        query cosine with each text (:func:`~falcon_cli.objectives.common.image_text_similarity`)."""
        from falcon_cli.objectives.common import image_text_similarity

        return image_text_similarity(image_feat, text_feat)

    @staticmethod
    def pooled_image_feature(image_feat: torch.Tensor) -> torch.Tensor:
        """One unit vector per image ``[B, E]`` (float32): the L2-normalised mean of its Q query features
        ``[B, Q, E]`` (``[B, E]`` input is only normalised).

        The embedding cache, the search spaces and the composers hold one vector per image (their
        nearest-neighbour and similarity-quantile machinery is written for ``[N, E]``), whereas BLIP-2's ITC
        scores Q vectors per image. The mean is a text-independent summary; where the pair's caption is at
        hand, :func:`~falcon_cli.objectives.common.paired_image_feature` (the query closest to the pair's
        own text, MAFA's choice for BLIP-2) is the alternative.
        """
        if image_feat.dim() == 3:
            image_feat = image_feat.float().mean(dim=1)
        elif image_feat.dim() != 2:
            raise ValueError(f"image features of shape {tuple(image_feat.shape)}: expected [B, Q, E] or [B, E]")
        return F.normalize(image_feat.float(), dim=-1)

    def _joint(self, image_embeds: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``[queries; text]`` through the Q-Former, the queries cross-attending to ``image_embeds``; ``mask``:
        a 2-D ``[B, Q + L]`` padding mask or a boolean 4-D mask used exactly -> hidden [B, Q + L, width]."""
        embeds = self.embeddings(input_ids=input_ids, query_embeds=self._queries(input_ids.shape[0]))
        return self.qformer(query_embeds=embeds, query_length=self.config.num_query_tokens, attention_mask=mask,
                            encoder_hidden_states=image_embeds).last_hidden_state

    def itm_logits(self, image_embeds: torch.Tensor, input_ids: torch.Tensor,
                   attention_mask: torch.Tensor) -> torch.Tensor:
        """ITM logits [P, 2] (index 1 = matched, float32) of P (image, text) pairs: queries and text in one
        pass, attending to each other bidirectionally (padding masked), the queries cross-attending to
        ``image_embeds`` [P, N, vision_width]; ``itm_head`` on each query output, averaged over the Q queries
        (LAVIS, HF's ``Blip2ForImageTextRetrieval``)."""
        q = self.config.num_query_tokens
        mask = torch.cat([attention_mask.new_ones(attention_mask.shape[0], q), attention_mask], dim=1)
        hidden = self._joint(image_embeds, input_ids, mask)
        return self.itm_head(hidden[:, :q]).float().mean(dim=1)

    def pair_itm_logits(self, image_embeds: torch.Tensor, text_tokens: torch.Tensor | None, input_ids: torch.Tensor,
                        attention_mask: torch.Tensor) -> torch.Tensor:
        """:meth:`itm_logits` with ALBEF's signature (``text_tokens`` unused: the Q-Former reads the ids)."""
        return self.itm_logits(image_embeds, input_ids, attention_mask)

    def match_logits(self, image_embeds: torch.Tensor, text_tokens: torch.Tensor | None, input_ids: torch.Tensor,
                     attention_mask: torch.Tensor) -> torch.Tensor:
        """ITM match logits [P] (class 1, raw) of P pairs: the retrieval re-ranking score. ``text_tokens`` is
        unused (ALBEF's version of this method reads text tokens, this one the ids)."""
        return self.itm_logits(image_embeds, input_ids, attention_mask)[:, 1]

    def itg_logits(self, image_embeds: torch.Tensor, input_ids: torch.Tensor,
                   attention_mask: torch.Tensor) -> torch.Tensor:
        """Image-grounded text generation logits [B, L, vocab_size] in one pass: the decoder input is
        ``input_ids`` with position 0 replaced by ``[DEC]``; ``[queries; text]`` under
        :func:`itg_attention_mask`, the queries cross-attending to ``image_embeds``; ``lm_head`` on the text
        positions. Position t predicts token t + 1 (:func:`~falcon_cli.objectives.blip2.itg_loss` shifts)."""
        dec = torch.full_like(input_ids[:, :1], self.config.dec_id)
        decoder_ids = torch.cat([dec, input_ids[:, 1:]], dim=1)
        mask = itg_attention_mask(attention_mask, self.config.num_query_tokens)
        hidden = self._joint(image_embeds, decoder_ids, mask)
        return self.lm_head(hidden[:, self.config.num_query_tokens:], self.embeddings.word_embeddings.weight)

    def forward(self, images: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Blip2Encodings:
        """Clamp the temperature in place (LAVIS, ALBEF), then encode images and texts.

        Call it once per step: a second call after the temperature entered the step's graph would modify a
        tensor saved for backward. ITM and ITG then run on ``image_embeds`` with :meth:`itm_logits` and
        :meth:`itg_logits`.
        """
        self.clamp_temperature_()
        image_embeds, image_feat = self.encode_image(images)
        text_tokens, text_feat = self.encode_text(input_ids, attention_mask)
        return Blip2Encodings(image_embeds, image_feat, text_tokens, text_feat, self.temperature())

    # --- bookkeeping -------------------------------------------------------------------------------
    def num_parameters(self, trainable_only: bool = False) -> int:
        """Number of (distinct) parameters; ``trainable_only`` leaves the frozen image encoder out."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    @property
    def num_image_tokens(self) -> int:
        """Image tokens per image (what the Q-Former cross-attends to): patches plus [CLS]."""
        return (self.config.image_size // self.config.patch_size) ** 2 + 1


# ---------------------------------------------------------------------------------------------
# Weight sources.

def build_blip2(config: Blip2Config) -> Blip2QFormer:
    """A :class:`Blip2QFormer` for ``config``: random init, then the weight sources it names
    (``vision_weights``, then ``qformer_weights``); any problem with a source is one-line :class:`FalconError`."""
    model = Blip2QFormer(config)
    if config.vision_weights:
        if config.vision == "hf":
            load_blip2_vision_weights(model, config.vision_weights)
        else:
            from falcon_cli.models.weights import load_vision_weights

            load_vision_weights(model.visual_encoder, config.vision_weights)
    if config.qformer_weights:
        checkpoint = _Checkpoint(config.qformer_weights, "qformer_weights")
        if checkpoint.kind == "bert":
            load_bert_into_qformer(model, config.qformer_weights)
        else:
            load_blip2_qformer_weights(model, config.qformer_weights, checkpoint=checkpoint)
    return model


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _names(keys, limit: int = 4) -> str:
    keys = sorted(keys)
    if not keys:
        return "none"
    return f"{len(keys)} ({', '.join(keys[:limit])}{', ...' if len(keys) > limit else ''})"


def _looks_local(source: str) -> bool:
    path = Path(source).expanduser()
    return source.startswith(("/", "./", "../", "~", ".")) or source.count("/") > 1 or path.exists()


class _Checkpoint:
    """A transformers checkpoint (a ``save_pretrained`` directory or a hub id): its ``config.json`` and the
    tensors whose names start with given prefixes (only the shards holding them are read or downloaded)."""

    def __init__(self, source: str, what: str):
        self.source, self.what = source, what
        self.local = _looks_local(source)
        path = Path(source).expanduser()
        if self.local:
            if path.is_file():
                raise FalconError(f"{what} '{source}': a file; give a checkpoint directory written by save_pretrained "
                                  "(or a hub id)")
            if not path.is_dir():
                raise FalconError(f"{what} '{source}': no such directory (give a save_pretrained directory of a HF "
                                  "BLIP-2 or BERT checkpoint, or a hub id)")
            self.directory = path
        else:
            from falcon_cli.runtime.hub import prepare_hub

            prepare_hub()
        config_file = self._fetch("config.json", required=True)
        try:
            self.config: dict[str, Any] = json.loads(config_file.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise FalconError(f"{what} '{source}': cannot read config.json ({_first_line(exc)})") from None
        model_type = self.config.get("model_type")
        if model_type == "bert":
            self.kind = "bert"
        elif model_type in ("blip-2", "blip_2"):
            self.kind = "blip2"
        else:
            raise FalconError(f"{what} '{source}': config.json has model_type {model_type!r}; expected a HF BLIP-2 "
                              "('blip-2') or a BERT ('bert') checkpoint")

    def _fetch(self, filename: str, required: bool = False) -> Path | None:
        """The local path of ``filename`` in the checkpoint (downloaded for a hub id), or None when absent."""
        if self.local:
            path = self.directory / filename
            if path.is_file():
                return path
            if required:
                raise FalconError(f"{self.what} '{self.source}': no {filename} in it (give a directory written by "
                                  "save_pretrained)")
            return None
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError

        from falcon_cli.runtime.hub import hub_hint

        try:
            return Path(hf_hub_download(self.source, filename))
        except EntryNotFoundError as exc:  # not in the repo, or offline and not cached
            if not required:
                return None
            why = hub_hint(self.source) or _first_line(exc)
        except Exception as exc:  # noqa: BLE001 - unknown repo, no network, ...: one line says which source failed
            why = hub_hint(self.source) or _first_line(exc)
        raise FalconError(f"{self.what} '{self.source}': cannot fetch {filename} from the hub ({why}); "
                          "give a local directory")

    def tensors(self, prefixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
        """Every tensor whose name starts with one of ``prefixes`` (``model.safetensors``, sharded safetensors
        with their index, or ``pytorch_model.bin`` read with ``weights_only``)."""
        wanted = (lambda key: key.startswith(prefixes))
        for index_name, single in (("model.safetensors.index.json", "model.safetensors"),
                                   ("pytorch_model.bin.index.json", "pytorch_model.bin")):
            index = self._fetch(index_name)
            if index is not None:
                try:
                    weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
                except (OSError, json.JSONDecodeError, KeyError) as exc:
                    raise FalconError(f"{self.what} '{self.source}': cannot read {index_name} "
                                      f"({_first_line(exc)})") from None
                shards = sorted({file for key, file in weight_map.items() if wanted(key)})
                state: dict[str, torch.Tensor] = {}
                for shard in shards:
                    state.update(self._read(self._fetch(shard, required=True), wanted))
                return state
            path = self._fetch(single)
            if path is not None:
                return self._read(path, wanted)
        raise FalconError(f"{self.what} '{self.source}': no model.safetensors or pytorch_model.bin (nor a sharded "
                          "index) in it")

    def _read(self, path: Path, wanted: Callable[[str], bool]) -> dict[str, torch.Tensor]:
        try:
            if path.suffix == ".safetensors":
                from safetensors import safe_open

                with safe_open(str(path), framework="pt", device="cpu") as f:
                    return {key: f.get_tensor(key) for key in f.keys() if wanted(key)}
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            return {key: value for key, value in state.items() if wanted(key)}
        except Exception as exc:  # noqa: BLE001 - corrupt file, pickled code refused by weights_only, ...
            raise FalconError(f"{self.what} '{self.source}': cannot read {path.name} ({_first_line(exc)})") from None


def _check_and_load(model: nn.Module, mapped: dict[str, torch.Tensor], what: str, source: str, hint: str) -> None:
    """Copy ``mapped`` (our names) into ``model`` after checking every key has a place and every shape fits:
    the first key that does not is named in one line with both shapes."""
    target = model.state_dict()
    extra = sorted(set(mapped) - set(target))
    if extra:
        raise FalconError(f"{what} '{source}': the checkpoint's {extra[0]} has no counterpart in the model; {hint}")
    for key in target:  # the model's order: the first mismatch is the earliest parameter
        if key in mapped and tuple(mapped[key].shape) != tuple(target[key].shape):
            raise FalconError(f"{what} '{source}': {key} is {tuple(mapped[key].shape)} in the checkpoint but "
                              f"{tuple(target[key].shape)} in the model; {hint}")
    result = model.load_state_dict(mapped, strict=False)
    assert not result.unexpected_keys, result.unexpected_keys  # every key was checked above


def _check_config_field(what: str, source: str, section: dict[str, Any], theirs: str, value: Any, ours: str) -> None:
    found = section.get(theirs)
    if found is not None and found != value:
        raise FalconError(f"{what} '{source}': the checkpoint has {theirs}={found} but the model config has "
                          f"{ours}={value}; set {ours}={found}")


def load_blip2_vision_weights(model: Blip2QFormer, source: str, what: str = "vision_weights", *,
                              checkpoint: _Checkpoint | None = None) -> None:
    """Load a HF BLIP-2 checkpoint's image tower into ``model`` (``vision: hf``): ``vision_model.*`` into
    ``visual_encoder`` and ``vision_model.post_layernorm`` into ``ln_vision``. Every tower weight must be
    there with the model's shape; position embeddings of another grid are resized as ALBEF's
    (:func:`~falcon_cli.models.vision.resize_pos_embed`)."""
    from falcon_cli.models.vision import resize_pos_embed

    config = model.config
    if config.vision != "hf":
        raise FalconError(f"{what} '{source}': a HF BLIP-2 image tower needs vision: hf")
    checkpoint = checkpoint or _Checkpoint(source, what)
    if checkpoint.kind != "blip2":
        raise FalconError(f"{what} '{source}': a {checkpoint.kind} checkpoint; vision: hf takes a HF BLIP-2 checkpoint")
    vision_config = checkpoint.config.get("vision_config") or {}
    _check_config_field(what, source, vision_config, "num_attention_heads", config.vision_heads, "vision_heads")
    state = checkpoint.tensors(("vision_model.",))
    if not state:
        raise FalconError(f"{what} '{source}': no vision_model.* weights in it (not a HF BLIP-2 checkpoint with "
                          "its image encoder)")
    mapped = {}
    for key, value in state.items():
        name = key[len("vision_model."):]
        mapped["ln_vision." + name[len("post_layernorm."):] if name.startswith("post_layernorm.")
               else "visual_encoder." + name] = value
    pos_key = "visual_encoder.embeddings.position_embedding"
    pos = mapped.get(pos_key)
    target_pos = model.visual_encoder.embeddings.position_embedding
    if pos is not None and pos.dim() == 3 and pos.shape[-1] == target_pos.shape[-1] and pos.shape != target_pos.shape:
        mapped[pos_key] = resize_pos_embed(pos, config.image_size // config.patch_size)
    _check_and_load(model, mapped, what, source,
                    "set vision_width/vision_layers/vision_mlp_ratio/patch_size to the checkpoint's architecture")
    expected = {k for k in model.state_dict() if k.startswith("visual_encoder.")} | {"ln_vision.weight", "ln_vision.bias"}
    missing = expected - set(mapped)
    if missing:
        raise FalconError(f"{what} '{source}': the checkpoint lacks {_names(missing)} of the image encoder; set "
                          "vision_layers to the checkpoint's")
    eps = vision_config.get("layer_norm_eps")
    if eps is not None and eps != model.ln_vision.eps:
        log.warning("vision weights from %s: checkpoint layer_norm_eps %s differs from the model's %s",
                    source, eps, model.ln_vision.eps)
    log.info("vision weights from %s: loaded %d tensors (vision_model.post_layernorm -> ln_vision)",
             source, len(mapped))


_QFORMER_RENAMES = {"qformer.": "qformer.", "query_tokens": "query_tokens", "embeddings.": "embeddings.",
                    "vision_projection.": "vision_proj.", "text_projection.": "text_proj.", "itm_head.": "itm_head."}
"""HF BLIP-2 name prefix -> ours, for the Q-Former side of a checkpoint."""


def load_blip2_qformer_weights(model: Blip2QFormer, source: str, what: str = "qformer_weights", *,
                               checkpoint: _Checkpoint | None = None) -> None:
    """Load the Q-Former side of a HF BLIP-2 checkpoint into ``model``: ``qformer.*``, ``query_tokens``,
    ``embeddings.*``, ``vision_projection`` -> ``vision_proj``, ``text_projection`` -> ``text_proj``,
    ``itm_head``. Parts a stage-2 checkpoint lacks (text embeddings and feed-forward, projections, ITM head)
    and what no HF checkpoint has (``lm_head``, ``temp``) keep their initialisation; a warning names them."""
    config = model.config
    checkpoint = checkpoint or _Checkpoint(source, what)
    if checkpoint.kind != "blip2":
        raise FalconError(f"{what} '{source}': a {checkpoint.kind} checkpoint where a HF BLIP-2 one was expected")
    qformer_config = checkpoint.config.get("qformer_config") or {}
    _check_config_field(what, source, qformer_config, "num_attention_heads", config.qformer_heads, "qformer_heads")
    if qformer_config.get("hidden_act", "gelu") != "gelu":
        raise FalconError(f"{what} '{source}': hidden_act '{qformer_config['hidden_act']}' is not supported (need gelu)")
    state = checkpoint.tensors(tuple(_QFORMER_RENAMES))
    mapped = {}
    for key, value in state.items():
        if key.endswith("position_ids"):  # a buffer older transformers saved
            continue
        for theirs, ours in _QFORMER_RENAMES.items():
            if key.startswith(theirs):
                mapped[ours + key[len(theirs):]] = value
                break
    if "query_tokens" not in mapped or not any(k.startswith("qformer.") for k in mapped):
        raise FalconError(f"{what} '{source}': no qformer.* and query_tokens in it (not a HF BLIP-2 checkpoint)")
    _check_and_load(model, mapped, what, source,
                    "set qformer_width/qformer_layers/qformer_intermediate_size/cross_attention_frequency/"
                    "num_query_tokens/vocab_size/max_position_embeddings/embed_dim to the checkpoint's")
    ours = {k for k in model.state_dict() if not k.startswith(("visual_encoder.", "ln_vision."))}
    fresh = sorted(ours - set(mapped))
    expected_fresh = {k for k in fresh if k.startswith("lm_head.") or k == "temp"}
    log.log(logging.WARNING if set(fresh) - expected_fresh else logging.INFO,
            "qformer weights from %s: loaded %d tensors; kept at init: %s", source, len(mapped), _names(fresh, 6))


def load_bert_into_qformer(model: Blip2QFormer, source: str, what: str = "qformer_weights") -> None:
    """Initialise the Q-Former from a transformers BERT checkpoint (hub id or ``save_pretrained`` directory of
    ``BertForMaskedLM`` / ``BertForPreTraining`` / ``BertModel``), as LAVIS's ``init_Qformer``.

    BERT layer i -> Q-Former layer i: self-attention, and the feed-forward block into both the text
    (``intermediate``/``output``) and the query (``intermediate_query``/``output_query``) copies. Word
    embeddings (rows ``>= BERT's vocab_size``, i.e. [DEC], keep their init), position embeddings, the
    embedding LayerNorm (-> ``qformer.layernorm``), and the MLM head's transform and bias (-> ``lm_head``).
    Cross-attention, queries, projections and the ITM head stay new; BERT's token-type embeddings and any
    layers beyond ``qformer_layers`` are not used.
    """
    from transformers import BertForMaskedLM

    from falcon_cli.runtime.hub import hub_hint, prepare_hub

    config = model.config
    local = _looks_local(source)
    if not local:
        prepare_hub()
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        bert, info = BertForMaskedLM.from_pretrained(str(Path(source).expanduser()) if local else source,
                                                     output_loading_info=True)
    except Exception as exc:  # noqa: BLE001 - offline and not cached, unknown id, bad files, ...
        why = ("" if local else hub_hint(source)) or _first_line(exc)
        raise FalconError(f"{what} '{source}': cannot load BERT weights ({why})") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    bert_config = bert.config
    if bert_config.num_attention_heads != config.qformer_heads:
        raise FalconError(f"{what} '{source}': BERT has num_attention_heads={bert_config.num_attention_heads} but the "
                          f"model config has qformer_heads={config.qformer_heads}; set qformer_heads="
                          f"{bert_config.num_attention_heads}")
    if getattr(bert_config, "hidden_act", "gelu") != "gelu":
        raise FalconError(f"{what} '{source}': hidden_act '{bert_config.hidden_act}' is not supported (need gelu)")
    if bert_config.num_hidden_layers < config.qformer_layers:
        raise FalconError(f"{what} '{source}': BERT has {bert_config.num_hidden_layers} layers but qformer_layers is "
                          f"{config.qformer_layers}; lower it to fit")
    if bert_config.vocab_size > config.vocab_size:
        raise FalconError(f"{what} '{source}': BERT's vocabulary has {bert_config.vocab_size} ids but the model's "
                          f"{config.vocab_size}; set vocab_size to at least {bert_config.vocab_size} + 1 ([DEC])")
    sd = bert.state_dict()
    missing_head = any(k.startswith("cls.predictions.transform") for k in info.get("missing_keys", ()))
    n = bert_config.vocab_size
    target = model.state_dict()
    mapped: dict[str, torch.Tensor] = {}
    word = sd["bert.embeddings.word_embeddings.weight"]
    if word.shape[1] != config.qformer_width:
        raise FalconError(f"{what} '{source}': embeddings.word_embeddings.weight is {tuple(word.shape)} in the "
                          f"checkpoint but {tuple(target['embeddings.word_embeddings.weight'].shape)} in the model; "
                          f"set qformer_width={word.shape[1]}")
    rows = target["embeddings.word_embeddings.weight"].clone()
    rows[:n] = word
    mapped["embeddings.word_embeddings.weight"] = rows
    mapped["embeddings.position_embeddings.weight"] = sd["bert.embeddings.position_embeddings.weight"]
    for p in ("weight", "bias"):
        mapped[f"qformer.layernorm.{p}"] = sd[f"bert.embeddings.LayerNorm.{p}"]
    for i in range(config.qformer_layers):
        theirs, ours = f"bert.encoder.layer.{i}.", f"qformer.encoder.layer.{i}."
        for p in ("weight", "bias"):
            for proj in ("query", "key", "value"):
                mapped[f"{ours}attention.attention.{proj}.{p}"] = sd[f"{theirs}attention.self.{proj}.{p}"]
            for part in ("dense", "LayerNorm"):
                mapped[f"{ours}attention.output.{part}.{p}"] = sd[f"{theirs}attention.output.{part}.{p}"]
            for suffix in ("", "_query"):
                mapped[f"{ours}intermediate{suffix}.dense.{p}"] = sd[f"{theirs}intermediate.dense.{p}"]
                for part in ("dense", "LayerNorm"):
                    mapped[f"{ours}output{suffix}.{part}.{p}"] = sd[f"{theirs}output.{part}.{p}"]
    if not missing_head:
        for p in ("weight", "bias"):
            mapped[f"lm_head.dense.{p}"] = sd[f"cls.predictions.transform.dense.{p}"]
            mapped[f"lm_head.norm.{p}"] = sd[f"cls.predictions.transform.LayerNorm.{p}"]
        bias = target["lm_head.bias"].clone()
        bias[:n] = sd["cls.predictions.bias"]
        mapped["lm_head.bias"] = bias
    _check_and_load(model, mapped, what, source,
                    "set qformer_width/qformer_intermediate_size/max_position_embeddings to BERT's")
    log.log(logging.WARNING if missing_head else logging.INFO,
            "qformer weights from BERT %s: loaded %d tensors (layers 0-%d, text and query feed-forward; word rows "
            "%d-%d kept at init); cross-attention, queries, projections, ITM head%s newly initialised",
            source, len(mapped), config.qformer_layers - 1, n, config.vocab_size - 1,
            ", LM head (not in the checkpoint)" if missing_head else "")
