"""Benchmark: time and peak memory of a k-means search-space partition (``falcon build-search-spaces``).

Synthetic data: ``--pairs`` image and text embeddings (``--dim``, fp16 as in ``embeddings.h5``)
drawn around ``--topics`` random topic directions (text = its image plus noise), so the
clusters are real but uneven. One :func:`~falcon_cli.sampling.partition.kmeans_partition` at
|M| = ``--space``, then one :func:`~falcon_cli.sampling.partition.random_partition` and the
summary of both (within-space cosines). Defaults: 566,747 pairs (COCO Karpathy-train
captions, "567K"), 256-d, |M| = 5664 (FALCON's COCO setting): k = 101 spaces.

    PYTHONPATH=. .venv/bin/python benchmarks/kmeans_partition.py
    PYTHONPATH=. .venv/bin/python benchmarks/kmeans_partition.py --pairs 100000 --space 1920

Peak memory: the process's max RSS (``ru_maxrss``) at the end, and its growth over the
resident memory once the embeddings exist (libraries and the fp16 embeddings included there). Options: --seed,
--iterations (k-means), --topics.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from benchmarks.memory import max_rss_mib, rss_mib  # noqa: E402


def synthetic_chunks(pairs: int, dim: int, topics: int, seed: int, rows: int = 65536):
    """Unit float32 (image, text) chunks of ``rows`` pairs (the last one shorter) around ``topics`` directions with
    Zipf-like topic sizes: text is its image plus noise. Drawn chunk by chunk, so any size can be written to disk."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((topics, dim)).astype(np.float32)
    weights = 1.0 / np.arange(1, topics + 1)
    for start in range(0, pairs, rows):
        topic = rng.choice(topics, size=min(rows, pairs - start), p=weights / weights.sum())
        base = centers[topic] + 1.5 * rng.standard_normal((len(topic), dim)).astype(np.float32)
        other = base + 0.8 * rng.standard_normal(base.shape).astype(np.float32)
        yield base / np.linalg.norm(base, axis=1, keepdims=True), other / np.linalg.norm(other, axis=1, keepdims=True)


def synthetic(pairs: int, dim: int, topics: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Unit fp16 embeddings around ``topics`` directions (:func:`synthetic_chunks`), whole arrays."""
    image = np.empty((pairs, dim), dtype=np.float16)
    text = np.empty((pairs, dim), dtype=np.float16)
    start = 0
    for image_rows, text_rows in synthetic_chunks(pairs, dim, topics, seed):
        image[start : start + len(image_rows)], text[start : start + len(text_rows)] = image_rows, text_rows
        start += len(image_rows)
    return image, text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=566_747, help="number of pairs (default 566747)")
    parser.add_argument("--dim", type=int, default=256, help="embedding width (default 256)")
    parser.add_argument("--space", type=int, default=5664, help="search-space size |M| (default 5664)")
    parser.add_argument("--topics", type=int, default=300, help="topic directions of the synthetic data (default 300)")
    parser.add_argument("--iterations", type=int, default=20, help="k-means iterations (default 20)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    # (imported here, not at the top: scale_simulation.py imports synthetic_chunks to write a file, without torch)
    from falcon_cli.sampling.partition import kmeans_partition, partition_summary, random_partition

    image, text = synthetic(args.pairs, args.dim, args.topics, args.seed)
    pair_ids = np.arange(args.pairs, dtype=np.int64)
    base_rss = rss_mib()

    start = time.perf_counter()
    kmeans = kmeans_partition(image, text, pair_ids, args.space, args.seed, iterations=args.iterations)
    kmeans_seconds = time.perf_counter() - start
    start = time.perf_counter()
    random = random_partition(pair_ids, args.space, args.seed)
    random_seconds = time.perf_counter() - start
    start = time.perf_counter()
    summary = partition_summary({"random": random, "kmeans": kmeans}, image, text)
    summary_seconds = time.perf_counter() - start
    peak = max_rss_mib()

    sizes = kmeans.sizes()
    print(
        f"{args.pairs} pairs x {args.dim}, |M| = {args.space}: {kmeans.num_spaces} spaces, "
        f"sizes {sizes.min()}..{sizes.max()} (last {sizes[-1]})"
    )
    print(
        f"kmeans_partition {kmeans_seconds:.1f} s, random_partition {random_seconds:.2f} s, "
        f"partition_summary {summary_seconds:.1f} s"
    )
    print(
        f"peak RSS {peak:.0f} MiB ({peak - base_rss:+.0f} MiB over the {base_rss:.0f} MiB "
        "with the embeddings in memory)"
    )
    for name, stats in summary.items():
        print(
            f"  {name:7s} mean within-space cosine: joint {stats['mean_cosine_joint']:.4f}, "
            f"i2t {stats['mean_cosine_i2t']:.4f}"
        )


if __name__ == "__main__":
    main()
