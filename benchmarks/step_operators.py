"""Benchmark: host operators per pretraining step, the quantity that set albef-base's step time on an H100.

On the H100 (benchmarks/README.md, issue 32) the host, not the GPU, set the step: each eager operator costs
the host several microseconds whatever its size, and an eager albef-base step took 188 ms, its kernels 102 of
them. How many operators a step dispatches does not depend on the machine, the batch or the resolution, so
this counts them anywhere (a CPU too), for each phase of one ALBEF training step (forward, backward,
optimizer) with the model, objective and optimizer built as the pretrain stage builds them, under bf16
autocast as on a GPU: the number to drive down before a GPU is lent again (by capturing the step in CUDA
graphs, or by writing it with fewer operators).

    PYTHONPATH=. .venv/bin/python benchmarks/step_operators.py                          # albef-base, ~1 min
    PYTHONPATH=. .venv/bin/python benchmarks/step_operators.py --model albef-tiny --precision fp32

Operators are PyTorch's ``aten::`` calls, nested ones included (a linear is its ``addmm`` and the views around
it); "with a kernel" leaves out the views, reshapes and empty allocations that launch nothing on a GPU. The
forward and backward counts are the GPU's too (the same modules dispatch the same operators); the optimizer's
is the CPU's (there the fused AdamW runs tensor by tensor; on a GPU it is a few multi-tensor kernels).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from falcon_compose_ops import NO_KERNEL  # noqa: E402  (beside this script)

from falcon_cli.models.registry import create_model  # noqa: E402
from falcon_cli.objectives.false_negatives import StepContext  # noqa: E402
from falcon_cli.objectives.mlm import MlmMask  # noqa: E402
from falcon_cli.objectives.vlp import VlpObjective  # noqa: E402
from falcon_cli.runtime.optim import build_optimizer  # noqa: E402


def count(prof) -> tuple[int, int, collections.Counter]:
    """(operators, operators with a kernel, the ten most called) of a profile."""
    calls = collections.Counter({e.key: e.count for e in prof.key_averages() if e.key.startswith("aten::")})
    total = sum(calls.values())
    return total, total - sum(n for k, n in calls.items() if k in NO_KERNEL), calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="albef-base")
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16", help="bf16: autocast, as on a GPU")
    parser.add_argument("--batch", type=int, default=4, help="pairs per step (the count does not depend on it)")
    parser.add_argument("--text-tokens", type=int, default=25, help="padded caption length (COCO's ~25)")
    parser.add_argument("--image-size", type=int, default=32, help="small: the count does not depend on it")
    args = parser.parse_args()
    torch.manual_seed(0)
    vocab = 30522
    model = create_model(args.model, vocab_size=vocab, image_size=args.image_size)
    objective = VlpObjective(model)  # ALBEF/GRIT's ITC + ITM (hardest negatives) + MLM, as shapes-demo and COCO
    optimizer = build_optimizer(objective, 1e-4, 0.02)
    batch, length = args.batch, args.text_tokens
    images = torch.randn(batch, 3, args.image_size, args.image_size)
    ids = torch.randint(1000, vocab, (batch, length))
    ids[:, 0] = 101
    attention = torch.ones(batch, length, dtype=torch.long)
    attention[1:, length - 5 :] = 0  # some padding, as real batches have
    generator = torch.Generator().manual_seed(0)
    mask = MlmMask.sample(
        ids,
        attention,
        probability=0.5,
        generator=generator,
        vocab_size=vocab,
        mask_token_id=103,
        pad_token_id=0,
        cls_token_id=101,
    )

    def autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16) if args.precision == "bf16" else contextlib.nullcontext()

    def step(profiles: dict | None = None) -> None:
        phase = (
            (lambda name: profile(activities=[ProfilerActivity.CPU]))
            if profiles is not None
            else (lambda name: contextlib.nullcontext())
        )
        context = StepContext(torch.arange(batch), 1, 10, 100, None)
        with phase("forward") as forward, autocast():
            loss = objective(images, ids, attention, mask, 0.4, generator, context).loss
        with phase("backward") as backward:
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
        with phase("optimizer") as update:
            optimizer.step()
        if profiles is not None:
            profiles.update(forward=forward, backward=backward, optimizer=update)

    step()  # warm-up: lazy initialisations and the optimizer's state stay out of the count
    profiles: dict = {}
    step(profiles)
    print(f"{args.model}, {args.precision}, {length} text tokens: host operators per training step")
    totals = [0, 0]
    for name, prof in profiles.items():
        ops, kernels, calls = count(prof)
        totals[0] += ops
        totals[1] += kernels
        top = ", ".join(f"{k.removeprefix('aten::')} {n}" for k, n in calls.most_common(6))
        print(f"  {name:<9} {ops:6,d} operators, {kernels:6,d} with a kernel   ({top})")
    print(f"  {'step':<9} {totals[0]:6,d} operators, {totals[1]:6,d} with a kernel")


if __name__ == "__main__":
    main()
