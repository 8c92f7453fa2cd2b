"""False-negative-aware retrieval metrics: every truly compatible item is a positive.

Ground truth is a boolean matrix ``positives[q, n]`` (query ``q`` is compatible with item
``n``). Per query with ``R = positives[q].sum()`` positives:

* ``R@K``: 1 if any positive is among the top ``K`` items;
* ``R-P`` (R-Precision): the fraction of the top ``R`` items that are positives;
* ``mAP@R``: the sum, over positives ranked within the top ``R``, of the precision at that
  rank, divided by ``R`` (positives outside the top ``R`` count zero).

Values are percentages averaged over queries with at least one positive. Ties are broken
towards the lower index, as ``argsort(descending=True, stable=True)`` does. Queries are
processed in chunks and only the top ``max(R, K)`` items of a chunk are ranked, so a
5000 x 25000 matrix never needs a full integer rank tensor.
"""

from __future__ import annotations

from typing import Sequence

import torch

from falcon_cli.errors import FalconError
from falcon_cli.evaluation.intervals import with_intervals

KS = (1, 5, 10)


def row_block(matrix: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Rows ``start:stop`` of a 2-D tensor as a contiguous tensor.

    For a transposed view (``scores.t()``) the matching columns of the original are copied
    first and then transposed, which is several times faster on CPU than a strided copy.
    """
    block = matrix[start:stop]
    if block.is_contiguous():
        return block
    if matrix.stride(0) == 1:
        return matrix.t()[:, start:stop].contiguous().t().contiguous()
    return block.contiguous()


def stable_topk_indices(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices [Q, k] of each row's ``k`` highest scores, ties towards the lower index.

    Equal to ``scores.argsort(dim=1, descending=True, stable=True)[:, :k]`` without sorting
    whole rows: ``topk`` finds the k-th value; only rows where a tie at that value straddles
    the cut are re-selected, taking the tied items in index order.
    """
    n_rows, n_cols = scores.shape
    k = min(int(k), n_cols)
    if k <= 0 or n_rows == 0:
        return torch.empty(n_rows, max(k, 0), dtype=torch.long, device=scores.device)
    values, top = scores.topk(k, dim=1)
    threshold = values[:, -1:]
    straddles = (scores == threshold).sum(dim=1) > (values == threshold).sum(dim=1)
    if bool(straddles.any()):
        rows = straddles.nonzero().squeeze(1)
        block, cut = scores[rows], threshold[rows]
        above, ties = block > cut, block == cut
        need = k - above.sum(dim=1, keepdim=True)
        chosen = above | (ties & (ties.cumsum(dim=1, dtype=torch.int32) <= need))
        top[rows] = chosen.nonzero()[:, 1].view(-1, k)
    # Ascending indices, then a stable sort by value: ties fall towards the lower index.
    top = top.sort(dim=1).values
    order = scores.gather(1, top).argsort(dim=1, descending=True, stable=True)
    return top.gather(1, order)


def multi_positive_metrics(
    scores: torch.Tensor, positives: torch.Tensor, ks: Sequence[int] = KS, *, chunk: int = 1024
) -> dict[str, float]:
    """``{"R@1": …, "R-P": …, "mAP@R": …, "queries": n}`` in percent, over queries with a positive.

    ``scores`` is [Q, N] (higher = more similar), ``positives`` a boolean [Q, N] of the same
    shape. Queries without any positive are skipped; ``queries`` counts those evaluated.
    """
    if scores.dim() != 2 or tuple(positives.shape) != tuple(scores.shape):
        raise FalconError(
            f"scores {tuple(scores.shape)} and positives {tuple(positives.shape)} must be matrices "
            "of the same [queries, items] shape"
        )
    if chunk < 1:
        raise FalconError(f"chunk must be a positive number of queries, got {chunk}")
    ks = [int(k) for k in ks]
    if any(k < 1 for k in ks):
        raise FalconError(f"every K of R@K must be at least 1, got {ks}")
    n_queries, n_items = scores.shape
    positives = positives.to(device=scores.device, dtype=torch.bool)
    device = scores.device
    hits_at = {k: torch.zeros((), dtype=torch.float64, device=device) for k in ks}
    r_precision = torch.zeros((), dtype=torch.float64, device=device)
    map_at_r = torch.zeros((), dtype=torch.float64, device=device)
    evaluated = 0
    for start in range(0, n_queries, chunk):
        pos = row_block(positives, start, start + chunk)
        n_pos = pos.sum(dim=1)
        keep = n_pos > 0
        if not bool(keep.any()):
            continue
        pos, n_pos = pos[keep], n_pos[keep]
        block = row_block(scores, start, start + chunk)[keep]
        if block.dtype not in (torch.float32, torch.float64):
            block = block.float()
        if bool(torch.isnan(block).any()):
            raise FalconError(
                "the score matrix contains NaN: check the embeddings (a diverged model or an "
                "empty input) before computing retrieval metrics"
            )
        depth = min(n_items, max(int(n_pos.max()), max(ks, default=1)))
        top = stable_topk_indices(block, depth)
        hits = pos.gather(1, top)  # [C, depth]: is the item at rank r a positive?
        for k in ks:
            hits_at[k] += hits[:, : min(k, depth)].any(dim=1).double().sum()
        ranks = torch.arange(1, depth + 1, device=device)
        within_r = ranks[None, :] <= n_pos[:, None]
        hits_r = hits & within_r
        r = n_pos.double()
        r_precision += (hits_r.sum(dim=1).double() / r).sum()
        precision = hits_r.cumsum(dim=1).double() / ranks[None, :].double()
        map_at_r += ((precision * hits_r).sum(dim=1) / r).sum()
        evaluated += int(pos.shape[0])
    if evaluated == 0:
        raise FalconError(
            "no query has a positive: multi-positive retrieval metrics need at least one True in the positives matrix"
        )
    result = {f"R@{k}": 100.0 * hits_at[k].item() / evaluated for k in ks}
    result["R-P"] = 100.0 * r_precision.item() / evaluated
    result["mAP@R"] = 100.0 * map_at_r.item() / evaluated
    result["queries"] = evaluated
    return result


def fn_aware_retrieval(
    scores_i2t: torch.Tensor,
    positives_i2t: torch.Tensor,
    prefix: str,
    ks: Sequence[int] = KS,
    scores_t2i: torch.Tensor | None = None,
) -> dict[str, float]:
    """Both directions of :func:`multi_positive_metrics` with prefixed keys, in percent.

    Keys: ``{prefix}_i2t_R@K`` for each K, ``{prefix}_i2t_R-P``, ``{prefix}_i2t_mAP@R``, the
    same for ``t2i`` (scored by ``scores_t2i`` [n_texts, n_images], default the transpose: ITM
    re-ranking scores the two directions differently), and ``{prefix}_mean_R``, the mean of the
    ``2 * len(ks)`` R@K values. Each R@K has its 95% interval (``…_lo``, ``…_hi``; Wilson's over the
    direction's queries with a positive).
    """
    result: dict[str, float] = {}
    recalls = []
    for direction, scores, positives in (
        ("i2t", scores_i2t, positives_i2t),
        ("t2i", scores_i2t.t() if scores_t2i is None else scores_t2i, positives_i2t.t()),
    ):
        metrics = multi_positive_metrics(scores, positives, ks)
        for k in ks:
            result[f"{prefix}_{direction}_R@{k}"] = metrics[f"R@{k}"]
            with_intervals(result, f"{prefix}_{direction}_R@{k}", metrics["queries"])
            recalls.append(metrics[f"R@{k}"])
        result[f"{prefix}_{direction}_R-P"] = metrics["R-P"]
        result[f"{prefix}_{direction}_mAP@R"] = metrics["mAP@R"]
    result[f"{prefix}_mean_R"] = sum(recalls) / len(recalls)
    return result


def perfect_recall_at_1(positives_i2t: torch.Tensor, img2txt: Sequence[Sequence[int]]) -> dict[str, float]:
    """The standard R@1 (%) of a perfect model, which ranks every true match first in an order the query cannot
    decide: a caption finds its own image with probability 1 / (the images it truly describes), an image one of its
    own captions with probability (its own captions) / (the captions that truly describe it). Standard R@1 above it
    means the model tells apart what the data does not: on training pairs, that it memorised them.
    ``positives_i2t``: bool [n_images, n_texts]; ``img2txt``: each image's own captions (all of them positives)."""
    positives = positives_i2t.bool()
    own = torch.zeros_like(positives)
    for image, texts in enumerate(img2txt):
        own[image, list(texts)] = True
    own &= positives  # (an own caption the oracle does not count as a match is never found first)
    per_text = positives.sum(0).clamp(min=1).double()
    per_image = positives.sum(1).clamp(min=1).double()
    return {
        "i2t": 100.0 * (own.sum(1).double() / per_image).mean().item(),
        "t2i": 100.0 * (own.sum(0).double() / per_text).mean().item(),
    }
