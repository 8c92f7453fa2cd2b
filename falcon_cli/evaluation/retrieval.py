"""Image-text retrieval recall, ALBEF's protocol, computed from a score matrix.

Text retrieval (``i2t``): for each image, rank all texts; the image's rank is the best
rank of any of its captions. Image retrieval (``t2i``): for each text, the rank of its
image. Values are percentages with explicit keys (``i2t_R@1``, ``t2i_R@5``, ``mean_R``).
"""

from __future__ import annotations

from typing import Sequence

import torch

from falcon_cli.evaluation.intervals import with_intervals

KS = (1, 5, 10)


def retrieval_ranks(
    scores_i2t: torch.Tensor,
    img2txt: Sequence[Sequence[int]],
    txt2img: Sequence[int],
    scores_t2i: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """0-based ranks: per image, the best rank of its captions; per text, the rank of its image.

    ``scores_i2t`` is [n_images, n_texts] (higher = more similar); ``scores_t2i`` [n_texts, n_images]
    ranks images for each text (default: the transpose; ITM re-ranking scores the two directions
    differently). Equal scores rank in index order: the lower index first (a stable descending
    sort). ALBEF's ``itm_eval`` ranks with ``np.argsort(score)[::-1]``, the reverse of numpy's
    default, unstable ascending sort: among equal scores the later index comes first in short rows,
    and the order is unspecified in long ones. Only a positive tied with a negative at the cut-off
    can change R@K.
    """
    n_images, n_texts = scores_i2t.shape
    scores = scores_i2t.float()
    # A query's rank of a candidate is the number of candidates ahead of it in that order: those that
    # score higher, and those that score the same with a lower index. Counting them is one pass over the
    # matrix, where sorting every row cost seconds per evaluation on one CPU thread (2,000 x 10,000).
    positives = torch.zeros(n_images, n_texts, dtype=torch.bool, device=scores.device)
    for i, texts in enumerate(img2txt):
        positives[i, list(texts)] = True
    # An image's best-ranked caption is the one first in the order: its highest-scoring caption, and
    # among captions tied at that score the lowest index (``argmax`` returns the first of equal maxima).
    best = torch.where(positives, scores, torch.full_like(scores, -torch.inf)).amax(dim=1)
    first = (positives & (scores == best[:, None])).int().argmax(dim=1)
    image_ranks = _ranks_of(scores, best, first)
    has_caption = positives.any(dim=1)
    image_ranks = torch.where(has_caption, image_ranks, torch.full_like(image_ranks, torch.iinfo(torch.long).max))

    scores_t = scores.t() if scores_t2i is None else scores_t2i.float()
    target = torch.as_tensor(list(txt2img), device=scores.device, dtype=torch.long)
    text_ranks = _ranks_of(scores_t, scores_t.gather(1, target[:, None]).squeeze(1), target)
    return image_ranks, text_ranks


def _ranks_of(scores: torch.Tensor, value: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Per row of ``scores``, the 0-based rank of the entry at ``index`` (whose score is ``value``) in a
    stable descending sort of the row: entries scoring higher, plus equal entries at lower indices."""
    ahead = (scores > value[:, None]).sum(dim=1)
    columns = torch.arange(scores.shape[1], device=scores.device)
    tied_before = ((scores == value[:, None]) & (columns < index[:, None])).sum(dim=1)
    return ahead + tied_before


def recall_at_k(
    scores_i2t: torch.Tensor,
    img2txt: Sequence[Sequence[int]],
    txt2img: Sequence[int],
    ks: Sequence[int] = KS,
    scores_t2i: torch.Tensor | None = None,
) -> dict[str, float]:
    """``{"i2t_R@1": …, "t2i_R@1": …, "i2t_mean": …, "t2i_mean": …, "mean_R": …}`` in percent
    (``scores_t2i``: see :func:`retrieval_ranks`); each R@K with its 95% interval (``i2t_R@1_lo`` /
    ``i2t_R@1_hi``, Wilson's, over the direction's queries: :mod:`~falcon_cli.evaluation.intervals`)."""
    image_ranks, text_ranks = retrieval_ranks(scores_i2t, img2txt, txt2img, scores_t2i)
    result: dict[str, float] = {}
    for k in ks:
        result[f"i2t_R@{k}"] = 100.0 * (image_ranks < k).double().mean().item()
        with_intervals(result, f"i2t_R@{k}", len(image_ranks))
    for k in ks:
        result[f"t2i_R@{k}"] = 100.0 * (text_ranks < k).double().mean().item()
        with_intervals(result, f"t2i_R@{k}", len(text_ranks))
    result["i2t_mean"] = sum(result[f"i2t_R@{k}"] for k in ks) / len(ks)
    result["t2i_mean"] = sum(result[f"t2i_R@{k}"] for k in ks) / len(ks)
    result["mean_R"] = (result["i2t_mean"] + result["t2i_mean"]) / 2
    return result
