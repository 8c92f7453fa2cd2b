"""The ALBEF image encoder: a timm ``VisionTransformer`` that returns all tokens, and the one
function that resizes its position embeddings to another resolution."""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from falcon_cli.errors import FalconError
from falcon_cli.models.config import AlbefConfig


def build_vision_encoder(config: AlbefConfig) -> nn.Module:
    """A timm ViT with ALBEF's settings (qkv bias, LayerNorm eps 1e-6, no classifier head).

    ``encoder.forward_features(images)`` gives the final-normed tokens ``[B, 1 + N, vision_width]``
    with the [CLS] token first. Parameter names are timm's, so timm checkpoints load as they are.
    """
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(
        img_size=config.image_size,
        patch_size=config.patch_size,
        embed_dim=config.vision_width,
        depth=config.vision_layers,
        num_heads=config.vision_heads,
        mlp_ratio=config.vision_mlp_ratio,
        qkv_bias=True,
        norm_layer=partial(nn.LayerNorm, eps=1e-6),
        num_classes=0,
        drop_path_rate=config.vision_drop_path_rate,
    )


def resize_pos_embed(pos_embed: torch.Tensor, grid: int, num_prefix_tokens: int = 1) -> torch.Tensor:
    """ViT position embeddings ``[1, num_prefix_tokens + g*g, D]`` resampled to a ``grid`` x ``grid`` patch grid.

    Exactly ALBEF's ``interpolate_pos_embed``: the patch rows, laid out as a ``[1, D, g, g]`` image,
    are resized with plain bicubic interpolation (``align_corners=False``, no antialiasing; timm's
    ``resample_abs_pos_embed`` antialiases by default and differs by up to 0.4 on a random table),
    and the prefix ([CLS]) rows are kept as they are. The arithmetic runs in float32 (CPU bicubic
    has no half kernels) and the result has the input's dtype. Returned unchanged when the grid
    already fits. Every place that changes a ViT's resolution (pretrained image weights, fine-tuning
    at 384 px, official ALBEF checkpoints) goes through this function.
    """
    if pos_embed.dim() != 3 or pos_embed.shape[0] != 1:
        raise FalconError(f"position embeddings of shape {tuple(pos_embed.shape)}: expected [1, tokens, width]")
    patches = pos_embed.shape[1] - num_prefix_tokens
    old = math.isqrt(max(patches, 0))
    if patches <= 0 or old * old != patches:
        raise FalconError(
            f"position embeddings of shape {tuple(pos_embed.shape)}: {patches} patch positions after "
            f"{num_prefix_tokens} prefix token(s) do not form a square grid"
        )
    if old == grid:
        return pos_embed
    prefix, patch = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    image = patch.float().reshape(1, old, old, -1).permute(0, 3, 1, 2)
    image = F.interpolate(image, size=(grid, grid), mode="bicubic", align_corners=False)
    patch = image.permute(0, 2, 3, 1).reshape(1, grid * grid, -1).to(pos_embed.dtype)
    return torch.cat([prefix, patch], dim=1)
