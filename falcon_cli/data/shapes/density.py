"""False-negative density: for each caption, how many images of its split it truly describes.

In contrastive pretraining every other image of a batch is treated as a negative for a
caption; each of those that the caption truly describes is a false negative. A caption that
describes many images of its split ("a red shape") makes false negatives common; one that
describes only its own image (a full description) makes them rare. The statistics here are
the knob that says how hard the false-negative problem of a world is.

A composer picks *pairs*, not images: the pretraining file lists every caption of an image as
its own pair (as ALBEF's COCO file does), so another caption of the anchor's own image is a
negative it can pick, and always a false one. The rates below therefore come in two kinds:
over the split's other *images* (``random_negative_fn_rate``) and over its other *pairs*
(``pair_negative_fn_rate``, with the same-image part ``same_image_pair_rate`` reported apart).
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
    pairs_described: np.ndarray
    """``int64[C]``: captions (pairs) of the split whose image the caption describes (its own pair included)."""
    near_misses: np.ndarray
    """``int32[C]``: near misses of the caption's image (the other scenes of its family; 0 without families)."""
    near_misses_described: np.ndarray
    """``int32[C]``: how many of those the caption truly describes (false negatives among the hardest negatives)."""
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
    family_size: int = 1,
) -> CaptionJudgement:
    """Evaluate each distinct logical form once over all scenes and derive per-caption facts.

    ``image_split`` / ``caption_split`` hold split codes (index into ``SPLITS``);
    ``caption_form[c]`` indexes ``forms``; images ``k * family_size ... (k + 1) * family_size - 1`` form
    family ``k`` (a drawn scene and its near misses; see ``ShapesConfig.near_misses``).
    """
    n_captions = caption_form.shape[0]
    n_images = image_split.shape[0]
    family = np.arange(n_images) // family_size
    caption_family = family[caption_image_row]
    near_misses = (np.bincount(family)[caption_family] - 1).astype(np.int32)
    near_misses_described = np.zeros(n_captions, dtype=np.int32)
    captions_of_image = np.bincount(caption_image_row, minlength=image_split.shape[0])
    images_described = np.zeros(n_captions, dtype=np.int32)
    pairs_described = np.zeros(n_captions, dtype=np.int64)
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
        pairs_per_split = np.bincount(image_split[truth], weights=captions_of_image[truth], minlength=len(SPLITS))
        pairs_described[group] = np.rint(pairs_per_split[caption_split[group]]).astype(np.int64)
        own[group] = truth[caption_image_row[group]]
        if family_size > 1:
            described_in_family = np.bincount(family[truth], minlength=family[-1] + 1)
            near_misses_described[group] = described_in_family[caption_family[group]] - truth[caption_image_row[group]]
        test_captions = group[caption_split[group] == test_split]
        if test_captions.size:
            true_images = test_rows[truth[test_rows]]
            block = np.empty((true_images.size * test_captions.size, 2), dtype=np.int64)
            block[:, 0] = np.repeat(true_images, test_captions.size)
            block[:, 1] = np.tile(test_captions, true_images.size)
            pair_blocks.append(block)
    pairs = np.concatenate(pair_blocks) if pair_blocks else np.zeros((0, 2), dtype=np.int64)
    pairs = pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]
    return CaptionJudgement(images_described, pairs_described, near_misses, near_misses_described, own, pairs)


def _summary(
    images: np.ndarray,
    pairs: np.ndarray,
    own_pairs: np.ndarray,
    split_images: int,
    split_pairs: int,
    near: np.ndarray,
    near_described: np.ndarray,
) -> dict:
    if images.size == 0:
        return {"captions": 0}
    with_near = near > 0
    mean = float(images.mean())
    other_images, other_pairs = max(split_images - 1, 1), max(split_pairs - 1, 1)
    return {
        "captions": int(images.size),
        "mean": round(mean, 4),
        "median": float(np.median(images)),
        "max": int(images.max()),
        "mean_false_negatives": round(mean - 1.0, 4),
        "mean_fraction_of_split": round(mean / split_images, 6),
        "fraction_with_false_negatives": round(float((images > 1).mean()), 4),
        "random_negative_fn_rate": round(float(((images - 1) / other_images).mean()), 6),
        "pair_negative_fn_rate": round(float(((pairs - 1) / other_pairs).mean()), 6),
        "same_image_pair_rate": round(float(((own_pairs - 1) / other_pairs).mean()), 6),
        "near_miss_fn_rate": round(float((near_described[with_near] / near[with_near]).mean()), 6)
        if with_near.any()
        else None,
    }


def density_statistics(
    judgement: CaptionJudgement,
    caption_split: np.ndarray,
    caption_kind: np.ndarray,
    caption_image_row: np.ndarray,
    split_sizes: dict[str, int],
) -> dict:
    """Per split, overall and per caption kind: how many images each caption describes, and how
    often a uniformly drawn negative is a false one.

    - ``mean`` / ``median`` / ``max``: images of the split the caption describes (own image included);
      ``mean_false_negatives`` is ``mean - 1``; ``mean_fraction_of_split`` divides ``mean`` by the
      split's image count (the own image included: an upper bound kept for older pages).
    - ``random_negative_fn_rate``: the chance that an image drawn uniformly from the split's *other*
      images is truly described by the caption, averaged over captions.
    - ``pair_negative_fn_rate``: the chance that a pair drawn uniformly from the split's other pairs
      is a false negative for the caption — its image is described by the caption, which is always
      so for another caption of the caption's own image. It is what a composer can pick. The same
      number holds for images as anchors (both count the true (image, caption) pairs off the
      diagonal).
    - ``same_image_pair_rate``: the part of ``pair_negative_fn_rate`` that is another pair of the
      caption's own image.
    - ``near_miss_fn_rate``: the chance that a near miss of the caption's image (a scene of its family,
      differing in one thing) is still truly described by it: how risky the hardest negatives are
      (None in a world without near misses).
    """
    captions_of_image = np.bincount(caption_image_row)
    own_pairs = captions_of_image[caption_image_row]
    out = {}
    for code, split in enumerate(SPLITS):
        in_split = caption_split == code
        split_pairs = int(in_split.sum())

        def summary(rows: np.ndarray) -> dict:
            return _summary(
                judgement.images_described[rows],
                judgement.pairs_described[rows],
                own_pairs[rows],
                split_sizes[split],
                split_pairs,
                judgement.near_misses[rows],
                judgement.near_misses_described[rows],
            )

        stats = summary(in_split)
        stats["by_kind"] = {
            kind: summary(in_split & (caption_kind == k))
            for k, kind in enumerate(CAPTION_KINDS)
            if (in_split & (caption_kind == k)).any()
        }
        out[split] = stats
    return out
