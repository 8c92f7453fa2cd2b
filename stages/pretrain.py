"""The pretrain stage: ALBEF (ITC + ITM + MLM), BLIP-2 stage-1 (ITC + ITM + ITG) or dual-encoder (sigmoid or InfoNCE
contrastive + captioning) pretraining with a batch composer.

Reads top to bottom:
1. processes, device, precision and seeds (torchrun or a plain process);
2. data, the run's tokenizer, the model and its objective (its framework's: falcon_cli/frameworks.py),
   optimizer and scaler;
3. the batch composer (uniform, GRIT, a fixed or progressive quantile, or FALCON with its
   learned scheduler), the embedding cache it reads, the batch log;
4. resume from the latest checkpoint if asked: every piece of state, so the run continues
   exactly where it stopped;
5. the epoch loop: compose the epoch's batches from the cache of the previous epoch
   (FALCON: one batch at a time, because batch k + 1 depends on the scheduler after step k),
   train on them, reward and update the scheduler (FALCON), fill the cache from the
   training forward itself (no extra pass), checkpoint, write the cache to
   ``embeddings/epoch_<e>.h5``;
6. zero-shot ITC retrieval on the test split, before and after training.

Single process: ``falcon pretrain --recipe shapes-demo``. Several: ``torchrun
--nproc_per_node 4 -m falcon_cli pretrain --recipe coco-albef`` (multi-node: add
``--nnodes N --node_rank R --rdzv_endpoint HOST:PORT``). Batch size is per process.
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import record_function
from torch.utils.data import DataLoader

from falcon_cli.artifacts.results import write_results as write_results_table
from falcon_cli.runtime.run_dir import RunDirectory
from falcon_cli.artifacts.tables import BATCHES
from falcon_cli.config.schema import Recipe
from falcon_cli.data.collate import PretrainCollate
from falcon_cli.data.datasets import pretrain_dataset, retrieval_dataset
from falcon_cli.data.preloaded import PreloadedImages
from falcon_cli.data.shared_images import SharedImages
from falcon_cli.data.spec import load_spec
from falcon_cli.data.tokenizer import load_run_tokenizer
from falcon_cli.data.transforms import build_transform
from falcon_cli.errors import FalconError, Refused
from falcon_cli.evaluation.zero_shot import zero_shot_retrieval
from falcon_cli.models.albef_checkpoint import load_albef_checkpoint
from falcon_cli.models.registry import create_model
from falcon_cli.objectives.itc import alpha_ramp
from falcon_cli.objectives.mlm import MlmMask
from falcon_cli.objectives.false_negatives import StepContext, flag_counts, flag_summary
from falcon_cli.frameworks import build_objective, model_framework, model_overrides
from falcon_cli.reporting.figures import q_over_training
from falcon_cli.runtime import distributed as D
from falcon_cli.runtime.checkpoint import latest_checkpoint, resume_point, rewind_latest, save_checkpoint
from falcon_cli.runtime.console import make_console
from falcon_cli.runtime.finite import NonFiniteGuard
from falcon_cli.runtime.metrics import MetricsLog
from falcon_cli.runtime.optim import build_optimizer, learning_rate, set_learning_rate
from falcon_cli.runtime.precision import autocast, grad_scaler, pick_device, resolve_precision
from falcon_cli.runtime.profiling import StepProfiler
from falcon_cli.runtime.progress import track
from falcon_cli.runtime.seeding import rng_state, seed_everything, set_rng_state
from falcon_cli.sampling.batch_log import BatchLog, read_batch_log
from falcon_cli.sampling.cache import EmbeddingCache
from falcon_cli.sampling.composers import (GritComposer, UniformComposer, batches_from_state, batches_state, num_batches,
                                          num_space_batches, shard_pair_ids)
from falcon_cli.sampling.feed import FalconFeed, loader_settings
from falcon_cli.sampling.oracle_view import composition_summary
from falcon_cli.sampling.quantile import QuantileSpaces
from falcon_cli.sampling.scheduler import NegativeScheduler, positive_margin_rewards, progressive_q
from falcon_cli.sampling.scheduler_features import SchedulerFeatures
from falcon_cli.sampling.warm_start import load_warm_start
from falcon_cli.data.pairs import records_fingerprint
from falcon_cli.artifacts.embeddings import FINGERPRINT_ATTR

log = logging.getLogger("falcon")
console = make_console(stderr=True)



def run(config: Recipe, run: RunDirectory, *, resume: bool = False, overwrite: bool = False) -> dict:
    """Pretrain according to ``config.pretrain``; returns the summary recorded in the manifest."""
    p = config.pretrain

    # 1. Processes, device, precision, seeds. Every rank draws its own randomness (seed + rank).
    device = pick_device(p.device)
    distributed = D.init_distributed(device.type)  # already joined by run_stages under torchrun
    rank, world = D.rank(), D.world_size()
    precision = resolve_precision(p.precision, device)
    seed_everything(config.seed + rank)
    main = D.is_main_process()

    # 2. Data, tokenizer, model. The tokenizer is the one the data stage saved in this run.
    spec = load_spec(config.data.dataset)
    if config.data.on_missing is not None:
        spec.on_missing = config.data.on_missing
    tokenizer = load_run_tokenizer(run.path, config.name)
    framework = model_framework(p.model)  # ALBEF, BLIP-2 or a dual encoder: everything below the model is the same
    model = create_model(p.model, **model_overrides(framework, len(tokenizer), vision_weights=p.vision_weights,
                                                    text_weights=p.text_weights, image_size=p.image_size,
                                                    pad_token_id=tokenizer.pad_token_id))
    if p.init is not None:  # a whole official ALBEF/GRIT-VLP/MAFA checkpoint (docs/pretraining.md)
        load_albef_checkpoint(model, p.init)
    if p.vision_trainable_epochs:  # BLIP-2 without a pretrained image encoder: it trains first (so AdamW holds it)
        model.set_image_encoder_trainable(True)
    resolution = model.config.image_size
    dataset = pretrain_dataset(spec, build_transform(p.augment, resolution, hflip=p.hflip), seed=config.seed)
    fingerprint = records_fingerprint(dataset.records, spec.base_dir)  # which pairs: recorded in every embeddings file
    # False negatives (MAFA, SRCL, DiHT, GloFND): checked and loaded before any training; on the shapes
    # world the oracle measures what the method flags.
    false_negatives, truth = build_false_negatives(config, spec, dataset, device, run)
    # On a shapes world the quantile composers log the oracle's view of every chained slot (the
    # anchor's false-negative density, the safe q, whether the pick is one): it changes no choice.
    chain_truth = None
    if spec.shapes_world is not None and p.composer in ("quantile", "progressive", "falcon"):
        from falcon_cli.judges.oracle import in_batch_truth

        chain_truth = truth or in_batch_truth(spec.resolve(spec.shapes_world), dataset.records)
    # Pairs that show the same image are false negatives by construction; `same_image: mask` keeps them
    # out of the ITC denominators and ITM mining.
    shared_images = SharedImages(dataset.records, device) if p.same_image == "mask" else None
    objective = build_objective(framework, model, p, false_negatives).to(device)
    if p.compile:
        model.compile_encoders(mode=p.compile_mode)
    optimizer = build_optimizer(objective, p.lr, p.weight_decay)
    scaler = grad_scaler(precision, device)

    def wrap(objective):  # (again when BLIP-2's image encoder freezes: DDP must know what still trains)
        return torch.nn.parallel.DistributedDataParallel(objective, device_ids=[device.index] if device.type == "cuda" else None) \
            if distributed else objective
    trainer = wrap(objective)
    # Checkpoint files: the model alone (loadable by every later stage), and the momentum parts.
    weight_files = {"model": model}
    if p.itc == "momentum":
        weight_files["momentum"] = torch.nn.ModuleDict({"encoders": objective.momentum_encoders, "queue": objective.queue})
    if p.false_negatives == "glofnd":  # the per-pair thresholds and their Adam state
        weight_files["glofnd"] = false_negatives.thresholds
    collate = PretrainCollate(tokenizer, p.max_text_length)
    special = dict(vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id,
                   pad_token_id=tokenizer.pad_token_id, cls_token_id=tokenizer.cls_token_id)

    # 3. Batches. The shard generator is identical on every rank (so shards are disjoint);
    # the composition, masking and ITM generators are per rank. The quantile composers use
    # uniform batches in epoch 0 (no features yet), like GRIT.
    composer = (GritComposer(p.batch_size, p.search_space_size, drop_last=p.drop_last) if p.composer == "grit"
                else UniformComposer(p.batch_size, drop_last=p.drop_last))
    inputs = SchedulerFeatures(p.scheduler_features, p.quantile_levels, p.quantile_temperature)
    scheduler = NegativeScheduler(quantiles=inputs.dim, hidden=p.scheduler_hidden, blocks=p.scheduler_blocks,
                                  lr=p.scheduler_lr, weight_decay=p.scheduler_weight_decay, reward=p.reward,
                                  reward_mode=p.reward_mode, credit=p.scheduler_credit, baseline=p.reward_baseline,
                                  baseline_decay=p.reward_baseline_decay, normalize=p.scheduler_advantage_norm,
                                  entropy=p.scheduler_entropy, max_concentration=p.scheduler_max_concentration,
                                  grad_clip=p.scheduler_grad_clip, device=device) if p.composer == "falcon" else None

    def quantile_spaces(shard, generator, warm_epoch: bool = False) -> QuantileSpaces:
        return QuantileSpaces(shard, warm.cache if warm_epoch else cache, warm.width if warm_epoch else p.search_space_size,
                              p.batch_size, generator, drop_last=p.drop_last,
                              level=p.scheduler_level if p.composer == "falcon" else "instance",
                              quantiles=p.quantile_levels, temperature=p.quantile_temperature,
                              features=p.scheduler_features, sampler=p.composer,
                              grouped=warm_epoch, truth=chain_truth)
    all_ids = torch.tensor(dataset.pair_ids, dtype=torch.long)
    cache = EmbeddingCache(all_ids, model.config.embed_dim, device=device)
    # Warm start (opt-in): epoch 0 from built search spaces and the embeddings that built them.
    warm = None
    if p.search_spaces is not None:
        if p.composer == "uniform":
            raise FalconError(f"pretrain.search_spaces={p.search_spaces} needs a composer that uses search spaces "
                              "(grit, quantile, progressive, falcon); pretrain.composer is uniform")
        spaces_path = run.path / "search_spaces.parquet" if p.search_spaces == "run" else Path(p.search_spaces)
        embeddings_path = (Path(config.search_spaces.embeddings) if config.search_spaces.embeddings is not None
                           else run.path / "embeddings" / "embeddings.h5")
        warm = load_warm_start(spaces_path, embeddings_path, all_ids, device=device, fingerprint=fingerprint,
                               dataset=str(config.data.dataset), warn=lambda line: console.print(f"[yellow]warning:[/] {line}"))
    generators = {name: torch.Generator().manual_seed(config.seed + offset)
                  for name, offset in (("shard", 0), ("compose", 1000 + rank), ("mask", 2000 + rank))}
    itm_generator = torch.Generator(device=device).manual_seed(config.seed + 3000 + rank)
    batch_log = BatchLog(run.path / "batches.parquet", part_rank=rank)
    metrics = MetricsLog(run.path / "metrics.jsonl")
    def epoch_steps(epoch: int) -> int:
        """Steps of ``epoch`` on every rank: all the batches its composer makes (every pair of the shard
        once; equal shards give every rank the same count), capped by ``max_steps_per_epoch``."""
        shard = math.ceil(len(all_ids) / world)
        warm_epoch = warm is not None and epoch == 0
        if p.composer in ("quantile", "progressive", "falcon") and (epoch > 0 or warm_epoch):  # space by space
            steps = num_space_batches(shard, warm.width if warm_epoch else p.search_space_size, p.batch_size, p.drop_last)
        else:  # uniform, and GRIT, whose chains are cut across search spaces
            steps = num_batches(shard, p.batch_size, p.drop_last)
        return min(steps, p.max_steps_per_epoch) if p.max_steps_per_epoch else steps
    total_steps = sum(epoch_steps(e) for e in range(p.epochs))
    if main:
        console.print(f"[bold]pretrain[/] {p.model} ({model.num_parameters() / 1e6:.1f}M parameters) on {device}, "
                      f"{precision}; {len(dataset):,} pairs; batch {p.batch_size} × {world} processes = "
                      f"global batch {p.batch_size * world}; composer {p.composer}; {p.epochs} epochs")

    # 4. Resume: model, optimizer, scaler, every RNG, the composer, the epoch's batches, the cache.
    start_epoch, start_index, global_step, pending, spaces, feed, ahead = 0, 0, 0, None, None, None, None
    rewards: list[float] = []  # this epoch's FALCON rewards (kept in checkpoints for the epoch summary)
    credited: list[list[float]] = []  # per used step: [its credited reward, whether its pick was a false negative]
    fn_counts = torch.zeros(4, dtype=torch.long, device=device)  # this epoch's flagged-vs-oracle counts (flag_counts)
    checkpoint_dir = run.path / "checkpoints"
    results: dict = {}
    kept = sorted(d.name for d in checkpoint_dir.iterdir() if d.name.isdigit()) if checkpoint_dir.is_dir() else []
    if kept and not resume and not overwrite:  # never train over a run's checkpoints by accident
        raise Refused(f"{run.path} already holds pretraining checkpoints (the newest after step {int(kept[-1])}): "
                      "pass --resume to continue it, or --overwrite to train it again from scratch")
    found = resume_point(checkpoint_dir, weight_files) if resume else None
    checkpoint, state, damaged = found if found is not None else (None, None, [])
    if checkpoint is None and main:  # from scratch: what an earlier attempt logged and saved goes
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
        metrics.truncate_after(0)
    if damaged and main:
        console.print(f"[yellow]damaged checkpoints passed over[/]: {'; '.join(damaged)}")
    if checkpoint is not None:
        if state["world_size"] != world:
            raise Refused(f"{checkpoint}: saved with {state['world_size']} processes, resuming with {world}; "
                          f"resume with the same number (nothing was changed)")
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        composer.load_state_dict(state["composer"])
        cache.load_state_dict(state["cache"])
        mine = state["ranks"][rank]
        set_rng_state(mine["rng"])
        for name, generator in generators.items():
            generator.set_state(mine["generators"][name])
        itm_generator.set_state(mine["itm_generator"])
        start_epoch, start_index, global_step = state["epoch"], state["batch_index"], state["global_step"]
        pending = batches_from_state(mine["batches"]) if mine["batches"] is not None else None
        fn_counts = torch.tensor(mine.get("fn_counts", [0, 0, 0, 0]), dtype=torch.long, device=device)
        if mine.get("spaces") is not None:  # mid-epoch in a FALCON epoch: its spaces, position and log rows
            spaces = quantile_spaces(torch.empty(0, dtype=torch.long), None, warm_epoch=warm is not None and start_epoch == 0)
            spaces.load_state_dict(mine["spaces"])
            batch_log.load_state_dict(mine["batch_log"])
            rewards = list(mine["rewards"])
            credited = [list(c) for c in mine.get("credited", [])]
            ahead = mine["falcon_ahead"]  # composed before the checkpoint, not yet trained (scheduler_lag > 0)
        if scheduler is not None:
            scheduler.load_state_dict(state["scheduler"])
        results = state.get("results", {})
        metrics.truncate_after(global_step)
        if main:
            console.print(f"resumed from {checkpoint} (epoch {start_epoch}, step {global_step})")
    elif resume and main:
        console.print(f"nothing to resume in {checkpoint_dir}: starting from scratch")

    def save(epoch: int, batch_index: int, batches) -> Path | None:
        """Checkpoint everything needed to continue at (epoch, batch_index)."""
        mine = {"rng": rng_state(), "generators": {n: g.get_state() for n, g in generators.items()},
                "itm_generator": itm_generator.get_state(),
                "batches": batches_state(batches) if batches is not None else None,
                "spaces": spaces.state_dict() if spaces is not None else None,  # mid FALCON epoch only
                "batch_log": batch_log.state_dict() if spaces is not None else None,
                "falcon_ahead": feed.ahead_state() if feed is not None else None,
                "rewards": list(rewards), "credited": [list(c) for c in credited], "fn_counts": fn_counts.tolist()}
        ranks = [None] * world if main else None
        if distributed:
            dist.gather_object(mine, ranks, dst=0)
        else:
            ranks = [mine]
        if not main:
            return None
        state = {"world_size": world, "epoch": epoch, "batch_index": batch_index, "global_step": global_step,
                 "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(), "composer": composer.state_dict(),
                 "cache": cache.state_dict(), "ranks": ranks, "results": results,
                 "scheduler": scheduler.state_dict() if scheduler is not None else None}
        return save_checkpoint(checkpoint_dir, global_step, weight_files, state,
                               {"epoch": epoch, "batch_index": batch_index, "model": p.model, "image_size": resolution},
                               keep_last=p.keep_last)

    guard = NonFiniteGuard(device, framework.losses)
    profiler = StepProfiler(run.path / "profile", p.profile_steps, device=device, enabled=main,
                            start=epoch_steps(0) if p.epochs > 1 else min(10, max(epoch_steps(0) - p.profile_steps, 0)))

    def stop_if_non_finite() -> None:
        """Stop with one line at the run's first non-finite step, if there was one (a host sync)."""
        bad = guard.first()
        if bad is None:
            return
        latest = latest_checkpoint(checkpoint_dir) if main else None
        if latest is not None and int(latest.name) == bad["step"] and precision == "fp32":
            latest = rewind_latest(checkpoint_dir, bad["step"])  # its weights gave this loss
        what = (f"loss is {bad['loss']}" if not math.isfinite(bad["loss"])
                else f"the gradient norm is {bad['norm']} (loss {bad['loss']:.4g})")
        raise FalconError(non_finite_stop(what, bad["epoch"], bad["step"],
                                          ", ".join(f"{name} {bad[name]:.4g}" for name in framework.losses),
                                          precision, p, latest))

    # Only rank 0 evaluates, so only rank 0 loads the eval split.
    eval_split = retrieval_dataset(spec, p.eval_split, build_transform("test", resolution)) if p.eval_split and main else None
    if eval_split is not None and checkpoint is None:
        results["untrained"] = zero_shot_retrieval(model, eval_split, tokenizer, device, max_length=p.max_text_length)
    # Preloaded images (opt-in, fixed transform): decoded once onto the device, gathered per batch there.
    preloaded = None
    if p.preload_images:
        preloaded = PreloadedImages(dataset.records, dataset.transform, device, num_workers=p.num_workers)
        dataset.load_images = False
        if main:
            console.print(f"preloaded {len(preloaded.pixels):,} images on {device} ({preloaded.nbytes / 2**20:,.0f} MiB)")
    D.barrier()

    # 5. Train.
    for epoch in range(start_epoch, p.epochs):
        dataset.set_epoch(epoch)
        if p.vision_trainable_epochs and epoch >= p.vision_trainable_epochs and model.vision_trainable:
            model.set_image_encoder_trainable(False)  # frozen from here on, as BLIP-2's; DDP wraps what still trains
            trainer = wrap(objective)
        warm_epoch = warm is not None and epoch == 0
        falcon_epoch = p.composer == "falcon" and (epoch > 0 or warm_epoch)
        if pending is None and spaces is None:
            # Epoch 0 is uniform (no features yet) unless warm-started from built search spaces (taken in
            # their order: under DDP each rank gets a contiguous block); later epochs group by last
            # epoch's embeddings.
            shard = (shard_pair_ids(warm.order, rank, world, None) if warm_epoch
                     else shard_pair_ids(all_ids, rank, world, generators["shard"]))
            if p.composer == "uniform" or (epoch == 0 and not warm_epoch):
                batches = composer.compose_epoch(epoch, shard, None, generators["compose"])
            elif p.composer == "grit":
                batches = composer.compose_epoch(epoch, shard, warm.cache if warm_epoch else cache, generators["compose"],
                                                 grouped_width=warm.width if warm_epoch else None)
            elif p.composer in ("quantile", "progressive"):  # q does not depend on training: the whole epoch now
                q = p.quantile if p.composer == "quantile" else progressive_q(epoch, p.epochs, p.progressive_start,
                                                                              p.progressive_end)
                batches = quantile_spaces(shard, generators["compose"], warm_epoch).compose_all(q, generators["compose"])
            else:  # falcon: the spaces now, each batch when the previous step (and scheduler update) is done
                spaces, batches = quantile_spaces(shard, generators["compose"], warm_epoch), None
            if batches is not None:
                batches = batches[:epoch_steps(epoch)]
                batch_log.extend(epoch, batches, rank=rank)
                if p.composer in ("quantile", "progressive") and (epoch > 0 or warm_epoch):  # q and the oracle's view
                    metrics.write(step=global_step, epoch=epoch, kind="epoch_summary",
                                  **composition_summary(batch_log.rows(epoch)))
                batch_log.write(epoch)
            cache.reset()  # `filled` now tracks this epoch; features stay until overwritten
            start_index = 0
            rewards, credited = [], []
        else:
            batches, pending = pending, None
        if batches is not None:
            # The loader gets its own generator: a fresh iterator must not draw from the global RNG,
            # or a resumed run's dropout would drift from the uninterrupted run's. (Augmentation is
            # seeded per item, so the workers' seeds do not matter.)
            total = len(batches)
            loader = DataLoader(dataset, batch_sampler=[[dataset.index_of(int(i)) for i in b.pair_ids] for b in batches[start_index:]],
                                collate_fn=collate, num_workers=p.num_workers, pin_memory=device.type == "cuda",
                                generator=torch.Generator().manual_seed(config.seed + epoch))
        else:
            # FALCON: each batch composed when the loader asks for it (scheduler_lag batches ahead)
            total = epoch_steps(epoch)
            feed = FalconFeed(spaces, scheduler.alpha_beta, dataset.index_of, generators["compose"],
                              lambda index, composed, epoch=epoch: batch_log.add(epoch, index, rank, composed),
                              start=start_index, stop=total, ahead=ahead)
            ahead = None
            loader = DataLoader(dataset, batch_sampler=feed, collate_fn=collate, pin_memory=device.type == "cuda",
                                generator=torch.Generator().manual_seed(config.seed + epoch),
                                **loader_settings(p.scheduler_lag, p.num_workers))
        tick, seen = time.perf_counter(), 0
        for index, batch in enumerate(track(loader, f"epoch {epoch}", total=total - start_index), start=start_index):
            profiler.before(global_step)
            lr = learning_rate(global_step, epoch, lr=p.lr, min_lr=p.min_lr, warmup_lr=p.warmup_lr,
                               warmup_steps=p.warmup_steps, cosine_epochs=p.cosine_epochs or p.epochs)
            set_learning_rate(optimizer, lr)
            input_ids = batch["input_ids"].to(device, non_blocking=True)
            attention_mask = batch["attention_mask"].to(device, non_blocking=True)
            pair_ids = batch["pair_ids"].to(device, non_blocking=True)
            images = (preloaded.images(pair_ids) if preloaded is not None
                      else batch["images"].to(device, non_blocking=True))
            # The mask is drawn on the CPU (its generator), from the loader's CPU tensors: sampling it from the
            # device copies would read them back, a host sync every step.
            mask = MlmMask.sample(batch["input_ids"], batch["attention_mask"], probability=p.mlm_probability,
                                  generator=generators["mask"], **special).to(device, non_blocking=True) \
                if framework.masked_language else None
            alpha = alpha_ramp(p.distill_alpha, index, total, epoch)
            same_image = shared_images.mask(pair_ids, check=False) if shared_images is not None else None
            # L_before from a no-grad pass: in eval mode, or per caption for per-step credit
            per_pair = falcon_epoch and scheduler.per_step
            margin = p.reward == "positive_margin"  # read from this step's own forward: no reward passes
            if falcon_epoch and not margin and (p.reward_mode == "eval" or per_pair or p.reward == "alignment"):
                with record_function("falcon/reward"):
                    before, image_k = measure_reward_loss(objective, scheduler, precision, device,
                                                          eval_mode=p.reward_mode == "eval", per_pair=per_pair,
                                                          inputs=(images, input_ids, attention_mask, mask),
                                                          same_image=same_image)
            with autocast(precision, device):
                context = StepContext(pair_ids, epoch, global_step, total_steps, same_image)
                out = trainer(images, input_ids, attention_mask, mask, alpha, itm_generator, context)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(out.loss).backward()
            norm = None
            if p.grad_clip is not None:
                scaler.unscale_(optimizer)
                norm = torch.nn.utils.clip_grad_norm_(objective.parameters(), p.grad_clip)
            elif precision != "fp16":  # (fp16: the scaler skips steps with inf gradients and lowers its scale)
                norm = torch.nn.utils.get_total_norm([q.grad for q in objective.parameters() if q.grad is not None])
            # A non-finite loss or gradient stops the run, saving nothing: the weights that gave it are not
            # worth resuming, and a save would push intact checkpoints out. The verdict stays on the device
            # (no host sync per step): from the first non-finite step on the optimizer skips every update,
            # and the verdict is read where the loop syncs anyway: logging, checkpoints, FALCON's scheduler.
            losses = {name: getattr(out, name) for name in framework.losses}  # (itc, itm, and mlm or itg)
            guard.observe(optimizer, epoch, global_step, out.loss, tuple(losses.values()),
                          norm if precision != "fp16" else None, skip=precision != "fp16")
            step_after = global_step + 1
            if (precision == "fp16" or falcon_epoch or step_after % p.log_every == 0 or index == total - 1
                    or (p.checkpoint_every and step_after % p.checkpoint_every == 0)):
                stop_if_non_finite()
            scaler.step(optimizer)
            scaler.update()
            if falcon_epoch:
                # Reward Δ = L(θ_k) − L(θ_{k+1}) on this batch with the identical mask, then REINFORCE.
                # Per-step credit: Δ per caption, each q credited with the Δ of the pair it chose (or its anchor's).
                if margin:  # each pick's hardness, charged past its anchor's own pair (θ_k's features)
                    delta = positive_margin_rewards(out.image_feat, out.text_feat, p.reward_overshoot, p.reward_margin)
                else:
                    if p.reward_mode == "train" and not per_pair and p.reward != "alignment":
                        before = scheduler.loss_value(losses)
                        image_k = objective.image_state(out)
                    with record_function("falcon/reward"):
                        after, _ = measure_reward_loss(objective, scheduler, precision, device,
                                                       eval_mode=p.reward_mode == "eval", per_pair=per_pair,
                                                       inputs=(images, input_ids, attention_mask, mask),
                                                       image=image_k if p.reward_images == "reuse" else None,
                                                       same_image=same_image)
                    delta = before - after
                rewards.append(float((delta[1:] if margin else delta).mean()))  # (slot 0 has no pick to score)
                composed, record = feed.take(batch["pair_ids"])
                with record_function("falcon/update"):
                    update = scheduler.update(record, delta if per_pair else rewards[-1])
                advantage, concentration = update["advantage"], update["concentration"]
                # each used step's credited reward beside the oracle's verdict on its pick (NaN without an oracle)
                picked = composed.chosen_is_fn[1:][:len(update["rewards"])].double()
                credited += torch.stack([update["rewards"], picked], 1).tolist()
            # The cache holds every rank's features: each rank composes next epoch from it.
            cache.update(D.all_gather_cat(pair_ids), D.all_gather_cat(out.image_feat), D.all_gather_cat(out.text_feat))
            if truth is not None and false_negatives.flagged_i2t is not None:  # what the method flagged vs the oracle
                fn_counts += flag_counts(false_negatives.flagged_i2t, truth(batch["pair_ids"]))
            global_step += 1
            seen += len(pair_ids) * world
            profiler.after(global_step)

            if global_step % p.log_every == 0 or index == total - 1:
                logged = torch.stack([out.loss.detach(), *losses.values()]).float()
                if distributed:
                    dist.all_reduce(logged)
                    logged /= world
                elapsed = time.perf_counter() - tick
                peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
                metrics.write(step=global_step, epoch=epoch, loss=logged[0], **dict(zip(losses, logged[1:])), lr=lr,
                              temperature=out.temperature, pairs_per_s=seen / max(elapsed, 1e-9), elapsed_s=elapsed, text_tokens=input_ids.shape[1],
                              peak_memory_mib=peak, sampler=batches[index].sampler if batches is not None else "falcon",
                              reward=rewards[-1] if falcon_epoch else None, advantage=advantage if falcon_epoch else None,
                              concentration=concentration if falcon_epoch else None,
                              **({"same_image_masked": same_image.sum()} if same_image is not None else {}),
                              **false_negatives.stats)
            if p.checkpoint_every and global_step % p.checkpoint_every == 0 and index + 1 < total:
                save(epoch, index + 1, batches)

        if truth is not None and p.false_negatives in ("mafa", "glofnd"):  # precision / recall against the oracle
            if distributed:
                dist.all_reduce(fn_counts)
            if int(fn_counts[3]):  # (GloFND before its start epoch flags nothing)
                metrics.write(step=global_step, epoch=epoch, kind="false_negatives", **flag_summary(fn_counts))
            fn_counts.zero_()
        if falcon_epoch:  # the epoch's batch log part, and what the scheduler did this epoch (this rank)
            metrics.write(step=global_step, epoch=epoch, kind="epoch_summary",
                          **composition_summary(batch_log.rows(epoch), rewards, credited))
            batch_log.write(epoch)
            spaces = feed = None

        if main:
            path = cache.save(run.path / "embeddings" / f"epoch_{epoch:03d}.h5",
                              {"model": p.model, "checkpoint": f"step {global_step}", "dataset": spec.name,
                               "split": "pretrain", "epoch": epoch, FINGERPRINT_ATTR: fingerprint})
            run.add_artifact(path, schema="embeddings", schema_version=1)
        save(epoch + 1, 0, None)

    # 6. Zero-shot retrieval with the trained model (ITC only; ITM re-ranking is `falcon evaluate`).
    if eval_split is not None:
        results["trained"] = zero_shot_retrieval(model, eval_split, tokenizer, device, max_length=p.max_text_length)
        write_results(run, results, split=p.eval_split, resolution=resolution, step=global_step)
    D.barrier()
    if main:
        run.add_artifact("batches.parquet", schema="batches", schema_version=BATCHES.version)
        run.add_artifact("metrics.jsonl", schema="metrics", schema_version=1)
        if p.composer in ("quantile", "progressive", "falcon"):
            figure = q_over_training(read_batch_log(run.path / "batches.parquet"), run.path / "figures" / "q_over_training.png")
            run.add_artifact(figure, schema="figure", schema_version=1)
    return {"steps": global_step, "epochs": p.epochs, "pairs": len(dataset), "world_size": world,
            "precision": precision, "device": str(device), "retrieval": results}


