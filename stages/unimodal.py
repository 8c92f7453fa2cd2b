"""The unimodal stage: the shapes world's DeiT and BERT, trained once and shared by every run that asks.

ALBEF starts from an ImageNet-supervised DeiT and a BERT trained with masked language modelling; a
shapes run that starts from random weights ends where the choice of negatives barely matters. This
stage gives the shapes runs the same kind of start. Reads top to bottom:

1. settings: the world (a shapes world: its scenes are the image labels), the architecture of
   ``pretrain.model`` at ``pretrain.encoders.image_size``, the run's tokenizer, and the cache entry those and the
   seed name (:func:`falcon_cli.config.unimodal.unimodal_weights`). A complete entry is reused as it is;
2. the image encoder: the model's ViT classifies, per grid cell, the shape, the colour and the size
   (or "empty") of the world's training images and of ``unimodal.extra_images`` scenes drawn afresh
   (ImageNet is far larger than COCO); accuracy on the validation images;
3. the text encoder: a BERT of the model's text width and ``text_layers + fusion_layers`` layers learns
   masked language modelling on the training captions; masked-token accuracy on the validation captions;
4. both written atomically into the cache entry with ``report.json``; the run gets ``results/unimodal.*``.

Pretraining loads them with ``pretrain.encoders.vision_weights: unimodal`` and ``pretrain.encoders.text_weights:
unimodal``."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import NoReturn

import numpy as np
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
from PIL import Image
from rich.markup import escape
from safetensors.torch import save_file

from falcon_cli.artifacts.atomic import atomic_dir, write_json
from falcon_cli.artifacts.results import write_results
from falcon_cli.config.schema import Recipe
from falcon_cli.config.unimodal import unimodal_model_config, unimodal_seed, unimodal_weights, world_config
from falcon_cli.data.collate import tokenize
from falcon_cli.data.images import load_image
from falcon_cli.data.shapes.config import ShapesConfig
from falcon_cli.data.shapes.generation import extra_scenes
from falcon_cli.data.shapes.scene import scenes_from_objects_column
from falcon_cli.data.tokenizer import load_run_tokenizer
from falcon_cli.data.transforms import build_transform
from falcon_cli.errors import FalconError
from falcon_cli.frameworks import model_framework
from falcon_cli.models.unimodal import (
    ATTRIBUTES,
    REPORT_FILE,
    TEXT_DIR,
    VISION_FILE,
    SceneAttributeClassifier,
    masked_language_model,
)
from falcon_cli.models.weights import quiet_transformers
from falcon_cli.objectives.mlm import MlmMask
from falcon_cli.runtime.console import make_console
from falcon_cli.runtime.distributed import on_rank_zero
from falcon_cli.runtime.optim import build_optimizer, set_learning_rate
from falcon_cli.runtime.precision import grad_scaler, pick_device
from falcon_cli.runtime.progress import log_epoch, track
from falcon_cli.runtime.run_dir import RunDirectory
from falcon_cli.runtime.seeding import seed_everything
from falcon_cli.runtime.update import UpdateStep

console = make_console(stderr=True)


def run(config: Recipe, run: RunDirectory) -> dict:
    """Train (or reuse) the unimodal encoders of ``config``'s world, model and seed; returns the summary."""
    return on_rank_zero(lambda: _unimodal(config, run))


