"""False-negative density: for each caption, how many images of its split it truly describes.

In contrastive pretraining every other image of a batch is treated as a negative for a
caption; each of those that the caption truly describes is a false negative. A caption that
describes many images of its split ("a red shape") makes false negatives common; one that
describes only its own image (a full description) makes them rare. The statistics here are
the knob that says how hard the false-negative problem of a world is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from falcon_cli.data.shapes.config import CAPTION_KINDS, SPLITS
from falcon_cli.data.shapes.oracle import SceneIndex, evaluate_normalized
from falcon_cli.runtime.progress import track


@dataclass
class CaptionJudgement:
    """What the oracle says about every caption of a world."""

    images_described: np.ndarray
    """``int32[C]``: images of the caption's own split that the caption describes (own image included)."""
    true_of_own_image: np.ndarray
    """``bool[C]``: whether each caption is true of its own image (must be all True)."""
    test_pairs: np.ndarray
    """``int64[P, 2]``: (image row, caption row) of every true pair among test images x test captions, sorted."""


def judge_captions(
    index: SceneIndex,
    image_split: np.ndarray,
    forms: list[dict],
    caption_form: np.ndarray,
    caption_image_row: np.ndarray,
    caption_split: np.ndarray,
    test_split: int = SPLITS.index("test"),
) -> CaptionJudgement:
    """Evaluate each distinct logical form once over all scenes and derive per-caption facts.

    ``image_split`` / ``caption_split`` hold split codes (index into ``SPLITS``);
    ``caption_form[c]`` indexes ``forms``.
    """
    n_captions = caption_form.shape[0]
    images_described = np.zeros(n_captions, dtype=np.int32)
    own = np.zeros(n_captions, dtype=bool)
    test_rows = np.flatnonzero(image_split == test_split)
    pair_blocks: list[np.ndarray] = []
    order = np.argsort(caption_form, kind="stable")
    boundaries = np.flatnonzero(np.diff(caption_form[order])) + 1
    for group in track(np.split(order, boundaries), "judging captions"):
        if group.size == 0:
            continue
        truth = evaluate_normalized(forms[int(caption_form[group[0]])], index)
        per_split = np.bincount(image_split[truth], minlength=len(SPLITS))
        images_described[group] = per_split[caption_split[group]]
        own[group] = truth[caption_image_row[group]]
        test_captions = group[caption_split[group] == test_split]
        if test_captions.size:
            true_images = test_rows[truth[test_rows]]
            block = np.empty((true_images.size * test_captions.size, 2), dtype=np.int64)
            block[:, 0] = np.repeat(true_images, test_captions.size)
            block[:, 1] = np.tile(test_captions, true_images.size)
            pair_blocks.append(block)
    pairs = np.concatenate(pair_blocks) if pair_blocks else np.zeros((0, 2), dtype=np.int64)
    pairs = pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]
    return CaptionJudgement(images_described, own, pairs)


def _summary(values: np.ndarray, split_size: int) -> dict:
    if values.size == 0:
        return {"captions": 0}
    mean = float(values.mean())
    return {
        "captions": int(values.size),
        "mean": round(mean, 4),
        "median": float(np.median(values)),
        "max": int(values.max()),
        "mean_false_negatives": round(mean - 1.0, 4),
        "mean_fraction_of_split": round(mean / split_size, 6),
        "fraction_with_false_negatives": round(float((values > 1).mean()), 4),
    }


def density_statistics(images_described: np.ndarray, caption_split: np.ndarray, caption_kind: np.ndarray, split_sizes: dict[str, int]) -> dict:
    """Per split: mean / median / max images described per caption, overall and per caption kind.

    ``mean_false_negatives`` is ``mean - 1`` (the caption's own image is not a false
    negative); ``mean_fraction_of_split`` divides by the split's image count so splits of
    different sizes compare.
    """
    out = {}
    for code, split in enumerate(SPLITS):
        in_split = caption_split == code
        stats = _summary(images_described[in_split], split_sizes[split])
        stats["by_kind"] = {
            kind: _summary(images_described[in_split & (caption_kind == k)], split_sizes[split])
            for k, kind in enumerate(CAPTION_KINDS)
            if (in_split & (caption_kind == k)).any()
        }
        out[split] = stats
    return out
