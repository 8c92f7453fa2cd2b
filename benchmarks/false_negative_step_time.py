"""Benchmark: the extra cost per training step of each false-negative method, measured in one run.

Every method is built exactly as the pretrain stage builds it
(``falcon_cli.objectives.false_negative_builder.build_false_negatives``) on a shapes world, and one training step
(forward, backward, AdamW step) of albef-tiny is timed on real batches (images loaded and transformed, captions
tokenised) for each: plain ITC, DiHT, SRCL (the auxiliary features looked up from an embeddings.h5), GloFND (thresholds
updated every step), MAFA with the oracle as discriminator, and MAFA with a frozen falcon checkpoint as discriminator
(the paper's Con-D: it re-reads the 2B judged pairs' images and runs its own encoders and fusion on them). The ratios to
plain ITC are printed.

    PYTHONPATH=. .venv/bin/python benchmarks/false_negative_step_time.py                    # CPU, about 2 minutes
    PYTHONPATH=. .venv/bin/python benchmarks/false_negative_step_time.py --batch 96 --device cuda
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from falcon_cli.artifacts.embeddings import EmbeddingsWriter  # noqa: E402
from falcon_cli.config.recipes import load_recipe  # noqa: E402
from falcon_cli.data.collate import PretrainCollate  # noqa: E402
from falcon_cli.data.datasets import pretrain_dataset  # noqa: E402
from falcon_cli.data.shapes import generate_world  # noqa: E402
from falcon_cli.data.spec import load_spec  # noqa: E402
from falcon_cli.data.tokenizer import train_wordpiece_tokenizer  # noqa: E402
from falcon_cli.data.transforms import build_transform  # noqa: E402
from falcon_cli.models.registry import create_model  # noqa: E402
from falcon_cli.objectives.false_negative_builder import build_false_negatives  # noqa: E402
from falcon_cli.objectives.false_negatives import StepContext  # noqa: E402
from falcon_cli.objectives.mlm import MlmMask  # noqa: E402
from falcon_cli.objectives.vlp import VlpObjective  # noqa: E402
from falcon_cli.runtime.checkpoint import save_checkpoint  # noqa: E402
from falcon_cli.runtime.precision import pick_device  # noqa: E402
from falcon_cli.runtime.run_dir import RunDirectory  # noqa: E402

METHODS = {
    "none": [],
    "diht": ["pretrain.false_negatives.method=diht"],
    "srcl": ["pretrain.false_negatives.method=srcl"],
    "glofnd": ["pretrain.false_negatives.method=glofnd", "pretrain.false_negatives.glofnd.start_epoch=0"],
    "mafa (oracle)": ["pretrain.false_negatives.method=mafa", "pretrain.false_negatives.mafa.judge=oracle"],
    "mafa (checkpoint Con-D)": [
        "pretrain.false_negatives.method=mafa",
        "pretrain.false_negatives.mafa.judge=checkpoint",
    ],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--world", type=Path, default=None, help="a shapes world (default: generate 200 images in a temp dir)"
    )
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=6, help="timed steps per method (after one warm-up step)")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    device = pick_device(args.device)
    tmp = Path(tempfile.mkdtemp(prefix="fn-bench-"))
    world = args.world or tmp / "world"
    if args.world is None:
        config, _ = load_recipe("shapes-demo", [f"data.dataset={world}", "data.shapes.images=200"])
        generate_world(config.data.shapes, world, workers=1)
    spec = load_spec(world)
    transform = build_transform("test", 64)
    dataset = pretrain_dataset(spec, transform)
    tokenizer = train_wordpiece_tokenizer(
        [r.captions[0] for r in dataset.records], tmp / "run" / "data" / "tokenizer", vocab_size=400
    )
    collate = PretrainCollate(tokenizer, 25)
    torch.manual_seed(0)
    model = create_model("albef-tiny", vocab_size=len(tokenizer)).to(device)
    # The inputs the methods read: a frozen checkpoint (MAFA's Con-D) and an auxiliary model's features (SRCL).
    save_checkpoint(
        tmp / "run" / "checkpoints",
        1,
        {"model": create_model("albef-tiny", vocab_size=len(tokenizer))},
        {},
        {"epoch": 1, "model": "albef-tiny"},
    )
    aux = torch.nn.functional.normalize(torch.randn(len(dataset), 256), dim=1).numpy().astype(np.float16)
    with EmbeddingsWriter(
        tmp / "aux.h5",
        n=len(dataset),
        dim=256,
        attrs=dict(model="random", checkpoint="", dataset=str(world), split="pretrain", epoch=0),
    ) as writer:
        writer.write(0, aux, aux, np.array(dataset.pair_ids, dtype=np.int64))

    rng = np.random.default_rng(0)
    batches = [
        collate([dataset[i] for i in rng.choice(len(dataset), args.batch, replace=False)])
        for _ in range(args.steps + 1)
    ]
    print(f"albef-tiny on {device}, batch {args.batch}, {args.steps} timed steps per method, world {world}")
    # Every method gets its own copy of the model; the methods take turns step by step, so drift in the
    # machine's speed (other processes, warm-up) hits them all alike.
    runs = {}
    for name, overrides in METHODS.items():
        config, _ = load_recipe(
            "shapes-demo",
            [
                f"data.dataset={world}",
                f"pretrain.false_negatives.srcl.aux_embeddings={tmp / 'aux.h5'}",
                f"pretrain.false_negatives.mafa.judge_model={tmp / 'run'}",
                f"pretrain.runtime.device={device}",
                *overrides,
            ],
        )
        method, _ = build_false_negatives(config, spec, dataset, device, RunDirectory(tmp / "run"))
        objective = VlpObjective(copy.deepcopy(model), false_negatives=method).to(device)
        runs[name] = (objective, torch.optim.AdamW(objective.parameters(), lr=1e-5))
    timings = {name: [] for name in runs}
    for step, batch in enumerate(batches):
        images, ids, attention = (batch[k].to(device) for k in ("images", "input_ids", "attention_mask"))
        mask = MlmMask.sample(
            ids,
            attention,
            vocab_size=len(tokenizer),
            mask_token_id=tokenizer.mask_token_id,
            pad_token_id=tokenizer.pad_token_id,
            cls_token_id=tokenizer.cls_token_id,
            generator=torch.Generator().manual_seed(step),
        )
        context = StepContext(batch["pair_ids"].to(device), epoch=1, step=5, total_steps=10)
        for name, (objective, optimizer) in runs.items():
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            out = objective(images, ids, attention, mask, context=context)
            optimizer.zero_grad(set_to_none=True)
            out.loss.backward()
            optimizer.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if step:  # the first round warms up
                timings[name].append(time.perf_counter() - start)
    timings = {name: statistics.median(times) for name, times in timings.items()}
    base = timings["none"]
    print(f"{'method':<26}{'s/step':>10}{'vs none':>10}")
    for name, seconds in timings.items():
        print(f"{name:<26}{seconds:>10.3f}{seconds / base:>10.2f}")


if __name__ == "__main__":
    main()
