"""The pretrain stage: ALBEF (ITC + ITM + MLM), BLIP-2 stage-1 (ITC + ITM + ITG) or dual-encoder (sigmoid or InfoNCE
contrastive + captioning) pretraining with a batch composer.

It is built, then trained, as a torchtune recipe is: ``run`` is ``train(build(config, run))``.

:func:`build` reads top to bottom:
1. processes, device, precision and seeds (torchrun or a plain process);
2. data, the run's tokenizer, the model, the false-negative method and the objective (the framework
   record builds them: falcon_cli/frameworks.py), optimizer and scaler;
3. the batch composer (uniform, GRIT, a fixed or progressive quantile, or FALCON with its learned
   scheduler; found by name, falcon_cli/methods/composers.py), the embedding cache it reads, the epoch's batches
   (:class:`~falcon_cli.sampling.epochs.EpochBatches`), and the composer's hooks around each step
   (:mod:`falcon_cli.sampling.step_hooks`: FALCON's reward and scheduler update; nothing for the others);
4. the training state (:class:`~falcon_cli.runtime.train_state.TrainState`): every stateful part named
   once, restored on ``--resume`` so the run continues exactly where it stopped.

:func:`train` is the loop:
5. each epoch composed from the cache of the previous epoch (FALCON: one batch at a time, because batch k + 1
   depends on the scheduler after step k); each step's forward, update and hooks; the cache filled from the
   training forward itself (no extra pass); checkpoints; the cache written to ``embeddings/epoch_<e>.h5``;
6. zero-shot ITC retrieval on the test split, before and after training.

Single process: ``falcon pretrain --recipe shapes-demo``. Several: ``torchrun
--nproc_per_node 4 -m falcon_cli pretrain --recipe coco-albef`` (multi-node: add
``--nnodes N --node_rank R --rdzv_endpoint HOST:PORT``). Batch size is per process.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from rich.markup import escape

from falcon_cli.artifacts.embeddings import FINGERPRINT_ATTR
from falcon_cli.artifacts.results import write_results as write_results_table
from falcon_cli.artifacts.tables import BATCHES
from falcon_cli.config.schema import Recipe, SchedulerConfig
from falcon_cli.config.unimodal import unimodal_weights
from falcon_cli.data.collate import PretrainCollate
from falcon_cli.data.datasets import pretrain_dataset, retrieval_dataset
from falcon_cli.data.pairs import records_fingerprint
from falcon_cli.data.preloaded import PreloadedImages
from falcon_cli.data.spec import load_spec
from falcon_cli.data.tokenizer import load_run_tokenizer
from falcon_cli.data.transforms import build_transform
from falcon_cli.errors import FalconError
from falcon_cli.evaluation.zero_shot import oracle_positives, zero_shot_retrieval
from falcon_cli.frameworks import build_objective, model_framework, model_overrides
from falcon_cli.judges.oracle import in_batch_truth
from falcon_cli.models.albef_checkpoint import load_albef_checkpoint
from falcon_cli.models.registry import create_model
from falcon_cli.objectives.false_negative_builder import build_false_negatives, excluded_negatives
from falcon_cli.objectives.false_negatives import FlagsAgainstOracle, StepContext
from falcon_cli.objectives.itc import alpha_ramp
from falcon_cli.objectives.mlm import MlmMask
from falcon_cli.registry import COMPOSERS, REWARDS
from falcon_cli.reporting.figures import q_over_training
from falcon_cli.runtime import distributed as D
from falcon_cli.runtime.checkpoint import latest_checkpoint, rewind_latest
from falcon_cli.runtime.console import make_console
from falcon_cli.runtime.graph_step import TrainingForward
from falcon_cli.runtime.loggers import RunLoggers
from falcon_cli.runtime.metrics import MetricsLog
from falcon_cli.runtime.optim import build_optimizer, learning_rate, set_learning_rate
from falcon_cli.runtime.precision import grad_scaler, pick_device, resolve_precision
from falcon_cli.runtime.preemption import Preemption
from falcon_cli.runtime.profiling import StepProfiler
from falcon_cli.runtime.progress import log_epoch, track
from falcon_cli.runtime.run_dir import RunDirectory
from falcon_cli.runtime.seeding import seed_everything
from falcon_cli.runtime.train_state import Generators, GlobalRng, TrainState
from falcon_cli.runtime.update import UpdateStep
from falcon_cli.sampling.batch_log import BatchLog, part_name, read_batch_log
from falcon_cli.sampling.epochs import EpochBatches, build_composer
from falcon_cli.sampling.falcon_step import FalconStep
from falcon_cli.sampling.scheduler import NegativeScheduler
from falcon_cli.sampling.scheduler_features import SchedulerFeatures
from falcon_cli.sampling.sharded_cache import ShardedCache
from falcon_cli.sampling.step_hooks import STEP_LOGGED, step_hooks
from falcon_cli.sampling.warm_start import WarmStart, load_warm_start

log = logging.getLogger("falcon")
console = make_console(stderr=True)


@dataclass
class Pretraining:
    """Everything :func:`build` assembled for :func:`train`: the process, the data, the model and its objective, the
    batches and their composer's hooks, the training state, the logs."""

    config: Any
    run: Any
    p: Any
    device: Any
    distributed: Any
    rank: Any
    world: Any
    main: Any
    precision: Any
    loggers: Any
    spec: Any
    tokenizer: Any
    framework: Any
    model: Any
    resolution: Any
    dataset: Any
    fingerprint: Any
    excluded: Any
    masked_key: Any
    objective: Any
    false_negatives: Any
    optimizer: Any
    trainer: Any
    forward: Any
    collate: Any
    special: Any
    cache: Any
    epochs: Any
    batch_log: Any
    hooks: Any
    generators: Any
    flags: Any
    metrics: Any
    total_steps: Any
    state: Any
    results: Any
    update_model: Any
    profiler: Any
    eval_split: Any
    positives: Any
    preloaded: Any
    preemption: Any


