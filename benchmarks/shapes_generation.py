"""Benchmark: how fast is shapes-world generation (everything included)?

Generates a world from scratch (images, captions, oracle tables, FN density, all dataset
files) into a temporary directory and prints seconds and images per second. Target:
10,000 images in under 30 s on a 2-core CPU.

    PYTHONPATH=. .venv/bin/python benchmarks/shapes_generation.py --images 10000

Options: --seed, --size, --workers (image-rendering processes; default up to 2),
--out DIR to keep the world (default: a temporary directory, deleted afterwards),
--profile to print the 25 most expensive functions (single process: use --workers 1).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from falcon_cli.data.shapes import ShapesConfig, generate_world  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=10_000, help="number of images (default 10000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", type=int, default=64, help="image size in pixels (default 64)")
    parser.add_argument("--workers", type=int, default=None, help="rendering processes (default: up to 2)")
    parser.add_argument("--out", type=Path, default=None, help="keep the world here (default: temporary, deleted)")
    parser.add_argument("--profile", action="store_true", help="print a cProfile summary of the main process")
    args = parser.parse_args()

    config = ShapesConfig(images=args.images, seed=args.seed, size=args.size)
    scratch = None
    out = args.out
    if out is None:
        scratch = Path(tempfile.mkdtemp(prefix="shapes-bench-"))
        out = scratch / "world"
    profiler = cProfile.Profile() if args.profile else None
    start = time.perf_counter()
    try:
        if profiler:
            profiler.enable()
        summary = generate_world(config, out, overwrite=True, workers=args.workers)
        if profiler:
            profiler.disable()
        seconds = time.perf_counter() - start
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    test = summary.false_negative_density["test"]
    print(f"images: {args.images}  seconds: {seconds:.2f}  images/s: {args.images / seconds:.0f}")
    print(
        f"test split: {test['captions']} captions, images described per caption: "
        f"mean {test['mean']:.2f}, median {test['median']:.1f}, max {test['max']}"
    )
    if profiler:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
