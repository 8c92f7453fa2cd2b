"""Benchmark: what composing one FALCON batch on demand costs in operators and host round trips.

On a GPU every operator is a kernel launch (a few microseconds each, whatever its size) and every
``.item()`` / ``.cpu()`` waits for the queue, so for the on-demand composition of training (batch k + 1
depends on the scheduler after step k: it cannot overlap the step) these counts, not FLOPs, set its
time. This counts them on any device with the profiler, for one space at the paper's |M| and B.

    PYTHONPATH=. .venv/bin/python benchmarks/falcon_compose_ops.py                  # |M| 5,664, B 96
    PYTHONPATH=. .venv/bin/python benchmarks/falcon_compose_ops.py --device cuda    # + the time per batch there
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from falcon_cli.sampling.cache import EmbeddingCache  # noqa: E402
from falcon_cli.sampling.quantile import QuantileSpaces  # noqa: E402
from falcon_cli.sampling.scheduler import NegativeScheduler  # noqa: E402

# aten operators that return views or metadata only: no kernel
NO_KERNEL = {
    "aten::as_strided",
    "aten::view",
    "aten::select",
    "aten::unsqueeze",
    "aten::squeeze",
    "aten::reshape",
    "aten::detach",
    "aten::lift_fresh",
    "aten::resolve_conj",
    "aten::resolve_neg",
    "aten::empty",
    "aten::empty_strided",
    "aten::empty_like",
    "aten::slice",
    "aten::t",
    "aten::transpose",
    "aten::expand",
    "aten::alias",
    "aten::_reshape_alias",
    "aten::to",
    "aten::numpy_T",
    "aten::contiguous",
    "aten::unbind",
    "aten::split",
    "aten::chunk",
    "aten::permute",
    "aten::_unsafe_view",
    "aten::flatten",
    "aten::view_as",
}
"""Operators that launch no kernel on a GPU (views, reshapes, empty allocations); step_operators.py uses it too."""
HOST_READS = ("aten::_local_scalar_dense", "aten::nonzero")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--space", type=int, default=5664)
    parser.add_argument("--batch", type=int, default=96)
    parser.add_argument("--batches", type=int, default=5, help="batches measured")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    ids = torch.arange(2 * args.space)
    cache = EmbeddingCache(ids, dim=256, device=args.device)
    features = torch.nn.functional.normalize(torch.randn(len(ids), 2, 256, generator=g), dim=-1).to(args.device)
    cache.update(ids.to(args.device), features[:, 0], features[:, 1])
    scheduler = NegativeScheduler(quantiles=100, device=torch.device(args.device))
    spaces = QuantileSpaces(ids, cache, args.space, args.batch, g)
    spaces.next_batch(scheduler.alpha_beta, g)  # enter the space: its sorted tables are built once per space

    def compose_and_update() -> None:
        for _ in range(args.batches):
            _, record = spaces.next_batch(scheduler.alpha_beta, g)
            scheduler.update(record, 0.01)

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        compose_and_update()
    events = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    per_batch = lambda keys: sum(e.count for e in events if keys(e.key)) / args.batches  # noqa: E731
    print(f"|M| {args.space}, B {args.batch}, {args.device}: per composed batch and scheduler update")
    print(
        f"  aten operators {per_batch(lambda k: True):,.0f}, "
        f"of them with a kernel {per_batch(lambda k: k not in NO_KERNEL):,.0f}"
    )
    print(
        f"  host reads (.item(), .cpu(), nonzero) {per_batch(lambda k: k in HOST_READS):,.0f}; "
        f"host-to-device copies {per_batch(lambda k: k == 'aten::_to_copy'):,.0f}"
    )
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    composing = updating = 0.0
    for _ in range(args.batches):  # unprofiled, the two parts timed apart (each ends with the device idle)
        sync()
        start = time.perf_counter()
        _, record = spaces.next_batch(scheduler.alpha_beta, g)
        sync()
        middle = time.perf_counter()
        scheduler.update(record, 0.01)
        sync()
        composing, updating = composing + middle - start, updating + time.perf_counter() - middle
    print(
        f"  {(composing + updating) / args.batches * 1e3:.1f} ms per batch (unprofiled): composing "
        f"{composing / args.batches * 1e3:.1f}, scheduler update {updating / args.batches * 1e3:.1f}"
    )


if __name__ == "__main__":
    main()
