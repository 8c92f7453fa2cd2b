"""Two per-epoch costs that a GPU run's profile found on the host, each against what it replaced, in one run.

    PYTHONPATH=. .venv/bin/python benchmarks/epoch_overheads.py                       # the cpu budget's test split
    PYTHONPATH=. .venv/bin/python benchmarks/epoch_overheads.py --threads 1 --device cuda

* ``ranks``: the retrieval ranks of one evaluation (``retrieval_ranks``: 2,012 images x 10,060 captions, both
  directions), counted in one pass over the score matrix, against a stable descending sort of every row (the
  way they were computed before; the tests keep it as the reference the counts must equal);
* ``item seeding``: seeding the CPU generator for one item's augmentation (``PretrainDataset.__getitem__``), with
  ``torch.default_generator.manual_seed`` against ``torch.manual_seed``, which also seeds every accelerator
  backend and, for those not initialised, records a stack trace per call.

A single-process GPU profile of the ``cpu`` phase-sweep budget (H200, one torch thread per run as the sweep
gives each of its runs) put 20 s of 3 epochs' 113 s in the item seeding (``cProfile`` inflates it about 14x) and
19 s in the sorts; docs/results.md.
"""

from __future__ import annotations

import argparse
import time

import torch

from falcon_cli.evaluation.retrieval import retrieval_ranks


def sorted_ranks(scores: torch.Tensor, img2txt, txt2img) -> tuple[torch.Tensor, torch.Tensor]:
    """The ranks by sorting every row (what ``retrieval_ranks`` did before it counted)."""
    n_images, n_texts = scores.shape
    order = scores.argsort(dim=1, descending=True, stable=True)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(n_texts, device=scores.device).expand(n_images, -1))
    positives = torch.zeros(n_images, n_texts, dtype=torch.bool, device=scores.device)
    for i, texts in enumerate(img2txt):
        positives[i, list(texts)] = True
    image_ranks = torch.where(positives, rank, torch.iinfo(torch.long).max).min(dim=1).values
    order_t = scores.t().argsort(dim=1, descending=True, stable=True)
    rank_t = torch.empty_like(order_t).scatter_(
        1, order_t, torch.arange(n_images, device=scores.device).expand(n_texts, -1)
    )
    return image_ranks, rank_t.gather(1, torch.as_tensor(txt2img, device=scores.device)[:, None]).squeeze(1)


def timed(fn, repeats: int, device: str) -> float:
    """Best wall time of ``repeats`` calls of ``fn`` (after one warm-up), in seconds."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2012)
    parser.add_argument("--captions-per-image", type=int, default=5)
    parser.add_argument("--items", type=int, default=4500, help="Items seeded (one epoch of the cpu budget).")
    parser.add_argument("--threads", type=int, help="Torch threads (default: torch's).")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    n_texts = args.images * args.captions_per_image
    img2txt = [list(range(i * args.captions_per_image, (i + 1) * args.captions_per_image)) for i in range(args.images)]
    txt2img = [t // args.captions_per_image for t in range(n_texts)]
    scores = torch.randn(args.images, n_texts, generator=torch.Generator().manual_seed(0)).to(args.device)
    scores = (scores * 8).round() / 8  # (ties, as a trained model's fp16 similarities have)
    counted, reference = retrieval_ranks(scores, img2txt, txt2img), sorted_ranks(scores, img2txt, txt2img)
    assert all(torch.equal(a, b) for a, b in zip(counted, reference)), "the counted ranks differ from the sort's"
    sort_s = timed(lambda: sorted_ranks(scores, img2txt, txt2img), args.repeats, args.device)
    count_s = timed(lambda: retrieval_ranks(scores, img2txt, txt2img), args.repeats, args.device)

    def seed_all() -> None:
        for item in range(args.items):
            torch.manual_seed(item)

    def seed_cpu() -> None:
        for item in range(args.items):
            torch.default_generator.manual_seed(item)

    all_s, cpu_s = timed(seed_all, args.repeats, "cpu"), timed(seed_cpu, args.repeats, "cpu")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {args.device}")
    print(
        f"ranks, {args.images:,} x {n_texts:,}: sorted {sort_s:.3f} s, counted {count_s:.3f} s "
        f"({sort_s / count_s:.0f}x)"
    )
    print(
        f"item seeding, {args.items:,} items: torch.manual_seed {all_s:.3f} s, CPU generator {cpu_s:.4f} s "
        f"({all_s / max(cpu_s, 1e-9):.0f}x)"
    )


if __name__ == "__main__":
    main()
