"""Image-text matching (ITM): in-batch negative mining, fusion-input assembly and the loss.

``sim_i2t`` [B, N] has images as rows and texts as columns, ``sim_t2i`` [B, N] texts as
rows and images as columns (as returned in :class:`~falcon_cli.objectives.itc.ItcOutput`).
Only the first B columns (the local batch) are candidates, so ALBEF's [B, B + K]
queue-extended matrices can be passed directly. Mining runs under ``no_grad`` in float32.

``positive_mask`` is pair level (bool [B, B], rows images, columns texts, True = the pair
matches): such pairs are never chosen as negatives, in either direction. Build it from
sample ids with :func:`~falcon_cli.objectives.common.positive_mask_from_ids` when a batch
can hold duplicates. The anchor's own pair (the diagonal) is always excluded. If a row
has no candidate left after excluding ``positive_mask``, the positive mask is ignored for
that row (the diagonal is still excluded); B must be at least 2.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from falcon_cli.objectives.common import fp32_region

__all__ = ["hardest_negatives", "sample_negatives", "ItmPairs", "itm_pair_indices", "itm_loss", "mined_itm_loss"]


def _excluded(
    sim_i2t: Tensor, sim_t2i: Tensor, positive_mask: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """In-batch float32 sims [B, B] and the excluded entries per direction (diag-only fallback per row)."""
    if sim_i2t.dim() != 2 or sim_t2i.dim() != 2 or sim_i2t.shape[0] != sim_t2i.shape[0]:
        raise ValueError(
            f"sim_i2t and sim_t2i must be [B, N] with the same B, got {tuple(sim_i2t.shape)} and {tuple(sim_t2i.shape)}"
        )
    b = sim_i2t.shape[0]
    if b < 2:
        raise ValueError("in-batch negatives need a batch of at least 2 pairs")
    if sim_i2t.shape[1] < b or sim_t2i.shape[1] < b:
        raise ValueError(
            f"similarity matrices need at least B={b} columns, got {tuple(sim_i2t.shape)}, {tuple(sim_t2i.shape)}"
        )
    s_i2t = sim_i2t[:, :b].detach().float()
    s_t2i = sim_t2i[:, :b].detach().float()
    eye = torch.eye(b, dtype=torch.bool, device=s_i2t.device)
    if positive_mask is None:
        return s_i2t, s_t2i, eye, eye, eye
    if positive_mask.shape != (b, b):
        raise ValueError(f"positive_mask must have shape ({b}, {b}), got {tuple(positive_mask.shape)}")
    pos = positive_mask.to(device=s_i2t.device).bool() | eye
    # a row left without candidates falls back to excluding only its diagonal
    ex_i2t = torch.where(pos.all(dim=1, keepdim=True), eye, pos)
    pos_t = pos.t()
    ex_t2i = torch.where(pos_t.all(dim=1, keepdim=True), eye, pos_t)
    return s_i2t, s_t2i, ex_i2t, ex_t2i, eye


@torch.no_grad()
def hardest_negatives(
    sim_i2t: Tensor, sim_t2i: Tensor, *, positive_mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Deterministic hardest in-batch negatives (GRIT-VLP / FALCON ITM).

    Args:
        sim_i2t: [B, N] image-to-text similarities (N >= B; first B columns used).
        sim_t2i: [B, N] text-to-image similarities.
        positive_mask: optional bool [B, B] (rows images, columns texts) of extra positives.

    Returns ``(neg_text_for_image, neg_image_for_text)``, both int64 [B]:
    ``neg_text_for_image[i] = argmax_{j not excluded} sim_i2t[i, j]`` and
    ``neg_image_for_text[i] = argmax_{j not excluded} sim_t2i[i, j]`` (excluded entries are
    set to -inf; ties go to the lowest index).
    """
    s_i2t, s_t2i, ex_i2t, ex_t2i, _ = _excluded(sim_i2t, sim_t2i, positive_mask)
    with fp32_region(s_i2t.device):
        neg_text = s_i2t.masked_fill(ex_i2t, float("-inf")).argmax(dim=1)
        neg_image = s_t2i.masked_fill(ex_t2i, float("-inf")).argmax(dim=1)
    return neg_text, neg_image