def _unimodal(config: Recipe, run: RunDirectory) -> dict:
    u, p = config.unimodal, config.pretrain
    # 1. What to train, and whether it exists already.
    if not model_framework(p.model).unimodal_init:
        raise FalconError(
            f"unimodal: pretrain.model={p.model} is not an ALBEF model; the unimodal stage trains "
            "ALBEF's encoders (a ViT and a BERT)"
        )
    tokenizer = load_run_tokenizer(run.path, config.name)
    weights = unimodal_weights(config, tokenizer.get_vocab())
    if weights.complete():
        report = json.loads(weights.report.read_text(encoding="utf-8"))
        console.print(f"unimodal weights reused: {escape(str(weights.path))}")
        return _record(run, weights.path, report, reused=True)
    model_config = unimodal_model_config(config, len(tokenizer))
    device = pick_device(u.device)
    seed = unimodal_seed(config)  # (unimodal.seed, else the run's)
    seed_everything(seed)
    world = Path(config.data.dataset)
    scenes = pq.read_table(world / "scenes.parquet", columns=["image_id", "split", "file", "objects"])
    vocabulary = json.loads((world / "world.json").read_text(encoding="utf-8"))["vocabulary"]
    start = time.perf_counter()

    # 2. The image encoder: per cell, shape / colour / size or empty (class 0), on the world's training images
    #    and ``extra_images`` scenes drawn afresh (the ImageNet analogue: many more images than pairs).
    arrays = scenes_from_objects_column(scenes.column("objects"))
    split = np.array(scenes.column("split").to_pylist())
    rows = {name: np.flatnonzero(split == name) for name in ("train", "val")}
    transform = build_transform("test", model_config.image_size)  # no crops or flips: the labels name cells
    files = scenes.column("file").to_pylist()
    images = {name: _stack([transform(load_image(world / files[i])) for i in rows[name].tolist()]) for name in rows}
    codes = {name: {a: getattr(arrays, a)[rows[name]] for a in ATTRIBUTES} for name in rows}
    if u.extra_images:
        extra, pixels = extra_scenes(ShapesConfig.model_validate(world_config(world)), u.extra_images, seed)
        images["train"] = torch.cat([images["train"], _stack([transform(Image.fromarray(p)) for p in pixels])])
        codes["train"] = {a: np.concatenate([codes["train"][a], getattr(extra, a)]) for a in ATTRIBUTES}
    labels = {
        name: {a: torch.from_numpy(codes[name][a].astype(np.int64) + 1) for a in ATTRIBUTES}  # -1 empty -> 0
        for name in rows
    }
    classes = {
        "shape": len(vocabulary["shapes"]) + 1,
        "color": len(vocabulary["colors"]) + 1,
        "size": len(vocabulary["sizes"]) + 1,
    }
    classifier = SceneAttributeClassifier(model_config, classes).to(device)

    def image_loss(batch: torch.Tensor, target: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        logits = classifier(batch.to(device, torch.float32))
        target = {name: target[name].to(device) for name in ATTRIBUTES}
        loss = sum(F.cross_entropy(logits[n].flatten(0, 1), target[n].flatten()) for n in ATTRIBUTES) / len(ATTRIBUTES)
        return loss, {n: (logits[n].argmax(-1) == target[n]) for n in ATTRIBUTES}

    image_report = _fit(
        classifier,
        u.image_epochs,
        u.batch_size,
        u.image_lr,
        u.weight_decay,
        u.grad_clip,
        seed,
        train=(images["train"], labels["train"]),
        step=image_loss,
        what="unimodal image",
    )
    image_report.update(_image_accuracy(classifier, image_loss, images["val"], labels["val"], u.batch_size))
    image_report["train_images"], image_report["extra_images"] = len(images["train"]), u.extra_images

    # 3. The text encoder: masked language modelling on the training captions, cut where pretraining cuts them.
    captions = pq.read_table(world / "captions.parquet", columns=["split", "text"]).to_pydict()
    texts = {name: [t for s, t in zip(captions["split"], captions["text"]) if s == name] for name in ("train", "val")}
    tokens = {name: tokenize(tokenizer, texts[name], p.encoders.max_text_length) for name in texts}
    bert = masked_language_model(model_config, len(tokenizer), tokenizer.pad_token_id).to(device)
    special = dict(
        vocab_size=len(tokenizer),
        mask_token_id=tokenizer.mask_token_id,
        pad_token_id=tokenizer.pad_token_id,
        cls_token_id=tokenizer.cls_token_id,
        probability=u.mlm_probability,
    )
    mask_generator = torch.Generator().manual_seed(seed + 7000)

    def text_loss(ids: torch.Tensor, mask: torch.Tensor, generator: torch.Generator = mask_generator):
        sample = MlmMask.sample(ids, mask, generator=generator, **special)
        out = bert(
            input_ids=sample.masked_ids.to(device), attention_mask=mask.to(device), labels=sample.labels.to(device)
        )
        chosen = sample.labels.to(device) != -100
        return out.loss, {"token": (out.logits.argmax(-1) == sample.labels.to(device))[chosen]}

    text_report = _fit(
        bert,
        u.text_epochs,
        u.batch_size,
        u.text_lr,
        u.weight_decay,
        u.grad_clip,
        seed + 1,
        train=tokens["train"],
        step=text_loss,
        what="unimodal text",
    )
    text_report.update(_text_accuracy(text_loss, tokens["val"], u.batch_size, seed))

    # 4. Both encoders, atomically, with what they reached and what produced them.
    report = {
        "image": image_report,
        "text": text_report,
        "key": weights.key,
        "seed": seed,
        "model": p.model,
        "image_size": model_config.image_size,
        "settings": u.model_dump(mode="json"),
        "seconds": round(time.perf_counter() - start, 1),
    }
    with atomic_dir(weights.path) as tmp:
        encoder = {k: v.detach().cpu().contiguous() for k, v in classifier.encoder.state_dict().items()}
        save_file(encoder, str(tmp / VISION_FILE), metadata={"format": "pt"})
        with quiet_transformers():  # (no progress bar of its own: ours say where the stage is)
            bert.save_pretrained(str(tmp / TEXT_DIR))
        write_json(tmp / REPORT_FILE, report)
    return _record(run, weights.path, report, reused=False)


# --- the pieces the story above calls ------------------------------------------------------------------------


def _fit(
    module: torch.nn.Module,
    epochs: int,
    batch_size: int,
    lr: float,
    weight_decay: float,
    grad_clip: float | None,
    seed: int,
    *,
    train,
    step,
    what: str,
) -> dict:
    """Train ``module`` with AdamW (warm-up over the first epoch, cosine to 1% of ``lr``, the gradient norm clipped
    to ``grad_clip`` unless None) on ``train``, a tuple of tensors split into shuffled batches along dim 0;
    ``step(*batch) -> (loss, hits)``. Returns the last loss, the largest gradient norm seen (before clipping) and
    on how many steps it was clipped."""
    module.train()
    optimizer = build_optimizer(module, lr, weight_decay)
    parameters = [q for q in module.parameters() if q.requires_grad]
    limit = math.inf if grad_clip is None else grad_clip

    def stop(bad: dict) -> NoReturn:  # (a non-finite step: stop before the weights are saved)
        problem = f"loss is {bad['loss']}" if not math.isfinite(bad["loss"]) else f"the gradient norm is {bad['norm']}"
        raise FalconError(
            f"{what}: {problem} at epoch {bad['epoch']}, step {bad['step']}; "
            "lower unimodal.image_lr or unimodal.text_lr"
        )

    # Backward, clipping, the non-finite guard on the device, the optimizer (the same step as every loop's; fp32,
    # so the scaler is a no-op). Clipping to infinity measures the norm (every gradient times 1.0: unchanged).
    update = UpdateStep(
        module,
        optimizer,
        grad_scaler("fp32", parameters[0].device),
        "fp32",
        grad_clip=limit,
        stop=stop,
        parts=(),
    )
    n = len(train[0])  # (the first of ``train`` is a tensor)
    steps_per_epoch = max(1, n // batch_size)
    total = max(1, epochs * steps_per_epoch)
    order = torch.Generator().manual_seed(seed)
    loss, done, largest, clipped = None, 0, 0.0, 0
    for epoch in range(epochs):
        tick = time.perf_counter()
        epoch_largest = torch.zeros((), device=parameters[0].device)  # (kept on the device: no sync per step)
        epoch_clipped = torch.zeros((), dtype=torch.long, device=parameters[0].device)
        permutation = torch.randperm(n, generator=order)
        for k in track(range(steps_per_epoch), f"{what} epoch {epoch}"):
            rows = permutation[k * batch_size : (k + 1) * batch_size]
            warm = min(1.0, (done + 1) / steps_per_epoch)
            set_learning_rate(optimizer, lr * warm * (0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * done / total))))
            loss, _ = step(*(_take(t, rows) for t in train))
            norm = update(loss, {}, epoch, done, sync=False)  # (the norm before clipping)
            epoch_largest, epoch_clipped = torch.maximum(epoch_largest, norm), epoch_clipped + (norm > limit)
            done += 1
        update.check()  # (the epoch's end syncs anyway)
        largest, clipped = max(largest, float(epoch_largest)), clipped + int(epoch_clipped)
        log_epoch(
            what,
            epoch,
            epochs,
            steps=done,
            loss=float(loss.detach()),
            max_grad_norm=float(epoch_largest),
            clipped_steps=int(epoch_clipped),
            seconds=time.perf_counter() - tick,
        )
    module.eval()
    return {
        "epochs": epochs,
        "steps": done,
        "final_loss": round(float(loss.detach()), 4) if loss is not None else None,
        "max_grad_norm": round(largest, 4),
        "clipped_steps": clipped,
    }


