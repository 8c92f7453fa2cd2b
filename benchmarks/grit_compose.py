"""Benchmark: time and peak memory to compose one GRIT-VLP epoch.

Synthetic data: ``--pairs`` random unit vectors per modality (256-d, fp16) in an
:class:`~falcon_cli.sampling.EmbeddingCache`; one :meth:`GritComposer.compose_epoch` at
|M| = ``--space``, B = ``--batch``. Defaults: 566,747 pairs (the COCO Karpathy-train
captions, "567K"), |M| = 1920, B = 96.

    PYTHONPATH=. .venv/bin/python benchmarks/grit_compose.py
    PYTHONPATH=. .venv/bin/python benchmarks/grit_compose.py --device cuda
    PYTHONPATH=. .venv/bin/python benchmarks/grit_compose.py --pairs 100000 --max-chunk-gb 0.25

Peak memory: on CPU the growth of the process's max RSS (``resource.getrusage``) during
composition, over the RSS once the cache is built (tracemalloc does not see torch); on
CUDA ``torch.cuda.max_memory_allocated`` during composition minus what was allocated before.
Options: --seed, --dim, --threads (torch CPU threads), --step-threads (threads for the
sequential step loop; default 1, 0 = torch's setting), --max-chunk-gb (bound on one chunk's
similarity blocks; default 1).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.memory import max_rss_mib, rss_mib  # noqa: E402
from falcon_cli.sampling import EmbeddingCache, GritComposer  # noqa: E402
from falcon_cli.sampling.composers import chunk_plan  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=566_747, help="number of pairs (default 566747)")
    parser.add_argument("--space", type=int, default=1920, help="search-space size |M| (default 1920)")
    parser.add_argument("--batch", type=int, default=96, help="batch size B (default 96)")
    parser.add_argument("--dim", type=int, default=256, help="embedding dimension (default 256)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument(
        "--step-threads", type=int, default=1, help="CPU threads for the step loop (default 1; 0: torch's setting)"
    )
    parser.add_argument("--max-chunk-gb", type=float, default=1.0, help="memory bound for one chunk's blocks (GiB)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    ids = torch.arange(args.pairs, dtype=torch.int64) * 7 + 3  # non-contiguous ids
    cache = EmbeddingCache(ids, dim=args.dim, device=device)
    gen = torch.Generator().manual_seed(args.seed)
    for start in range(0, args.pairs, 65536):  # fill in chunks: keep the set-up peak low
        chunk = ids[start : start + 65536]
        image = torch.nn.functional.normalize(torch.randn(len(chunk), args.dim, generator=gen), dim=1)
        text = torch.nn.functional.normalize(torch.randn(len(chunk), args.dim, generator=gen), dim=1)
        cache.update(chunk, image, text)
    max_bytes = int(args.max_chunk_gb * 2**30)
    composer = GritComposer(args.batch, args.space, max_chunk_bytes=max_bytes, step_threads=args.step_threads or None)
    per_chunk, copy = chunk_plan(min(args.space, args.pairs), args.dim, max_bytes)

    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    base_rss, base_max = rss_mib(), max_rss_mib()
    start = time.perf_counter()
    batches = composer.compose_epoch(1, ids, cache, torch.Generator().manual_seed(args.seed + 1))
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak_rss = max_rss_mib()

    seen = torch.cat([b.pair_ids for b in batches])
    assert len(seen) == args.pairs and torch.equal(seen.sort().values, ids), "an epoch must cover every pair once"
    spaces = -(-args.pairs // args.space)
    print(
        f"pairs: {args.pairs}  |M|: {args.space}  B: {args.batch}  dim: {args.dim}  device: {device}  "
        f"threads: {torch.get_num_threads()}  step threads: {args.step_threads or torch.get_num_threads()}"
    )
    print(
        f"search spaces: {spaces}  per chunk: {per_chunk}  chunks: {-(-spaces // per_chunk)}  "
        f"two blocks (I2T and T2I): {copy}  batches: {len(batches)}"
    )
    print(f"seconds: {seconds:.2f}")
    print(
        f"cache: {2 * cache.image.numel() * cache.image.element_size() / 2**20:.0f} MiB  "
        f"RSS before: {base_rss:.0f} MiB  max RSS before: {base_max:.0f} MiB  max RSS after: {peak_rss:.0f} MiB  "
        f"peak growth: {max(0.0, peak_rss - base_rss):.0f} MiB"
    )
    if device.type == "cuda":
        print(
            f"cuda peak during compose: {(torch.cuda.max_memory_allocated() - base) / 2**20:.0f} MiB above "
            f"{base / 2**20:.0f} MiB allocated before"
        )


if __name__ == "__main__":
    main()
