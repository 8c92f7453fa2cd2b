"""The evaluate stage: the downstream numbers of a run, into ``results/``.

Reads top to bottom:
1. processes, device, precision; the run's tokenizer and dataset;
2. each task in ``evaluate.tasks``:
   * ``retrieval``: for each model in ``evaluate.retrieval.models`` (``pretrained`` = zero-shot,
     FALCON's protocol; ``finetuned`` = after ``falcon finetune --task retrieval``; a checkpoint
     directory or an official ALBEF/GRIT-VLP/MAFA ``.pth`` file), ITC similarity
     of every pair with each query's top k re-ranked by the ITM match logit; TR/IR R@1/5/10, and
     the false-negative-aware metrics: on the shapes world every caption the oracle says truly
     describes an image is a positive (R@K, R-Precision, mAP@R); on COCO 5K the ECCV Caption,
     CxC and COCO 1K/5K metrics through ``eccv_caption``, with COCO ids from the entries or matched
     in COCO's captions file (``evaluate.retrieval.coco_captions``); when none can be computed the
     reason is printed and recorded. → ``results/retrieval.{json,csv,md}``;
   * ``vqa``: the fine-tuned decoder ranks the answer list; the server-format answers go to
     ``results/vqa_result_<split>.json`` and, where the split has answers, the VQA accuracy to
     ``results/vqa.{json,csv,md}``;
   * ``nlvr2``: accuracy of the fine-tuned classifier on dev and test-P → ``results/nlvr2.*``.

Scoring is sharded across processes under torchrun (``torchrun --nproc_per_node 8 -m falcon_cli
evaluate retrieval runs/coco-albef``); only rank 0 writes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch

from falcon_cli.artifacts.atomic import write_json
from falcon_cli.artifacts.results import results_name, write_results
from falcon_cli.config.schema import Recipe
from falcon_cli.data.collate import Nlvr2Collate, VqaCollate, tokenize
from falcon_cli.data.datasets import (
    nlvr2_dataset,
    pretrain_retrieval_dataset,
    retrieval_dataset,
    vqa_answer_list,
    vqa_dataset,
)
from falcon_cli.data.pairs import caption_pairs, pairs_fingerprint
from falcon_cli.data.retrieval import SplitIds, ids_from_entries, split_ids
from falcon_cli.data.shapes.near_misses import family_pairs, family_size
from falcon_cli.data.shapes.oracle import ShapesOracle
from falcon_cli.data.spec import load_spec
from falcon_cli.data.tokenizer import load_run_tokenizer
from falcon_cli.data.transforms import build_transform
from falcon_cli.errors import FalconError
from falcon_cli.evaluation import eccv  # (called through the module: the seam where tests stand in for eccv_caption)
from falcon_cli.evaluation.downstream import answer_questions, nlvr2_accuracy
from falcon_cli.evaluation.eccv import COCO_TEST_IMAGES
from falcon_cli.evaluation.multi_positive import fn_aware_retrieval, perfect_recall_at_1
from falcon_cli.evaluation.near_misses import near_miss_confusion
from falcon_cli.evaluation.retrieval import recall_at_k
from falcon_cli.evaluation.scoring import embed_split, retrieval_scores
from falcon_cli.evaluation.vqa_accuracy import vqa_score
from falcon_cli.evaluation.zero_shot import oracle_positives, split_targets
from falcon_cli.frameworks import framework_of
from falcon_cli.models.pretrained import (
    UNSTATED_TEXT_LENGTH,
    find_checkpoint,
    finetuned_weights,
    model_from_checkpoint,
    task_model_from_checkpoint,
    trained_text_length,
)
from falcon_cli.runtime import distributed as D
from falcon_cli.runtime.console import make_console
from falcon_cli.runtime.precision import autocast, pick_device, resolve_precision
from falcon_cli.runtime.run_dir import RunDirectory

console = make_console(stderr=True)


def run(config: Recipe, run: RunDirectory) -> dict:
    """Evaluate every task in ``config.evaluate.tasks``; returns the summary recorded in the manifest."""
    e = config.evaluate
    device = pick_device(e.device)
    D.init_distributed(device.type)
    precision = resolve_precision(e.precision, device)
    spec = load_spec(config.data.dataset)
    ctx = Context(config, run, spec, load_run_tokenizer(run.path, config.name), device, precision)
    return {task: EVALUATORS[task](ctx) for task in e.tasks}


class Context:
    """What every evaluation needs."""

    def __init__(self, config: Recipe, run: RunDirectory, spec, tokenizer, device: torch.device, precision: str):
        self.config, self.run, self.spec, self.tokenizer = config, run, spec, tokenizer
        self.device, self.precision, self.e = device, precision, config.evaluate

    def autocast(self):
        return autocast(self.precision, self.device)

    def text_length(self, checkpoint: Path) -> int:
        """``evaluate.max_text_length``, else the limit ``checkpoint`` was trained with (ALBEF's 30 if it does not
        say)."""
        return self.e.max_text_length or trained_text_length(checkpoint) or UNSTATED_TEXT_LENGTH

    def finetuned(self, task: str, checkpoint: str | None = None) -> Path:
        """``checkpoint``, else ``finetune/<task>/best`` of this run (what ``falcon finetune`` kept)."""
        path = Path(checkpoint) if checkpoint is not None else finetuned_weights(self.run.path, task)
        if not (path / "model.safetensors").is_file():
            raise FalconError(
                f"{path}: no fine-tuned {task} model; run `falcon finetune --task {task} --run-dir "
                f"{self.run.path}` first (or add finetune to the recipe's stages)"
            )
        return path


# --- retrieval ------------------------------------------------------------------------------------


def evaluate_retrieval(ctx: Context) -> dict:
    """TR/IR R@1/5/10 (ITC, top k re-ranked by ITM) and false-negative-aware metrics, one row per model."""
    r, e = ctx.e.retrieval, ctx.e
    k = None if r.itc_only else r.k
    checkpoints = {name: resolve_model(ctx, name) for name in r.models}  # every path checked before any scoring
    truth, dataset, loaded_at = None, None, None  # truth: (kind, metrics(i2t, t2i) or None, meta)
    near_misses, near_miss_rows = None, []  # near_misses: (i2t, t2i) -> confusion rows, on worlds with near misses
    rows = []
    for name, checkpoint in checkpoints.items():
        model = model_from_checkpoint(checkpoint, e.image_size, vocab_size=len(ctx.tokenizer)).to(ctx.device)
        framework = framework_of(model)
        rule = framework.rerank if r.rerank_score == "auto" else r.rerank_score
        if rule != "none" and not framework.family.itm_head:
            raise FalconError(
                f"evaluate.retrieval.rerank_score={r.rerank_score}: {checkpoint} is a "
                f"{model.config.framework} model without an ITM head; use rerank_score: auto (its "
                "embedding similarity alone)"
            )
        depth = None if rule == "none" else k  # a dual encoder ranks by its embedding similarity alone
        resolution = model.config.image_size
        if loaded_at != resolution:  # checkpoints fine-tuned at another resolution get their own transform
            first = dataset is None
            dataset, loaded_at = split_dataset(ctx, build_transform("test", resolution)), resolution
            if first:  # the ground truth depends on the split's entries only
                truth = false_negative_truth(ctx, dataset)
                near_misses = near_miss_truth(ctx, dataset) if truth[0] == "oracle" else None
        text_length = ctx.text_length(checkpoint)
        embeddings = embed_split(
            model,
            dataset,
            ctx.tokenizer,
            ctx.device,
            batch_size=e.batch_size,
            max_length=text_length,
            autocast=ctx.autocast(),
            num_workers=e.num_workers,
            keep_tokens=depth is not None,
        )
        scorings = [None, depth] if depth is not None and r.also_itc else [depth]  # None = ITC only
        for top in scorings:
            i2t, t2i = (
                s.cpu()
                for s in retrieval_scores(
                    model,
                    embeddings,
                    k=top,
                    batch_size=e.batch_size,
                    autocast=ctx.autocast(),
                    add_itc=rule == "itm+itc",
                )
            )
            scoring = "itc" if top is None else f"itc+itm@{top}" if rule == "itm" else f"itc+(itm+itc)@{top}"
            row = {
                "model": name,
                "scoring": scoring,
                "resolution": resolution,
                "max_text_length": text_length,
                **recall_at_k(i2t, *split_targets(dataset), scores_t2i=t2i),
            }
            if truth[1] is not None:
                row.update(truth[1](i2t, t2i))
            rows.append({**row, "checkpoint": str(checkpoint)})
            if near_misses is not None:
                near_miss_rows += [{"model": name, "scoring": scoring, **r} for r in near_misses(i2t, t2i)]
        del model, embeddings
    if all(row["scoring"] == "itc" for row in rows):  # (ITC only asked, or models without an ITM head)
        k = None
    meta = {
        "dataset": ctx.spec.name,
        "split": r.split,
        "scoring": "itc" if k is None else "itc+itm",
        "k": k,
        "false_negatives": truth[0],
        **truth[2],
        "images": len(dataset),
        "texts": len(dataset.text),
        "split_fingerprint": pairs_fingerprint(caption_pairs(dataset), ctx.spec.base_dir),  # (falcon compare)
        "units": "percent",
    }
    if D.is_main_process():
        console.print(
            write_results(
                ctx.run,
                results_name("retrieval", r.split),
                rows,
                meta,
                f"Retrieval on `{r.split}` ({meta['scoring']}{'' if k is None else f', k={k}'}, percent)",
            ),
            markup=False,
        )
        if near_miss_rows:
            console.print(write_near_misses(ctx, near_miss_rows, meta), markup=False)
    return {"meta": meta, "rows": rows}


def split_dataset(ctx: Context, transform):
    """The retrieval split ``evaluate.retrieval.split`` names: a val/test file of the spec, or the pretraining pairs
    grouped by image (``pretrain``)."""
    r = ctx.e.retrieval
    if r.split == "pretrain":
        return pretrain_retrieval_dataset(ctx.spec, transform, max_images=r.pretrain_images)
    return retrieval_dataset(ctx.spec, r.split, transform)


def near_miss_truth(ctx: Context, dataset) -> Callable | None:
    """On a shapes world drawn with near misses: ``(i2t, t2i) -> rows`` of :func:`near_miss_confusion` (how often a
    sibling the query does not match outranks its own match, by kind of difference); None otherwise."""
    size = family_size(ctx.spec.resolve(ctx.spec.shapes_world))
    if size <= 1:
        return None
    oracle = ShapesOracle.load(ctx.spec.resolve(ctx.spec.shapes_world))
    positives = oracle_positives(ctx.spec, dataset, oracle)
    image_ids = ids_from_entries(dataset.records).image_ids
    pairs = family_pairs(oracle.scenes, oracle.image_rows(image_ids), image_ids, size)
    img2txt = split_targets(dataset)[0]
    return lambda i2t, t2i: near_miss_confusion(i2t, t2i, img2txt, positives, pairs)


def write_near_misses(ctx: Context, rows: list[dict], meta: dict) -> str:
    """``results/near_misses.{json,csv,md}``: one row per model, scoring and direction, a column per kind of
    difference (percent of comparisons the sibling wins); the comparisons per kind go into the meta."""
    wide, counts = {}, {}
    for r in rows:
        key = (r["model"], r["scoring"], r["direction"])
        wide.setdefault(key, {"model": r["model"], "scoring": r["scoring"], "direction": r["direction"]})[r["kind"]] = (
            r["confusion"]
        )
        counts.setdefault(r["direction"], {})[r["kind"]] = r["comparisons"]
    info = {key: meta[key] for key in ("dataset", "split", "k", "units") if key in meta}
    return write_results(
        ctx.run,
        results_name("near_misses", meta["split"]),
        list(wide.values()),
        {**info, "comparisons": counts},
        f"Near misses on `{meta['split']}`: how often a sibling scene the query does not match outranks "
        f"its own match, by what separates them (percent; 50 = chance; comparisons "
        + "; ".join(f"{d}: {c['all']:,}" for d, c in counts.items())
        + ")",
    )


def resolve_model(ctx: Context, name: str) -> Path:
    """The checkpoint an ``evaluate.retrieval.models`` entry names: a directory, or an ALBEF/GRIT-VLP/MAFA ``.pth``
    file."""
    if name == "pretrained":
        return find_checkpoint(ctx.run.path, "evaluate.retrieval.models: pretrained")
    if name == "finetuned":
        return ctx.finetuned("retrieval")
    return find_checkpoint(name, f"evaluate.retrieval.models: {name}")


def false_negative_truth(ctx: Context, dataset) -> tuple[str, Callable | None, dict]:
    """``(kind, metrics(i2t, t2i) -> dict, meta)``: the false-negative-aware metrics the split supports
    (``evaluate.retrieval.false_negatives``); kind ``none`` has no metrics. ``meta`` goes into the
    results file: where the COCO ids came from and how many matched, and under ``auto`` why metrics
    were skipped (also printed)."""
    r = ctx.e.retrieval
    wanted = r.false_negatives
    if wanted == "auto" and ctx.spec.shapes_world is not None:
        wanted = "oracle"
    if wanted == "auto" and r.split == "pretrain":
        skipped = (
            "ECCV Caption, CxC and COCO 1K/5K metrics skipped: they annotate the COCO 5K test split, "
            "not pretraining pairs"
        )
        return "none", None, {"false_negatives_skipped": skipped}
    if wanted == "none":
        return "none", None, {}
    if wanted == "oracle":
        metrics, perfect = oracle_truth(ctx, dataset)
        return "oracle", metrics, {f"perfect_{direction}_R@1": value for direction, value in perfect.items()}
    ids, problem = coco_test_ids(ctx, dataset)
    meta = {} if ids is None else {"coco_ids": ids.counts()}
    if ids is not None and ids.source != "entries" and D.is_main_process():
        console.print(f"COCO ids from {ids.source}: {ids.summary()} of the {r.split} split matched", markup=False)
    if problem is not None:
        if wanted == "eccv":
            raise FalconError(f"evaluate.retrieval.false_negatives=eccv: {problem}")
        skipped = f"ECCV Caption, CxC and COCO 1K/5K metrics skipped: {problem}"
        if D.is_main_process():
            console.print(skipped, style="yellow", markup=False)  # paths and captions may hold [brackets]
        return "none", None, {**meta, "false_negatives_skipped": skipped}

    eccv.check_ids(ids.image_ids, ids.caption_ids)  # before any scoring

    def eccv_and_coco_1k(i2t: torch.Tensor, t2i: torch.Tensor) -> dict:
        return {
            **eccv.eccv_metrics(i2t, ids.image_ids, ids.caption_ids, top_k=r.top_k_lists, scores_t2i=t2i),
            **eccv.coco_1k_recalls(i2t, *split_targets(dataset), scores_t2i=t2i),
        }

    return "eccv", eccv_and_coco_1k, meta


def coco_test_ids(ctx: Context, dataset) -> tuple[SplitIds | None, str | None]:
    """The split's COCO ids (:func:`split_ids`: ``evaluate.retrieval.coco_captions``, else the entries')
    and, if ECCV Caption / CxC cannot be computed with them, why (one sentence)."""
    r = ctx.e.retrieval
    if len(dataset) != COCO_TEST_IMAGES:
        return None, (
            f"the {r.split} split has {len(dataset):,} images, and ECCV Caption and CxC annotate only "
            f"the COCO Karpathy 5K test split ({COCO_TEST_IMAGES:,} images)"
        )
    ids = split_ids(dataset.records, r.coco_captions)
    if ids is None:
        return None, (
            f"the {r.split} split's entries have no image_id and caption_ids (ALBEF's coco_karpathy_test.json "
            "has none) and evaluate.retrieval.coco_captions is not set; point it at COCO's "
            "annotations/captions_val2014.json to map the captions to COCO ids"
        )
    if not ids.complete:
        return ids, (
            f"only {ids.summary()} of the {r.split} split matched in {ids.source} (first unmatched: "
            f"{ids.first_unmatched}); it must be COCO's captions_val2014.json and the split the COCO "
            "Karpathy 5K test split"
        )
    return ids, None


def oracle_truth(ctx: Context, dataset) -> tuple[Callable, dict]:
    """The shapes oracle's metrics (every caption that truly describes an image is a positive), and the standard
    R@1 a perfect model scores on the split per direction (``meta.perfect_t2i_R@1``, ``perfect_i2t_R@1``: above it,
    a model tells apart what the captions do not say)."""
    if ctx.spec.shapes_world is None:
        raise FalconError(
            f"evaluate.retrieval.false_negatives=oracle: dataset {ctx.spec.name} has no shapes_world "
            "(the oracle exists only for generated shapes worlds); use eccv, auto or none"
        )
    positives = oracle_positives(ctx.spec, dataset)
    if positives is None:
        raise FalconError(
            f"evaluate.retrieval.false_negatives=oracle: the {ctx.e.retrieval.split} split's entries "
            "need image_id and caption_ids (the shapes world writes them); regenerate the world"
        )
    perfect = {
        direction: round(value, 2)
        for direction, value in perfect_recall_at_1(positives, split_targets(dataset)[0]).items()
    }
    return lambda i2t, t2i: fn_aware_retrieval(i2t, positives, "oracle", scores_t2i=t2i), perfect


# --- VQA ------------------------------------------------------------------------------------------


def evaluate_vqa(ctx: Context) -> dict:
    """Answers for the split in the evaluation server's format, and the local VQA accuracy where answers exist."""
    v, e = ctx.e.vqa, ctx.e
    checkpoint = ctx.finetuned("vqa", v.checkpoint)
    meta_file = json.loads((checkpoint / "meta.json").read_text())
    model = task_model_from_checkpoint(checkpoint, "vqa").to(ctx.device)
    resolution = e.image_size or model.config.image_size
    dataset = vqa_dataset(ctx.spec, v.split, build_transform("test", resolution))
    answers = vqa_answer_list(ctx.spec)
    max_answer_length = int(meta_file.get("max_answer_length", 10))
    answer_ids, answer_mask = tokenize(ctx.tokenizer, answers, max_answer_length)
    text_length = ctx.text_length(checkpoint)
    predictions = answer_questions(
        model,
        dataset,
        VqaCollate(ctx.tokenizer, text_length, max_answer_length),
        answer_ids,
        answer_mask,
        answers,
        ctx.device,
        k=v.k,
        batch_size=e.batch_size,
        num_workers=e.num_workers,
        autocast=ctx.autocast(),
    )
    row = {"split": v.split, "questions": len(dataset)}
    truth = {rec.question_id: rec.answers for rec in dataset.records if rec.answers is not None}
    if len(truth) == len(dataset.records):
        score = vqa_score(predictions, truth, v.answer_processing)
        row.update(accuracy=score["accuracy"])
    meta = {
        "dataset": ctx.spec.name,
        "checkpoint": str(checkpoint),
        "resolution": resolution,
        "max_text_length": text_length,
        "k": v.k,
        "candidates": len(answers),
        "answer_processing": v.answer_processing,
        "units": "percent",
    }
    if D.is_main_process():
        result_file = ctx.run.path / "results" / f"vqa_result_{v.split}.json"
        write_json(
            result_file,
            [{"question_id": qid, "answer": predictions[qid]} for qid in (rec.question_id for rec in dataset.records)],
            indent=None,
        )
        ctx.run.add_artifact(Path("results") / result_file.name, schema="vqa_server_result", schema_version=1)
        note = (
            "" if "accuracy" in row else " (no answers in this split: submit the result file to the evaluation server)"
        )
        console.print(write_results(ctx.run, "vqa", [row], meta, f"VQA on `{v.split}`{note} (percent)"), markup=False)
    return {"meta": meta, "rows": [row]}