def run(config: Recipe, run: RunDirectory, *, resume: bool = False, overwrite: bool = False) -> dict:
    """Pretrain according to ``config.pretrain``; returns the summary recorded in the manifest."""
    return train(build(config, run, resume=resume, overwrite=overwrite))


def build(config: Recipe, run: RunDirectory, *, resume: bool = False, overwrite: bool = False) -> Pretraining:
    """Every part of the pretraining, restored from the latest checkpoint on ``resume`` (steps 1 to 4 above)."""
    p = config.pretrain

    # 1. Processes, device, precision, seeds. Every rank draws its own randomness (seed + rank).
    device = pick_device(p.runtime.device)
    distributed = D.init_distributed(device.type)  # already joined by run_stages under torchrun
    rank, world, main = D.rank(), D.world_size(), D.is_main_process()
    precision = resolve_precision(p.runtime.precision, device)
    seed_everything(config.seed + rank)
    # The run's loggers besides metrics.jsonl (TensorBoard, wandb, MLflow): their packages checked now, before any work.
    loggers = RunLoggers(
        p.logging.loggers,
        run.path / "loggers",
        what="pretrain.logging.loggers",
        name=run.path.name,
        config=config.model_dump(mode="json"),
        main=main,
    )

    # 2. Data, tokenizer (the one the data stage saved in this run), model and its framework's objective.
    spec = load_spec(config.data.dataset)
    if config.data.on_missing is not None:
        spec.on_missing = config.data.on_missing
    tokenizer = load_run_tokenizer(run.path, config.name)
    framework = model_framework(p.model)  # ALBEF, BLIP-2 or a dual encoder: everything below the model is the same
    vision_weights, text_weights = weight_sources(config, run, tokenizer)  # (`unimodal`: the unimodal stage's)
    model = create_model(
        p.model,
        **model_overrides(
            framework,
            len(tokenizer),
            vision_weights=vision_weights,
            text_weights=text_weights,
            image_size=p.encoders.image_size,
            pad_token_id=tokenizer.pad_token_id,
        ),
    )
    if p.encoders.init is not None:  # a whole official ALBEF/GRIT-VLP/MAFA checkpoint (docs/pretraining.md)
        load_albef_checkpoint(model, p.encoders.init)
    if (
        p.encoders.vision_trainable_epochs
    ):  # BLIP-2 without a pretrained image encoder: it trains first (so AdamW holds it)
        model.set_image_encoder_trainable(True)
    resolution = model.config.image_size
    dataset = pretrain_dataset(
        spec, build_transform(p.loader.augment, resolution, hflip=p.loader.hflip), seed=config.seed
    )
    fingerprint = records_fingerprint(dataset.records, spec.base_dir)  # which pairs: recorded in every embeddings file
    # The false-negative method (MAFA, SRCL, DiHT, GloFND, or the plain ITC), checked before any training; on
    # the shapes world the oracle measures what it flags. `same_image: mask` keeps pairs that show the same
    # image (false negatives by construction) out of the ITC denominators and ITM mining.
    method, truth = build_false_negatives(
        config, spec, dataset, device, run, warn=lambda line: console.print(f"[yellow]warning:[/] {escape(line)}")
    )
    # `false_negatives.oracle: mask` (a diagnostic) keeps every truly matching pair out the same way.
    excluded = excluded_negatives(p.false_negatives, spec, dataset.records, device, check=False)
    masked_key = "same_image_masked" if p.false_negatives.oracle == "keep" else "oracle_masked"  # (metrics.jsonl)
    objective = build_objective(framework, model, p.losses, method).to(device)
    false_negatives = objective.false_negatives  # (the method, or the framework's plain ITC)
    if p.runtime.compile:
        model.compile_encoders(mode=p.runtime.compile_mode)
    optimizer = build_optimizer(objective, p.optim.lr, p.optim.weight_decay)
    scaler = grad_scaler(precision, device)
    trainer = data_parallel(objective, device) if distributed else objective
    # The step's forward, eager or captured whole (`runtime.graph_step`: one shape for every step, so captions padded).
    forward = training_forward(trainer, p, precision, device)
    collate = PretrainCollate(tokenizer, p.encoders.max_text_length, fixed_length=p.runtime.graph_step)
    special = dict(
        vocab_size=len(tokenizer),
        mask_token_id=tokenizer.mask_token_id,
        pad_token_id=tokenizer.pad_token_id,
        cls_token_id=tokenizer.cls_token_id,
    )

    # 3. Batches: the composer (uniform, GRIT, a fixed or progressive quantile, or FALCON with its learned
    # scheduler), the cache of features it reads, the batch log. The shard generator is identical on every
    # rank (so shards are disjoint); composition, masking and ITM draw from per-rank generators. Under DDP each
    # rank's cache holds its shards only, this epoch's and the next one's (about 2N / world rows).
    all_ids = torch.tensor(dataset.pair_ids, dtype=torch.long)
    cache = ShardedCache(all_ids, model.config.embed_dim, device=device, rank=rank, world=world)
    warm = warm_start(config, run, all_ids, device, fingerprint) if p.composer.search_spaces is not None else None
    scheduler = build_scheduler(p.scheduler, device) if p.composer.name == "falcon" else None
    falcon = FalconStep(scheduler, p.scheduler, precision, device) if scheduler is not None else None
    # On a shapes world the quantile composers log the oracle's view of every chained slot (the anchor's
    # false-negative density, the safe q, whether the pick is one): it changes no choice.
    chain_truth = (
        truth or in_batch_truth(spec.resolve(spec.shapes_world), dataset.records)
        if spec.shapes_world is not None and COMPOSERS.get(p.composer.name).draws_q
        else None
    )
    if scheduler is not None and REWARDS.get(p.scheduler.reward.name).oracle and chain_truth is None:
        raise FalconError(
            f"pretrain.scheduler.reward.name={p.scheduler.reward.name}: the dataset in {spec.base_dir} is not a "
            "shapes world (its dataset.yaml names no shapes_world), so no oracle judges the picks; use "
            "pretrain.scheduler.reward.name=positive_margin+itm (the model's own ITM head)"
        )
    composer = build_composer(p, truth=chain_truth, source=scheduler.alpha_beta if scheduler is not None else None)
    generators = run_generators(config.seed, rank, device)
    batch_log = BatchLog(run.path / "batches.parquet", part_rank=rank)
    epochs = EpochBatches(
        composer,
        cache,
        all_ids,
        rank=rank,
        world=world,
        shard_generator=generators["shard"],
        compose_generator=generators["compose"],
        batch_log=batch_log,
        warm=warm,
        max_steps=p.max_steps_per_epoch,
    )
    hooks = step_hooks(
        falcon, epochs, batch_log, lag=p.scheduler.lag, overlap=p.scheduler.overlap
    )  # (FALCON's work around each step)
    flags = FlagsAgainstOracle(false_negatives, truth, device) if truth is not None else None
    metrics = MetricsLog(run.path / "metrics.jsonl", loggers)
    total_steps = sum(epochs.steps(e) for e in range(p.epochs))
    if main:
        console.print(
            f"[bold]pretrain[/] {p.model} ({model.num_parameters() / 1e6:.1f}M parameters) on {device}, "
            f"{precision}; {len(dataset):,} pairs; batch {p.batch_size} × {world} processes = "
            f"global batch {p.batch_size * world}; composer {p.composer.name}; {p.epochs} epochs"
        )

    # 4. Checkpoints hold everything, so a resumed run continues exactly: the model alone (loadable by every
    # later stage), momentum parts, GloFND's thresholds; optimizer, scaler, composer, scheduler; and per rank
    # every RNG, its embedding cache shards, where its epoch stands, FALCON's epoch record and the flag counts.
    state = TrainState(
        run.path / "checkpoints",
        checkpoint_weights(model, objective, false_negatives),
        what="pretraining",
        keep_last=p.checkpoints.keep_last,
        say=console.print,
        shared={"optimizer": optimizer, "scaler": scaler, "composer": composer, "scheduler": scheduler},
        # (the cache before epoch_batches: a resumed FALCON epoch's spaces read it)
        per_rank={
            "rng": GlobalRng(),
            "generators": generators,
            "cache": cache,
            "epoch_batches": epochs,
            "falcon": falcon,
            "flags": flags,
        },
        meta={"model": p.model, "image_size": resolution, "max_text_length": p.encoders.max_text_length},
    )
    state.begin(resume=resume, overwrite=overwrite)
    metrics.truncate_after(state.step)  # what the killed run logged after its checkpoint goes (the loggers start here)
    results = state.values.setdefault("results", {})
    # Backward, clipping, the non-finite guard on the device, the optimizer (the same step as every loop's).
    update_model = UpdateStep(
        objective,
        optimizer,
        scaler,
        precision,
        grad_clip=p.optim.grad_clip,
        stop=lambda bad: stop_non_finite(bad, state, precision, p, framework.losses),
        parts=framework.losses,
    )
    profiler = StepProfiler(
        run.path / "profile",
        p.runtime.profile_steps,
        device=device,
        enabled=main,
        start=epochs.steps(0) if p.epochs > 1 else min(10, max(epochs.steps(0) - p.runtime.profile_steps, 0)),
    )

    # Only rank 0 evaluates, so only rank 0 loads the eval split.
    # On a shapes world every number also comes false-negative aware (any true match counts), as `falcon evaluate`'s.
    eval_split = (
        retrieval_dataset(spec, p.eval.split, build_transform("test", resolution)) if p.eval.split and main else None
    )
    positives = oracle_positives(spec, eval_split) if eval_split is not None else None
    if eval_split is not None and state.checkpoint is None:
        results["untrained"] = zero_shot_retrieval(
            model, eval_split, tokenizer, device, positives=positives, max_length=p.encoders.max_text_length
        )
    preloaded = preload_images(dataset, device, p.loader.num_workers) if p.loader.preload_images else None
    D.barrier()
    # A preemption notice (SIGTERM, SIGUSR1, SIGUSR2) stops every rank after the same step, checkpointed exactly
    # there, with the requeue exit status (runtime/preemption.py; docs/cluster.md).
    preemption = Preemption(
        p.runtime.preempt_grace_s,
        key="pretrain.runtime.preempt_grace_s",
        checkpoints=state.directory,
        say=console.print,
    ).install()
    return Pretraining(
        config=config,
        run=run,
        p=p,
        device=device,
        distributed=distributed,
        rank=rank,
        world=world,
        main=main,
        precision=precision,
        loggers=loggers,
        spec=spec,
        tokenizer=tokenizer,
        framework=framework,
        model=model,
        resolution=resolution,
        dataset=dataset,
        fingerprint=fingerprint,
        excluded=excluded,
        masked_key=masked_key,
        objective=objective,
        false_negatives=false_negatives,
        optimizer=optimizer,
        trainer=trainer,
        forward=forward,
        collate=collate,
        special=special,
        cache=cache,
        epochs=epochs,
        batch_log=batch_log,
        hooks=hooks,
        generators=generators,
        flags=flags,
        metrics=metrics,
        total_steps=total_steps,
        state=state,
        results=results,
        update_model=update_model,
        profiler=profiler,
        eval_split=eval_split,
        positives=positives,
        preloaded=preloaded,
        preemption=preemption,
    )


