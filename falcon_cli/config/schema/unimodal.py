"""The ``unimodal`` stage's section: the image and text encoders' starting points on a shapes world."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field

from falcon_cli.config.paths import InputPath
from falcon_cli.config.schema.base import Section


class UnimodalConfig(Section):
    """The ``unimodal`` stage (shapes worlds): ALBEF's DeiT and BERT in miniature, trained once per world, model
    and seed and cached (``falcon_cli/models/unimodal.py``); pretraining takes them with
    ``pretrain.encoders.vision_weights: unimodal`` and ``pretrain.encoders.text_weights: unimodal``. The encoders have
    ``pretrain.model``'s architecture at ``pretrain.encoders.image_size``."""

    image_epochs: int = Field(30, ge=0)
    """Epochs of the image encoder over the world's training images: per grid cell, classify the shape, the colour
    and the size (or empty), the ImageNet analogue."""
    text_epochs: int = Field(20, ge=0)
    """Epochs of the text encoder over the training captions: masked language modelling, the BERT analogue."""
    extra_images: int = Field(0, ge=0)
    """Scenes drawn afresh from the world's scene distribution (its objects per scene and vocabulary) and rendered
    in memory, added to the world's training images for the image encoder: ImageNet is far larger than COCO, and
    at 32-48 px a ViT learns shapes only from many thousands of images. None of them is in the world."""
    seed: int | None = Field(None, ge=0)
    """The seed of the unimodal encoders (their init, data order, masks and extra scenes); None = the run's
    ``seed``. A sweep that starts every seed of a comparison from the same encoders (as every ALBEF run starts
    from the same DeiT and BERT) sets it, so the encoders are trained once."""
    batch_size: int = Field(64, ge=1)
    """Images or captions per step."""
    image_lr: float = Field(1e-3, gt=0)
    """Peak AdamW learning rate of the image encoder (linear warm-up over the first epoch, cosine to 1% of it)."""
    text_lr: float = Field(5e-4, gt=0)
    """Peak AdamW learning rate of the text encoder (same schedule)."""
    weight_decay: float = Field(0.05, ge=0)
    """AdamW weight decay of both."""
    grad_clip: float | None = Field(1.0, gt=0)
    """Clip the global gradient norm of both to this value (None = no clipping). Without it a ViT at peak ``image_lr``
    can diverge for an epoch and end far worse: the third ``coco-like`` world's encoder (seed 0) jumped from loss
    0.23 to 1.18 in its second epoch and read shape right in 65% of occupied cells instead of ~97%."""
    mlm_probability: float = Field(0.15, gt=0, lt=1)
    """Share of caption tokens masked (BERT's 15%, 80/10/10 as in pretraining's MLM)."""
    cache_dir: Annotated[Path | None, InputPath()] = None
    """Where the weights are kept, one subdirectory per world, architecture, tokenizer, settings and seed; None =
    ``<data.dataset>/unimodal`` (inside the world, so every run of that world shares them)."""
    device: str = "auto"
    """``auto`` (the local GPU if any, else CPU), ``cpu`` or ``cuda[:n]``."""
