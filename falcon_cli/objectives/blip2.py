"""BLIP-2 stage-1 losses that ALBEF's objectives do not already provide: pure tensor functions, float32.

* ITG (image-grounded text generation): :func:`itg_loss` over the logits of
  :meth:`~falcon_cli.models.blip2.Blip2QFormer.itg_logits`.
* ITM: no function of its own. BLIP-2's ITM loss (LAVIS ``Blip2Qformer.forward``: ``itm_head`` averaged
  over the queries on ``[pos; pos; neg]`` texts x ``[pos; neg; pos]`` images, cross-entropy against labels
  ``[1]*B + [0]*2B``, mean over the 3B pairs) is exactly :func:`falcon_cli.objectives.itm.itm_loss` given
  the positives' logits ``[B, 2]`` and the negatives' ``[2B, 2]``: call
  ``itm_loss(logits[:B], logits[B:])`` on the ``[3B, 2]`` logits of
  :class:`~falcon_cli.objectives.itm.ItmPairs` order (B positives, then B negative images, then B negative
  texts: LAVIS's order), or let :func:`~falcon_cli.objectives.itm.mined_itm_loss` mine the pairs.
* ITC: the existing ITC functions over :func:`~falcon_cli.objectives.common.image_text_similarity`, which
  scores ``[B, Q, E]`` query features by their best query (BLIP-2's definition).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from falcon_cli.objectives.common import fp32_region

__all__ = ["ITG_LABEL_SMOOTHING", "itg_loss"]

ITG_LABEL_SMOOTHING = 0.1
"""LAVIS's Q-Former LM loss smooths its targets by 0.1 (``BertLMHeadModel``: ``CrossEntropyLoss(label_smoothing=0.1)``)."""


def itg_loss(logits: Tensor, input_ids: Tensor, attention_mask: Tensor, *,
             label_smoothing: float = ITG_LABEL_SMOOTHING, per_sample: bool = False) -> Tensor:
    """Image-grounded text generation loss (teacher forcing), float32 even under autocast.

    Args:
        logits: [B, L, V] from ``itg_logits`` (position t has seen the decoder input up to t: [DEC] and
            the caption's tokens 1..t).
        input_ids: int64 [B, L], the caption (position 0, [CLS], is what [DEC] replaced).
        attention_mask: [B, L], 1 for a token, 0 for padding.
        label_smoothing: the cross-entropy's target smoothing (LAVIS: 0.1; 0 gives plain next-token CE).
        per_sample: return each caption's mean token loss [B] instead of the batch mean.

    Position t predicts token t + 1 (the logits are shifted left by one, the labels right), and only real
    tokens are predicted: token t + 1 counts iff ``attention_mask[:, t + 1]`` is 1. Each predicted token's
    loss is ``(1 - s) * -log p(y) + s * mean_v(-log p(v))`` for smoothing ``s``. The scalar is the mean over
    every predicted token of the batch (``torch.nn.CrossEntropyLoss`` with ``ignore_index``, as LAVIS), so
    longer captions weigh more; ``per_sample[b]`` is the mean over caption b's predicted tokens, and
    ``scalar == sum_b n_b * per_sample[b] / sum_b n_b``. A caption (or batch) without a predicted token
    gives 0, not NaN, still connected to the graph. Only the predicted positions are cast to float32.
    """
    if logits.dim() != 3 or logits.shape[:2] != input_ids.shape or input_ids.shape != attention_mask.shape:
        raise ValueError(f"need logits [B, L, V] with input_ids and attention_mask [B, L], got {tuple(logits.shape)}, "
                         f"{tuple(input_ids.shape)}, {tuple(attention_mask.shape)}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must lie in [0, 1], got {label_smoothing}")
    keep = attention_mask[:, 1:].bool()                       # [B, L - 1]: token t + 1 is real
    picked = logits[:, :-1][keep].float()                      # [M, V]
    targets = input_ids[:, 1:][keep].long()                    # [M]
    with fp32_region(logits.device):
        token = F.cross_entropy(picked, targets, reduction="none", label_smoothing=label_smoothing)  # [M]
    if not per_sample:
        return token.sum() / keep.sum().clamp(min=1)
    rows = keep.nonzero()[:, 0]
    sums = torch.zeros(keep.shape[0], dtype=token.dtype, device=token.device).index_add(0, rows, token)
    return sums / keep.sum(dim=1).clamp(min=1)
