"""The ``evaluate`` stage's section: retrieval, VQA and NLVR2 results."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from falcon_cli.config.paths import InputPath
from falcon_cli.config.schema.base import Section, TaskName


class RetrievalEvalConfig(Section):
    """Retrieval evaluation (ALBEF's and BLIP-2's protocol): ITC similarity of all pairs, the top k re-ranked by the ITM
    head."""

    models: Annotated[list[str], InputPath(keywords=("pretrained", "finetuned"))] = ["pretrained"]
    """Which weights to evaluate, one row each: ``pretrained`` (the run's latest pretraining checkpoint:
    zero-shot, FALCON's protocol), ``finetuned`` (``finetune/retrieval/best``: MAFA's and SRCL's protocol),
    a checkpoint directory, or an official ALBEF / GRIT-VLP / MAFA ``.pth`` file."""
    split: Literal["pretrain", "val", "test"] = "test"
    """The retrieval split; ``pretrain``: the pretraining pairs the run trained on, one item per image with every
    caption it is paired with (at most ``pretrain_images`` images), scored as a split: beside ``test``, how much of
    what the model ranks well it only memorised. Its results go to ``results/retrieval_pretrain.*`` (and
    ``near_misses_pretrain.*``), so the test split's stay."""
    pretrain_images: int | None = Field(5000, ge=1)
    """With ``split: pretrain``: at most this many of the pretraining images, drawn at random (seed 0, the same for
    every run of a dataset), as a 5K test split has; None = all of them."""
    k: int = Field(256, ge=1)
    """Re-ranking depth: the ITC top k of each query are re-scored with the ITM match logit (COCO 5K:
    256, Flickr30k 1K: 128)."""
    rerank_score: Literal["auto", "itm", "itm+itc"] = "auto"
    """What re-scores the top k: ``itm`` (ALBEF's rule: the ITM match logit alone), ``itm+itc`` (LAVIS's
    rule for BLIP-2: the match logit plus the ITC cosine); ``auto`` = the model framework's own rule (a dual
    encoder has no ITM head: it ranks by its embedding similarity alone, and ``k`` does not apply)."""
    itc_only: bool = False
    """Rank by ITC similarity only (fast; no re-ranking)."""
    also_itc: bool = True
    """With re-ranking, also report each model's ITC-only ranking (one more row; the same embeddings)."""
    false_negatives: Literal["auto", "oracle", "eccv", "none"] = "auto"
    """False-negative-aware metrics: ``oracle`` (the shapes world's compatibility: every truly matching
    item is a positive), ``eccv`` (ECCV Caption, CxC and COCO 1K/5K through the ``eccv_caption`` package;
    COCO 5K test, needs COCO ids: ``coco_captions`` or entries with ``image_id`` and ``caption_ids``),
    ``none``; ``auto`` = the oracle where the dataset has one, else ECCV where it can be computed, else
    none with the reason printed and recorded in the results' ``meta.false_negatives_skipped``."""
    coco_captions: Annotated[Path | None, InputPath()] = None
    """COCO's ``annotations/captions_val2014.json`` (relative paths are relative to the working
    directory): maps the split's images and captions to COCO image and caption ids for ``eccv``, by
    image file name and caption text (whitespace, case and trailing periods ignored). Needed for ALBEF's
    ``coco_karpathy_test.json``, whose entries carry no ids; when set it is used even if they do. The
    match counts go to the results' ``meta.coco_ids``; anything unmatched means no ECCV metrics."""
    top_k_lists: int = Field(50, ge=10)
    """Length of the ranked lists handed to ``eccv_caption`` (at least the largest R: 48)."""


class VqaEvalConfig(Section):
    """VQA evaluation: rank the candidate answer list with the fine-tuned decoder."""

    split: Literal["val", "test"] = "test"
    """The VQA split answered; with answers in the file, the local VQA accuracy is reported too."""
    k: int = Field(128, ge=1)
    """Candidates kept by first-token probability, then re-scored by full-sequence likelihood."""
    checkpoint: Annotated[str | None, InputPath()] = None
    """The fine-tuned VQA weights (a checkpoint directory); None = this run's ``finetune/vqa/best``."""
    answer_processing: Literal["official", "normalized"] = "official"
    """How the local accuracy matches a prediction against the human answers. ``official``: as the
    official ``vqaEval.py`` and the evaluation server (the prediction is fully normalised; the human
    answers only lose punctuation, and only when they are not all identical), comparable with published
    numbers. ``normalized``: the human answers are fully normalised too (case, number words, articles,
    contractions), a more forgiving score."""


class Nlvr2EvalConfig(Section):
    """NLVR2 evaluation: accuracy of the fine-tuned classifier."""

    splits: list[Literal["dev", "test"]] = ["dev", "test"]
    """The NLVR2 splits reported (``test`` = test-P)."""
    checkpoint: Annotated[str | None, InputPath()] = None
    """The fine-tuned NLVR2 weights (a checkpoint directory); None = this run's ``finetune/nlvr2/best``."""


class EvaluateConfig(Section):
    """The ``evaluate`` stage: downstream results into ``results/`` (``retrieval``, ``vqa``, ``nlvr2``)."""

    tasks: list[TaskName] = ["retrieval"]
    """Which evaluations to run, in this order (``vqa`` and ``nlvr2`` need the fine-tuned checkpoints)."""
    retrieval: RetrievalEvalConfig = RetrievalEvalConfig()
    """Retrieval."""
    vqa: VqaEvalConfig = VqaEvalConfig()
    """VQA."""
    nlvr2: Nlvr2EvalConfig = Nlvr2EvalConfig()
    """NLVR2."""
    image_size: int | None = Field(None, ge=8)
    """Evaluation resolution; None = each checkpoint's own."""
    max_text_length: int | None = Field(None, ge=2)
    """Token limit of captions, questions and statements; None = the limit each evaluated checkpoint was
    trained with (its ``meta.json``, else its run's config: the pretraining zero-shot numbers and these
    then agree), 30 for checkpoints that do not say (official ``.pth`` files: ALBEF's). Recorded per row
    in the results."""
    batch_size: int = Field(64, ge=1)
    """Images or texts per encoder forward, and pairs per ITM re-ranking forward."""
    device: str = "auto"
    """``auto`` (the local GPU if any, else CPU), ``cpu`` or ``cuda[:n]``."""
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """``auto`` = bf16 autocast on GPUs that support it (fp16 elsewhere on CUDA), fp32 on CPU."""
    num_workers: int = Field(2, ge=0)
    """DataLoader worker processes."""

    @model_validator(mode="after")
    def _check(self) -> "EvaluateConfig":
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"tasks must be distinct, got {self.tasks}")
        if not self.retrieval.models:
            raise ValueError("retrieval.models must name at least one model (pretrained, finetuned or a checkpoint)")
        if not self.nlvr2.splits:
            raise ValueError("nlvr2.splits must name dev and/or test")
        return self
