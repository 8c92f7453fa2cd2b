"""The finetune stage: ALBEF's downstream fine-tuning, one task after another.

Reads top to bottom:
1. processes, device, precision, seeds; the run's tokenizer; the pretrained checkpoint to start from (a
   falcon run or checkpoint, or an official ALBEF/GRIT-VLP/MAFA .pth file);
2. each task in ``finetune.tasks`` (reference-code.md §5):
   * ``retrieval``: ITC against a momentum queue in which every caption of the same image is a
     positive, plus ITM with sampled negatives; after each epoch the ``select_split`` is scored
     (ITC, top k re-ranked by ITM) and the epoch with the best mean recall is kept;
   * ``vqa``: the answer decoder starts as a copy of the fusion layers; each question's answers
     are scored by sequence cross-entropy weighted by how many annotators gave them; the last
     epoch is kept (ALBEF trains on train + val);
   * ``nlvr2``: text-assignment pretraining on the run's own image-text pairs (the fusion layers
     duplicated, one copy per image), then the two-way classifier; best by dev accuracy;
3. every task writes ``finetune/<task>/``: ``checkpoints/`` after each epoch (``--resume``
   continues after the last finished one, ``--overwrite`` trains the task again; without either a
   task that has checkpoints is refused, nothing changed), ``best/`` (the kept weights and
   ``meta.json``) and ``metrics.jsonl``. The checkpoints go through the same
   :class:`~falcon_cli.runtime.train_state.TrainState` as pretraining's.

Single process: ``falcon finetune --recipe shapes-demo --task vqa``. Several: ``torchrun
--nproc_per_node 8 -m falcon_cli finetune --recipe coco-albef --task retrieval`` (batch size is per
process; scoring is sharded across the processes).
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Callable, NoReturn

import torch
from rich.markup import escape
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from falcon_cli.artifacts.atomic import atomic_dir, write_json
from falcon_cli.config.schema import Recipe, TaskTraining
from falcon_cli.data.collate import Nlvr2Collate, PretrainCollate, RetrievalCollate, VqaCollate
from falcon_cli.data.datasets import nlvr2_dataset, pretrain_dataset, retrieval_dataset, vqa_dataset
from falcon_cli.data.spec import load_spec
from falcon_cli.data.tokenizer import load_run_tokenizer
from falcon_cli.data.transforms import build_transform
from falcon_cli.errors import FalconError
from falcon_cli.evaluation.downstream import nlvr2_accuracy
from falcon_cli.evaluation.retrieval import recall_at_k
from falcon_cli.evaluation.scoring import embed_split, retrieval_scores
from falcon_cli.evaluation.zero_shot import split_targets
from falcon_cli.models.albef import pooled_features
from falcon_cli.models.nlvr2 import AlbefNLVR2
from falcon_cli.models.pretrained import (
    FINETUNED,
    albef_from_checkpoint,
    at_resolution,
    find_checkpoint,
    finetuned_weights,
)
from falcon_cli.models.vqa import AlbefVQA
from falcon_cli.models.weights import save_weights
from falcon_cli.objectives.itc import alpha_ramp
from falcon_cli.objectives.retrieval import RetrievalObjective
from falcon_cli.objectives.text_assignment import text_assignment_loss, text_assignment_pairs
from falcon_cli.runtime import distributed as D
from falcon_cli.runtime.console import make_console
from falcon_cli.runtime.loggers import RunLoggers
from falcon_cli.runtime.loggers import require as require_loggers
from falcon_cli.runtime.metrics import MetricsLog
from falcon_cli.runtime.optim import build_optimizer, learning_rate, set_learning_rate
from falcon_cli.runtime.precision import autocast, grad_scaler, pick_device, resolve_precision
from falcon_cli.runtime.preemption import Preemption
from falcon_cli.runtime.progress import log_epoch, track
from falcon_cli.runtime.run_dir import RunDirectory
from falcon_cli.runtime.seeding import seed_everything
from falcon_cli.runtime.train_state import Generators, GlobalRng, TrainState, refuse_training_over
from falcon_cli.runtime.update import UpdateStep

console = make_console(stderr=True)


def run(config: Recipe, run: RunDirectory, *, resume: bool = False, overwrite: bool = False) -> dict:
    """Fine-tune every task in ``config.finetune.tasks``; returns the summary recorded in the manifest."""
    f = config.finetune

    # 1. Processes, device, precision, seeds; tokenizer and starting checkpoint, checked before any work.
    device = pick_device(f.device)
    D.init_distributed(device.type)
    precision = resolve_precision(f.precision, device)
    seed_everything(config.seed + D.rank())
    spec = load_spec(config.data.dataset)
    if config.data.on_missing is not None:
        spec.on_missing = config.data.on_missing
    tokenizer = load_run_tokenizer(run.path, config.name)
    start = find_checkpoint(f.checkpoint or run.path, "finetune.checkpoint")
    require_loggers(f.loggers, "finetune.loggers")  # (each task opens its own: finetune/<task>/loggers/)
    ctx = Context(config, run, spec, tokenizer, device, precision, resume, overwrite)

    # 2. The tasks, one after another, each from the pretrained weights. A task (or its text-assignment
    # part) with checkpoints is refused before any task trains, unless --resume or --overwrite says what to do.
    for task in f.tasks:
        for part in sorted((run.path / FINETUNED / task).rglob("checkpoints")):
            refuse_training_over(
                part, f"{part.parent.relative_to(run.path / FINETUNED)} fine-tuning", resume=resume, overwrite=overwrite
            )
    results = {}
    for task in f.tasks:
        if D.is_main_process():
            console.print(f"[bold]finetune[/] {task} from {escape(str(start))} on {device}, {precision}")
        results[task] = TASKS[task](ctx, start)
    return {"start": str(start), **results}


class Context:
    """What every task needs: the config, the run, data, tokenizer, device and precision."""

    def __init__(
        self,
        config: Recipe,
        run: RunDirectory,
        spec,
        tokenizer,
        device: torch.device,
        precision: str,
        resume: bool,
        overwrite: bool = False,
    ):
        self.config, self.run, self.spec, self.tokenizer = config, run, spec, tokenizer
        self.device, self.precision, self.resume, self.overwrite = device, precision, resume, overwrite
        self.f = config.finetune

    def transform(self, resolution: int, train: bool = True):
        """Fine-tuning augmentation (or resize only: ``finetune.augment: false``; always for evaluation)."""
        kind = "finetune" if train and self.f.augment else "test"
        return build_transform(kind, resolution, hflip=self.f.augment)

    def autocast(self):
        return autocast(self.precision, self.device)


# --- retrieval ------------------------------------------------------------------------------------


def finetune_retrieval(ctx: Context, start: Path) -> dict:
    """ITC (momentum queue, same-image positives) + ITM; best epoch by mean recall on ``select_split``."""
    t, f = ctx.f.retrieval, ctx.f
    global_batch = t.batch_size * D.world_size()
    if t.queue_size % global_batch:
        raise FalconError(
            f"finetune.retrieval.queue_size={t.queue_size} is not a multiple of the global batch "
            f"{global_batch} (batch_size {t.batch_size} × {D.world_size()} processes); choose a multiple"
        )
    model = albef_from_checkpoint(start, t.image_size, vocab_size=len(ctx.tokenizer))
    resolution = model.config.image_size
    train = retrieval_dataset(ctx.spec, "train", ctx.transform(resolution))
    select = retrieval_dataset(ctx.spec, t.select_split, ctx.transform(resolution, train=False))
    objective = RetrievalObjective(model, queue_size=t.queue_size, momentum=t.momentum).to(ctx.device)
    generator = torch.Generator(device=ctx.device).manual_seed(ctx.config.seed + 3000 + D.rank())

    def loss(batch: dict, epoch: int, index: int, steps: int):
        alpha = alpha_ramp(t.distill_alpha, index, steps, epoch)
        out = objective(
            batch["images"], batch["input_ids"], batch["attention_mask"], batch["image_idx"], alpha, generator
        )
        return out.loss, {"itc": out.itc, "itm": out.itm}

    def score() -> dict:
        embeddings = embed_split(
            model,
            select,
            ctx.tokenizer,
            ctx.device,
            max_length=f.max_text_length,
            autocast=ctx.autocast(),
            num_workers=f.num_workers,
        )
        i2t, t2i = retrieval_scores(model, embeddings, k=t.select_k, autocast=ctx.autocast())
        return recall_at_k(i2t.cpu(), *split_targets(select), scores_t2i=t2i.cpu())

    return fit(
        ctx,
        "retrieval",
        LossModule(objective, loss),
        {
            "model": model,
            "momentum": nn.ModuleDict({"encoders": objective.momentum_encoders, "queue": objective.queue}),
        },
        train,
        RetrievalCollate(ctx.tokenizer, f.max_text_length),
        t,
        select=score,
        metric="mean_R",
        drop_last=True,
        meta={"image_size": resolution},
        generators=Generators(itm=generator),
    )


# --- VQA ------------------------------------------------------------------------------------------


def finetune_vqa(ctx: Context, start: Path) -> dict:
    """The answer decoder from the fusion layers; annotator-weighted answer cross-entropy; last epoch kept."""
    t, f = ctx.f.vqa, ctx.f
    albef = albef_from_checkpoint(start, t.image_size, vocab_size=len(ctx.tokenizer))
    model = AlbefVQA.from_pretrained(albef).to(ctx.device)
    # Several splits train as one (VQA v2: train + val).
    train = torch.utils.data.ConcatDataset(
        [vqa_dataset(ctx.spec, split, ctx.transform(albef.config.image_size)) for split in t.train_splits]
    )

    def loss(batch: dict, epoch: int, index: int, steps: int):
        states = model.encode_question(batch["image"], batch["question_ids"], batch["question_mask"])
        value = model.answer_loss(
            states, batch["question_mask"], batch["answer_ids"], batch["answer_mask"], batch["weights"], batch["n"]
        )
        return value, {}

    return fit(
        ctx,
        "vqa",
        LossModule(model, loss),
        {"model": model},
        train,
        VqaCollate(ctx.tokenizer, f.max_text_length, t.max_answer_length),
        t,
        meta={"image_size": albef.config.image_size, "max_answer_length": t.max_answer_length},
    )


# --- NLVR2 ----------------------------------------------------------------------------------------


def finetune_nlvr2(ctx: Context, start: Path) -> dict:
    """Text-assignment pretraining on the run's pairs, then the two-way classifier; best by dev accuracy."""
    t, f = ctx.f.nlvr2, ctx.f
    albef = albef_from_checkpoint(start, t.ta_image_size, vocab_size=len(ctx.tokenizer))
    project, pooling = albef.vision_proj.to(ctx.device).eval(), albef.config.pooling  # frozen: only picks hard images
    model = AlbefNLVR2.from_albef(albef).to(ctx.device)
    summary: dict = {}
    if t.ta_epochs > 0:
        pairs = pretrain_dataset(ctx.spec, ctx.transform(albef.config.image_size), seed=ctx.config.seed)
        generator = torch.Generator(device=ctx.device).manual_seed(ctx.config.seed + 4000 + D.rank())

        def ta_loss(batch: dict, epoch: int, index: int, steps: int):
            tokens = model.visual_encoder.forward_features(batch["images"])
            with torch.no_grad():
                feat = pooled_features(tokens.detach(), project, pooling)
            first, second, labels = text_assignment_pairs(feat, generator)
            text = model.text_encoder(batch["input_ids"], batch["attention_mask"])
            fused = model.fusion_encoder(text, batch["attention_mask"], tokens[first], tokens[second])
            return text_assignment_loss(model.ta_logits(fused), labels), {}

        ta = TaskTraining(
            epochs=t.ta_epochs,
            lr=t.ta_lr,
            min_lr=t.ta_lr,
            warmup_lr=t.warmup_lr,
            warmup_steps=0,
            weight_decay=t.weight_decay,
            grad_clip=t.grad_clip,
            batch_size=t.ta_batch_size,
            image_size=t.ta_image_size,
            max_steps_per_epoch=t.ta_max_steps,
        )
        summary["text_assignment"] = fit(
            ctx,
            "nlvr2/text_assignment",
            LossModule(model, ta_loss),
            {"model": model},
            pairs,
            PretrainCollate(ctx.tokenizer, f.max_text_length),
            ta,
            drop_last=True,
            meta={"image_size": albef.config.image_size},
            generators=Generators(pairs=generator),
        )
    # The classifier at its own resolution: position embeddings resampled, every other weight kept.
    state, config = at_resolution(model.state_dict(), model.config, t.image_size)
    if config.image_size != model.config.image_size:
        model = AlbefNLVR2(config).to(ctx.device)
        model.load_state_dict(state)
    train = nlvr2_dataset(ctx.spec, "train", ctx.transform(config.image_size))
    dev = nlvr2_dataset(ctx.spec, "dev", ctx.transform(config.image_size, train=False))
    collate = Nlvr2Collate(ctx.tokenizer, f.max_text_length)

    def loss(batch: dict, epoch: int, index: int, steps: int):
        logits = model(batch["images0"], batch["images1"], batch["input_ids"], batch["attention_mask"], head="nlvr")
        return torch.nn.functional.cross_entropy(logits.float(), batch["labels"]), {}

    def score() -> dict:
        return {
            "dev_accuracy": nlvr2_accuracy(
                model,
                dev,
                collate,
                ctx.device,
                batch_size=t.batch_size,
                num_workers=f.num_workers,
                autocast=ctx.autocast(),
            )
        }

    summary.update(
        fit(
            ctx,
            "nlvr2",
            LossModule(model, loss),
            {"model": model},
            train,
            collate,
            t,
            select=score,
            metric="dev_accuracy",
            meta={"image_size": config.image_size},
        )
    )
    return summary


