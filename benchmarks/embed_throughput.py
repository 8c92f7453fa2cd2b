"""Benchmark: `falcon embed` throughput (pairs/s) on CPU for albef-tiny, through the real stage.

Builds a shapes world of ``--images`` images (4-5 captions each, so about 5x as many pairs) in a
temporary directory, runs the data stage (world + WordPiece tokenizer), saves a randomly
initialised albef-tiny checkpoint into that run (throughput does not depend on the weights), then
runs the embed stage with ``embed.encoder=falcon:<that run>`` and prints the stage's summary:
``pairs_per_s`` covers the encoding loop (image decode + transform and tokenising in the
DataLoader workers, the forward passes, chunk writes); ``seconds`` also covers loading the split,
building the model and assembling ``embeddings.h5``.

    PYTHONPATH=. .venv/bin/python benchmarks/embed_throughput.py
    PYTHONPATH=. .venv/bin/python benchmarks/embed_throughput.py --images 500 --batch-size 128 --workers 2 --threads 2

Options: --images, --batch-size, --workers (DataLoader processes), --threads (torch intra-op threads), --device.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    """Parse the options, build the world and checkpoint, run the embed stage, print its summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=200, help="shapes-world images (pairs are about 5x this)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=1, help="DataLoader worker processes")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    os.environ.setdefault("FALCON_PROGRESS", "0")

    import torch

    from falcon_cli.config.recipes import load_recipe
    from falcon_cli.data.tokenizer import load_tokenizer
    from falcon_cli.models import create_model
    from falcon_cli.runtime.checkpoint import save_checkpoint
    from falcon_cli.runtime.run_dir import RunDirectory
    from stages import run_stages

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        world = [f"data.dataset={root / 'world'}", f"data.shapes.images={args.images}", "data.verify_images=false"]
        source_config, _ = load_recipe("shapes-demo", world)
        source = RunDirectory.open(root / "source", config=source_config.model_dump(mode="json"), seed=0)
        run_stages(source_config, source, ["data"])
        model = create_model("albef-tiny", vocab_size=len(load_tokenizer(source.path / "data" / "tokenizer")))
        save_checkpoint(source.path / "checkpoints", 0, {"model": model}, {}, {"epoch": 0, "model": "albef-tiny"})

        config, _ = load_recipe(
            "shapes-demo",
            [
                *world,
                f"embed.encoder=falcon:{source.path}",
                f"embed.device={args.device}",
                f"embed.batch_size={args.batch_size}",
                f"embed.num_workers={args.workers}",
            ],
        )
        run = RunDirectory.open(root / "embed", config=config.model_dump(mode="json"), seed=0)
        summary = run_stages(config, run, ["data", "embed"])["embed"]
    print(
        json.dumps(
            {
                "images": args.images,
                "batch_size": args.batch_size,
                "workers": args.workers,
                "threads": args.threads,
                **summary,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