@torch.no_grad()
def _image_accuracy(classifier, step, images: torch.Tensor, labels: dict[str, torch.Tensor], batch_size: int) -> dict:
    """Per attribute, the share of validation cells classified right, over every cell and over the occupied cells
    alone (the informative one: most cells are empty); the share of images with every cell right; and what
    answering "empty" everywhere scores (the chance level of the first)."""
    classifier.eval()
    hits = {n: [] for n in ATTRIBUTES}
    for k in range(0, len(images), batch_size):
        _, batch_hits = step(images[k : k + batch_size], _take(labels, slice(k, k + batch_size)))
        for n in ATTRIBUTES:
            hits[n].append(batch_hits[n].cpu())
    per = {n: torch.cat(hits[n]) for n in ATTRIBUTES}  # [images, 9] each
    occupied = labels["shape"] > 0
    every_cell = torch.stack([per[n].all(dim=1) for n in ATTRIBUTES]).all(dim=0)
    return {
        **{f"val_{n}_accuracy": round(100 * per[n].float().mean().item(), 2) for n in ATTRIBUTES},
        **{f"val_{n}_accuracy_occupied": round(100 * per[n][occupied].float().mean().item(), 2) for n in ATTRIBUTES},
        "val_scene_accuracy": round(100 * every_cell.float().mean().item(), 2),
        "val_images": len(images),
        "val_empty_cells": round(100 * (~occupied).float().mean().item(), 2),
    }