def train(t: Pretraining) -> dict:
    """The epoch loop (step 5), then zero-shot retrieval (step 6); returns the summary recorded in the manifest. Each
    epoch is composed from the cache of the previous one; the cache fills from the training forward itself. What a
    composer does around each step is behind ``t.hooks`` (:mod:`falcon_cli.sampling.step_hooks`)."""
    p, state, epochs, metrics, hooks = t.p, t.state, t.epochs, t.metrics, t.hooks
    for epoch in range(state.epoch, p.epochs):
        t.dataset.set_epoch(epoch)
        if p.encoders.vision_trainable_epochs and epoch >= p.encoders.vision_trainable_epochs:
            freeze_image_encoder(t)  # (BLIP-2 without a pretrained image encoder: frozen from here on)
        if epochs.begin(epoch):  # composed now (not resumed in the middle of it)
            state.batch_index = 0
            hooks.epoch_composed()
            if epochs.summary is not None:  # a quantile epoch composed up front: its q and the oracle's view
                metrics.write(step=state.step, epoch=epoch, kind="epoch_summary", **epochs.summary)
        hooks.begin_epoch(epoch)
        loader, total = epochs.loader(
            t.dataset,
            t.collate,
            state.batch_index,
            num_workers=p.loader.num_workers,
            lag=hooks.lag,
            pin_memory=t.device.type == "cuda",
            seed=t.config.seed + epoch,
        )
        tick, seen = time.perf_counter(), 0
        for index, batch in enumerate(
            track(hooks.loader(loader), f"epoch {epoch}", total=total - state.batch_index), start=state.batch_index
        ):
            t.profiler.before(state.step)
            lr = step_learning_rate(p, state.step, epoch)
            set_learning_rate(t.optimizer, lr)
            mask = t.generators["mask"] if t.framework.masked_language else None
            inputs, pair_ids = step_inputs(batch, t.device, t.preloaded, mask, p.losses.mlm_probability, t.special)
            same_image = t.excluded(pair_ids) if t.excluded is not None else None
            hooks.before_step(t.objective, inputs, same_image)
            context = StepContext(
                pair_ids, epoch, state.step, t.total_steps, same_image, mask_itm=p.false_negatives.oracle != "mask_itc"
            )
            ramp = alpha_ramp(p.losses.distill_alpha, index, total, epoch)
            out = t.forward(inputs, ramp, t.generators["itm"], context)
            losses = {name: getattr(out, name) for name in t.framework.losses}  # (itc, itm, and mlm or itg)
            after = state.step + 1  # (the non-finite verdict is a host sync: read only where the loop syncs anyway)
            t.update_model(
                out.loss,
                losses,
                epoch,
                state.step,
                sync=hooks.syncs
                or after % p.logging.every == 0
                or index == total - 1
                or bool(p.checkpoints.every and after % p.checkpoints.every == 0),
            )
            halted = t.update_model.guard.halted
            logged = hooks.after_step(t.objective, out, losses, inputs, same_image, batch["pair_ids"], halted)
            if logged.get("halted"):  # (an update that waited for this step found a non-finite one before it)
                t.update_model.check()
            # Every rank's features: a rank's next shard holds pairs the other ranks train now.
            t.cache.update(
                D.all_gather_cat(pair_ids), D.all_gather_cat(out.image_feat), D.all_gather_cat(out.text_feat)
            )
            if t.flags is not None:  # what the method flagged vs the oracle
                t.flags.observe(batch["pair_ids"])
            state.step += 1
            D.note_step(epoch, state.step)  # (under torchrun: the line a lost rank's peers print names this step)
            seen += len(pair_ids) * t.world
            t.profiler.after(state.step)
            if state.step % p.logging.every == 0 or index == total - 1:
                log_step(t, epoch, index, out, losses, lr, logged, same_image, inputs, seen, tick)
            if p.checkpoints.every and state.step % p.checkpoints.every == 0 and index + 1 < total:
                t.preemption.save(state, epoch, index + 1)
            if t.preemption.requested():  # (a host-side all-reduce under torchrun: every rank stops after this step)
                raise t.preemption.stop_after_step(state, epoch, index + 1)
        end_epoch(t, epoch, seen, tick, out)
    t.preemption.uninstall()
    return finish(t)


