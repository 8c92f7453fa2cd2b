"""The ``data`` stage's section: the dataset spec, a shapes world to generate, the check and the tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from falcon_cli.config.paths import InputPath
from falcon_cli.config.schema.base import Section
from falcon_cli.data.shapes.config import ShapesConfig


class DataConfig(Section):
    """Which dataset a run uses, how it is checked, and which tokenizer reads its captions."""

    dataset: Annotated[Path | None, InputPath()] = None
    """The dataset spec: a ``dataset.yaml`` file or the directory holding one (relative paths are
    relative to the working directory). None (only with ``shapes``): the generated world goes into the
    run directory, ``<run>/world``, never into the working directory by accident."""

    shapes: ShapesConfig | None = None
    """If set, generate a shapes world with these settings at ``dataset`` when it is missing
    (an existing world with the same settings is reused)."""

    on_missing: Literal["fail", "skip"] | None = None
    """Missing images: ``fail`` stops with the count and the first paths, ``skip`` drops those
    entries and records how many in the manifest. Default: the spec's own ``on_missing``."""

    verify_images: bool = True
    """Open every image once during the data check (catches unreadable files, costs a pass over the images)."""

    tokenizer: Annotated[str, InputPath(when="exists", keywords=("wordpiece",))] = "wordpiece"
    """``wordpiece`` trains a BERT-style WordPiece tokenizer on the training captions and saves it in
    the run (offline); anything else is a hub id (``bert-base-uncased``) or a local directory. Non-BERT
    tokenizers load too, e.g. a dual encoder's (``timm/ViT-B-16-SigLIP``'s SentencePiece,
    ``openai/clip-vit-base-patch16``'s BPE; padded with their eos token when they have no pad token)."""

    tokenizer_vocab_size: int = Field(1000, ge=16)
    """Vocabulary size when ``tokenizer`` is ``wordpiece``."""

    @model_validator(mode="after")
    def _dataset_or_world(self) -> "DataConfig":
        if self.dataset is None and self.shapes is None:
            raise ValueError(
                "data.dataset is required (a dataset.yaml or the directory holding one) unless data.shapes "
                "generates a world, which then goes into the run directory"
            )
        return self