# --- NLVR2 ----------------------------------------------------------------------------------------


def evaluate_nlvr2(ctx: Context) -> dict:
    """Accuracy of the fine-tuned NLVR2 classifier on each split (``test`` = test-P)."""
    n, e = ctx.e.nlvr2, ctx.e
    checkpoint = ctx.finetuned("nlvr2", n.checkpoint)
    model = task_model_from_checkpoint(checkpoint, "nlvr2").to(ctx.device)
    resolution = e.image_size or model.config.image_size
    text_length = ctx.text_length(checkpoint)
    collate = Nlvr2Collate(ctx.tokenizer, text_length)
    rows = []
    for split in n.splits:
        dataset = nlvr2_dataset(ctx.spec, split, build_transform("test", resolution))
        accuracy = nlvr2_accuracy(
            model,
            dataset,
            collate,
            ctx.device,
            batch_size=e.batch_size,
            num_workers=e.num_workers,
            autocast=ctx.autocast(),
        )
        rows.append({"split": split, "statements": len(dataset), "accuracy": accuracy})
    meta = {
        "dataset": ctx.spec.name,
        "checkpoint": str(checkpoint),
        "resolution": resolution,
        "max_text_length": text_length,
        "units": "percent",
    }
    if D.is_main_process():
        console.print(write_results(ctx.run, "nlvr2", rows, meta, "NLVR2 accuracy (percent)"), markup=False)
    return {"meta": meta, "rows": rows}


EVALUATORS = {"retrieval": evaluate_retrieval, "vqa": evaluate_vqa, "nlvr2": evaluate_nlvr2}
