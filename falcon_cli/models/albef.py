"""ALBEF without a momentum model: image encoder, text encoder, fusion encoder and heads.

The model computes representations only; losses live in :mod:`falcon_cli.objectives`.
A training step composes the methods below::

    image_tokens, image_feat = model.encode_image(images)           # ITC features
    text_tokens, text_feat = model.encode_text(input_ids, attention_mask)
    sim = image_feat @ text_feat.T / model.temperature()
    fused = model.fuse(text_tokens, attention_mask, image_tokens)    # also for negatives
    itm = model.itm_logits(fused)                                    # [B, 2]
    fused_mlm = model.fuse(masked_text_tokens, attention_mask, image_tokens)
    mlm = model.mlm_logits(fused_mlm)                                # [B, L, vocab]

``model(images, input_ids, attention_mask)`` runs both encoders and, like ALBEF's forward,
first clamps the temperature in place; a loop that calls the methods directly calls
:meth:`ALBEF.clamp_temperature_` once per step (e.g. after ``optimizer.step()``).

All methods are device- and dtype-agnostic (CPU, CUDA, ``torch.autocast``), and nothing
branches on tensor values, so they work under ``torch.compile``. Features are returned
in float32 (normalised after upcasting) whatever the autocast dtype.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from falcon_cli.models.bert import FusionEncoder, MLMHead, TextEncoder, init_bert_weights
from falcon_cli.models.config import AlbefConfig
from falcon_cli.models.similarity import image_text_similarity
from falcon_cli.models.vision import build_vision_encoder
from falcon_cli.models.weights import load_bert_weights, load_vision_weights


class Encodings(NamedTuple):
    """What :meth:`ALBEF.forward` returns (a tuple, so DDP and ``torch.compile`` handle it)."""

    image_tokens: torch.Tensor
    """[B, 1 + N, vision_width] ViT tokens, [CLS] first."""
    image_feat: torch.Tensor
    """[B, embed_dim] L2-normalised float32 image features."""
    text_tokens: torch.Tensor
    """[B, L, text_width] text-encoder tokens."""
    text_feat: torch.Tensor
    """[B, embed_dim] L2-normalised float32 text features."""
    temperature: torch.Tensor
    """[] the clamped ITC temperature."""


def pooled_features(
    tokens: torch.Tensor, projection: nn.Module, pooling: str, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """L2-normalised float32 ITC features ``[B, embed_dim]`` from encoder ``tokens`` ``[B, T, width]``.

    ``pooling`` ``cls`` projects the first token (ALBEF); ``mean`` projects the mean of the ViT
    patch tokens (``attention_mask`` None: token 0 is [CLS] and is left out) or of the text
    tokens the ``attention_mask`` keeps. The model and its momentum copy both use this.
    """
    if pooling == "cls":
        pooled = tokens[:, 0]
    elif attention_mask is None:
        pooled = tokens[:, 1:].mean(dim=1)
    else:
        keep = attention_mask.unsqueeze(-1).to(tokens.dtype)
        pooled = (tokens * keep).sum(dim=1) / keep.sum(dim=1).clamp_min(1)
    return F.normalize(projection(pooled).float(), dim=-1)


class ALBEF(nn.Module):
    """ALBEF (no momentum encoder) with stable, plain parameter names.

    Submodules: ``visual_encoder`` (timm ViT), ``text_encoder`` (BERT embeddings + text layers),
    ``fusion_encoder`` (BERT layers with cross-attention), ``vision_proj``/``text_proj``
    (width -> ``embed_dim``), ``itm_head`` (Linear(text_width, 2)), ``mlm_head`` (decoder tied to
    ``text_encoder.embeddings.word.weight``), and ``temp`` (the ITC temperature parameter).
    """

    def __init__(self, config: AlbefConfig):
        super().__init__()
        self.config = config
        self.visual_encoder = build_vision_encoder(config)
        self.text_encoder = TextEncoder(config)
        self.fusion_encoder = FusionEncoder(config)
        self.mlm_head = MLMHead(config)
        init_bert_weights(self.text_encoder)
        init_bert_weights(self.fusion_encoder)
        init_bert_weights(self.mlm_head)
        # Created outside BERT in ALBEF, so PyTorch's default Linear init.
        self.vision_proj = nn.Linear(config.vision_width, config.embed_dim)
        self.text_proj = nn.Linear(config.text_width, config.embed_dim)
        self.itm_head = nn.Linear(config.text_width, 2)
        self.temp = nn.Parameter(torch.tensor(float(config.temp_init)))

    # --- temperature ---------------------------------------------------------------------------
    def temperature(self) -> torch.Tensor:
        """The ITC temperature clamped to ``[temp_min, temp_max]``; safe to call any number of times.

        The gradient passes straight through to ``temp`` (as in ALBEF, which uses the in-place
        clamped parameter itself), so a temperature sitting on a bound can still move back.
        """
        clamped = self.temp.clamp(self.config.temp_min, self.config.temp_max)
        return self.temp + (clamped - self.temp).detach()

    @torch.no_grad()
    def clamp_temperature_(self) -> None:
        """Clamp the ``temp`` parameter itself in place, as ALBEF does at the start of each forward.

        Call it once per step, before the temperature is used in the step's graph (or after
        ``optimizer.step()``), so the raw parameter never drifts outside the range.
        """
        self.temp.clamp_(self.config.temp_min, self.config.temp_max)

    # --- encoders ------------------------------------------------------------------------------
    def encode_image(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``images`` [B, 3, H, W] -> (image tokens [B, 1 + N, vision_width], image features [B, embed_dim])."""
        tokens = self.visual_encoder.forward_features(images)
        return tokens, pooled_features(tokens, self.vision_proj, self.config.pooling)

    def encode_text(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Text encoder only (for ITC): -> (text tokens [B, L, text_width], text features [B, embed_dim]).

        ``attention_mask`` [B, L] is the padding mask (1 = token, 0 = padding).
        """
        tokens = self.text_encoder(input_ids, attention_mask)
        return tokens, pooled_features(tokens, self.text_proj, self.config.pooling, attention_mask)

    def fuse(self, text_tokens: torch.Tensor, attention_mask: torch.Tensor, image_tokens: torch.Tensor) -> torch.Tensor:
        """Fusion encoder: text tokens self-attend (bidirectionally, padding masked) and cross-attend
        to all image tokens -> fused tokens [B, L, text_width]."""
        return self.fusion_encoder(text_tokens, attention_mask, image_tokens)

    # --- heads ---------------------------------------------------------------------------------
    def itm_logits(self, fused: torch.Tensor) -> torch.Tensor:
        """ITM logits [B, 2] (index 1 = matched) from the fused [CLS] token."""
        return self.itm_head(fused[:, 0])

    def pair_itm_logits(
        self,
        image_tokens: torch.Tensor,
        text_tokens: torch.Tensor,
        input_ids: torch.Tensor | None,
        attention_mask: torch.Tensor,
    ) -> torch.Tensor:
        """ITM logits [P, 2] of P (image, text) pairs given their encoder tokens (``input_ids`` are unused
        here: BLIP-2's version reads them instead of text tokens)."""
        return self.itm_logits(self.fuse(text_tokens, attention_mask, image_tokens))

    def match_logits(
        self,
        image_tokens: torch.Tensor,
        text_tokens: torch.Tensor,
        input_ids: torch.Tensor | None,
        attention_mask: torch.Tensor,
    ) -> torch.Tensor:
        """ITM match logits [P] (class 1, raw) of P pairs: the retrieval re-ranking score."""
        return self.pair_itm_logits(image_tokens, text_tokens, input_ids, attention_mask)[:, 1]

    def similarity(self, image_feat: torch.Tensor, text_feat: torch.Tensor) -> torch.Tensor:
        """ITC similarities ``[N_images, N_texts]`` (cosines of the unit features)."""
        return image_text_similarity(image_feat, text_feat)

    def mlm_logits(self, fused: torch.Tensor) -> torch.Tensor:
        """MLM logits ``[..., vocab_size]`` for fused tokens ``[..., text_width]`` (pass ``fused[mask]``
        to score only the masked positions)."""
        return self.mlm_head(fused, self.text_encoder.embeddings.word.weight)

    def forward(self, images: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Encodings:
        """Clamp the temperature in place (ALBEF), then encode images and texts.

        Call it once per step: a second call after the temperature entered the step's graph
        would modify a tensor saved for backward. Further encodings in the same step (masked
        texts for MLM, ...) use :meth:`encode_text`/:meth:`encode_image` directly.
        """
        self.clamp_temperature_()
        image_tokens, image_feat = self.encode_image(images)
        text_tokens, text_feat = self.encode_text(input_ids, attention_mask)
        return Encodings(image_tokens, image_feat, text_tokens, text_feat, self.temperature())

    def compile_encoders(self, **options) -> None:
        """``torch.compile`` the image, text and fusion encoders in place (``options`` go to
        :meth:`torch.nn.Module.compile`): parameter names, and so checkpoints, do not change, and the
        heads and losses around them (which index by data-dependent masks) stay eager."""
        # the ViT is called through forward_features (not __call__, which Module.compile wraps)
        self.visual_encoder.forward_features = torch.compile(self.visual_encoder.forward_features, **options)
        for encoder in (self.text_encoder, self.fusion_encoder):
            encoder.compile(**options)

    # --- bookkeeping ---------------------------------------------------------------------------
    def num_parameters(self, trainable_only: bool = False) -> int:
        """Number of (distinct) parameters."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    @property
    def num_image_tokens(self) -> int:
        """Tokens per image: patches plus [CLS]."""
        return (self.config.image_size // self.config.patch_size) ** 2 + 1


def build_albef(config: AlbefConfig) -> ALBEF:
    """An :class:`ALBEF` of ``config`` with its pretrained image (timm/DeiT) and text (BERT) weights, if named
    (the ``albef`` family's builder, :mod:`falcon_cli.models.families`)."""
    model = ALBEF(config)
    if config.vision_weights:
        load_vision_weights(model.visual_encoder, config.vision_weights)
    if config.text_weights:
        load_bert_weights(model, config.text_weights)
    return model
