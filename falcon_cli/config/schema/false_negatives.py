"""The false-negative methods' sections: ``pretrain.mafa``, ``.srcl``, ``.diht`` and ``.glofnd``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from falcon_cli.config.paths import InputPath
from falcon_cli.config.schema.base import Section

FalseNegativeMethod = Literal["none", "mafa", "srcl", "diht", "glofnd"]
"""The values of ``pretrain.false_negatives``."""


class MafaConfig(Section):
    """MAFA (``pretrain.false_negatives: mafa``): efficient connection mining with a frozen
    connection discriminator, plus S-ITC label smoothing (docs/methods.md)."""

    judge: Literal["oracle", "blip", "checkpoint"] = "checkpoint"
    """The connection discriminator that scores each anchor's hardest in-batch candidate: a falcon
    ``checkpoint``'s ITM head (the paper's Con-D), ``blip`` (a BLIP ITM head), or the shapes world's
    ``oracle`` (an upper bound: a perfect discriminator)."""

    judge_model: Annotated[str | None, InputPath(when="exists")] = None
    """``checkpoint``: a falcon run or checkpoint directory (required); ``blip``: a hub id or local
    directory (None = ``Salesforce/blip-itm-base-coco``)."""

    high: float = Field(0.8, ge=0.0, le=1.0)
    """p(match) above this turns the hardest negative into a positive (ITC target, ITM label, extra MLM
    pair). MAFA: 0.8; FALCON's COCO reproduction needed 0.98."""

    low: float = Field(0.5, ge=0.0, le=1.0)
    """Between ``low`` and ``high`` the candidate is ambiguous: ITM uses the second-hardest negative."""

    smoothing: float = Field(0.5, ge=0.0, le=1.0)
    """S-ITC label smoothing α of the ITC targets, from epoch 1 on (0 in epoch 0)."""

    mlm_pairs: Literal["per_direction", "distinct"] = "per_direction"
    """Extra MLM pairs: one per conversion (``per_direction``, MAFA's code: a pair converted from
    both its image and its caption joins the MLM set twice) or one per distinct converted pair
    (``distinct``). Extra pairs reuse their caption's mask (MAFA masks each appended row afresh)."""

    batch_size: int = Field(64, ge=1)
    """Pairs per discriminator forward pass (model discriminators)."""

    fp16: bool = False
    """Run a model discriminator in fp16 autocast (CUDA only)."""


class SrclConfig(Section):
    """SRCL (``pretrain.false_negatives: srcl``): negatives weighted by a frozen auxiliary model's and
    the current model's similarity (a reconstruction; docs/methods.md)."""

    aux_embeddings: Annotated[Path | None, InputPath()] = None
    """The frozen auxiliary model's features of every pretraining pair, an ``embeddings.h5`` from
    ``falcon embed``; None = the run's own ``embeddings/embeddings.h5``."""

    delta: float = Field(5.0, ge=0.0)
    """Sharpness of the weights ``w = (N - 1) softmax_j(-delta * cos_mix)``: 0 = plain InfoNCE; larger
    down-weights negatives that look like the anchor more strongly."""

    mix_until: float = Field(1.0, gt=0.0)
    """The auxiliary model's share α falls linearly from 1 to 0 over this fraction of training."""


class DihtConfig(Section):
    """DiHT's HN-NCE (``pretrain.false_negatives: diht``): importance-weighted hard negatives."""

    beta: float = Field(0.5, ge=0.0)
    """Hardness β of both directions: negatives weighted by ``(N - 1) softmax_j(β · logits)``; 0 = InfoNCE."""

    alpha: float = Field(1.0, gt=0.0, le=1.0)
    """Weight α of the positive in the denominator (1 = InfoNCE's)."""


class GlofndConfig(Section):
    """GloFND (``pretrain.false_negatives: glofnd``): per-pair learned similarity thresholds; negatives
    above them are dropped from the ITC denominators."""

    alpha: float = Field(0.01, gt=0.0, lt=1.0)
    """The fraction of each anchor's negatives taken as false: λ tracks the (1 − α)-quantile of its similarities."""

    lr: float = Field(0.05, gt=0.0)
    """Adam learning rate of the thresholds (betas 0.9, 0.98)."""

    start_epoch: int = Field(1, ge=0)
    """First epoch in which thresholds are learned and negatives dropped."""

    adam_step: Literal["epoch", "count"] = "epoch"
    """The step count t of the threshold Adam's bias correction (1 − β^t): ``epoch`` = the 0-based
    training epoch + 1 for every pair (the authors' code, so the baseline reproduces it); ``count`` =
    each pair's own number of updates (textbook per-index Adam). They differ when ``start_epoch`` > 0:
    ``epoch`` takes smaller first steps (0.74 × lr from epoch 1, 0.46 × lr from epoch 15)."""
