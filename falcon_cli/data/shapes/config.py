"""The knobs of a shapes world (``falcon data shapes`` and the ``data`` section of recipes)."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, model_validator

from falcon_cli.data.shapes.vocabulary import COLORS, SHAPES

CAPTION_KINDS: tuple[str, ...] = ("attribute", "combination", "position", "relation", "count", "full")
"""Caption kinds, in the order they are stored and reported."""

SPLITS: tuple[str, ...] = ("train", "val", "test")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class CaptionMix(_Section):
    """Relative weights of the caption kinds (need not sum to 1; 0 disables a kind)."""

    attribute: float = Field(1.0, ge=0)
    """One attribute of one object: "a red shape", "there is a circle", "a small thing"."""
    combination: float = Field(1.0, ge=0)
    """Two or three attributes of one object: "a small red circle", "a blue square"."""
    position: float = Field(1.0, ge=0)
    """An object in a named grid cell: "a blue square in the top left"."""
    relation: float = Field(1.0, ge=0)
    """Two distinct objects and a spatial relation: "a red circle left of a blue square"."""
    count: float = Field(1.0, ge=0)
    """An exact count: "three shapes", "two green objects"."""
    full: float = Field(1.0, ge=0)
    """The whole scene: the exact object count and every object with all its attributes."""

    @model_validator(mode="after")
    def _some_kind_enabled(self) -> "CaptionMix":
        if sum(self.weights()) <= 0:
            raise ValueError("caption_mix: at least one caption kind needs a weight > 0")
        return self

    def weights(self) -> list[float]:
        """Weights in :data:`CAPTION_KINDS` order."""
        return [float(getattr(self, kind)) for kind in CAPTION_KINDS]


class SplitFractions(_Section):
    """Fractions of images per split (by image: all captions of an image share its split)."""

    train: float = Field(0.8, gt=0, lt=1)
    """Fraction of images in the training split."""
    val: float = Field(0.1, gt=0, lt=1)
    """Fraction of images in the validation split (NLVR2 calls it ``dev``)."""
    test: float = Field(0.1, gt=0, lt=1)
    """Fraction of images in the test split (the oracle's compatibility table covers it)."""

    @model_validator(mode="after")
    def _sum_to_one(self) -> "SplitFractions":
        total = self.train + self.val + self.test
        if not math.isclose(total, 1.0, abs_tol=1e-6):
            raise ValueError(f"splits: train + val + test must sum to 1, got {total:g}")
        return self


class ShapesConfig(_Section):
    """Everything that determines a shapes world; the same config gives byte-identical files."""

    images: int = Field(2000, ge=6)
    """Number of images (scenes) in the world, over all splits."""
    seed: int = Field(0, ge=0)
    """Seed of every random choice (per-image generators are derived from (seed, stream, index))."""
    size: int = Field(64, ge=24, le=1024)
    """Image width and height in pixels."""
    min_objects: int = Field(1, ge=1, le=9)
    """Fewest objects in an image (one object per cell of the 3x3 grid)."""
    max_objects: int = Field(4, ge=1, le=9)
    """Most objects in an image (at most 9: one per grid cell)."""
    num_colors: int = Field(6, ge=2, le=len(COLORS))
    """How many colours the world uses: the first N of red, green, blue, yellow, purple, orange, pink, cyan, white, brown."""
    num_shapes: int = Field(4, ge=2, le=len(SHAPES))
    """How many shapes the world uses: the first N of circle, square, triangle, diamond, star, hexagon, cross, pentagon."""
    paraphrase_prob: float = Field(0.2, ge=0, le=1)
    """Probability that each word slot of a caption uses a synonym ("ball" for circle, "crimson" for red)."""
    caption_mix: CaptionMix = CaptionMix()
    """Relative weights of the caption kinds."""
    captions_per_image: int = Field(5, ge=1, le=20)
    """Captions per image (kinds drawn without replacement while enough kinds are enabled)."""
    splits: SplitFractions = SplitFractions()
    """Fractions of images in train / val / test."""
    vqa_questions_per_image: int = Field(3, ge=0, le=10)
    """VQA questions per image (colour, shape, size, count, existence, colour-at-position)."""
    vqa_answer_variation: float = Field(0.2, ge=0, le=0.4)
    """Probability that each of the 10 human answers uses a synonym ("crimson", "two" for "2"); the canonical answer stays the majority."""
    nlvr2_statements_per_image: float = Field(1.0, ge=0, le=20)
    """NLVR2 statements per split = this x images in the split, rounded up to an even number (half True, half False)."""
    background_noise: float = Field(0.03, ge=0, le=0.5)
    """Standard deviation of Gaussian noise on background pixels, as a fraction of full intensity (0 = plain)."""

    @model_validator(mode="after")
    def _consistent(self) -> "ShapesConfig":
        if self.min_objects > self.max_objects:
            raise ValueError(f"min_objects ({self.min_objects}) must be <= max_objects ({self.max_objects})")
        sizes = split_sizes(self.images, self.splits)
        small = {name: n for name, n in sizes.items() if n < 2}
        if small:
            detail = ", ".join(f"{name}={n}" for name, n in small.items())
            raise ValueError(
                f"images={self.images} leaves fewer than 2 images in split(s) {detail}; "
                "raise images or that split's fraction"
            )
        return self


def split_sizes(images: int, fractions: SplitFractions) -> dict[str, int]:
    """Images per split: val and test are rounded, train takes the rest (so they sum to ``images``)."""
    val = int(round(images * fractions.val))
    test = int(round(images * fractions.test))
    return {"train": images - val - test, "val": val, "test": test}
