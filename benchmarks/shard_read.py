"""Pairs per second read by pair id: webdataset shards (through the index) against one file per image.

    PYTHONPATH=. .venv/bin/python benchmarks/shard_read.py --pairs 4000 --rounds 5

Writes ``--pairs`` JPEGs (``--size`` px, CC3M-like 20-40 KB) as files with a pretraining JSON, converts them
with ``falcon data shards`` (the same bytes in tars of ``--per-shard`` pairs) and its index, then reads the
pairs in a random order of ids per round, each pair read from both layouts back to back (taking turns at going
first: this machine is noisy, so the ratio is taken within a round, and the median over rounds reported). Two reads: the
encoded bytes only, and the bytes decoded to RGB (:func:`falcon_cli.data.images.load_image`, what a DataLoader worker
does before the transform). The page cache is warm for both (the first round is a warm-up and is not counted).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from falcon_cli.data.datasets import pretrain_records
from falcon_cli.data.images import load_image
from falcon_cli.data.shards import convert_to_shards
from falcon_cli.data.spec import load_spec


def write_files(root: Path, pairs: int, size: int, seed: int) -> None:
    """``pairs`` JPEGs of smooth noise (so that they compress like photographs) and a dataset spec naming them."""
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True)
    entries = []
    for i in range(pairs):
        small = rng.integers(0, 256, (size // 8, size // 8, 3), dtype=np.uint8)
        image = Image.fromarray(small).resize((size, size), Image.BICUBIC)
        image.save(root / "images" / f"{i:07d}.jpg", quality=90)
        entries.append({"image": f"images/{i:07d}.jpg", "caption": f"picture number {i}"})
    (root / "pretrain.json").write_text(json.dumps(entries))
    (root / "dataset.yaml").write_text("name: bench\npretrain: [pretrain.json]\n")


def time_reads(layouts: dict[str, list], order: list[int], decode: bool) -> dict[str, float]:
    """Pairs per second of each layout reading ``images[i]`` for i in ``order``: the two read the same pair back
    to back, taking turns at going first, so that a noisy neighbour slows both alike."""
    read = (lambda image: load_image(image)) if decode else (lambda image: image.read_bytes())
    names = list(layouts)
    spent = dict.fromkeys(names, 0.0)
    for n, i in enumerate(order):
        for name in names if n % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            read(layouts[name][i])
            spent[name] += time.perf_counter() - start
    return {name: len(order) / spent[name] for name in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4000)
    parser.add_argument("--size", type=int, default=256, help="image side in pixels")
    parser.add_argument("--per-shard", type=int, default=1000, help="pairs per tar shard")
    parser.add_argument("--rounds", type=int, default=5, help="counted rounds (after one warm-up)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="also write the results here as JSON")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="shard-read-") as tmp:
        files = Path(tmp) / "files"
        write_files(files, args.pairs, args.size, args.seed)
        convert_to_shards(
            load_spec(files),
            pretrain_records(load_spec(files))[0],
            Path(tmp) / "shards",
            samples_per_shard=args.per_shard,
        )
        layouts = {
            name: [r.image for r in pretrain_records(load_spec(Path(tmp) / name))[0]] for name in ("files", "shards")
        }
        mean_kb = statistics.mean(i.stat().st_size for i in layouts["files"]) / 1024
        results: dict = {"pairs": args.pairs, "size": args.size, "per_shard": args.per_shard, "mean_kb": mean_kb}
        for decode in (False, True):
            what = "decoded" if decode else "bytes"
            rates: dict = {"files": [], "shards": []}
            for round_ in range(args.rounds + 1):
                order = random.Random(args.seed + round_).sample(range(args.pairs), args.pairs)
                measured = time_reads(layouts, order, decode)
                if round_:  # round 0 warms the page cache and the shard descriptors
                    for name, rate in measured.items():
                        rates[name].append(rate)
            ratios = [s / f for s, f in zip(rates["shards"], rates["files"])]
            results[what] = {
                "files_pairs_per_s": statistics.median(rates["files"]),
                "shards_pairs_per_s": statistics.median(rates["shards"]),
                "ratio_median": statistics.median(ratios),
                "ratio_min": min(ratios),
                "ratio_max": max(ratios),
            }
            print(
                f"{what:8s} files {statistics.median(rates['files']):9,.0f} pairs/s   shards "
                f"{statistics.median(rates['shards']):9,.0f} pairs/s   shards/files {statistics.median(ratios):.3f} "
                f"(rounds {min(ratios):.3f}-{max(ratios):.3f})"
            )
        print(f"{args.pairs:,} pairs, {args.size}px JPEG, {mean_kb:.1f} KB mean, {args.per_shard} pairs a shard")
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
