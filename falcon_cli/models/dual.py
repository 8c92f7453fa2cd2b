"""Dual encoders on open_clip: CLIP- or SigLIP-style image and text towers, optionally with a captioning
decoder on the image tower (SigLIP 2's LocCa-style decoder, in miniature).

A :class:`DualConfig` names either an open_clip architecture (``open_clip_model``: ``ViT-B-16``,
``ViT-B-16-SigLIP``, ``local-dir:DIR``, ``hf-hub:ORG/REPO``; weights from ``open_clip_weights``, a
pretrained tag or a checkpoint file) or, with ``open_clip_model`` unset, open_clip towers of the sizes
it lists (``dual-tiny``, for tests and the shapes world). :class:`DualEncoder` wraps the open_clip model
with the interface every falcon stage uses: ``encode_image``/``encode_text`` return ``(tokens, unit
features)``, ``temperature()`` the softmax temperature (1 / logit scale), ``logit_scale``/``logit_bias``
the sigmoid loss's ``t`` and ``b``, and ``caption_logits`` the decoder's next-token logits.

The decoder (``decoder_layers`` > 0) is open_clip's ``MultimodalTransformer`` (CoCa's text decoder:
causal self-attention over the caption, cross-attention to the image tokens) over its own token and
position embeddings, reading the image tower's last-layer tokens: it adds a captioning loss to the
image tower without touching the text tower, as SigLIP 2's decoder does.

An open_clip CoCa (``coca_ViT-B-32``, ``coca_ViT-L-14``) brings its own decoder and is used as CoCa trains
it: the image tokens are its attentional pooler's outputs, and the decoder reads the per-token outputs of
the causal text tower (so the caption loss trains the text tower too) instead of embedding the ids itself.

Images reach the model normalised as every falcon transform does (CLIP's mean and std); a model trained
with other statistics (SigLIP: 0.5, 0.5) is given ``image_mean``/``image_std`` and re-normalises inside
:meth:`DualEncoder.encode_image`, so the data path is the same for every model.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from falcon_cli.data.normalization import CLIP_MEAN, CLIP_STD
from falcon_cli.errors import FalconError
from falcon_cli.models.dual_config import DualConfig, is_coca_name  # noqa: F401 (the model's config, here too)
from falcon_cli.models.open_clip_names import (
    HF_HUB,
    LOCAL_DIR,
    _check_open_clip_name,
    _check_open_clip_pretrained,
    _first_line,
    note_open_clip,
    pinned_open_clip,
)
from falcon_cli.runtime.hub import hub_hint, prepare_hub


def init_multimodal_transformer(t: nn.Module) -> None:
    """CLIP's initialisation of open_clip's ``MultimodalTransformer``: open_clip never runs its own (its
    ``init_parameters`` reads attributes the class lacks), which leaves ``text_projection`` as uninitialised
    memory, NaN at times, in any decoder built without weights (ours, or a CoCa from scratch)."""
    proj_std, attn_std, fc_std = (t.width**-0.5) * ((2 * t.layers) ** -0.5), t.width**-0.5, (2 * t.width) ** -0.5
    for block in [*t.resblocks, *t.cross_attn]:
        nn.init.normal_(block.attn.in_proj_weight, std=attn_std)
        nn.init.normal_(block.attn.out_proj.weight, std=proj_std)
        nn.init.normal_(block.mlp.c_fc.weight, std=fc_std)
        nn.init.normal_(block.mlp.c_proj.weight, std=proj_std)
    nn.init.normal_(t.text_projection, std=t.width**-0.5)


class CaptionDecoder(nn.Module):
    """Caption tokens -> next-token logits, attending causally to earlier tokens and to all image tokens."""

    def __init__(self, vocab_size: int, width: int, layers: int, heads: int, context_length: int, image_width: int):
        from open_clip.transformer import MultimodalTransformer

        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, width)
        self.positional_embedding = nn.Parameter(torch.empty(context_length, width))
        self.image_proj = nn.Sequential(nn.LayerNorm(image_width), nn.Linear(image_width, width))
        self.transformer = MultimodalTransformer(
            width=width, layers=layers, heads=heads, context_length=context_length, output_dim=vocab_size
        )
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        nn.init.normal_(self.positional_embedding, std=0.01)
        init_multimodal_transformer(self.transformer)

    def forward(self, image_tokens: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """``[B, L, vocab]``: position t's logits for token t + 1 of ``input_ids`` [B, L] (padding follows the
        caption, so the causal mask keeps it out of every real token's context)."""
        length = input_ids.shape[1]
        if length > self.positional_embedding.shape[0]:
            raise ValueError(
                f"captions of {length} tokens exceed the decoder's context of {self.positional_embedding.shape[0]}"
            )
        text = self.token_embedding(input_ids) + self.positional_embedding[:length]
        return self.transformer(self.image_proj(image_tokens), text)