@torch.no_grad()
def _text_accuracy(step, tokens, batch_size: int, seed: int) -> dict:
    """The share of masked validation tokens predicted right (one fixed mask, drawn with ``seed``)."""
    generator = torch.Generator().manual_seed(seed + 7001)
    hits = []
    ids, mask = tokens
    for k in range(0, len(ids), batch_size):
        _, batch_hits = step(ids[k : k + batch_size], mask[k : k + batch_size], generator)
        hits.append(batch_hits["token"].cpu())
    hits = torch.cat(hits)
    return {
        "val_masked_token_accuracy": round(100 * hits.float().mean().item(), 2),
        "val_masked_tokens": int(hits.numel()),
        "val_captions": int(len(ids)),
    }


def _take(batch, rows):
    """``batch[rows]``, or a dict of those."""
    return {k: v[rows] for k, v in batch.items()} if isinstance(batch, dict) else batch[rows]


def _stack(images: list[torch.Tensor]) -> torch.Tensor:
    """The transformed images as one half-precision tensor (what is kept in memory; steps cast to float32)."""
    return torch.stack(images).half() if images else torch.empty(0, dtype=torch.float16)


def _record(run: RunDirectory, path: Path, report: dict, *, reused: bool) -> dict:
    """``results/unimodal.*`` in the run, and the stage's summary."""
    row = {
        "weights": str(path),
        "reused": reused,
        **{f"image_{k}": v for k, v in report["image"].items()},
        **{f"text_{k}": v for k, v in report["text"].items()},
    }
    console.print(
        write_results(
            run,
            "unimodal",
            [row],
            {"key": report["key"], "seed": report["seed"], "units": "percent"},
            "Unimodal encoders (validation split, percent)",
        ),
        markup=False,
    )
    return {"weights": str(path), "reused": reused, "image": report["image"], "text": report["text"]}
