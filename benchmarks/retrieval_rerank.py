"""Retrieval scoring cost: ITC ranking alone vs the top k re-ranked by ITM, on random split embeddings.

    PYTHONPATH=. .venv/bin/python benchmarks/retrieval_rerank.py --images 100 --texts 500 --k 16 64
    PYTHONPATH=. .venv/bin/python benchmarks/retrieval_rerank.py --model albef-base --images 200 --texts 1000 \\
        --k 16 --device cuda

Reports seconds and re-ranked (image, text) pairs per second for each k, and the ratio to the
ITC-only ranking measured in the same run. Re-ranking fuses 2 × k × (images + texts) / 2 pairs:
k per image (texts) plus k per text (images).
"""

from __future__ import annotations

import argparse
import time

import torch

from falcon_cli.evaluation.scoring import SplitEmbeddings, retrieval_scores
from falcon_cli.models.registry import create_model
from falcon_cli.runtime.precision import autocast, pick_device, resolve_precision


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="albef-tiny")
    parser.add_argument("--images", type=int, default=100)
    parser.add_argument("--texts", type=int, default=500)
    parser.add_argument("--text-length", type=int, default=16)
    parser.add_argument("--k", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--batch-size", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()

    device = pick_device(args.device)
    precision = resolve_precision("auto", device)
    torch.manual_seed(0)
    model = create_model(args.model, vocab_size=1000).to(device).eval()
    with torch.no_grad(), autocast(precision, device):
        images = torch.randn(args.images, 3, model.config.image_size, model.config.image_size, device=device)
        image_tokens, image_feat = model.encode_image(images)
        ids = torch.randint(5, 1000, (args.texts, args.text_length), device=device)
        mask = torch.ones_like(ids)
        mask[:, args.text_length // 2 :] = torch.rand(args.texts, 1, device=device).lt(0.5).long()  # some padding
        text_tokens, text_feat = model.encode_text(ids, mask)
    split = SplitEmbeddings(image_tokens, image_feat.float(), text_tokens, mask, text_feat.float())

    def timed(k, batch_size) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        retrieval_scores(model, split, k=k, batch_size=batch_size, autocast=autocast(precision, device))
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    timed(None, 64)
    itc = min(timed(None, 64) for _ in range(3))
    print(
        f"{args.model} on {device} ({precision}): {args.images} images, {args.texts} texts; "
        f"ITC ranking {itc * 1e3:.1f} ms"
    )
    print(f"{'k':>5} {'batch':>6} {'pairs':>8} {'seconds':>8} {'pairs/s':>9} {'x ITC':>8}")
    for k in args.k:
        pairs = min(k, args.texts) * args.images + min(k, args.images) * args.texts
        for batch_size in args.batch_size:
            seconds = timed(k, batch_size)
            print(f"{k:>5} {batch_size:>6} {pairs:>8} {seconds:>8.2f} {pairs / seconds:>9.0f} {seconds / itc:>8.0f}")


if __name__ == "__main__":
    main()