class DualEncoder(nn.Module):
    """An open_clip dual encoder (``clip``), its sigmoid bias where open_clip's model has none, and an optional
    captioning ``decoder``. See the module docstring."""

    def __init__(self, config: DualConfig, clip: nn.Module):
        super().__init__()
        self.config = config
        self.clip = clip
        if config.contrastive == "sigmoid" and getattr(clip, "logit_bias", None) is None:
            self.logit_bias_extra = nn.Parameter(torch.tensor(float(config.logit_bias_init)))
        elif config.contrastive == "softmax" and getattr(clip, "logit_bias", None) is not None:
            clip.logit_bias.requires_grad_(False)  # a SigLIP model trained with InfoNCE: its bias has no use
        mean, std = torch.tensor(config.image_mean), torch.tensor(config.image_std)
        clip_mean, clip_std = torch.tensor(CLIP_MEAN), torch.tensor(CLIP_STD)
        # x_model = (x_clip * clip_std + clip_mean - mean) / std = x_clip * scale + shift, per channel
        self.register_buffer("pixel_scale", (clip_std / std).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("pixel_shift", ((clip_mean - mean) / std).view(1, 3, 1, 1), persistent=False)
        self.renormalise = not (torch.equal(mean, clip_mean) and torch.equal(std, clip_std))
        self.coca = is_coca(clip)
        if self.coca and config.decoder_layers:
            raise FalconError(
                f"{config.open_clip_model} is a CoCa, which has its own captioning decoder: set "
                "decoder_layers: 0 in the model config"
            )
        # A tower that pools the last position (SigLIP) or appends a class token there (CoCa: its position embedding
        # is the padded length's) must see every caption padded to the full context, as open_clip's tokenizer does.
        self.pad_to_context = text_tower_setting(clip, "pool_type") == "last" or self.coca
        # CoCa masks its padding by id (open_clip's 0) and keeps the end-of-text token visible: captions from a
        # tokenizer that pads with end-of-text (Hugging Face's CLIP) are re-padded from their attention mask.
        self.text_pad_id = int(clip.text.pad_id) if self.coca else config.pad_token_id
        self.decoder = None
        if config.decoder_layers:
            self.decoder = CaptionDecoder(
                config.vocab_size,
                config.decoder_width,
                config.decoder_layers,
                config.decoder_heads,
                config.context_length,
                image_token_width(clip),
            )

    # --- the towers --------------------------------------------------------------------------------
    def encode_image(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(last-layer image tokens [B, N, width], unit image features [B, embed_dim]) in one pass."""
        if self.renormalise:
            images = images * self.pixel_scale + self.pixel_shift
        return open_clip_image(self.clip, images)

    def encode_text(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(text tokens, unit text features [B, embed_dim]): what :meth:`caption_logits` reads as the caption, and
        the contrastive feature. The text tokens are the ids [B, L] themselves, or for a CoCa its text tower's
        per-token outputs [B, L, width]. Captions are padded to ``context_length`` where the tower reads the last
        position (SigLIP, CoCa), so a caption's feature never depends on the batch it is in."""
        ids = input_ids
        if self.coca and attention_mask is not None:
            ids = ids.masked_fill(attention_mask == 0, self.text_pad_id)
        if self.pad_to_context and ids.shape[1] < self.config.context_length:
            ids = F.pad(ids, (0, self.config.context_length - ids.shape[1]), value=self.text_pad_id)
        ids = ids[:, : self.config.context_length]
        if self.coca:
            tokens, features = open_clip_text(self.clip, ids, with_tokens=True)
            return tokens[
                :, : input_ids.shape[1]
            ], features  # causal: the padding after a caption changes none of its tokens
        return input_ids, open_clip_text(self.clip, ids)

    # --- the losses' parameters --------------------------------------------------------------------
    def logit_scale(self) -> torch.Tensor:
        """The logit scale ``t`` = exp(learned log t), clamped at ``logit_scale_max`` (gradient flows below it)."""
        return self.clip.logit_scale.exp().clamp(max=self.config.logit_scale_max).reshape(())

    def logit_bias(self) -> torch.Tensor:
        """The sigmoid loss's bias ``b`` (open_clip's own for a SigLIP model, else this wrapper's)."""
        bias = getattr(self.clip, "logit_bias", None)
        return (bias if bias is not None else self.logit_bias_extra).reshape(())

    def temperature(self) -> torch.Tensor:
        """The softmax temperature 1 / t (what the embedding cache's ITC, retrieval and the logs read)."""
        return 1.0 / self.logit_scale()

    @property
    def has_decoder(self) -> bool:
        """Whether there is a captioning decoder (built here, or CoCa's own)."""
        return self.decoder is not None or self.coca

    def caption_logits(self, image_tokens: torch.Tensor, text_tokens: torch.Tensor) -> torch.Tensor:
        """The decoder's next-token logits [B, L, vocab] of a caption (its text tokens from :meth:`encode_text`)
        given the image tokens."""
        if self.coca:
            return self.clip.text_decoder(image_tokens, text_tokens)
        if self.decoder is None:
            raise FalconError(
                "this dual encoder has no captioning decoder (decoder_layers: 0): the caption loss "
                "and reward need one; register a model config with decoder_layers > 0"
            )
        return self.decoder(image_tokens, text_tokens)

    def caption_text(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The text tokens :meth:`caption_logits` reads: the ids, or (CoCa) the text tower's outputs."""
        return self.encode_text(input_ids, attention_mask)[0] if self.coca else input_ids

    def num_parameters(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)


def is_coca(clip: nn.Module) -> bool:
    """Whether an open_clip model is a CoCa (it has a text decoder)."""
    return getattr(clip, "text_decoder", None) is not None


def open_clip_image(clip: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An open_clip model's (last-layer image tokens [B, N, width], unit image features [B, D]) in one pass of its
    image tower: what a dual encoder trains on and what ``falcon embed`` stores for an open_clip encoder. For a
    CoCa the tokens are its attentional pooler's (what its decoder reads)."""
    if is_coca(clip):
        features, tokens = clip._encode_image(images, normalize=True)
        return tokens, features
    out = clip.visual.forward_intermediates(images, indices=1, normalize_intermediates=True, output_fmt="NLC")
    tokens = out["image_intermediates"][-1]
    if tokens.dim() == 4:  # a convolutional trunk's [B, C, H, W]
        tokens = tokens.flatten(2).transpose(1, 2)
    return tokens, F.normalize(out["image_features"], dim=-1)


def open_clip_text(clip: nn.Module, input_ids: torch.Tensor, with_tokens: bool = False):
    """An open_clip model's unit text features [B, D] of token ids [B, L] (padded as its tower expects); with
    ``with_tokens`` (a CoCa's text tower) also its per-token outputs first: ``(tokens [B, L, width], features)``."""
    if with_tokens:
        features, tokens = clip._encode_text(input_ids, normalize=True)
        return tokens, features
    return F.normalize(clip.encode_text(input_ids), dim=-1)


def image_token_width(clip: nn.Module) -> int:
    """The width of the image tower's tokens (a ViT's width, or a timm trunk's ``num_features``)."""
    visual = clip.visual
    trunk = getattr(visual, "trunk", None)
    if trunk is not None:
        return int(trunk.num_features)
    width = getattr(getattr(visual, "transformer", None), "width", None)
    if width is None:
        raise FalconError(f"{type(visual).__name__}: an image tower whose token width falcon cannot read; use a ViT")
    return int(width)


def text_tower_setting(clip: nn.Module, name: str):
    """A setting of open_clip's text tower (``pool_type``, ``context_length``, ``vocab_size``), wherever the model
    class keeps it (``CustomTextCLIP.text.<name>``, or ``CLIP``'s flattened ``text_pool_type``/``<name>``)."""
    text = getattr(clip, "text", None)
    if text is not None and hasattr(text, name):
        return getattr(text, name)
    return getattr(clip, "text_pool_type" if name == "pool_type" else name, None)


def build_open_clip(config: DualConfig) -> nn.Module:
    """The open_clip model of ``config``: a named architecture with its weights, or the towers it lists."""
    import open_clip

    if config.open_clip_model is None:
        vision = dict(
            image_size=config.image_size,
            patch_size=config.patch_size,
            width=config.vision_width,
            layers=config.vision_layers,
            head_width=config.vision_head_width,
            pool_type=config.vision_pool,
        )
        bidirectional = config.text_pool != "argmax"
        text = dict(
            context_length=config.context_length,
            vocab_size=config.vocab_size,
            width=config.text_width,
            heads=config.text_heads,
            layers=config.text_layers,
            no_causal_mask=bidirectional,
            pad_id=config.pad_token_id,
            pool_type=config.text_pool,
        )
        clip = open_clip.CustomTextCLIP(
            config.embed_dim,
            vision_cfg=vision,
            text_cfg=text,
            init_logit_scale=math.log(config.logit_scale_init),
            init_logit_bias=config.logit_bias_init if config.contrastive == "sigmoid" else None,
        )
        clip.text.use_pad_mask = bidirectional  # (not a CLIPTextCfg field) keep padding out of bidirectional attention
        return clip
    return _named_open_clip(config)


def _named_open_clip(config: DualConfig) -> nn.Module:
    import open_clip

    name, weights = config.open_clip_model, config.open_clip_weights
    _check_open_clip_name(name, open_clip)
    if name.startswith((LOCAL_DIR, HF_HUB)):
        weights = None
    if weights is not None:
        _check_open_clip_pretrained(name, weights, open_clip)
    from_hub = name.startswith(HF_HUB) or (weights is not None and not Path(weights).expanduser().is_file())
    if from_hub:
        prepare_hub()
    try:
        # (the tag's preprocessing is not taken: a dual encoder normalises with its config's image_mean/image_std)
        load_name, load_weights, _ = pinned_open_clip(name, weights, open_clip, "open_clip_model", "vision_weights")
        clip = open_clip.create_model(load_name, pretrained=load_weights)
    except FalconError:
        raise
    except Exception as exc:  # open_clip raises RuntimeError/ValueError/OSError for weights it cannot load
        why = (
            hub_hint(weights or name) if from_hub else ""
        ) or "give a local checkpoint file or a tag in open_clip's cache"
        raise FalconError(
            f"open_clip could not build {name} with weights {weights!r} ({_first_line(exc)}); {why}"
        ) from None
    note_open_clip(name, weights, open_clip, "open_clip_model", "vision_weights")
    if is_coca(clip) and weights is None and not name.startswith((LOCAL_DIR, HF_HUB)):
        init_multimodal_transformer(clip.text_decoder)  # a CoCa from scratch
    size = getattr(clip.visual, "image_size", None)
    settings = {
        "embed_dim": getattr(clip.visual, "output_dim", None),
        "context_length": text_tower_setting(clip, "context_length"),
        "image_size": size[0] if isinstance(size, (tuple, list)) else size,
    }
    for key, value in settings.items():
        if value is not None and int(value) != getattr(config, key):
            raise FalconError(
                f"open_clip model {name}: {key} is {value} but the model config says {getattr(config, key)}; "
                f"set {key}: {value} in the model config"
            )
    vocab = text_tower_setting(clip, "vocab_size")
    if vocab is not None and config.vocab_size > int(vocab):
        raise FalconError(
            f"open_clip model {name}: its text tower knows {vocab} token ids but the run's tokenizer has "
            f"{config.vocab_size}; use the model's own tokenizer (data.tokenizer)"
        )
    return clip


def build_dual(config: DualConfig) -> DualEncoder:
    """A :class:`DualEncoder` for ``config``, its open_clip weights loaded where it names them."""
    return DualEncoder(config, build_open_clip(config))


__all__ = [
    "CaptionDecoder",
    "DualConfig",
    "DualEncoder",
    "build_dual",
    "build_open_clip",
    "image_token_width",
    "init_multimodal_transformer",
    "is_coca",
    "is_coca_name",
    "open_clip_image",
    "open_clip_text",
    "text_tower_setting",
]
