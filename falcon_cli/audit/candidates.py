"""How risky the hard candidates of a search space are under a trained model (the paper's Figure 2 premise).

A hard-negative composer takes an anchor's most similar candidates from a search space; the premise of
FALCON is that the harder a candidate, the likelier it is a false negative. This module measures that
directly, for any model's embeddings and a ground truth: the pairs are cut into random search spaces of
``space_size`` (as the composers cut them), every anchor's candidates in its space are ranked by similarity,
and the truth is read at rank 1, rank 10, the median rank, and over all candidates (a random pick).

Both directions: a caption anchor's candidates are the space's other images (each image once, the anchor's
own image left out); an image anchor's candidates are the space's captions of other images. Other captions
of the anchor's own image are always false and are reported apart by the density statistics; here they are
left out, so the rates are about telling different scenes apart.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd
import torch

RANKS = ("top-1", "top-10", "median", "random")
"""The candidates whose truth is read: the hardest, the 10th hardest, the median one, and any one (the mean over
all)."""


def candidate_risk(
    image_feat: torch.Tensor,
    text_feat: torch.Tensor,
    image_ids: np.ndarray,
    truth: Callable[[np.ndarray], np.ndarray],
    *,
    space_size: int,
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """``{direction: {rank: false-negative rate}}`` for directions ``t2i``, ``i2t`` and ``both`` (anchors pooled).

    ``image_feat`` / ``text_feat``: ``[N, D]`` features of N pairs (pair k = image ``image_ids[k]`` with its
    caption k); ``truth(rows)``: ``bool [m, m]`` for the pairs at ``rows``, entry ``[i, j]`` whether caption
    ``rows[j]`` describes pair ``rows[i]``'s image (asked one search space at a time, so the truth of N x N pairs
    is never held at once). The pairs are shuffled with ``seed`` and cut into spaces of
    ``space_size`` (a last, smaller space is kept when it has at least two images). Each rate is a share of
    anchors with at least as many candidates as the rank needs; ``anchors_<rank>`` says how many that was.
    """
    n = len(image_ids)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    image_ids = torch.as_tensor(np.asarray(image_ids), dtype=torch.int64)
    hits = {d: {r: [] for r in RANKS} for d in ("t2i", "i2t")}
    for start in range(0, n, space_size):
        rows = order[start : start + space_size]
        ids = image_ids[rows]
        first = _first_of_each(ids)  # one row per distinct image
        if len(first) < 2:
            continue
        sim = image_feat[rows].float() @ text_feat[rows].float().T  # [m, m]: pair i's image, caption j
        true = torch.as_tensor(np.asarray(truth(rows.numpy()), dtype=bool))  # [m, m]: caption j describes image i
        other = ids[:, None] != ids[None, :]  # candidates of other images
        # Caption anchors (columns) over the distinct images of the space (rows in ``first``).
        _read(sim[first].T, true[first].T, other[first].T, hits["t2i"])
        # Image anchors (one per distinct image) over the space's captions.
        _read(sim[first], true[first], other[first], hits["i2t"])
    out = {}
    for direction in ("t2i", "i2t", "both"):
        parts = ("t2i", "i2t") if direction == "both" else (direction,)
        out[direction] = {}
        for rank in RANKS:
            values = torch.cat([torch.cat(hits[d][rank]) if hits[d][rank] else torch.zeros(0) for d in parts])
            out[direction][rank] = float(values.mean()) if len(values) else float("nan")
            out[direction][f"anchors_{rank}"] = int(len(values))
    return out


def _first_of_each(ids: torch.Tensor) -> torch.Tensor:
    """Positions of the first occurrence of each distinct value of ``ids``, in order of position."""
    _, inverse = torch.unique(ids, return_inverse=True)
    firsts = torch.full((int(inverse.max()) + 1,), len(ids), dtype=torch.int64)
    return firsts.scatter_reduce(0, inverse, torch.arange(len(ids)), reduce="amin").sort().values


def _read(scores: torch.Tensor, true: torch.Tensor, allowed: torch.Tensor, hits: dict) -> None:
    """Per anchor (row): the truth of its candidates (allowed columns) at each rank of ``RANKS``."""
    count = allowed.sum(dim=1)
    ranked = scores.masked_fill(~allowed, float("-inf")).argsort(dim=1, descending=True, stable=True)
    sorted_true = true.gather(1, ranked).float()  # allowed candidates first, hardest first
    for rank, position in (
        ("top-1", torch.zeros_like(count)),
        ("top-10", torch.full_like(count, 9)),
        ("median", (count - 1) // 2),
    ):
        ok = position < count
        hits[rank].append(sorted_true[ok].gather(1, position[ok, None]).squeeze(1))
    ok = count > 0
    hits["random"].append((true & allowed).sum(dim=1)[ok].float() / count[ok])


def oracle_candidate_risk(embeddings, pair_at, oracle, epoch: int, *, space_size: int, seed: int = 0) -> pd.DataFrame:
    """:func:`candidate_risk` of one epoch's embedding cache (``embeddings``: ``image``, ``text``, ``pair_id``) against
    a shapes oracle (``oracle.matrix(image_ids, caption_ids)``); ``pair_at(epoch, pair_id)`` gives each pair's
    ``image_id`` and ``caption_id``. One row per direction (``t2i``, ``i2t``, ``both``): the rate at each rank
    and how many anchors it counts."""
    pairs = [pair_at(epoch, int(p)) for p in embeddings.pair_id]
    image_ids = np.array([p.image_id for p in pairs], dtype=np.int64)
    caption_ids = np.array([p.caption_id for p in pairs], dtype=np.int64)
    risk = candidate_risk(
        torch.as_tensor(embeddings.image),
        torch.as_tensor(embeddings.text),
        image_ids,
        lambda rows: oracle.matrix(image_ids[rows], caption_ids[rows]),
        space_size=space_size,
        seed=seed,
    )
    return pd.DataFrame(
        [{"epoch": epoch, "space_size": space_size, "direction": d, **values} for d, values in risk.items()]
    )


__all__ = ["RANKS", "candidate_risk", "oracle_candidate_risk"]