def freeze_image_encoder(t: Pretraining) -> None:
    """BLIP-2's image encoder frozen from ``pretrain.encoders.vision_trainable_epochs`` on; DDP wraps what still
    trains, and the step's forward is built again around it."""
    if not t.model.vision_trainable:
        return
    t.model.set_image_encoder_trainable(False)
    t.trainer = data_parallel(t.objective, t.device) if t.distributed else t.objective
    t.forward = training_forward(t.trainer, t.p, t.precision, t.device)


def step_learning_rate(p, step: int, epoch: int) -> float:
    """The VLP model's learning rate at ``step`` (``pretrain.optim``: warm-up, then the per-epoch cosine)."""
    o = p.optim
    return learning_rate(
        step,
        epoch,
        lr=o.lr,
        min_lr=o.min_lr,
        warmup_lr=o.warmup_lr,
        warmup_steps=o.warmup_steps,
        cosine_epochs=o.cosine_epochs or p.epochs,
    )


def log_step(t: Pretraining, epoch, index, out, losses, lr, logged, same_image, inputs, seen, tick) -> None:
    """One ``metrics.jsonl`` record of the step just trained (the losses averaged over ranks)."""
    elapsed = time.perf_counter() - tick
    t.metrics.write(
        step=t.state.step,
        epoch=epoch,
        **mean_over_ranks(out.loss, losses),
        lr=lr,
        temperature=out.temperature,
        pairs_per_s=seen / max(elapsed, 1e-9),
        elapsed_s=elapsed,
        text_tokens=inputs[1].shape[1],
        peak_memory_mib=peak_memory_mib(t.device),
        sampler=t.epochs.sampler(index),
        **{k: logged.get(k) for k in STEP_LOGGED},
        **({t.masked_key: same_image.sum()} if same_image is not None else {}),
        **t.false_negatives.stats,
    )


