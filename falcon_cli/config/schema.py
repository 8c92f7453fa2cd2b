"""Typed configuration: one section per stage, a docstring on every field.

A recipe (``recipes/*.yaml``) is validated against :class:`Recipe`. Unknown keys are
rejected (with the nearest valid key, see :mod:`falcon_cli.config.recipes`), values are
parsed to the field's type, and the resolved config is written into the run directory.
Later stages add their own sections here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

from falcon_cli.data.shapes.config import ShapesConfig

StageName = Literal["data"]
"""The stages a recipe can chain, in the order they may run."""

STAGE_ORDER: tuple[str, ...] = ("data",)


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, field docstrings are descriptions."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)


class DataConfig(Section):
    """Which dataset a run uses, how it is checked, and which tokenizer reads its captions."""

    dataset: Path
    """The dataset spec: a ``dataset.yaml`` file or the directory holding one (relative paths are
    relative to the working directory)."""

    shapes: ShapesConfig | None = None
    """If set, generate a shapes world with these settings at ``dataset`` when it is missing
    (an existing world with the same settings is reused)."""

    on_missing: Literal["fail", "skip"] | None = None
    """Missing images: ``fail`` stops with the count and the first paths, ``skip`` drops those
    entries and records how many in the manifest. Default: the spec's own ``on_missing``."""

    verify_images: bool = True
    """Open every image once during the data check (catches unreadable files, costs a pass over the images)."""

    tokenizer: str = "wordpiece"
    """``wordpiece`` trains a BERT-style WordPiece tokenizer on the training captions and saves it in
    the run (offline); anything else is a hub id (``bert-base-uncased``) or a local directory."""

    tokenizer_vocab_size: int = 1000
    """Vocabulary size when ``tokenizer`` is ``wordpiece``."""


class Recipe(Section):
    """A recipe: which stages to run, in order, and one config section per stage."""

    name: str = "recipe"
    """The recipe's name (defaults to the file stem); the default run directory is ``runs/<name>``."""

    description: str = ""
    """One line saying what this recipe is for (shown by ``falcon recipes list``)."""

    seed: int = 0
    """Global seed; each distributed rank uses ``seed + rank``."""

    stages: list[StageName] = ["data"]
    """Stages that ``falcon run`` executes, in order."""

    data: DataConfig
    """The ``data`` stage: dataset spec, optional shapes-world generation, check and tokenizer."""

    @model_validator(mode="after")
    def _stages_in_order(self) -> "Recipe":
        order = [STAGE_ORDER.index(s) for s in self.stages]
        if order != sorted(order) or len(set(order)) != len(order):
            raise ValueError(f"stages must be distinct and in pipeline order {list(STAGE_ORDER)}, got {self.stages}")
        return self
