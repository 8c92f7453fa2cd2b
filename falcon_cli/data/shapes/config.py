"""The knobs of a shapes world (``falcon data shapes`` and the ``data`` section of recipes)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from falcon_cli.data.shapes.presets import PRESETS, apply_preset
from falcon_cli.data.shapes.vocabulary import COLORS, SHAPES

if TYPE_CHECKING:  # (numpy is imported where the splits are drawn: the config schema reads this module)
    import numpy as np

__all__ = [
    "CAPTION_KINDS",
    "PRESETS",
    "SPLITS",
    "CaptionMix",
    "ShapesConfig",
    "SplitFractions",
    "assign_splits",
    "split_sizes",
]

CAPTION_KINDS: tuple[str, ...] = ("attribute", "combination", "position", "relation", "count", "full")
"""Caption kinds, in the order they are stored and reported."""

SPLITS: tuple[str, ...] = ("train", "val", "test")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CaptionMix(_Section):
    """Relative weights of the caption kinds (need not sum to 1; 0 disables a kind). An image's captions are drawn
    in rounds of one caption per enabled kind, the weights ordering each round, so they set which kinds fill a last,
    partial round rather than the shares (five captions over three kinds: one or two of each);
    ``ShapesConfig.scene_captions`` sets a share of whole-scene descriptions."""

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

    preset: Optional[Literal["coco-like", "medium", "dense"]] = None
    """A named false-negative regime (``coco-like``, ``medium``, ``dense``; see ``presets.py`` and docs/shapes.md): sets
    the caption mix, caption detail, objects per scene, vocabulary and near misses, unless given next to it."""
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
    """How many colours the world uses: the first N of red, green, blue, yellow, purple, orange, pink, cyan, white,
    brown."""
    num_shapes: int = Field(4, ge=2, le=len(SHAPES))
    """How many shapes the world uses: the first N of circle, square, triangle, diamond, star, hexagon, cross,
    pentagon."""
    paraphrase_prob: float = Field(0.2, ge=0, le=1)
    """Probability that each word slot of a caption uses a synonym ("ball" for circle, "crimson" for red)."""
    caption_mix: CaptionMix = CaptionMix()
    """Relative weights of the caption kinds."""
    captions_per_image: int = Field(5, ge=1, le=20)
    """Captions per image (kinds drawn without replacement while enough kinds are enabled)."""
    train_captions_per_image: Optional[int] = Field(None, ge=1, le=20)
    """Captions kept per training image: the first N of the ``captions_per_image`` drawn for it (in the order
    ``scene_captions`` shuffles them into), so the kept ones follow the same mix. Val and test images keep all. None:
    all. 1 makes a training batch hold each image once, as in CC3M and the other web corpora the papers pretrain on,
    where another caption of the anchor's own image, a false negative by construction, is rare."""
    scene_captions: int = Field(0, ge=0, le=20)
    """How many of each image's captions are whole-scene descriptions, each listing the objects in another order (as
    each of COCO's five captions describes the whole image); at most the scene's orderings (2 for two objects, 6 for
    three) and ``captions_per_image``; the other captions follow ``caption_mix``. 0: whole-scene descriptions only as
    ``caption_mix`` draws them (one per scene)."""
    splits: SplitFractions = SplitFractions()
    """Fractions of images in train / val / test."""
    vqa_questions_per_image: int = Field(3, ge=0, le=10)
    """VQA questions per image (colour, shape, size, count, existence, colour-at-position)."""
    vqa_answer_variation: float = Field(0.2, ge=0, le=0.4)
    """Probability that each of the 10 human answers uses a synonym ("crimson", "two" for "2"); the canonical answer
    stays the majority."""
    nlvr2_statements_per_image: float = Field(1.0, ge=0, le=20)
    """NLVR2 statements per split = this x images in the split, rounded up to an even number (half True, half False)."""
    background_noise: float = Field(0.03, ge=0, le=0.5)
    """Standard deviation of Gaussian noise on background pixels, as a fraction of full intensity (0 = plain)."""
    near_misses: int = Field(0, ge=0, le=8)
    """Near misses per drawn scene: scenes that differ from it in one thing (an object's colour, shape or size, an
    object's cell, or two objects swapped). A scene and its near misses form a family that shares a split; they are the
    hard negatives of each other, and the false negatives where a caption does not mention the difference."""
    min_attributes: int = Field(0, ge=0, le=3)
    """Fewest of size / colour / shape that the object descriptions of relation and position captions name (0: as drawn,
    relations 1-3 per object and positions 0-3; higher makes captions more specific and false negatives rarer)."""

    @model_validator(mode="before")
    @classmethod
    def _fill_preset(cls, data):
        return apply_preset(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _consistent(self) -> "ShapesConfig":
        if self.train_captions_per_image is not None and self.train_captions_per_image > self.captions_per_image:
            raise ValueError(
                f"train_captions_per_image ({self.train_captions_per_image}) must be <= captions_per_image "
                f"({self.captions_per_image}): it keeps the first N of each training image's captions"
            )
        if self.min_objects > self.max_objects:
            raise ValueError(f"min_objects ({self.min_objects}) must be <= max_objects ({self.max_objects})")
        small = {name: n for name, n in smallest_split_sizes(self).items() if n < 2}
        if small:  # one split may be short of 2 images: which one depends on the seeded draw
            codes = assign_splits(self)
            sizes = {name: int((codes == k).sum()) for k, name in enumerate(SPLITS)}
            small = {name: n for name, n in sizes.items() if n < 2}
        if small:
            detail = ", ".join(f"{name}={n}" for name, n in small.items())
            raise ValueError(
                f"images={self.images} leaves fewer than 2 images in split(s) {detail}; "
                "raise images or that split's fraction"
            )
        return self


def split_sizes(images: int, fractions: SplitFractions) -> dict[str, int]:
    """Items per split: val and test are rounded, train takes the rest (so they sum to ``images``)."""
    val = int(round(images * fractions.val))
    test = int(round(images * fractions.test))
    return {"train": images - val - test, "val": val, "test": test}


def family_split_sizes(config: "ShapesConfig") -> dict[str, int]:
    """Scene families per split (a scene and its ``near_misses`` share one; the last may be cut short)."""
    return split_sizes(-(-config.images // (config.near_misses + 1)), config.splits)


def smallest_split_sizes(config: "ShapesConfig") -> dict[str, int]:
    """Images per split if the last scene family, cut short to ``images``, falls into that split: a lower bound
    of each split's size that needs no draw (:func:`assign_splits` says where that family goes)."""
    family_size = config.near_misses + 1
    sizes = family_split_sizes(config)
    cut = sum(sizes.values()) * family_size - config.images
    return {name: families * family_size - cut for name, families in sizes.items()}


def assign_splits(config: "ShapesConfig") -> np.ndarray:
    """Split code (index into ``SPLITS``) per image: a seeded permutation of the scene families cut
    by the fractions, so a scene and its near misses always share a split (with ``near_misses`` = 0
    every image is its own family)."""
    import numpy as np

    from falcon_cli.data.shapes.seeding import STREAM_SPLITS, stream_generator  # (lazy: numpy; see the imports)

    family_size = config.near_misses + 1
    sizes = family_split_sizes(config)
    families = sum(sizes.values())
    order = stream_generator(config.seed, STREAM_SPLITS).permutation(families)
    family_split = np.empty(families, dtype=np.int8)
    start = 0
    for code, name in enumerate(SPLITS):
        family_split[order[start : start + sizes[name]]] = code
        start += sizes[name]
    return np.repeat(family_split, family_size)[: config.images]
