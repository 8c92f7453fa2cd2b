"""Masked language modelling: a reusable mask object and the loss.

FALCON's reward compares the MLM loss of the same mini-batch before and after an update
with *identical* masking, so the mask is an explicit object (:class:`MlmMask`) that is
sampled once and fed to both forwards. Consumers must not modify ``masked_ids`` /
``labels`` in place.

Masking follows ALBEF / GRIT-VLP ``mask()``: each token is selected with probability p
(Bernoulli), except [PAD] (and positions with ``attention_mask == 0``) and [CLS]; [SEP] is
NOT excluded, as in GRIT/ALBEF. Of the selected tokens 80% become [MASK], 10% a uniformly
random token id in ``[0, vocab_size)`` (special tokens included, as in BERT/ALBEF) and
10% stay unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from falcon_cli.objectives.common import fp32_region
from falcon_cli.runtime.precision import to_device_async

__all__ = ["IGNORE_INDEX", "MlmMask", "mlm_loss"]

IGNORE_INDEX = -100
"""Label of positions that are not predicted (PyTorch / transformers convention)."""


@dataclass(frozen=True, eq=False)
class MlmMask:
    """One sampled MLM mask for a batch of token ids.

    * ``masked_ids``: int64 [B, L], the model input (with [MASK] / random / kept tokens).
    * ``labels``: int64 [B, L], the original id at selected positions, -100 elsewhere.
    """

    masked_ids: Tensor
    labels: Tensor

    @classmethod
    def sample(
        cls,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        *,
        vocab_size: int,
        mask_token_id: int,
        pad_token_id: int,
        cls_token_id: int,
        probability: float = 0.5,
        generator: torch.Generator | None = None,
    ) -> "MlmMask":
        """Sample a mask for ``input_ids`` [B, L] (``attention_mask`` [B, L] or None).

        Random numbers are drawn on ``generator``'s device (CPU generator for a CUDA batch
        is fine: the result is moved to ``input_ids.device``), so the mask is a
        deterministic function of the generator state. Without a generator the global RNG
        of ``input_ids.device`` is used.
        """
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [B, L], got {tuple(input_ids.shape)}")
        if attention_mask is not None and attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask {tuple(attention_mask.shape)} must match input_ids {tuple(input_ids.shape)}"
            )
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"masking probability must lie in [0, 1], got {probability}")
        if vocab_size <= 0:
            raise ValueError(f"vocab_size must be positive, got {vocab_size}")
        out_dev = input_ids.device
        dev = generator.device if generator is not None else out_dev
        ids = input_ids.to(dev, torch.long)
        shape = ids.shape
        select = torch.rand(shape, generator=generator, device=dev) < probability
        split = torch.rand(shape, generator=generator, device=dev)
        random_words = torch.randint(vocab_size, shape, generator=generator, device=dev, dtype=torch.long)
        select &= (ids != pad_token_id) & (ids != cls_token_id)
        if attention_mask is not None:
            select &= attention_mask.to(dev).bool()
        to_mask = select & (split < 0.8)
        to_random = select & (split >= 0.8) & (split < 0.9)
        masked_ids = torch.where(to_mask, torch.full_like(ids, mask_token_id), ids)
        masked_ids = torch.where(to_random, random_words, masked_ids)
        labels = torch.where(select, ids, torch.full_like(ids, IGNORE_INDEX))
        return cls(masked_ids.to(out_dev), labels.to(out_dev))

    @property
    def selected(self) -> Tensor:
        """Bool [B, L]: positions that are predicted (``labels != -100``)."""
        return self.labels != IGNORE_INDEX

    @property
    def num_selected(self) -> Tensor:
        """Int64 [B]: number of predicted positions per sample."""
        return self.selected.sum(dim=1)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "MlmMask":
        """A copy on ``device``; ``non_blocking``: from the CPU to a GPU without waiting for its queue
        (:func:`~falcon_cli.runtime.precision.to_device_async`)."""
        if non_blocking:
            return MlmMask(to_device_async(self.masked_ids, device), to_device_async(self.labels, device))
        return MlmMask(self.masked_ids.to(device), self.labels.to(device))

    def state_dict(self) -> dict[str, Tensor]:
        """``{"masked_ids": [B, L], "labels": [B, L]}`` (CPU clones), e.g. for a checkpoint."""
        return {"masked_ids": self.masked_ids.detach().cpu().clone(), "labels": self.labels.detach().cpu().clone()}

    @classmethod
    def from_state_dict(cls, state: dict[str, Tensor], device: torch.device | str | None = None) -> "MlmMask":
        """Rebuild a mask from :meth:`state_dict` output (optionally onto ``device``)."""
        missing = {"masked_ids", "labels"} - set(state)
        if missing:
            raise KeyError(f"MlmMask state lacks {sorted(missing)}")
        mask = cls(state["masked_ids"].to(torch.long), state["labels"].to(torch.long))
        return mask.to(device) if device is not None else mask


def mlm_loss(logits: Tensor, labels: Tensor, *, per_sample: bool = False, fixed_shape: bool = False) -> Tensor:
    """MLM cross-entropy over the predicted positions (``labels != -100``), in float32.

    Args:
        logits: [B, L, V] (any leading shape ``[..., V]`` matching ``labels``).
        labels: int64 [B, L], -100 where not predicted (:attr:`MlmMask.labels`).
        per_sample: return [B] instead of a scalar (needs labels of shape [B, L]).

    Reduction: the scalar is the mean over all predicted tokens of the batch (as
    transformers' ``BertForMaskedLM``), so samples with more masked tokens weigh more.
    ``per_sample[b]`` is the mean over sample b's predicted tokens; hence
    ``scalar == sum_b n_b * per_sample[b] / sum_b n_b`` with ``n_b`` =
    ``(labels[b] != -100).sum()``. A batch (or sample) without predicted tokens gives 0
    (not NaN), still connected to the graph. Only the predicted positions are cast to
    float32, so the [B, L, V] logits are never copied in full.

    ``fixed_shape`` (the scalar only; ``pretrain.runtime.graph_step``): the same mean computed over every position, the
    unpredicted ones weighted 0, so that no shape depends on the mask (a gather of the selected positions is a
    data-dependent shape, which a captured graph cannot hold); it costs the float32 copy of all the logits.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match labels {tuple(labels.shape)} (+ vocab dim)")
    sel = labels != IGNORE_INDEX
    if fixed_shape and not per_sample:
        with fp32_region(logits.device):
            total = F.cross_entropy(
                logits.float().reshape(-1, logits.shape[-1]),
                labels.reshape(-1).long(),
                ignore_index=IGNORE_INDEX,
                reduction="sum",
            )
        return total / sel.sum().clamp(min=1)
    picked = logits[sel].float()  # [M, V]
    with fp32_region(logits.device):
        tok = F.cross_entropy(picked, labels[sel].long(), reduction="none")  # [M]
    if not per_sample:
        return tok.sum() / sel.sum().clamp(min=1)
    if labels.dim() != 2:
        raise ValueError(f"per_sample needs labels [B, L], got {tuple(labels.shape)}")
    rows = sel.nonzero()[:, 0]
    sums = torch.zeros(labels.shape[0], dtype=tok.dtype, device=tok.device).index_add(0, rows, tok)
    return sums / sel.sum(dim=1).clamp(min=1)