def non_finite_stop(what: str, epoch: int, step: int, parts: str, precision: str, p, latest: Path | None) -> str:
    """The one line a non-finite loss or gradient stops a run with: where, what to resume from, and what
    to change for this run's precision and settings."""
    changes = [f"pretrain.lr={p.lr / 10:g}"]
    if p.grad_clip is None:
        changes.append("pretrain.grad_clip=1.0")
    if precision in ("fp16", "bf16"):
        changes.append("pretrain.precision=fp32")
    advice = " and/or ".join(f"'{c}'" for c in changes)
    if latest is not None:
        where = (f"--resume continues from checkpoint {latest.name}, saved before it: add --overwrite and {advice} "
                 f"(if it fails again, its weights had already diverged: start again without --resume)")
    else:
        where = f"no usable checkpoint: start again with --overwrite and {advice}"
    return f"{what} at epoch {epoch}, step {step} ({parts}), in {precision}; nothing was saved; {where}"


def measure_reward_loss(objective, scheduler: NegativeScheduler, precision: str, device: torch.device, *,
                        eval_mode: bool, inputs: tuple, image: tuple | None = None,
                        same_image: torch.Tensor | None = None, per_pair: bool = False) -> tuple[torch.Tensor, tuple]:
    """The reward's loss on ``inputs`` (no gradient; per caption ``[B]`` with ``per_pair``), in eval mode or
    the current train mode, and the image (tokens, features) it used: ``image`` if given
    (``reward_images: reuse``), else encoded now. ``same_image``: the pairs removed from ITC/ITM in
    training (``same_image: mask``), removed here too."""
    if eval_mode:
        objective.eval()
    try:
        with autocast(precision, device), torch.no_grad():
            if image is None:
                image = objective.model.encode_image(inputs[0])
            return scheduler.loss_value(objective.measure(*inputs, parts=scheduler.parts, image=image,
                                                          same_image=same_image, per_pair=per_pair)), image
    finally:
        objective.train()