def end_epoch(t: Pretraining, epoch: int, seen: int, tick: float, out) -> None:
    """What ends an epoch: the composer's and the method's records, the cache written to ``embeddings/``, the learning
    curve's point, a checkpoint at the next epoch's start."""
    p, state, metrics = t.p, t.state, t.metrics
    halted, record = t.hooks.end_epoch(epoch)
    if halted:  # (scheduler.overlap: the epoch's last update, still waiting, found a non-finite step)
        t.update_model.check()
    flagged = t.flags.epoch_summary() if t.flags is not None else None  # precision / recall against the oracle
    if flagged is not None:
        metrics.write(step=state.step, epoch=epoch, kind="false_negatives", **flagged)
    if record is not None:  # what the scheduler did this epoch (this rank)
        metrics.write(step=state.step, epoch=epoch, kind="epoch_summary", **record)
    t.epochs.end()
    if t.loggers and COMPOSERS.get(p.composer.name).draws_q:  # the epoch's q's (this rank's), as a histogram
        q = read_batch_log(t.batch_log.path / part_name(epoch, t.rank))["q"]
        metrics.histogram("epoch_summary/q", q, state.step)
    # (every rank: rank 0 gathers the ranks' rows and writes them)
    path = t.cache.save(
        t.run.path / "embeddings" / f"epoch_{epoch:03d}.h5",
        {
            "model": p.model,
            "checkpoint": f"step {state.step}",
            "dataset": t.spec.name,
            "split": "pretrain",
            "epoch": epoch,
            FINGERPRINT_ATTR: t.fingerprint,
        },
    )
    if t.main:
        t.run.add_artifact(path, schema="embeddings", schema_version=1)
    if t.eval_split is not None and p.eval.every and (epoch + 1) % p.eval.every == 0 and epoch + 1 < p.epochs:
        metrics.write(step=state.step, epoch=epoch, kind="zero_shot", **zero_shot(t))  # the learning curve
    t.preemption.save(state, epoch + 1, 0)
    if t.preemption.requested():  # (during the epoch's end: its checkpoint is the place to continue from)
        raise t.preemption.stop_after_step(state, epoch + 1, 0)
    if seen:  # (log.txt shows each epoch even with no progress bar: sweeps, cluster jobs)
        elapsed = time.perf_counter() - tick
        log_epoch(
            "pretrain",
            epoch,
            p.epochs,
            steps=state.step,
            loss=float(out.loss.detach()),
            pairs_per_s=seen / elapsed,
            seconds=elapsed,
        )


