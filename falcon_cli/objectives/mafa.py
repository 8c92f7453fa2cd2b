"""MAFA (MAnaging FAlse negatives): Efficient Connection Mining (ECM) and the S-ITC schedule.

Reference: methods.md §2. Everything here is a pure, vectorised tensor function: the
similarities and a *score callback* (the frozen Connection Discriminator, Con-D) go in,
label decisions come out. Nothing here runs the trained model.

What ECM does (per mini-batch of B pairs, methods.md §2.2)
----------------------------------------------------------
For every image anchor b, rank the in-batch texts by ``w_i2t = softmax(s_i2t)`` with the
diagonal excluded; ``k1`` / ``k2`` are the hardest and second-hardest candidates. Con-D
scores the pair ``(I_b, T_k1)``, giving ``p = p(match)``:

* ``p > high`` (0.8): the hard negative is a **false negative, converted to a positive**:
  the ITC target row b gets a second positive at ``k1`` (row-normalised: 0.5 / 0.5), the
  ITM pair ``(I_b, T_k1)`` is kept with label 1, and ``(I_b, T_k1)`` joins the MLM set.
* ``low < p < high`` (0.5 .. 0.8): **ambiguous**: ITM uses the second-hardest ``(I_b, T_k2)``
  as the negative instead (label 0). ``k2`` is not re-checked by Con-D (M-3).
* otherwise: plain hardest negative ``(I_b, T_k1)``, label 0.

Text anchors use the same rule on ``w_t2i`` with Con-D scoring ``(I_k1, T_b)``; the two
directions are decided independently and the ITC masks are NOT symmetrised.

How it plugs in
---------------
* ITC: ``itc_grit(v, t, tau, consistency_weight=0, positive_mask=res.positive_mask_i2t,
  positive_mask_t2i=res.positive_mask_t2i, label_smoothing=smoothing(epoch))`` (MAFA drops
  GRIT's consistency term). The similarities to mine from are that call's ``sim_i2t`` /
  ``sim_t2i`` (detached), i.e. the same ones GRIT/FALCON mine ITM negatives from; ECM only
  relabels, so the trained model needs no extra forward.
* ITM: ``itm_pair_indices(res.neg_text_for_image, res.neg_image_for_text)`` gives the 3B
  fusion inputs (B positives, then the B text-anchor pairs ``(neg_image_for_text[i], i)``,
  then the B image-anchor pairs ``(i, neg_text_for_image[i])``) and
  ``itm_loss(logits[:B], logits[B:], neg_labels=res.neg_labels)`` labels the converted ones 1.
  :meth:`ConnectionMining.itm_pairs` returns the same indices with the relabelled [3B] labels.
* MLM: the extra pairs ``(mlm_image_index[k], mlm_text_index[k])`` are masked and
  reconstructed like ordinary pairs (caption ``mlm_text_index[k]`` given image
  ``mlm_image_index[k]``), on top of the B original pairs (see "Extra MLM pairs" below).
* S-ITC: :func:`smoothing` gives the label-smoothing epsilon for an epoch.

Resolved ambiguities
--------------------
* **M-1** alpha is not in the paper text: 0.5 (reference code and Tab. 2; 0.2 for BLIP-2).
* **M-2** no smoothing in epoch 0 (random sampling there, where S-ITC hurts), alpha from
  epoch 1 on (reference code, ``epoch > 0``).
* **M-3** the second-hardest candidate that replaces an ambiguous one is not re-scored.
* **M-4** how Con-D is obtained when pretraining on COCO itself is unspecified. Here the
  discriminator is any judge behind the ``score`` callback (a fine-tuned ITM head, an
  oracle, a stub). FALCON's COCO reproduction needed ``high = 0.98``: 0.8 collapsed
  (a COCO-fine-tuned Con-D over-scores COCO pairs), so ``high`` is a parameter.

Extra MLM pairs
---------------
MAFA's code (``models/model_pretrain_MAFA.py``, ``ALBEF_Base.forward``) appends one MLM row per
converted image anchor b, ``(caption k1_i2t[b], image b)``, and one per converted text anchor b,
``(caption b, image k1_t2i[b])``, to the B original rows, masks all rows afresh (Bernoulli 0.5
per token) and averages the cross-entropy over every masked token. A pair ``(image a, caption c)``
converted in both directions (c is a's hardest caption, a is c's hardest image, both judged
matches) is therefore appended twice. ``mlm_pairs="per_direction"`` (the default) does the same:
one extra pair per conversion, such a pair twice. ``mlm_pairs="distinct"`` adds each converted
(image, caption) pair once (what falcon did before the option). Either way falcon differs from
MAFA's code in the mask draws, not in the expected loss: an extra pair reuses its caption's own
mask from the batch (:class:`~falcon_cli.objectives.vlp.VlpObjective` fuses the already masked
caption with the extra image), so a pair added twice counts its masked tokens twice with one
mask, where MAFA's two copies and the caption's own row have independent masks.

Threshold equality: the reference uses strict inequalities, so ``p == high`` or
``p == low`` exactly falls in neither branch and (there) drops the pair from ITM. Dropping
a pair would change the 3B layout, so here ``p == high`` and ``p == low`` take the
"otherwise" branch: hardest ``k1`` as a plain negative, label 0 (a measure-zero difference).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from falcon_cli.objectives.common import fp32_region
from falcon_cli.objectives.itm import ItmPairs, itm_pair_indices

__all__ = ["MLM_PAIRS", "ConnectionMining", "ScoreFn", "connection_mining", "smoothing"]

MLM_PAIRS = ("per_direction", "distinct")
"""Which converted pairs join the MLM set: one per conversion (MAFA's code) or one per distinct pair."""

ScoreFn = Callable[[Tensor, Tensor], Tensor]
"""``score(image_index [n], text_index [n]) -> p(match) float [n]`` for the pairs
(image of batch item ``image_index[k]``, caption of batch item ``text_index[k]``)."""


@dataclass(eq=False)
class ConnectionMining:
    """ECM decisions for one batch of B pairs (all tensors on the device of the similarities).

    * ``positive_mask_i2t`` bool [B, B], rows images, columns texts: the diagonal plus
      ``(b, k1_i2t[b])`` for each converted image anchor b.
    * ``positive_mask_t2i`` bool [B, B], rows texts, columns images: the diagonal plus
      ``(b, k1_t2i[b])`` for each converted text anchor b. Not the transpose of the above.
    * ``neg_text_for_image`` int64 [B]: the ITM partner text of image anchor b: ``k1``
      (plain or converted) or ``k2`` (ambiguous).
    * ``neg_image_for_text`` int64 [B]: the ITM partner image of text anchor b, likewise.
    * ``neg_labels`` int64 [2B], in :func:`~falcon_cli.objectives.itm.itm_pair_indices` order:
      first the B text-anchor pairs ``(neg_image_for_text[i], i)``, then the B image-anchor
      pairs ``(i, neg_text_for_image[i])``; 1 where the pair was converted to a positive,
      else 0. Pass it as ``itm_loss(..., neg_labels=...)``.
    * ``mlm_image_index`` / ``mlm_text_index`` int64 [K]: the extra MLM pairs, sorted by
      (image, text): one per conversion (``mlm_pairs="per_direction"``, MAFA's code: a pair
      converted in both directions appears twice) or one per distinct converted pair
      (``"distinct"``).
    * ``converted_i2t`` / ``converted_t2i``: number of image / text anchors whose hardest
      candidate became a positive; ``swapped_i2t`` / ``swapped_t2i``: number whose ITM
      partner was replaced by the second-hardest (ambiguous band). Python ints.
    * ``scores_i2t`` / ``scores_t2i`` float32 [B]: Con-D's p(match) of each anchor's hardest
      candidate, ``(b, k1_i2t[b])`` resp. ``(k1_t2i[b], b)``.
    * ``hardest_text_for_image`` / ``hardest_image_for_text`` int64 [B]: ``k1`` per anchor
      (for logging / audits).
    """

    positive_mask_i2t: Tensor
    positive_mask_t2i: Tensor
    neg_text_for_image: Tensor
    neg_image_for_text: Tensor
    neg_labels: Tensor
    mlm_image_index: Tensor
    mlm_text_index: Tensor
    converted_i2t: int
    converted_t2i: int
    swapped_i2t: int
    swapped_t2i: int
    scores_i2t: Tensor
    scores_t2i: Tensor
    hardest_text_for_image: Tensor
    hardest_image_for_text: Tensor

    def itm_pairs(self) -> ItmPairs:
        """:class:`~falcon_cli.objectives.itm.ItmPairs` of the 3B ITM inputs, with labels
        ``[1]*B + neg_labels`` (int64 [3B]) instead of ``[1]*B + [0]*2B``."""
        pairs = itm_pair_indices(self.neg_text_for_image, self.neg_image_for_text)
        b = self.neg_text_for_image.shape[0]
        labels = torch.cat([pairs.labels[:b], self.neg_labels.to(pairs.labels.device, torch.long)])
        return ItmPairs(pairs.image_index, pairs.text_index, labels)

    def counts(self) -> dict[str, int]:
        """The four counts as a dict (for logging)."""
        return {
            "converted_i2t": self.converted_i2t,
            "converted_t2i": self.converted_t2i,
            "swapped_i2t": self.swapped_i2t,
            "swapped_t2i": self.swapped_t2i,
        }


def _check_threshold(name: str, value: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}") from None
    if not 0.0 <= v <= 1.0:  # also rejects NaN
        raise ValueError(f"{name} must lie in [0, 1], got {value!r}")
    return v


def _top2(sim: Tensor) -> tuple[Tensor, Tensor]:
    """Hardest and second-hardest off-diagonal column per row of a float32 [B, B] matrix.

    Ranking by ``sim`` equals ranking by ``softmax(sim)`` with the diagonal zeroed (softmax is
    monotone) but cannot tie through underflow. Ties go to the lower index (stable sort), as
    in :func:`~falcon_cli.objectives.itm.hardest_negatives`. With B == 2, ``k2 = k1``.
    """
    b = sim.shape[0]
    eye = torch.eye(b, dtype=torch.bool, device=sim.device)
    order = sim.masked_fill(eye, float("-inf")).sort(dim=1, descending=True, stable=True).indices
    k1 = order[:, 0]
    k2 = order[:, 1] if b >= 3 else k1
    return k1, k2


@torch.no_grad()
def connection_mining(
    sim_i2t: Tensor,
    sim_t2i: Tensor,
    score: ScoreFn,
    *,
    high: float = 0.8,
    low: float = 0.5,
    mlm_pairs: str = "per_direction",
) -> ConnectionMining:
    """MAFA's Efficient Connection Mining on one batch (methods.md §2.2), vectorised, no grad.

    Args:
        sim_i2t: [B, N] image-to-text similarities (rows images; N >= B, only the first B
            columns, the in-batch texts, are candidates, so queue-extended matrices work).
        sim_t2i: [B, N] text-to-image similarities (rows texts).
        score: the discriminator, ``score(image_index, text_index) -> p(match)`` float [n]
            (see :data:`ScoreFn`). Called exactly once, under ``no_grad``, with the 2B hardest
            candidates: first the image anchors ``(b, k1_i2t[b])`` for b = 0..B-1, then the
            text anchors ``(k1_t2i[b], b)``, so the frozen Con-D runs one batched pass.
        high: convert when ``p > high`` (MAFA 0.8; FALCON's COCO run needed 0.98).
        low: ambiguous when ``low < p < high`` (0.5); ``p <= low`` and ``p == high`` keep
            the hardest candidate as a plain negative. Need ``0 <= low <= high <= 1``.
        mlm_pairs: the extra MLM pairs: ``per_direction`` (one per conversion, as MAFA's code:
            a pair converted in both directions twice) or ``distinct`` (each converted pair once).

    B must be at least 2. With B == 2 every anchor has a single candidate and no
    second-hardest one: an ambiguous anchor then keeps ``k1`` as a plain negative (label 0)
    and is not counted as swapped.

    Returns a :class:`ConnectionMining`. Raises ValueError on bad shapes, thresholds, or a
    ``score`` result that is not [2B].
    """
    low_f, high_f = _check_threshold("low", low), _check_threshold("high", high)
    if low_f > high_f:
        raise ValueError(f"low must not exceed high, got low={low!r} > high={high!r}")
    if mlm_pairs not in MLM_PAIRS:
        raise ValueError(f"mlm_pairs must be one of {', '.join(MLM_PAIRS)}, got {mlm_pairs!r}")
    if not callable(score):
        raise ValueError(f"score must be callable (image_index, text_index) -> p, got {type(score).__name__}")
    if not isinstance(sim_i2t, Tensor) or not isinstance(sim_t2i, Tensor) or sim_i2t.dim() != 2 or sim_t2i.dim() != 2:
        raise ValueError("sim_i2t and sim_t2i must be 2-D tensors [B, N]")
    b = sim_i2t.shape[0]
    if sim_t2i.shape[0] != b:
        raise ValueError(
            f"sim_i2t and sim_t2i must have the same B rows, got {tuple(sim_i2t.shape)} and {tuple(sim_t2i.shape)}"
        )
    if b < 2:
        raise ValueError(f"sim_i2t: connection mining needs a batch of at least 2 pairs, got B={b}")
    for name, s in (("sim_i2t", sim_i2t), ("sim_t2i", sim_t2i)):
        if s.shape[1] < b:
            raise ValueError(f"{name} needs at least B={b} columns, got {tuple(s.shape)}")

    dev = sim_i2t.device
    with fp32_region(dev):
        k1_i2t, k2_i2t = _top2(sim_i2t[:, :b].detach().float())
        k1_t2i, k2_t2i = _top2(sim_t2i[:, :b].detach().to(dev).float())

    # One batched Con-D pass over the 2B hardest candidates.
    ar = torch.arange(b, device=dev)
    image_index = torch.cat([ar, k1_t2i])
    text_index = torch.cat([k1_i2t, ar])
    p = score(image_index, text_index)
    p = torch.as_tensor(p)
    if p.numel() != 2 * b:
        raise ValueError(f"score must return 2B={2 * b} probabilities (one per pair), got shape {tuple(p.shape)}")
    p = p.detach().reshape(-1).to(device=dev, dtype=torch.float32)
    p_i2t, p_t2i = p[:b], p[b:]

    conv_i2t, conv_t2i = p_i2t > high_f, p_t2i > high_f
    has_k2 = b >= 3
    amb_i2t = (p_i2t > low_f) & (p_i2t < high_f) & has_k2
    amb_t2i = (p_t2i > low_f) & (p_t2i < high_f) & has_k2

    eye = torch.eye(b, dtype=torch.bool, device=dev)
    mask_i2t = eye.clone()
    mask_i2t[ar, k1_i2t] |= conv_i2t
    mask_t2i = eye.clone()
    mask_t2i[ar, k1_t2i] |= conv_t2i

    neg_text_for_image = torch.where(amb_i2t, k2_i2t, k1_i2t)
    neg_image_for_text = torch.where(amb_t2i, k2_t2i, k1_t2i)
    # itm_pair_indices order: text-anchor pairs first, then image-anchor pairs.
    neg_labels = torch.cat([conv_t2i, conv_i2t]).long()

    # MLM: the converted (image, text) pairs of both directions, sorted by (image, text); one per
    # conversion (MAFA's code) or one per distinct pair.
    conv = torch.cat([conv_i2t, conv_t2i])
    keys = image_index[conv] * b + text_index[conv]
    keys = torch.unique(keys) if mlm_pairs == "distinct" else torch.sort(keys).values
    mlm_image_index, mlm_text_index = keys // b, keys % b

    return ConnectionMining(
        positive_mask_i2t=mask_i2t,
        positive_mask_t2i=mask_t2i,
        neg_text_for_image=neg_text_for_image,
        neg_image_for_text=neg_image_for_text,
        neg_labels=neg_labels,
        mlm_image_index=mlm_image_index,
        mlm_text_index=mlm_text_index,
        converted_i2t=int(conv_i2t.sum()),
        converted_t2i=int(conv_t2i.sum()),
        swapped_i2t=int(amb_i2t.sum()),
        swapped_t2i=int(amb_t2i.sum()),
        scores_i2t=p_i2t,
        scores_t2i=p_t2i,
        hardest_text_for_image=k1_i2t,
        hardest_image_for_text=k1_t2i,
    )


def smoothing(epoch: int, alpha: float = 0.5) -> float:
    """S-ITC label-smoothing epsilon for ``epoch`` (0-based): 0 in epoch 0, ``alpha`` from epoch 1 on (M-2).

    ``alpha`` defaults to 0.5 (M-1; MAFA's BLIP-2 variant uses 0.2). Pass the result as
    ``itc_grit(..., label_smoothing=...)``: targets become ``(1 - alpha) * y~ + alpha / B``.
    Raises ValueError for a negative ``epoch`` or ``alpha`` outside [0, 1].
    """
    if isinstance(epoch, bool) or not isinstance(epoch, numbers.Integral) or epoch < 0:
        raise ValueError(f"epoch must be a non-negative integer, got {epoch!r}")
    alpha_f = _check_threshold("alpha", alpha)
    return 0.0 if epoch == 0 else alpha_f