@torch.no_grad()
def sample_negatives(
    sim_i2t: Tensor,
    sim_t2i: Tensor,
    generator: torch.Generator | Tensor | None = None,
    *,
    positive_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """ALBEF's sampled in-batch negatives: one multinomial draw per anchor.

    Weights are ``softmax(sim[:, :B]) + 1e-4`` (ALBEF's floor, so every candidate keeps some
    mass even when the softmax underflows) with the diagonal and ``positive_mask`` entries
    set to 0. ``generator`` must live on the device of the similarities; a seeded generator
    makes the draw reproducible. A float tensor ``[2, B]`` of uniforms in [0, 1) instead draws each anchor's
    negative by the inverse of its weights' CDF (the same distribution; ``pretrain.runtime.graph_step`` draws the
    uniforms outside its captured step, which cannot hold a generator).

    Returns ``(neg_text_for_image, neg_image_for_text)``, both int64 [B] (same meaning as
    :func:`hardest_negatives`).
    """
    s_i2t, s_t2i, ex_i2t, ex_t2i, _ = _excluded(sim_i2t, sim_t2i, positive_mask)
    with fp32_region(s_i2t.device):
        w_i2t = (F.softmax(s_i2t, dim=1) + 1e-4).masked_fill(ex_i2t, 0.0)
        w_t2i = (F.softmax(s_t2i, dim=1) + 1e-4).masked_fill(ex_t2i, 0.0)
        if isinstance(generator, Tensor):
            return inverse_cdf_draw(w_i2t, generator[0]), inverse_cdf_draw(w_t2i, generator[1])
        neg_text = torch.multinomial(w_i2t, 1, generator=generator).squeeze(1)
        neg_image = torch.multinomial(w_t2i, 1, generator=generator).squeeze(1)
    return neg_text, neg_image


def inverse_cdf_draw(weights: Tensor, uniforms: Tensor) -> Tensor:
    """One index per row of ``weights`` [B, N] (non-negative, each row with some mass), drawn with probability
    proportional to the weight by ``uniforms`` [B] in [0, 1): the first index whose cumulative share exceeds it."""
    cdf = weights.cumsum(1)
    target = (uniforms.to(cdf.dtype) * cdf[:, -1]).unsqueeze(1)
    index = torch.searchsorted(cdf, target, right=True).squeeze(1)
    return index.clamp_(max=weights.shape[1] - 1)


class ItmPairs(NamedTuple):
    """Index lists for the 3B ITM fusion inputs (all int64 [3B], or float labels).

    Order: B positives ``(i, i)``, then B ``(neg_image_for_text[i], i)``, then B
    ``(i, neg_text_for_image[i])`` (ALBEF's order). Fusion input k is
    ``(image_embeds[image_index[k]], text_embeds[text_index[k]])``; ``labels`` [3B] int64
    are 1 for the first B and 0 for the rest.
    """

    image_index: Tensor
    text_index: Tensor
    labels: Tensor


def itm_pair_indices(neg_text_for_image: Tensor, neg_image_for_text: Tensor) -> ItmPairs:
    """Build :class:`ItmPairs` from the negatives of :func:`hardest_negatives` / :func:`sample_negatives` ([B] each)."""
    if neg_text_for_image.dim() != 1 or neg_text_for_image.shape != neg_image_for_text.shape:
        raise ValueError(
            f"negatives must both be [B], got {tuple(neg_text_for_image.shape)} and {tuple(neg_image_for_text.shape)}"
        )
    b = neg_text_for_image.shape[0]
    dev = neg_text_for_image.device
    ar = torch.arange(b, device=dev)
    image_index = torch.cat([ar, neg_image_for_text.to(dev, torch.long), ar])
    text_index = torch.cat([ar, ar, neg_text_for_image.to(dev, torch.long)])
    labels = torch.cat([torch.ones(b, dtype=torch.long, device=dev), torch.zeros(2 * b, dtype=torch.long, device=dev)])
    return ItmPairs(image_index, text_index, labels)


def itm_loss(logits_pos: Tensor, logits_neg: Tensor, *, neg_labels: Tensor | None = None) -> Tensor:
    """ITM cross-entropy over all 3B pairs, float32, mean over the 3B.

    Args:
        logits_pos: [B, 2] ITM-head logits of the positive pairs (label 1).
        logits_neg: [2B, 2] logits of the negative pairs (label 0), in :class:`ItmPairs` order.
        neg_labels: optional int64 [2B] labels for the second block instead of zeros
            (MAFA relabels detected false negatives as 1).

    Returns a scalar: ``CE(cat([logits_pos, logits_neg]), cat([1]*B, neg_labels or [0]*2B))``.
    """
    if logits_pos.dim() != 2 or logits_pos.shape[1] != 2 or logits_neg.dim() != 2 or logits_neg.shape[1] != 2:
        raise ValueError(f"ITM logits must be [*, 2], got {tuple(logits_pos.shape)} and {tuple(logits_neg.shape)}")
    b, dev = logits_pos.shape[0], logits_pos.device
    if neg_labels is None:
        neg_labels = torch.zeros(logits_neg.shape[0], dtype=torch.long, device=dev)
    elif neg_labels.shape != (logits_neg.shape[0],):
        raise ValueError(f"neg_labels must be [{logits_neg.shape[0]}], got {tuple(neg_labels.shape)}")
    logits = torch.cat([logits_pos.float(), logits_neg.float()], dim=0)
    labels = torch.cat([torch.ones(b, dtype=torch.long, device=dev), neg_labels.to(dev, torch.long)])
    with fp32_region(dev):
        return F.cross_entropy(logits, labels)


def mined_itm_loss(
    itc,
    pair_logits: Callable[[ItmPairs], Tensor],
    *,
    sample: bool = False,
    generator: torch.Generator | Tensor | None = None,
    mining=None,
    same_image: Tensor | None = None,
) -> Tensor:
    """ITM on a batch's B positives plus one negative text per image and one negative image per text, mined
    from the ITC similarities ``itc.sim_i2t``/``itc.sim_t2i`` (:func:`hardest_negatives`, or ALBEF's and
    LAVIS's multinomial :func:`sample_negatives` with ``sample``), never a pair of ``same_image`` (bool
    [B, B]) where given; with MAFA's ``mining``, its partners and labels (converted pairs count as matches).
    ``pair_logits(pairs)`` gives the model's ITM logits ``[3B, 2]`` of the :class:`ItmPairs` (ALBEF fuses text
    tokens with image tokens; BLIP-2 runs its queries and the text through the Q-Former): every framework
    mines and scores its ITM pairs here."""
    b = itc.sim_i2t.shape[0]
    if mining is not None:
        negatives, labels = (mining.neg_text_for_image, mining.neg_image_for_text), mining.neg_labels
    else:
        with torch.no_grad():
            sim_i2t, sim_t2i = itc.sim_i2t[:, :b].detach(), itc.sim_t2i[:, :b].detach()
            negatives = (
                sample_negatives(sim_i2t, sim_t2i, generator, positive_mask=same_image)
                if sample
                else hardest_negatives(sim_i2t, sim_t2i, positive_mask=same_image)
            )
        labels = None
    logits = pair_logits(itm_pair_indices(*negatives))
    return itm_loss(logits[:b], logits[b:], neg_labels=labels)
