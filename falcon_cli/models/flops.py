"""Analytic FLOP counts of an ALBEF pretraining step, for model FLOPs utilisation (MFU).

Counted as every benchmark of this kind counts them: the matrix products only (2 FLOPs per
multiply-add: linear layers, the patch-embedding convolution, attention's two batched
products), on the padded text length that actually runs; norms, activations, softmax and
losses are left out (a few percent). A backward costs twice its forward, so a trained pass
is 3x its forward, a no-grad pass (FALCON's reward) 1x.

The per-pair forward costs of albef-base (ViT-B/16 at 256 px = 257 tokens, 25 text tokens,
GRIT's MLM probability 0.5, so ~12.5 masked tokens):

=====================  ==========  =============================================
part                    GFLOP       what runs
=====================  ==========  =============================================
image encoder           46.4        ViT-B/16 on 257 tokens
text encoder             2.1        6 BERT layers on 25 tokens (ITC)
fusion, ITM              3 x 6.2    positives + one hard negative each way; the
                                    cross-attention keys/values of 257 image tokens
                                    are 3.6 of each pass's 6.2
masked text + fusion     2.1 + 6.2  MLM
MLM head                 0.6        12.5 masked tokens x (768^2 + 768 x 30,522)
=====================  ==========  =============================================

76.2 GFLOP forward, 229 GFLOP per trained pair; FALCON's exact reward (``scheduler.reward.images:
recompute``) adds a no-grad image encoder + MLM path (55.4 GFLOP, 1.24x), ``reuse`` only
the MLM path (9.0 GFLOP, 1.04x). ``tests/models/test_flops.py`` checks the counts against PyTorch's own
``FlopCounterMode`` on a real forward and a real training step.
"""

from __future__ import annotations

from falcon_cli.models.config import AlbefConfig


def vision_forward_flops(config: AlbefConfig) -> float:
    """One image through the ViT (patch embedding, every block) and the ITC projection."""
    patches = (config.image_size // config.patch_size) ** 2
    tokens, width = patches + 1, config.vision_width
    mlp = int(width * config.vision_mlp_ratio)
    per_layer = tokens * (4 * width * width + 2 * width * mlp) + 2 * tokens * tokens * width
    embed = patches * 3 * config.patch_size**2 * width
    return 2.0 * (embed + config.vision_layers * per_layer + width * config.embed_dim)


def _bert_layer_macs(config: AlbefConfig, length: int) -> int:
    """Multiply-adds of one BERT layer's self-attention and feed-forward on ``length`` tokens."""
    width = config.text_width
    return length * (4 * width * width + 2 * width * config.intermediate_size) + 2 * length * length * width


def text_forward_flops(config: AlbefConfig, length: int) -> float:
    """One caption of ``length`` (padded) tokens through the text encoder and the ITC projection."""
    return 2.0 * (config.text_layers * _bert_layer_macs(config, length) + config.text_width * config.embed_dim)


def fusion_forward_flops(config: AlbefConfig, length: int) -> float:
    """One (caption, image) pair through the fusion layers: self-attention, cross-attention to every image
    token (whose key/value projections run per pair, and dominate at 257 image tokens), feed-forward."""
    width, image_tokens = config.text_width, (config.image_size // config.patch_size) ** 2 + 1
    cross = (
        2 * length * width * width + 2 * image_tokens * config.vision_width * width + 2 * length * image_tokens * width
    )
    return 2.0 * config.fusion_layers * (_bert_layer_macs(config, length) + cross)


def mlm_head_flops(config: AlbefConfig, masked_tokens: float) -> float:
    """The MLM head (dense transform, then the tied vocabulary decoder) on ``masked_tokens`` tokens."""
    return 2.0 * masked_tokens * (config.text_width**2 + config.text_width * config.vocab_size)


def pretrain_flops_per_pair(
    config: AlbefConfig, text_length: int, masked_tokens: float, *, reward_images: str | None = None
) -> dict[str, float]:
    """FLOPs per pair of one ALBEF/GRIT pretraining step (ITC + ITM with one hard negative each way + MLM),
    by part, forward and backward together (``total``: their sum).

    ``masked_tokens``: the mean number of masked tokens per caption (MLM probability x real tokens).
    ``scheduler.reward.images``: None for a plain step; ``recompute`` or ``reuse`` adds FALCON's no-grad reward pass
    (the image encoder again, or not, plus the masked text, its fusion and the MLM head) as ``reward``.
    """
    train = 3.0  # forward + a backward of twice its cost
    parts = {
        "image_encoder": train * vision_forward_flops(config),
        "text_encoder": train * text_forward_flops(config, text_length),
        "itm_fusion": train * 3 * fusion_forward_flops(config, text_length),
        "mlm": train
        * (
            text_forward_flops(config, text_length)
            + fusion_forward_flops(config, text_length)
            + mlm_head_flops(config, masked_tokens)
        ),
    }
    if reward_images is not None:
        if reward_images not in ("recompute", "reuse"):
            raise ValueError(f"reward_images must be recompute or reuse, not {reward_images!r}")
        mlm_path = (
            text_forward_flops(config, text_length)
            + fusion_forward_flops(config, text_length)
            + mlm_head_flops(config, masked_tokens)
        )
        parts["reward"] = mlm_path + (vision_forward_flops(config) if reward_images == "recompute" else 0.0)
    parts["total"] = sum(parts.values())
    return parts