def write_results(run: RunDirectory, results: dict, *, split: str, resolution: int, step: int) -> None:
    """``results/retrieval_zeroshot.{json,csv,md}``: one row per model (``untrained``, ``trained``), percent."""
    meta = {"split": split, "checkpoint": f"step {step}", "resolution": resolution, "scoring": "itc", "k": None,
            "units": "percent"}
    rows = [{"model": name, **values} for name, values in results.items()]
    console.print(write_results_table(run, "retrieval_zeroshot", rows, meta,
                                      f"Zero-shot retrieval on `{split}` (ITC similarity, percent)"))


def build_false_negatives(config: Recipe, spec, dataset, device: torch.device, run: RunDirectory):
    """The run's false-negative method (``pretrain.false_negatives``; ``none``: the framework's plain ITC),
    every input checked now, and on a
    shapes world ``truth(pair_ids) -> bool [B, B]`` (image i truly described by caption j, off the
    diagonal) to measure what the method flags; None elsewhere."""
    from falcon_cli.objectives import false_negatives as methods

    p = config.pretrain
    world = spec.resolve(spec.shapes_world) if spec.shapes_world is not None else None
    truth = None
    if world is not None and p.false_negatives in ("mafa", "glofnd"):  # the methods that flag false negatives
        from falcon_cli.judges.oracle import in_batch_truth

        truth = in_batch_truth(world, dataset.records)
    if p.false_negatives == "diht":
        return methods.Diht(beta=p.diht.beta, alpha=p.diht.alpha), truth
    if p.false_negatives == "srcl":
        path = Path(p.srcl.aux_embeddings) if p.srcl.aux_embeddings is not None else run.path / "embeddings" / "embeddings.h5"
        if not path.exists():
            raise FalconError(f"{path}: not found; SRCL needs the frozen auxiliary model's features of every pair: make them "
                              "with `falcon embed` (embed.split=pretrain) or set pretrain.srcl.aux_embeddings=PATH")
        from falcon_cli.artifacts.embeddings import check_fingerprint, read_embeddings

        aux = read_embeddings(path)
        warning = check_fingerprint(path, aux.attrs, records_fingerprint(dataset.records, spec.base_dir), config.data.dataset)
        if warning is not None:
            console.print(f"[yellow]warning:[/] {warning}")
        cache = EmbeddingCache(torch.tensor(dataset.pair_ids, dtype=torch.long), aux.image.shape[1], device=device)
        cache.load(path, aux)
        missing = cache.pair_ids[~cache.filled]
        if len(missing):
            raise FalconError(f"{path}: no features for pair_id {int(missing.min())} ({len(missing)} pairs); embed this "
                              "dataset's pretraining split (embed.split=pretrain)")
        return methods.Srcl(cache.get, delta=p.srcl.delta, until=p.srcl.mix_until), truth
    if p.false_negatives == "glofnd":
        glofnd = methods.Glofnd(dataset.pair_ids, alpha=p.glofnd.alpha, lr=p.glofnd.lr, start_epoch=p.glofnd.start_epoch,
                                adam_step=p.glofnd.adam_step)
        glofnd.thresholds.to(device)
        return glofnd, truth
    if p.false_negatives == "mafa":
        from falcon_cli.judges import JudgedPair, load_judge
        from falcon_cli.judges.pairs import DatasetPairs

        m = p.mafa
        if m.judge == "checkpoint" and m.judge_model is None:
            raise FalconError("pretrain.mafa.judge=checkpoint needs pretrain.mafa.judge_model=DIR: a falcon run or "
                              "checkpoint directory (the frozen connection discriminator)")
        judge = load_judge(m.judge, model=m.judge_model, world=world, run=m.judge_model, device=p.device, fp16=m.fp16,
                           batch_size=m.batch_size)
        pairs = DatasetPairs(dataset)

        def discriminator(image_pairs: torch.Tensor, text_pairs: torch.Tensor, epoch: int) -> torch.Tensor:
            judged = []
            for image_pair, text_pair in zip(image_pairs.tolist(), text_pairs.tolist()):
                image, text = pairs(epoch, image_pair), pairs(epoch, text_pair)
                judged.append(JudgedPair(image=image.image, caption=text.caption, image_id=image.image_id,
                                         caption_id=text.caption_id))
            return torch.from_numpy(judge.score(judged)).float()

        return methods.Mafa(discriminator, high=m.high, low=m.low, smoothing=m.smoothing, mlm_pairs=m.mlm_pairs), truth
    framework = model_framework(p.model)
    return methods.PlainItc(label_smoothing=framework.itc_label_smoothing, stop_gradient=framework.itc_stop_gradient), truth

