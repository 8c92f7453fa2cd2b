"""SigLIP's pairwise sigmoid loss, with the two ways a false-negative method can treat a flagged pair.

Every (image i, text j) pair of a batch is one binary classification: ``z_ij = +1`` for a match, ``-1``
otherwise, logit ``l_ij = t · <x_i, y_j> + b`` with a learnable scale ``t`` (SigLIP: ``exp`` of a log-scale
initialised at ``log 10``) and bias ``b`` (initialised at ``-10``)::

    loss = -1/B · sum_ij log sigmoid(z_ij · l_ij)

(open_clip's ``SigLipLoss`` divides the sum by the number of images B, as here.) Unlike the softmax ITC,
each pair's term stands alone, so "dropping" and "converting" a false negative are both one entry:

* ``positive_mask`` (convert): the pair's label becomes ``+1``, it is pulled together like the diagonal;
* ``exclude`` (drop): the pair's term is removed from the sum (the divisor stays B: the other terms keep
  their weight, whereas a softmax renormalises over what is left);
* ``negative_weights`` (re-weight, DiHT's and SRCL's way): each negative pair's term is multiplied by a
  constant weight (rows of the softmax methods' weights average to 1, so the loss keeps its scale).

How each false-negative method uses them is in :meth:`falcon_cli.objectives.false_negatives.FalseNegatives.sigmoid`.

The loss runs in float32 whatever the autocast dtype.

Under DDP (:func:`distributed_sigmoid_loss`) each rank scores its images against its own texts, then passes
text features around the ring of ranks, one neighbour at a time (:class:`RingShift`, open_clip's "shift"
exchange: world - 1 point-to-point steps, never an all-gather of every rank's features at once), scoring
its images against each visiting chunk as negatives; the gradient of a visiting chunk travels back the
same way to the rank that owns it. The mean of the ranks' losses (what DDP's gradient averaging
optimises) is the loss of the global batch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from falcon_cli.objectives.common import fp32_region, image_text_similarity

SIGLIP_LOGIT_SCALE_INIT = 10.0
"""SigLIP's initial logit scale ``t`` (learned as ``log t``)."""
SIGLIP_LOGIT_BIAS_INIT = -10.0
"""SigLIP's initial logit bias ``b``: with B - 1 negatives per positive, a prior towards "no match"."""


def sigmoid_labels(n: int, device: torch.device, positive_mask: Tensor | None = None) -> Tensor:
    """float32 [n, n] labels: +1 on the diagonal and where ``positive_mask`` (bool, rows images) is True, -1
    elsewhere."""
    positives = torch.eye(n, dtype=torch.bool, device=device)
    if positive_mask is not None:
        positives = positives | positive_mask.to(device).bool()
    return positives.float() * 2 - 1


def sigmoid_loss(
    image_feat: Tensor,
    text_feat: Tensor,
    logit_scale: float | Tensor,
    logit_bias: float | Tensor,
    *,
    positive_mask: Tensor | None = None,
    exclude: Tensor | None = None,
    negative_weights: Tensor | None = None,
    negatives_only: bool = False,
) -> Tensor:
    """SigLIP's sigmoid loss of a batch (module docstring), float32.

    Args:
        image_feat: [B, D] normalised image features (or [B, Q, D]: the best query's similarity is used).
        text_feat: [B, D] normalised text features.
        logit_scale: the scale ``t`` itself (not its log), a float or a 0-d tensor (gradient flows).
        logit_bias: the bias ``b``, a float or a 0-d tensor.
        positive_mask: optional bool [B, B] (rows images, columns texts): pairs that count as matches
            (a false-negative method's "convert"); the diagonal always does.
        exclude: optional bool [B, B]: pairs whose term is removed (a method's "drop"); never the diagonal.
        negative_weights: optional float [B, B] (no gradient): each negative pair's term is multiplied by its
            weight (a method's "re-weight"); positives (the diagonal, ``positive_mask``) keep weight 1.
        negatives_only: every pair is a non-match (another rank's texts: no diagonal).
    """
    if text_feat.dim() != 2 or image_feat.shape[0] != text_feat.shape[0]:
        raise ValueError(
            f"image and text features need the same batch size, got {tuple(image_feat.shape)} "
            f"and {tuple(text_feat.shape)}"
        )
    n, device = text_feat.shape[0], text_feat.device
    with fp32_region(device):
        logits = image_text_similarity(image_feat.float(), text_feat.float()) * logit_scale + logit_bias
        labels = -torch.ones(n, n, device=device) if negatives_only else sigmoid_labels(n, device, positive_mask)
        terms = F.logsigmoid(labels * logits)
        if negative_weights is not None:
            terms = terms * torch.where(
                labels > 0, torch.ones_like(terms), negative_weights.to(device).float().detach()
            )
        if exclude is not None:
            keep = ~(exclude.to(device).bool() & ~torch.eye(n, dtype=torch.bool, device=device))
            terms = terms * keep
        return -terms.sum() / n


class RingShift(torch.autograd.Function):
    """Send a tensor to the next rank and receive the previous rank's (same shape); the backward sends the
    gradient of what was received back to the previous rank and receives, from the next one, the gradient
    of what was sent."""

    @staticmethod
    def forward(ctx, tensor: Tensor) -> Tensor:  # noqa: D102 - see the class
        return _exchange(tensor, to=+1)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:  # noqa: D102
        return _exchange(grad, to=-1)


def _exchange(tensor: Tensor, to: int) -> Tensor:
    """``tensor`` to rank ``rank + to``, and the one rank ``rank - to`` sends, received (point to point)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    received = torch.empty_like(tensor)
    ops = [
        dist.P2POp(dist.isend, tensor.contiguous(), (rank + to) % world),
        dist.P2POp(dist.irecv, received, (rank - to) % world),
    ]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return received


def distributed_sigmoid_loss(
    image_feat: Tensor,
    text_feat: Tensor,
    logit_scale: float | Tensor,
    logit_bias: float | Tensor,
    *,
    positive_mask: Tensor | None = None,
    exclude: Tensor | None = None,
    negative_weights: Tensor | None = None,
) -> Tensor:
    """:func:`sigmoid_loss` of this rank's images against every rank's texts (module docstring): its own batch
    (with the false-negative ``positive_mask``/``exclude``/``negative_weights`` of its own pairs), then each other
    rank's texts as negatives, passed around the ring. Plain :func:`sigmoid_loss` without an initialised process group
    or with one process."""
    loss = sigmoid_loss(
        image_feat,
        text_feat,
        logit_scale,
        logit_bias,
        positive_mask=positive_mask,
        exclude=exclude,
        negative_weights=negative_weights,
    )
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return loss
    chunk = text_feat
    for _ in range(dist.get_world_size() - 1):
        chunk = RingShift.apply(chunk)
        loss = loss + sigmoid_loss(image_feat, chunk, logit_scale, logit_bias, negatives_only=True)
    return loss


__all__ = [
    "RingShift",
    "SIGLIP_LOGIT_BIAS_INIT",
    "SIGLIP_LOGIT_SCALE_INIT",
    "distributed_sigmoid_loss",
    "sigmoid_labels",
    "sigmoid_loss",
]
