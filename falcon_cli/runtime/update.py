"""One optimizer update, the same in every training loop: pretraining, fine-tuning and the unimodal encoders.

The loop computes the loss (under autocast) and the learning rate; :class:`UpdateStep` does the rest of the step:

1. backward, through the GradScaler (a no-op unless fp16);
2. the gradient norm: clipped to ``grad_clip`` when set, else only measured (one fused kernel; skipped under fp16,
   whose scaler owns the inf check);
3. the non-finite guard (:class:`~falcon_cli.runtime.finite.NonFiniteGuard`), on the device: from the first
   non-finite loss or gradient on, the fused AdamW skips every update, and no host sync is spent per step;
4. the optimizer's step and the scaler's update.

The guard's verdict is read where the loop syncs anyway (``sync=True``: a logged step, a checkpoint, FALCON's
scheduler; every step under fp16). A non-finite step then stops the run through the loop's own ``stop`` (which
knows its keys and its checkpoints), saving nothing: the weights that gave it are not worth resuming.
"""

from __future__ import annotations

from typing import Callable, NoReturn

import torch
from torch import nn

from falcon_cli.runtime.finite import NonFiniteGuard


class UpdateStep:
    """Backward, clipping, the non-finite guard and the optimizer's step of one training step.

    Args:
        module: what is trained (its parameters' gradients are clipped and measured).
        optimizer: a fused AdamW (:func:`~falcon_cli.runtime.optim.build_optimizer`), which reads the guard's verdict.
        scaler: the run's GradScaler (:func:`~falcon_cli.runtime.precision.grad_scaler`; disabled but for fp16).
        precision: ``fp32``, ``bf16`` or ``fp16``.
        grad_clip: clip the global gradient norm to this; None = measure it only.
        stop: called with the first non-finite step (``epoch``, ``step``, ``loss``, each part, ``norm``) when the
            loop syncs; it raises the loop's one line.
        parts: the names of the loss parts the loop passes (the first step's, when None).
    """

    def __init__(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        scaler,
        precision: str,
        *,
        grad_clip: float | None,
        stop: Callable[[dict], NoReturn],
        parts: tuple[str, ...] | None = None,
    ):
        self.module, self.optimizer, self.scaler, self.precision = module, optimizer, scaler, precision
        self.grad_clip, self.stop = grad_clip, stop
        self.device = next(module.parameters()).device
        self.guard = NonFiniteGuard(self.device, parts) if parts is not None else None

    def __call__(
        self, loss: torch.Tensor, parts: dict[str, torch.Tensor], epoch: int, step: int, *, sync: bool
    ) -> torch.Tensor | None:
        """Update the weights from ``loss``; returns the gradient norm before clipping (None under fp16 without
        clipping). ``step``: the optimizer step this is (for the stop line)."""
        if self.guard is None:
            self.guard = NonFiniteGuard(self.device, tuple(parts))
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        norm, fp16 = None, self.precision == "fp16"
        if self.grad_clip is not None:
            self.scaler.unscale_(self.optimizer)
            norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.grad_clip)
        elif not fp16:
            norm = torch.nn.utils.get_total_norm([q.grad for q in self.module.parameters() if q.grad is not None])
        self.guard.observe(
            self.optimizer, epoch, step, loss, tuple(parts.values()), None if fp16 else norm, skip=not fp16
        )
        if sync or fp16:
            self.check()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return norm

    def check(self) -> None:
        """Stop (through ``stop``) at the run's first non-finite step, if there was one: one host sync."""
        bad = self.guard.first() if self.guard is not None else None
        if bad is not None:
            self.stop(bad)


__all__ = ["UpdateStep"]
