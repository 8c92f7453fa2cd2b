"""Benchmark: one rank's embedding cache memory at N pairs and world W, measured against the formula.

Builds rank 0's :class:`~falcon_cli.sampling.sharded_cache.ShardedCache` of ``--pairs`` pairs at ``--world`` ranks
(no process group: the all-gathers return this rank's own tensors, so the step's gathered batch is simulated as
``--batch x --world`` ids) and goes through what pretraining does to it: begin an epoch, ``--steps`` updates (few, so
that nearly every row of next epoch's shard is stale and the epoch-end hand-over moves them all: its worst case),
end the epoch, begin the next, the rank's checkpoint state written with ``torch.save`` and read back into a fresh
cache. Reports, as JSON lines, the device memory allocated (peak and held) and the host RSS at each phase, the
update's time per step, the rank file's size and save/load times, beside
:func:`~falcon_cli.sampling.sharded_cache.cache_bytes_per_rank`'s numbers. ``--full`` also measures the
unsharded cache of every pair (what every rank held before).

    PYTHONPATH=. .venv/bin/python benchmarks/sharded_cache_memory.py --pairs 200000 --world 8
    PYTHONPATH=. python3 benchmarks/sharded_cache_memory.py --device cuda --full     # 14M pairs, world 8
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.memory import max_rss_mib, rss_mib  # noqa: E402
from falcon_cli.sampling.cache import EmbeddingCache  # noqa: E402
from falcon_cli.sampling.composers import shard_pair_ids  # noqa: E402
from falcon_cli.sampling.sharded_cache import ShardedCache, cache_bytes_per_rank  # noqa: E402

GIB = 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=14_000_000, help="N (default 14M)")
    parser.add_argument("--world", type=int, default=8, help="W (default 8)")
    parser.add_argument("--batch", type=int, default=512, help="per-rank batch size (default 512)")
    parser.add_argument("--steps", type=int, default=200, help="updates in the epoch (default 200)")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--full", action="store_true", help="also measure the cache of every pair")
    args = parser.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    formula = cache_bytes_per_rank(args.pairs, args.world, dim=args.dim)
    print(
        json.dumps({"phase": "formula", **{k: v / GIB if k != "rows" else v for k, v in formula.items()}}), flush=True
    )

    def report(phase: str, **extra) -> None:
        row = {"phase": phase, "host_rss_gib": rss_mib() / 1024, "host_peak_rss_gib": max_rss_mib() / 1024, **extra}
        if cuda:
            torch.cuda.synchronize()
            row.update(
                device_gib=torch.cuda.memory_allocated(device) / GIB,
                device_peak_gib=torch.cuda.max_memory_allocated(device) / GIB,
            )
            torch.cuda.reset_peak_memory_stats(device)
        print(json.dumps(row), flush=True)

    ids = torch.arange(args.pairs, dtype=torch.int64)
    generator = torch.Generator().manual_seed(0)

    def shards() -> tuple[torch.Tensor, torch.Tensor]:
        shard = shard_pair_ids(ids, 0, args.world, generator)
        peek = torch.Generator()
        peek.set_state(generator.get_state())
        return shard, shard_pair_ids(ids, 0, args.world, peek)

    report("start")
    cache = ShardedCache(ids, args.dim, device=device, world=args.world)
    report("built", cache_gib=cache.nbytes / GIB)
    g = torch.Generator(device=device).manual_seed(1)
    order = torch.randperm(args.pairs, generator=torch.Generator().manual_seed(1))[
        : args.steps * args.batch * args.world
    ]
    order = order.to(device)  # (the pairs the simulated steps train; not the cache's memory)
    cache.begin(*shards())
    cache.reset()
    report("epoch 0 begun", cache_gib=cache.nbytes / GIB, rows=cache.rows)
    gathered = args.batch * args.world
    if cuda:
        torch.cuda.synchronize()
    tick = time.perf_counter()
    for step in range(args.steps):
        batch = order[step * gathered : (step + 1) * gathered]
        feats = torch.nn.functional.normalize(torch.randn(2, len(batch), args.dim, device=device, generator=g), dim=-1)
        cache.update(batch, feats[0], feats[1])
    if cuda:
        torch.cuda.synchronize()
    per_step = (time.perf_counter() - tick) / max(args.steps, 1)
    report("epoch 0 trained", update_ms=per_step * 1e3, cache_gib=cache.nbytes / GIB)
    tick = time.perf_counter()
    cache.end()
    report(
        "epoch 0 ended (hand-over)", seconds=time.perf_counter() - tick, cache_gib=cache.nbytes / GIB, rows=cache.rows
    )
    cache.begin(*shards())
    cache.reset()
    report("epoch 1 begun", cache_gib=cache.nbytes / GIB, rows=cache.rows)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rank-0.pt"
        tick = time.perf_counter()
        torch.save({"cache": cache.state_dict()}, path)
        report("checkpoint saved", seconds=time.perf_counter() - tick, file_gib=path.stat().st_size / GIB)
        del cache
        tick = time.perf_counter()
        state = torch.load(path, map_location="cpu", weights_only=True)
        restored = ShardedCache(ids, args.dim, device=device, world=args.world)
        restored.load_state_dict(state["cache"])
        del state
        report("checkpoint restored", seconds=time.perf_counter() - tick, cache_gib=restored.nbytes / GIB)
        del restored
    if args.full:
        full = EmbeddingCache(ids, args.dim, device=device)
        report("full cache of every pair (before sharding)", cache_gib=full.nbytes / GIB)


if __name__ == "__main__":
    main()