def zero_shot(t: Pretraining) -> dict:
    """Zero-shot ITC retrieval of the model as it is, on the eval split (rank 0)."""
    return zero_shot_retrieval(
        t.model, t.eval_split, t.tokenizer, t.device, positives=t.positives, max_length=t.p.encoders.max_text_length
    )


def finish(t: Pretraining) -> dict:
    """Step 6: zero-shot retrieval with the trained model (ITC only; ITM re-ranking is `falcon evaluate`), the run's
    figures; the summary recorded in the manifest."""
    p, state = t.p, t.state
    if t.eval_split is not None:
        t.results["trained"] = zero_shot(t)
        if p.eval.every:  # the curve's last point
            t.metrics.write(step=state.step, epoch=p.epochs - 1, kind="zero_shot", **t.results["trained"])
        write_results(t.run, t.results, split=p.eval.split, resolution=t.resolution, step=state.step)
    D.barrier()
    if t.main:
        record_artifacts(t.run, with_q_figure=COMPOSERS.get(p.composer.name).draws_q)
        t.metrics.image(Q_FIGURE, t.run.path / f"{Q_FIGURE}.png", state.step)
    t.metrics.close()
    return {
        "steps": state.step,
        "epochs": p.epochs,
        "pairs": len(t.dataset),
        "world_size": t.world,
        "precision": t.precision,
        "device": str(t.device),
        "retrieval": t.results,
        "dataset_fingerprint": t.fingerprint,
    }  # (`falcon compare` refuses runs of other pairs)


# --- the pieces the story above calls ------------------------------------------------------------------------


def run_generators(seed: int, rank: int, device: torch.device) -> Generators:
    """The run's generators: the shard generator is identical on every rank (so shards are disjoint); composition,
    MLM masking (CPU) and ITM sampling (on the device) draw from this rank's own."""
    return Generators(
        shard=torch.Generator().manual_seed(seed),
        compose=torch.Generator().manual_seed(seed + 1000 + rank),
        mask=torch.Generator().manual_seed(seed + 2000 + rank),
        itm=torch.Generator(device=device).manual_seed(seed + 3000 + rank),
    )


def training_forward(trainer: torch.nn.Module, p, precision: str, device: torch.device) -> TrainingForward:
    """The step's forward through ``trainer`` with the pretrain settings ``p``: eager, or captured
    (``runtime.graph_step``)."""
    return TrainingForward(
        trainer,
        precision,
        device,
        graph=p.runtime.graph_step,
        sample_itm=p.losses.itm_negatives == "sample",
        mode=p.runtime.compile_mode,
        backend=p.runtime.graph_backend,
    )


