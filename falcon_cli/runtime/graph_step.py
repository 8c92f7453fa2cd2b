"""The training step's forward through the objective: eager, or captured whole (``pretrain.runtime.graph_step``).

An eager step on a GPU is set by the host: albef-base launches about 24,000 operators a step at about 7 µs each
(benchmarks/README.md). Captured, the forward with every loss, ITM mining and MLM is one
``torch.compile(fullgraph=True)`` graph; AOTAutograd compiles its backward with it, and on CUDA
``mode="reduce-overhead"`` replays both as CUDA graphs. What a captured step cannot hold is kept out of it:

* data-dependent shapes: captions come padded to one length (the collate's ``fixed_length``), and the objective's
  ``fixed_shapes`` makes MLM weight its masked positions instead of gathering them;
* host reads: the checks that read the device (unknown pair ids, duplicate ids) are skipped while compiling (the
  ids come from the dataset itself), and the momentum queue's pointer stays a tensor;
* generators: the MLM mask is drawn on the host before the step (as always), and ITM's sampled negatives get
  uniforms drawn before the step from the run's ITM generator (so a resumed run draws the same);
* numbers that change every step: the distillation weight and the step's progress (SRCL's mixing schedule) enter
  as tensors.

Outputs of a CUDA-graph replay are overwritten by the next replay, so the step's outputs are cloned (a few small
tensors); the optimizer, gradient clipping and the non-finite guard run after it as before (fused and foreach
kernels: a handful of launches).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from falcon_cli.runtime.precision import autocast


class TrainingForward:
    """``forward(inputs, distill_alpha, itm_generator, context)``: one step's losses (the objective's output).

    Args:
        trainer: the objective, or the objective under DDP.
        precision, device: the run's (autocast around the forward).
        graph: capture it (``pretrain.runtime.graph_step``); else eager, exactly as the loop always ran it.
        sample_itm: ITM negatives are sampled (``losses.itm_negatives: sample``): uniforms are drawn for them.
        mode: ``torch.compile`` mode (None: ``reduce-overhead`` on CUDA, the default elsewhere).
        backend: ``inductor``, ``aot_eager`` or ``eager`` (``pretrain.runtime.graph_backend``).
    """

    def __init__(
        self,
        trainer: torch.nn.Module,
        precision: str,
        device: torch.device,
        *,
        graph: bool = False,
        sample_itm: bool = False,
        mode: str | None = None,
        backend: str = "inductor",
    ):
        self.trainer, self.precision, self.device, self.graph, self.sample_itm = (
            trainer,
            precision,
            device,
            graph,
            sample_itm,
        )
        # The numbers that change every step, as device tensors set in place (a kernel argument, no copy from the host)
        self.alpha, self.progress = (torch.zeros((), device=device) for _ in range(2))
        if graph:
            objective = trainer.module if isinstance(trainer, torch.nn.parallel.DistributedDataParallel) else trainer
            objective.fixed_shapes = True
            if mode is None or mode == "default":
                mode = "reduce-overhead" if device.type == "cuda" else None
            options = {"mode": mode} if backend == "inductor" and mode is not None else {}
            # The objective's own call is compiled, in place (parameter names unchanged), so that under DDP the
            # wrapper stays outside the graph (Dynamo cannot hold DDP's forward whole) and its gradient hooks fire as
            # the compiled backward produces each gradient. dynamic=None: the shapes are fixed by construction; a
            # last, smaller batch gets a graph of its own.
            objective.compile(fullgraph=True, backend=backend, **options)

    def __call__(self, inputs: tuple, distill_alpha: float, itm_generator: torch.Generator | None, context: Any):
        if not self.graph:
            with autocast(self.precision, self.device):
                return self.trainer(*inputs, distill_alpha, itm_generator, context)
        batch = inputs[1].shape[0]
        # (drawn where the eager step's multinomial would draw, from the same generator: a resume replays them)
        itm = (
            torch.rand(
                2,
                batch,
                generator=itm_generator,
                device=itm_generator.device if itm_generator is not None else self.device,
            ).to(self.device)
            if self.sample_itm
            else None
        )
        self.alpha.fill_(float(distill_alpha))
        # (the step's place in the schedules, SRCL's mixing weight: a Python number would be baked into the graph)
        self.progress.fill_(context.step / max(context.total_steps, 1))
        context = dataclasses.replace(context, progress=self.progress)
        if self.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()  # (the previous step's outputs are no longer read)
        with autocast(self.precision, self.device):
            out = self.trainer(*inputs, self.alpha, itm, context)
        # A replay's outputs live in the graph's memory, which the next replay writes over: keep copies.
        return type(out)(*(t.clone() if isinstance(t, torch.Tensor) else t for t in out))


__all__ = ["TrainingForward"]
