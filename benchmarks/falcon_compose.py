"""Time and peak memory to compose FALCON / quantile batches from synthetic embeddings.

    PYTHONPATH=. .venv/bin/python benchmarks/falcon_compose.py --pairs 567000 --space 5664 --batch 96
    PYTHONPATH=. .venv/bin/python benchmarks/falcon_compose.py --pairs 56640 --space 5664 --source policy

``--source policy`` draws q from a freshly initialised scheduler (instance level) once per
batch round, as a training epoch does with a fixed φ; ``--source 0.5`` uses a fixed q.
Spaces advance together in chunks (:meth:`QuantileSpaces.compose_all`). Reports seconds,
batches, the peak resident memory (``ru_maxrss``) of the process and its resident memory
just before composing (torch itself is ~0.5 GiB; the cached embeddings 0.54 GiB at 567K).
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.memory import max_rss_mib, rss_mib
from falcon_cli.sampling.cache import EmbeddingCache
from falcon_cli.sampling.policy import SchedulerPolicy
from falcon_cli.sampling.quantile import QuantileSpaces


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=567_000)
    parser.add_argument("--space", type=int, default=5664)
    parser.add_argument("--batch", type=int, default=96)
    parser.add_argument("--quantiles", type=int, default=100)
    parser.add_argument("--source", default="policy", help="'policy' or a fixed q in [0, 1]")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    ids = torch.arange(args.pairs)
    cache = EmbeddingCache(ids, dim=256, device=args.device)
    for start in range(0, args.pairs, 8192):  # small chunks: the generator's temporaries stay out of the peak
        chunk = ids[start : start + 8192]
        feats = torch.nn.functional.normalize(torch.randn(len(chunk), 2, 256, generator=g), dim=-1)
        cache.update(chunk.to(args.device), feats[:, 0].to(args.device), feats[:, 1].to(args.device))
    if args.source == "policy":
        policy = SchedulerPolicy(quantiles=args.quantiles).to(args.device).eval()
        source = lambda s_hat: policy(s_hat)  # noqa: E731
    else:
        source = float(args.source)
    before = rss_mib() / 1024
    tick = time.perf_counter()
    with torch.no_grad():
        spaces = QuantileSpaces(ids, cache, args.space, args.batch, g, quantiles=args.quantiles)
        batches = spaces.compose_all(source, g)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - tick
    peak = max_rss_mib() / 1024
    print(
        f"pairs {args.pairs:,}  |M| {args.space}  B {args.batch}  m {args.quantiles}  source {args.source}  "
        f"device {args.device}: {seconds:.1f} s, {len(batches)} batches, peak RSS {peak:.2f} GiB "
        f"(RSS before composing, with torch and the cached embeddings: {before:.2f} GiB)"
    )


if __name__ == "__main__":
    main()
