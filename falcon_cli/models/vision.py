"""The ALBEF image encoder: a timm ``VisionTransformer`` that returns all tokens."""

from __future__ import annotations

from functools import partial

from torch import nn

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
