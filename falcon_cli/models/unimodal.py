"""Unimodal starting points for pretraining on the shapes world: ALBEF's DeiT and BERT, in miniature.

ALBEF does not start from nothing: its image encoder is DeiT (supervised on ImageNet) and its text
encoder BERT (masked language modelling on books and Wikipedia). The shapes analogues:

- :class:`SceneAttributeClassifier`: the model's own ViT with, per grid cell, one classifier per
  attribute (shape, colour, size; "empty" is a class) over the cell's patches, trained on the world's
  training images and as many more scenes drawn afresh (``unimodal.extra_images``).
- :func:`masked_language_model`: a BERT of the model's text width and ``text_layers + fusion_layers``
  layers (what :func:`~falcon_cli.models.weights.load_bert_weights` maps onto ALBEF), trained with
  MLM on the training captions.

:class:`UnimodalWeights` says where the two are cached: one directory per (world, model architecture,
tokenizer, training settings, seed), so every method of a comparison starts from the same weights and
they are trained once. Pretraining takes them with ``pretrain.encoders.vision_weights: unimodal`` and
``pretrain.encoders.text_weights: unimodal``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from falcon_cli.data.shapes.vocabulary import GRID
from falcon_cli.models.config import AlbefConfig
from falcon_cli.models.vision import build_vision_encoder

VISION_FILE = "vision.safetensors"
"""The image encoder's weights (timm ViT names: what ``vision_weights`` loads)."""
TEXT_DIR = "text"
"""The text encoder: a ``BertForMaskedLM.save_pretrained`` directory (what ``text_weights`` loads)."""
REPORT_FILE = "report.json"
"""What each encoder reached on the world's validation split, and what produced them."""
CACHE_DIR = "unimodal"
"""Default cache: ``<world>/unimodal/<key>/``."""

ATTRIBUTES = ("shape", "color", "size")


class SceneAttributeClassifier(nn.Module):
    """The model's ViT and, per grid cell, one linear classifier per attribute over that cell's patch tokens.

    ``classes[a]`` is the number of values of attribute ``a`` plus one for an empty cell (class 0).
    ``forward(images)`` returns one ``[B, 9, classes[a]]`` logit tensor per attribute. A cell's feature is the
    mean of the patch tokens over it, weighted by how much of each patch lies in the cell (patches and cells
    need not line up); the heads are shared by the cells. Reading each cell from its own patches, rather than
    all nine from [CLS], makes the task local, as the fusion layers read the patches: on a 32 px world the
    [CLS] classifier was still near chance on shape after hundreds of steps (issue 34's probe).
    """

    def __init__(self, config: AlbefConfig, classes: dict[str, int], grid: int = GRID):
        super().__init__()
        self.encoder = build_vision_encoder(config)
        self.cells, self.classes = grid * grid, dict(classes)
        self.register_buffer("pool", cell_pooling(config.image_size, config.patch_size, grid), persistent=False)
        self.heads = nn.ModuleDict({name: nn.Linear(config.vision_width, n) for name, n in self.classes.items()})

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        patches = self.encoder.forward_features(images)[:, self.encoder.num_prefix_tokens :]  # [B, N, D]
        cells = torch.einsum("cn,bnd->bcd", self.pool, patches)  # [B, 9, D]
        return {name: head(cells) for name, head in self.heads.items()}


def cell_pooling(image_size: int, patch_size: int, grid: int = GRID) -> torch.Tensor:
    """``[grid*grid, patches]``: row ``c`` weights each patch (row-major) by the area it shares with cell ``c``
    (row-major), normalised to sum to 1."""
    patches = image_size // patch_size
    start = torch.arange(patches, dtype=torch.float64) * patch_size
    low = torch.arange(grid, dtype=torch.float64) * image_size / grid
    overlap = (
        torch.minimum(start[None] + patch_size, low[:, None] + image_size / grid)
        - torch.maximum(start[None], low[:, None])
    ).clamp(min=0)  # [grid, patches] per axis
    area = torch.einsum("ap,bq->abpq", overlap, overlap).reshape(grid * grid, patches * patches)
    return (area / area.sum(dim=1, keepdim=True)).float()


def masked_language_model(config: AlbefConfig, vocab_size: int, pad_token_id: int):
    """A fresh ``BertForMaskedLM`` shaped like ``config``'s text side: width, heads, feed-forward size, position
    and type vocabularies, and ``text_layers + fusion_layers`` layers (the fusion layers take BERT's upper
    layers, as ALBEF's take BERT-base's layers 6-11)."""
    from transformers import BertConfig, BertForMaskedLM  # (lazy: transformers, only when a text encoder trains)

    bert = BertConfig(
        vocab_size=vocab_size,
        hidden_size=config.text_width,
        num_hidden_layers=config.text_layers + config.fusion_layers,
        num_attention_heads=config.text_heads,
        intermediate_size=config.intermediate_size,
        max_position_embeddings=config.max_position_embeddings,
        type_vocab_size=config.type_vocab_size,
        layer_norm_eps=config.layer_norm_eps,
        hidden_dropout_prob=config.hidden_dropout,
        attention_probs_dropout_prob=config.attention_dropout,
        pad_token_id=pad_token_id,
        hidden_act="gelu",
    )
    return BertForMaskedLM(bert)


@dataclass(frozen=True)
class UnimodalWeights:
    """Where one set of unimodal weights lives: ``root / key``."""

    root: Path
    key: str

    @classmethod
    def for_run(
        cls, root: Path, *, world: dict, model: AlbefConfig, vocabulary: dict[str, int], settings: dict, seed: int
    ) -> "UnimodalWeights":
        """The cache entry of a world (its ``world.json`` config), the model's architecture (everything but
        the weight sources), the tokenizer's vocabulary, the training ``settings`` and the ``seed``."""
        architecture = model.model_dump(mode="json", exclude={"vision_weights", "text_weights"})
        what = {
            "world": world,
            "architecture": architecture,
            "settings": settings,
            "seed": seed,
            "vocabulary": hashlib.sha256(json.dumps(sorted(vocabulary.items())).encode()).hexdigest(),
        }
        return cls(Path(root), hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16])

    @property
    def path(self) -> Path:
        return self.root / self.key

    @property
    def vision(self) -> Path:
        return self.path / VISION_FILE

    @property
    def text(self) -> Path:
        return self.path / TEXT_DIR

    @property
    def report(self) -> Path:
        return self.path / REPORT_FILE

    def complete(self) -> bool:
        """Whether both encoders and the report are there (the directory is written atomically)."""
        return self.vision.is_file() and (self.text / "config.json").is_file() and self.report.is_file()
