"""GloFND (Vasudeva et al., 2025): per-pair learned similarity thresholds; negatives above them are dropped from
the ITC denominators (docs/methods.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from falcon_cli.config.section import Section
from falcon_cli.method_weights import ITC_CONSISTENCY_WEIGHT
from falcon_cli.registry import false_negative_method


class GlofndConfig(Section):
    """GloFND (``pretrain.false_negatives.method: glofnd``): per-pair learned similarity thresholds; negatives
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


def check(settings: GlofndConfig, pretrain) -> None:
    """GloFND must start within the run."""
    if settings.start_epoch >= pretrain.epochs:
        raise ValueError(
            f"false_negatives.glofnd.start_epoch={settings.start_epoch} is past the last epoch (epochs="
            f"{pretrain.epochs}: 0 to {pretrain.epochs - 1}), so GloFND would never filter; set "
            f"pretrain.false_negatives.glofnd.start_epoch below {pretrain.epochs} (docs/methods.md: start after the "
            "same fraction of training as the paper)"
        )


@false_negative_method(
    "glofnd",
    consistency_weight=ITC_CONSISTENCY_WEIGHT["glofnd"],
    config=GlofndConfig,
    same_image_mask=True,
    check=check,
    description="learned per-pair thresholds drop negatives",
)
def build(settings: GlofndConfig, context):
    """GloFND with one threshold per pretraining pair, on the training device."""
    # (lazy: the schema imports this file to read the settings; torch and the losses load when built)
    from falcon_cli.objectives.false_negatives import Glofnd

    glofnd = Glofnd(
        context.dataset.pair_ids,
        alpha=settings.alpha,
        lr=settings.lr,
        start_epoch=settings.start_epoch,
        adam_step=settings.adam_step,
    )
    glofnd.thresholds.to(context.device)
    return glofnd
