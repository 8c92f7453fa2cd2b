"""Benchmark: JPEG decoding + ALBEF's pretraining transform per CPU core, at COCO size and pre-resized.

Can the DataLoader workers of a GPU machine feed albef-base? One core decodes and augments
(RandomResizedCrop to 256, RandAugment, normalise: exactly `build_transform("pretrain", 256)`) COCO-sized
JPEGs (640x480, quality 90) and the same images stored pre-resized to a shorter side of 384 and 288;
the images/s per core times the workers a machine has is the rate its loader can sustain.

    PYTHONPATH=. .venv/bin/python benchmarks/jpeg_decode.py                 # 200 images of each size
    PYTHONPATH=. .venv/bin/python benchmarks/jpeg_decode.py --images 500 --sizes 640x480 512x384 384x288
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from falcon_cli.data.transforms import build_transform  # noqa: E402


def photo_like(width: int, height: int, rng: np.random.Generator) -> Image.Image:
    """A smooth random image with fine noise: compresses (and decodes) like a photograph, not like flat shapes."""
    coarse = rng.integers(0, 256, (height // 16 + 1, width // 16 + 1, 3), dtype=np.uint8)
    image = Image.fromarray(coarse).resize((width, height), Image.BICUBIC)
    noisy = np.asarray(image).astype(np.int16) + rng.integers(-12, 13, (height, width, 3))
    return Image.fromarray(noisy.clip(0, 255).astype(np.uint8))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--sizes", nargs="+", default=["640x480", "512x384", "384x288"])
    parser.add_argument("--resolution", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)  # one core: what one DataLoader worker has
    rng = np.random.default_rng(0)
    originals = [photo_like(640, 480, rng) for _ in range(args.images)]
    transform = build_transform("pretrain", args.resolution)
    print(f"{args.images} photo-like images, pretrain transform at {args.resolution} px, 1 thread")
    rates = {}
    for size in args.sizes:
        width, height = map(int, size.split("x"))
        files = []
        for image in originals:
            buffer = io.BytesIO()
            image.resize((width, height), Image.BICUBIC).save(buffer, format="JPEG", quality=90)
            files.append(buffer.getvalue())
        decode = time.perf_counter()
        for data in files:
            Image.open(io.BytesIO(data)).convert("RGB")
        decode = time.perf_counter() - decode
        start = time.perf_counter()
        for data in files:
            transform(Image.open(io.BytesIO(data)).convert("RGB"))
        seconds = time.perf_counter() - start
        rates[size] = args.images / seconds
        print(
            f"{size:>8}: {np.mean([len(f) for f in files]) / 1024:6.1f} KiB/file, "
            f"decode {decode / args.images * 1e3:5.2f} ms, "
            f"decode + transform {seconds / args.images * 1e3:5.2f} ms -> {rates[size]:6.1f} images/s per core "
            f"(x{rates[size] / rates[args.sizes[0]]:.2f})"
        )


if __name__ == "__main__":
    main()