def checkpoint_weights(model: torch.nn.Module, objective, false_negatives) -> dict[str, torch.nn.Module]:
    """The weight files of a checkpoint: the model alone (what every later stage loads), then what the objective
    and the false-negative method keep (ALBEF's momentum encoders and queue, GloFND's per-pair thresholds)."""
    return {"model": model, **objective.checkpoint_parts(), **false_negatives.checkpoint_parts()}


def preload_images(dataset, device: torch.device, num_workers: int) -> PreloadedImages:
    """The dataset's images decoded once onto the device with its fixed transform (``loader.preload_images``), gathered
    per batch there; the loader then reads captions only."""
    preloaded = PreloadedImages(dataset.records, dataset.transform, device, num_workers=num_workers)
    dataset.load_images = False
    if D.is_main_process():
        console.print(f"preloaded {len(preloaded.pixels):,} images on {device} ({preloaded.nbytes / 2**20:,.0f} MiB)")
    return preloaded


"""What a step's record says of FALCON's update (None outside FALCON epochs)."""


def mean_over_ranks(loss: torch.Tensor, losses: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``{"loss": ..., <each part>: ...}`` of a step, averaged over the ranks (one all-reduce)."""
    logged = torch.stack([loss.detach(), *losses.values()]).float()
    if D.world_size() > 1:
        dist.all_reduce(logged)
        logged /= D.world_size()
    return dict(zip(("loss", *losses), logged))


def peak_memory_mib(device: torch.device) -> float | None:
    """The most device memory allocated so far (MiB; None off CUDA)."""
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


Q_FIGURE = "figures/q_over_training"
"""The figure of q over training (quantile composers), without ``.png``: also its tag in the loggers."""


def record_artifacts(run: RunDirectory, *, with_q_figure: bool) -> None:
    """The manifest's record of what pretraining wrote besides checkpoints and embeddings: the batch log, the
    metrics log and, for the quantile composers, the figure of q over training."""
    run.add_artifact("batches.parquet", schema="batches", schema_version=BATCHES.version)
    run.add_artifact("metrics.jsonl", schema="metrics", schema_version=1)
    if with_q_figure:
        figure = q_over_training(read_batch_log(run.path / "batches.parquet"), run.path / f"{Q_FIGURE}.png")
        run.add_artifact(figure, schema="figure", schema_version=1)


def data_parallel(objective: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``objective`` under DDP (again when BLIP-2's image encoder freezes: DDP must know what still trains)."""
    return torch.nn.parallel.DistributedDataParallel(
        objective, device_ids=[device.index] if device.type == "cuda" else None
    )


def weight_sources(config: Recipe, run: RunDirectory, tokenizer) -> tuple[str | None, str | None]:
    """``pretrain.encoders.vision_weights`` and ``text_weights`` with the keyword ``unimodal`` replaced by the files the
    unimodal stage wrote for this run's world, model, tokenizer and seed (refused when it has not run)."""
    p = config.pretrain
    if "unimodal" not in (p.encoders.vision_weights, p.encoders.text_weights):
        return p.encoders.vision_weights, p.encoders.text_weights
    weights = unimodal_weights(config, tokenizer.get_vocab())
    if not weights.complete():
        raise FalconError(
            f"pretrain: vision_weights/text_weights=unimodal, but {weights.path} holds no unimodal "
            f"weights for this world, model and seed; add unimodal to the recipe's stages or run "
            f"`falcon unimodal --recipe {config.name} --run-dir {run.path}` first"
        )
    return (
        str(weights.vision) if p.encoders.vision_weights == "unimodal" else p.encoders.vision_weights,
        str(weights.text) if p.encoders.text_weights == "unimodal" else p.encoders.text_weights,
    )


def step_inputs(
    batch: dict,
    device: torch.device,
    preloaded: PreloadedImages | None,
    mask_generator: torch.Generator | None,
    mlm_probability: float,
    special: dict,
) -> tuple[tuple, torch.Tensor]:
    """One batch on the device: ``(images, input_ids, attention_mask, mlm mask or None)`` and the pair ids. The
    mask is drawn on the CPU (its generator) from the loader's CPU tensors: drawing it from the device copies
    would read them back, a host sync every step. Preloaded images are gathered on the device by pair id."""
    input_ids = batch["input_ids"].to(device, non_blocking=True)
    attention_mask = batch["attention_mask"].to(device, non_blocking=True)
    pair_ids = batch["pair_ids"].to(device, non_blocking=True)
    images = preloaded.images(pair_ids) if preloaded is not None else batch["images"].to(device, non_blocking=True)
    mask = (
        MlmMask.sample(
            batch["input_ids"],
            batch["attention_mask"],
            probability=mlm_probability,
            generator=mask_generator,
            **special,
        ).to(device, non_blocking=True)
        if mask_generator is not None
        else None
    )
    return (images, input_ids, attention_mask, mask), pair_ids


def build_scheduler(s: SchedulerConfig, device: torch.device) -> NegativeScheduler:
    """FALCON's scheduler φ from its settings (``pretrain.scheduler``): its inputs, network, optimizer and reward."""
    inputs = SchedulerFeatures(s.features, s.quantile_levels, s.quantile_temperature)
    return NegativeScheduler(
        quantiles=inputs.dim,
        hidden=s.hidden,
        blocks=s.blocks,
        lr=s.lr,
        weight_decay=s.weight_decay,
        reward=s.reward.name,
        reward_mode=s.reward.mode,
        credit=s.update.credit,
        baseline=s.update.baseline,
        baseline_decay=s.update.baseline_decay,
        normalize=s.update.advantage_norm,
        entropy=s.update.entropy,
        max_concentration=s.max_concentration,
        grad_clip=s.grad_clip,
        levels=s.update.levels,
        init_q=s.init_q,
        device=device,
    )


def warm_start(
    config: Recipe, run: RunDirectory, all_ids: torch.Tensor, device: torch.device, fingerprint: str
) -> WarmStart:
    """Epoch 0 from built search spaces (``pretrain.composer.search_spaces``) and the embeddings that built them."""
    p = config.pretrain
    if p.composer.name == "uniform":
        raise FalconError(
            f"pretrain.composer.search_spaces={p.composer.search_spaces} needs a composer that uses search spaces "
            "(grit, quantile, progressive, falcon); pretrain.composer.name is uniform"
        )
    spaces_path = (
        run.path / "search_spaces.parquet" if p.composer.search_spaces == "run" else Path(p.composer.search_spaces)
    )
    embeddings_path = (
        Path(config.search_spaces.embeddings)
        if config.search_spaces.embeddings is not None
        else run.path / "embeddings" / "embeddings.h5"
    )
    # Each rank reads only the embeddings of its own block of the spaces (the cache holds no other rows).
    return load_warm_start(
        spaces_path,
        embeddings_path,
        all_ids,
        rank=D.rank(),
        world=D.world_size(),
        device=device,
        fingerprint=fingerprint,
        dataset=str(config.data.dataset),
        warn=lambda line: console.print(f"[yellow]{escape(line)}[/]"),
    )


def stop_non_finite(bad: dict, state: TrainState, precision: str, p, losses: tuple[str, ...]) -> NoReturn:
    """Stop with one line at the run's first non-finite step ``bad`` (:meth:`UpdateStep.check`): where, and what to
    resume from. The checkpoint of that very step is rewound past (in fp32 its weights gave the loss)."""
    directory = state.directory
    latest = latest_checkpoint(directory) if D.is_main_process() else None
    if latest is not None and int(latest.name) == bad["step"] and precision == "fp32":
        latest = rewind_latest(directory, bad["step"])  # its weights gave this loss
    what = (
        f"loss is {bad['loss']}"
        if not math.isfinite(bad["loss"])
        else f"the gradient norm is {bad['norm']} (loss {bad['loss']:.4g})"
    )
    parts = ", ".join(f"{name} {bad[name]:.4g}" for name in losses)
    raise FalconError(non_finite_stop(what, bad["epoch"], bad["step"], parts, precision, p, latest))


def non_finite_stop(what: str, epoch: int, step: int, parts: str, precision: str, p, latest: Path | None) -> str:
    """The one line a non-finite loss or gradient stops a run with: where, what to resume from, and what
    to change for this run's precision and settings."""
    changes = [f"pretrain.optim.lr={p.optim.lr / 10:g}"]
    if p.optim.grad_clip is None:
        changes.append("pretrain.optim.grad_clip=1.0")
    if precision in ("fp16", "bf16"):
        changes.append("pretrain.runtime.precision=fp32")
    advice = " and/or ".join(f"'{c}'" for c in changes)
    if latest is not None:
        where = (
            f"--resume continues from checkpoint {latest.name}, saved before it: add --overwrite and {advice} "
            f"(if it fails again, its weights had already diverged: start again without --resume)"
        )
    else:
        where = f"no usable checkpoint: start again with --overwrite and {advice}"
    return f"{what} at epoch {epoch}, step {step} ({parts}), in {precision}; nothing was saved; {where}"


def write_results(run: RunDirectory, results: dict, *, split: str, resolution: int, step: int) -> None:
    """``results/retrieval_zeroshot.{json,csv,md}``: one row per model (``untrained``, ``trained``), percent."""
    meta = {
        "split": split,
        "checkpoint": f"step {step}",
        "resolution": resolution,
        "scoring": "itc",
        "k": None,
        "units": "percent",
    }
    rows = [{"model": name, **values} for name, values in results.items()]
    console.print(
        write_results_table(
            run, "retrieval_zeroshot", rows, meta, f"Zero-shot retrieval on `{split}` (ITC similarity, percent)"
        ),
        markup=False,
    )
