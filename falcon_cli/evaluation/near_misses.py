"""Which near misses a model tells apart: retrieval's errors among a shapes world's near-miss families.

In a world drawn with near misses (``data.shapes.near_misses``), each test image has siblings that differ from it
in one thing (an object's colour, shape or size, an object's cell, two objects swapped) or two. A sibling whose
image a caption does not describe is the hardest kind of negative the world has, and the kind a hard-negative
composer puts in a batch. For each kind of difference this measures how often such a sibling wins:

* ``t2i``: for a caption and a sibling image it does not describe, the sibling scores above the caption's own image;
* ``i2t``: for an image and a sibling's caption that does not describe it, that caption scores above every one of
  the image's own captions (so it would take the image's R@1).

The scores are the evaluation's own (ITC, or ITC's top k re-ranked by ITM), so the rates read beside R@1: a pair
that re-ranking never reached keeps its ITC order below every re-ranked one. 50% is chance for a difference the
model cannot see at all.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from falcon_cli.data.shapes.near_misses import NEAR_MISS_KINDS


def near_miss_confusion(
    scores_i2t: torch.Tensor,
    scores_t2i: torch.Tensor,
    img2txt: Sequence[Sequence[int]],
    positives: torch.Tensor,
    pairs: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> list[dict]:
    """One row per direction and kind (and ``all``): ``comparisons`` (how many (query, false sibling) pairs) and
    ``confusion`` (percent of them where the sibling wins; None without comparisons).

    ``scores_i2t`` [I, T] and ``scores_t2i`` [T, I] are the split's scores; ``positives`` [I, T] every true pair
    (the oracle's); ``pairs`` = ``(i, j, kinds)`` ordered sibling pairs of image positions
    (:func:`~falcon_cli.data.shapes.near_misses.family_pairs`).
    """
    first, second, kinds = pairs
    captions = _padded(img2txt)  # [I, C], -1 = none
    positives = positives.bool().cpu()
    i2t, t2i = scores_i2t.float().cpu(), scores_t2i.float().cpu()
    a, b = torch.as_tensor(first, dtype=torch.long), torch.as_tensor(second, dtype=torch.long)
    caption_of_a, caption_of_b = captions[a], captions[b]  # [P, C]

    # t2i: caption t of image a against a's sibling b (when t does not describe b).
    t = caption_of_a.clamp(min=0)
    valid = (caption_of_a >= 0) & ~positives[b[:, None], t]
    sibling_wins = t2i[t, b[:, None]] > t2i[t, a[:, None]]
    t2i_counts = (valid.sum(1), (valid & sibling_wins).sum(1))

    # i2t: image a against a caption of its sibling b that does not describe a, beside a's best own caption.
    own = i2t[a[:, None], caption_of_a.clamp(min=0)].masked_fill(caption_of_a < 0, float("-inf")).amax(1)  # [P]
    u = caption_of_b.clamp(min=0)
    valid = (caption_of_b >= 0) & ~positives[a[:, None], u]
    sibling_wins = i2t[a[:, None], u] > own[:, None]
    i2t_counts = (valid.sum(1), (valid & sibling_wins).sum(1))

    rows = []
    for direction, (n, wins) in (("i2t", i2t_counts), ("t2i", t2i_counts)):
        for kind in (*NEAR_MISS_KINDS, "all"):
            select = torch.ones(len(kinds), dtype=torch.bool) if kind == "all" else torch.as_tensor(kinds == kind)
            total, won = int(n[select].sum()), int(wins[select].sum())
            rows.append(
                {
                    "direction": direction,
                    "kind": kind,
                    "comparisons": total,
                    "confusion": 100.0 * won / total if total else None,
                }
            )
    return rows


def _padded(lists: Sequence[Sequence[int]]) -> torch.Tensor:
    """Lists of indices as one [len, longest] long tensor, padded with -1."""
    width = max((len(x) for x in lists), default=0)
    out = torch.full((len(lists), max(width, 1)), -1, dtype=torch.long)
    for row, items in enumerate(lists):
        out[row, : len(items)] = torch.as_tensor(list(items), dtype=torch.long)
    return out


__all__ = ["near_miss_confusion"]