TASKS: dict[str, Callable[[Context, Path], dict]] = {
    "retrieval": finetune_retrieval,
    "vqa": finetune_vqa,
    "nlvr2": finetune_nlvr2,
}


# --- the training loop every task shares -------------------------------------------------------------


class LossModule(nn.Module):
    """A module whose forward is ``loss(batch, epoch, index, steps) -> (loss, parts)``, so DDP wraps any task."""

    def __init__(self, module: nn.Module, loss: Callable):
        super().__init__()
        self.module = module
        self.loss = loss

    def forward(self, batch: dict, epoch: int, index: int, steps: int):
        return self.loss(batch, epoch, index, steps)


def fit(
    ctx: Context,
    name: str,
    trainable: LossModule,
    weights: dict[str, nn.Module],
    dataset,
    collate,
    t: TaskTraining,
    *,
    select: Callable[[], dict] | None = None,
    metric: str | None = None,
    drop_last: bool = False,
    meta: dict | None = None,
    generators: Generators | None = None,
) -> dict:
    """Train ``trainable`` on ``dataset`` for ``t.epochs``; after each epoch score it with ``select`` (or keep
    the last epoch) and checkpoint ``weights``; the kept weights go to ``finetune/<name>/best/``. ``generators``:
    the loss's own generators (ITM negatives, text-assignment pairs), checkpointed per rank with the global RNGs."""
    f, device, main = ctx.f, ctx.device, D.is_main_process()
    out = ctx.run.path / FINETUNED / name
    meta = {"max_text_length": f.max_text_length, **(meta or {})}  # evaluation cuts captions where training did
    world, rank = D.world_size(), D.rank()
    trainable.to(device)
    sampler = DistributedSampler(
        dataset, num_replicas=world, rank=rank, shuffle=True, seed=ctx.config.seed, drop_last=drop_last
    )
    loader = epoch_loader(
        dataset,
        sampler,
        0,
        t.batch_size,
        collate,
        drop_last=drop_last,
        num_workers=f.num_workers,
        pin_memory=device.type == "cuda",
        seed=ctx.config.seed,
    )
    steps = len(loader) if t.max_steps_per_epoch is None else min(len(loader), t.max_steps_per_epoch)
    if t.epochs > 0 and steps == 0:
        raise FalconError(
            f"finetune.{name.split('/')[0]}: {len(dataset)} examples make no full batch of "
            f"{t.batch_size} × {world} processes; lower batch_size"
        )
    runner = (
        torch.nn.parallel.DistributedDataParallel(
            trainable, device_ids=[device.index] if device.type == "cuda" else None, find_unused_parameters=True
        )
        if world > 1
        else trainable
    )
    optimizer = build_optimizer(trainable, t.lr, t.weight_decay)
    scaler = grad_scaler(ctx.precision, device)
    task = name.split("/")[0]

    def stop(bad: dict) -> NoReturn:  # (a non-finite step: the run stops, nothing saved since the last epoch's end)
        what = f"loss is {bad['loss']}" if not math.isfinite(bad["loss"]) else f"the gradient norm is {bad['norm']}"
        raise FalconError(
            f"finetune {name}: {what} at epoch {bad['epoch']}, step {bad['step']}; lower finetune.{task}.lr"
            + ("" if t.grad_clip is not None else f", set finetune.{task}.grad_clip=1.0")
            + " or use precision=fp32"
        )

    # Backward, clipping, the non-finite guard on the device, the optimizer (the same step as every loop's).
    update = UpdateStep(trainable, optimizer, scaler, ctx.precision, grad_clip=t.grad_clip, stop=stop)
    metrics = MetricsLog(
        out / "metrics.jsonl",
        RunLoggers(
            f.loggers,
            out / "loggers",
            what="finetune.loggers",
            name=f"{ctx.run.path.name}/{name}",
            main=main,
            config=ctx.config.model_dump(mode="json"),
        ),
    )
    # Checkpoints after each epoch hold the weights, optimizer, scaler, every rank's RNG, the best epoch so far
    # and the scores; a task's checkpoints are never trained over without --resume or --overwrite.
    state = TrainState(
        out / "checkpoints",
        weights,
        shared={"optimizer": optimizer, "scaler": scaler},
        per_rank={"rng": GlobalRng(), "generators": generators},
        what=f"{name} fine-tuning",
        keep_last=1,
        name=name,
        meta={"task": name, **meta},
        say=console.print,
    )
    state.begin(resume=ctx.resume, overwrite=ctx.overwrite)
    metrics.truncate_after(state.step)
    step, best, history = state.step, state.values.get("best"), state.values.get("history", [])

    # A preemption notice (SIGTERM, SIGUSR1, SIGUSR2) stops every rank after the same step, checkpointed there.
    preemption = Preemption(
        f.preempt_grace_s, key="finetune.preempt_grace_s", checkpoints=state.directory, say=console.print
    ).install()
    for epoch in range(state.epoch, t.epochs):
        sampler.set_epoch(epoch)
        trainable.train()
        start, state.batch_index = state.batch_index, 0  # (a resumed epoch continues at its next batch)
        loader = epoch_loader(
            dataset,
            sampler,
            start * t.batch_size,
            t.batch_size,
            collate,
            drop_last=drop_last,
            num_workers=f.num_workers,
            pin_memory=device.type == "cuda",
            seed=ctx.config.seed + epoch,
        )
        loss = None  # (none when a resumed epoch had no batch left)
        for index, batch in enumerate(track(loader, f"{name} epoch {epoch}", total=steps - start), start=start):
            if index >= steps:
                break
            lr = learning_rate(
                step,
                epoch,
                lr=t.lr,
                min_lr=t.min_lr,
                warmup_lr=t.warmup_lr,
                warmup_steps=t.warmup_steps,
                cosine_epochs=t.epochs,
            )
            set_learning_rate(optimizer, lr)
            batch = {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            with ctx.autocast():
                loss, parts = runner(batch, epoch, index, steps)
            logged = (step + 1) % f.log_every == 0 or index == steps - 1  # (the verdict is read where the loop syncs)
            update(loss, parts, epoch, step, sync=logged)
            step += 1
            D.note_step(epoch, step)  # (under torchrun: the line a lost rank's peers print names this step)
            if logged:
                metrics.write(step=step, epoch=epoch, loss=loss.detach().float(), lr=lr, **parts)
            if preemption.requested():  # (a host-side all-reduce under torchrun: every rank stops after this step)
                update.check()  # (never a checkpoint of weights a non-finite step gave)
                state.step, state.values = step, {"best": best, "history": history}
                raise preemption.stop_after_step(state, epoch, index + 1)
        update.check()
        scores = select() if select is not None else {}
        value = scores.get(metric) if metric else None
        improved = best is None or value is None or value > best["score"]
        if improved:
            best = {"epoch": epoch, "score": value, "metric": metric, **scores}
            if main:
                save_best(out, weights["model"], {"task": name, **best, **meta})
        history.append({"epoch": epoch, **scores})
        if main:
            metrics.write(step=step, epoch=epoch, kind="epoch", **scores)
            console.print(f"{name} epoch {epoch}: " + (", ".join(f"{k} {v:.2f}" for k, v in scores.items()) or "done"))
            log_epoch(
                f"finetune {name}",
                epoch,
                t.epochs,
                steps=step,
                loss=float(loss.detach()) if loss is not None else None,
                **scores,
            )
        state.step, state.values = step, {"best": best, "history": history}
        preemption.save(state, epoch + 1, 0)
        if preemption.requested():  # (during the epoch's selection: its checkpoint is the place to continue from)
            raise preemption.stop_after_step(state, epoch + 1, 0)
        D.barrier()
    preemption.uninstall()
    if t.epochs == 0 and main:  # nothing to train: the starting weights are the task's weights
        save_best(out, weights["model"], {"task": name, "epoch": None, **meta})
    metrics.close()
    D.barrier()
    return {
        "epochs": t.epochs,
        "steps": step,
        "steps_per_epoch": steps,
        "examples": len(dataset),
        "best": best,
        "history": history,
        "weights": str(finetuned_weights(ctx.run.path, name)),
    }


def epoch_loader(
    dataset,
    sampler: DistributedSampler,
    skip: int,
    batch_size: int,
    collate,
    *,
    drop_last: bool,
    num_workers: int,
    pin_memory: bool,
    seed: int,
) -> DataLoader:
    """The epoch's batches from the ``skip``-th example of this rank's order on (a resumed epoch continues at the
    batch after its checkpoint, the same batches). The loader has its own generator: creating it must not draw from
    the global RNG, or a resumed run's dropout would drift from the uninterrupted run's."""
    order = SkipFirst(sampler, skip) if skip else sampler
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=order,
        collate_fn=collate,
        num_workers=num_workers,
        drop_last=drop_last,
        pin_memory=pin_memory,
        generator=torch.Generator().manual_seed(seed),
    )


class SkipFirst(torch.utils.data.Sampler):
    """``sampler``'s indices after its first ``skip``."""

    def __init__(self, sampler, skip: int):
        self.sampler, self.skip = sampler, skip

    def __iter__(self):
        return itertools.islice(iter(self.sampler), self.skip, None)

    def __len__(self) -> int:
        return max(len(self.sampler) - self.skip, 0)


def save_best(out: Path, model: nn.Module, meta: dict) -> None:
    """``out/best/``: the kept weights (with the model config in their metadata) and what they scored."""
    with atomic_dir(out / "best") as tmp:
        save_weights(model, tmp / "model.safetensors")
        write_json(tmp / "meta.json", meta)
