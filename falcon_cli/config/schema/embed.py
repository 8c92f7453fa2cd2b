"""The ``embed`` and ``build_search_spaces`` stages' sections."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from falcon_cli.config.paths import InputPath
from falcon_cli.config.schema.base import Section


class EmbedConfig(Section):
    """The ``embed`` stage: embed every pair of a dataset split with a pretrained encoder
    (``embeddings/embeddings.h5``)."""

    encoder: Annotated[str, InputPath(prefixes=("falcon:", "open_clip:local-dir:"))] = "open_clip:ViT-B-32"
    """Which encoder: ``open_clip:<model name>`` (an open_clip architecture, weights from ``pretrained``)
    or ``falcon:<path>`` (a falcon run directory, whose latest checkpoint is used, or one checkpoint
    directory; its projected ITC features)."""

    pretrained: Annotated[str | None, InputPath(when="exists")] = "laion2b_s34b_b79k"
    """open_clip weights: a pretrained tag (``laion2b_s34b_b79k``; downloaded by open_clip, or taken
    from its cache) or a local checkpoint file; None = random weights. Ignored for ``falcon:`` encoders."""

    split: Literal["pretrain", "train", "val", "test"] = "pretrain"
    """Which pairs: ``pretrain`` (the spec's pretraining files, ids = their ``pair_id``), or a
    retrieval split ``train|val|test`` (one pair per caption, ids = the caption's position in the split)."""

    batch_size: int = Field(256, ge=1)
    """Pairs per forward pass."""

    fp16: bool = True
    """Store the embeddings as float16 (half the disk); False stores float32."""

    device: str = "auto"
    """``auto`` (the local GPU if any, else CPU), ``cpu`` or ``cuda[:n]``; on CUDA the encoders run under autocast."""

    num_workers: int = Field(2, ge=0)
    """DataLoader worker processes that load and transform images."""

    chunk_size: int = Field(65536, ge=1)
    """Pairs per completed chunk: the unit written to disk and the point ``--resume`` continues from."""


class SearchSpacesConfig(Section):
    """The ``build_search_spaces`` stage: group the pairs into search spaces of |M| (``search_spaces.parquet``)."""

    embeddings: Annotated[Path | None, InputPath()] = None
    """The ``embeddings.h5`` to partition; None = the run directory's ``embeddings/embeddings.h5``
    (what the ``embed`` stage writes). Relative paths are relative to the working directory."""

    method: Literal["random", "kmeans"] = "kmeans"
    """``random``: GRIT-VLP's shuffled spaces; ``kmeans``: balanced spherical k-means on the joint
    (normalised image + text) embedding, so the pairs of a space are semantically close."""

    size: int | None = Field(None, ge=1)
    """Search-space size |M|: pairs per space (the last space holds the remainder); None =
    ``pretrain.composer.search_space_size``, the |M| the batch composers use."""

    seed: int | None = Field(None, ge=0)
    """Seed of the partition (epoch e uses seed + e); None = the recipe's ``seed``."""

    epochs: int = Field(1, ge=1)
    """How many epochs of partitions to write (epochs 0 .. epochs - 1, each drawn afresh)."""

    kmeans_iterations: int = Field(20, ge=1)
    """k-means iterations (``method: kmeans``)."""

    compare: bool = True
    """Also build the other method's epoch-0 partition (not written) and report it beside the
    written one, so the summary shows what k-means changes over random spaces."""
