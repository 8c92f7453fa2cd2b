"""AdamW with ALBEF's parameter groups, and the GRIT/ALBEF learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: decayed weights, and biases / norms / every other 1-D tensor without decay.

    ALBEF's ``add_weight_decay`` also exempts 1-D tensors; its 0-d ``temp`` ends up decayed,
    which we keep (0-d tensors are not 1-D) so results match the reference.
    """
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim == 1 or name.endswith(".bias") else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, lr: float, weight_decay: float, betas=(0.9, 0.999)) -> torch.optim.AdamW:
    """AdamW over :func:`parameter_groups`, fused: one kernel for every parameter (on a GPU; on a CPU
    PyTorch's default per-tensor loop cost 3% of the demo), and the ``found_inf`` input that lets
    :class:`~falcon_cli.runtime.finite.NonFiniteGuard` skip a step without a host synchronisation.
    The update is AdamW's within float rounding; state dicts are interchangeable with the unfused one."""
    return torch.optim.AdamW(parameter_groups(model, weight_decay), lr=lr, betas=betas, fused=True)


def learning_rate(
    step: int, epoch: int, *, lr: float, min_lr: float, warmup_lr: float, warmup_steps: int, cosine_epochs: int
) -> float:
    """The reference schedule (ALBEF/GRIT ``scheduler/cosine_lr.py`` with warm-up in iterations).

    * During the first ``warmup_steps`` optimizer steps: linear from ``warmup_lr`` to ``lr``.
    * After that: a per-epoch cosine from ``lr`` toward ``min_lr`` over ``optim.cosine_epochs``
      epochs, evaluated at the current epoch (the reference steps it once per epoch).

    GRIT builds the cosine for 30 epochs and trains 20, so its last epoch runs at about
    3.7e-5 rather than 1e-5; recipes reproduce that with ``optim.cosine_epochs: 30``.
    """
    if step < warmup_steps:
        return warmup_lr + (lr - warmup_lr) * step / max(1, warmup_steps)
    progress = min(epoch, cosine_epochs) / max(1, cosine_epochs)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * progress))


def set_learning_rate(optimizer: torch.optim.Optimizer, value: float) -> None:
    """Write ``value`` into every parameter group."""
    for group in optimizer.param_groups:
        group["lr"] = value
