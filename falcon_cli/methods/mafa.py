"""MAFA (Byun et al., 2024): efficient connection mining with a frozen connection discriminator, plus S-ITC label
smoothing (docs/methods.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from falcon_cli.config.paths import InputPath
from falcon_cli.config.section import Section
from falcon_cli.method_weights import ITC_CONSISTENCY_WEIGHT
from falcon_cli.registry import false_negative_method


class MafaConfig(Section):
    """MAFA (``pretrain.false_negatives.method: mafa``): efficient connection mining with a frozen
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

    @model_validator(mode="after")
    def _check_thresholds(self) -> "MafaConfig":
        """The ambiguous band below the conversion threshold."""
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
        return self


@false_negative_method(
    "mafa",
    consistency_weight=ITC_CONSISTENCY_WEIGHT["mafa"],
    config=MafaConfig,
    capturable=False,  # (its judge runs on the host, on pairs mined in the middle of the step)
    description="connection mining with a frozen discriminator, S-ITC",
)
def build(settings: MafaConfig, context):
    """MAFA with its connection discriminator: a judge scoring each (image, caption) pair MAFA asks about."""
    import torch

    # (lazy: the schema imports this file to read the settings; torch and the losses load when built)
    from falcon_cli.errors import FalconError
    from falcon_cli.judges import JudgedPair, load_judge
    from falcon_cli.judges.pairs import DatasetPairs
    from falcon_cli.objectives.false_negatives import Mafa

    if settings.judge == "checkpoint" and settings.judge_model is None:
        raise FalconError(
            "pretrain.false_negatives.mafa.judge=checkpoint needs pretrain.false_negatives.mafa.judge_model=DIR: "
            "a falcon run or checkpoint directory (the frozen connection discriminator)"
        )
    judge = load_judge(
        settings.judge,
        model=settings.judge_model,
        world=context.world,
        run=settings.judge_model,
        device=context.device,
        fp16=settings.fp16,
        batch_size=settings.batch_size,
        what="pretrain.false_negatives.mafa.judge_model",
    )
    pairs = DatasetPairs(context.dataset)

    def discriminator(image_pairs: torch.Tensor, text_pairs: torch.Tensor, epoch: int) -> torch.Tensor:
        judged = []
        for image_pair, text_pair in zip(image_pairs.tolist(), text_pairs.tolist()):
            image, text = pairs(epoch, image_pair), pairs(epoch, text_pair)
            judged.append(
                JudgedPair(image=image.image, caption=text.caption, image_id=image.image_id, caption_id=text.caption_id)
            )
        return torch.from_numpy(judge.score(judged)).float()

    return Mafa(
        discriminator, high=settings.high, low=settings.low, smoothing=settings.smoothing, mlm_pairs=settings.mlm_pairs
    )
