"""Stop at the first non-finite loss or gradient without a host synchronisation in every step.

Reading a loss on the host (``if not torch.isfinite(loss)``) drains a GPU's queue once per step, so
the next step's kernels start only after the CPU has launched them again. :class:`NonFiniteGuard`
keeps each step's verdict on the device instead: from the first non-finite step on, AdamW skips
every update on the device (its ``found_inf`` input, as a GradScaler uses it), so the weights stay
those of the last finite step however late the verdict is read; :meth:`NonFiniteGuard.first` reads
it once, on the steps that log or checkpoint anyway.
"""

from __future__ import annotations

import torch


class NonFiniteGuard:
    """Watches a run's losses and gradient norms, on ``device``.

    Call :meth:`observe` after the backward, before ``optimizer.step()``; the optimizer must be a
    fused AdamW (:func:`falcon_cli.runtime.optim.build_optimizer`), which reads the guard's verdict
    as ``found_inf``. Under fp16 the GradScaler owns ``found_inf``: use :meth:`observe` with
    ``skip=False`` there (the verdict is still recorded, the scaler skips inf steps its own way).
    """

    def __init__(self, device: torch.device, parts: tuple[str, ...] = ("itc", "itm", "mlm")):
        self.parts = tuple(parts)  # the names of the loss parts :meth:`observe` is given, in order
        self.halted = torch.zeros((), dtype=torch.float32, device=device)  # 1.0 from the first bad step on
        self.record = torch.zeros(
            4 + len(self.parts), dtype=torch.float64, device=device
        )  # epoch, step, loss, parts, norm

    def observe(
        self,
        optimizer: torch.optim.Optimizer,
        epoch: int,
        step: int,
        loss: torch.Tensor,
        parts: tuple[torch.Tensor, ...],
        norm: torch.Tensor | None = None,
        *,
        skip: bool = True,
    ) -> None:
        """Record whether this step's ``loss`` (and gradient ``norm``) are finite, with the loss ``parts``
        (in the order of the guard's names) of the first step that was not; with ``skip``, make the optimizer skip this
        update (and every later one) on the device once any step was non-finite."""
        bad = ~torch.isfinite(loss.detach())
        if norm is not None:
            bad = bad | ~torch.isfinite(norm.detach())
        first = bad & (self.halted == 0)
        # (new_full is a fill kernel on the device: torch.tensor(x, device=...) would be a blocking copy)
        values = torch.stack(
            [
                loss.new_full((), float(epoch)),
                loss.new_full((), float(step)),
                loss.detach(),
                *(part.detach().to(loss.dtype) for part in parts),
                loss.new_zeros(()) if norm is None else norm.detach().to(loss.dtype),
            ]
        ).double()
        self.record = torch.where(first, values, self.record)
        self.halted = torch.maximum(self.halted, bad.float())
        if skip:
            optimizer.found_inf = self.halted

    def first(self) -> dict | None:
        """The first non-finite step (``epoch``, ``step``, ``loss``, each loss part by name, ``norm``), or
        None while every step was finite. One host synchronisation."""
        if not bool(self.halted):
            return None
        epoch, step, loss, *parts, norm = self.record.tolist()
        return {"epoch": int(epoch), "step": int(step), "loss": loss, **dict(zip(self.parts, parts)), "norm": norm}
