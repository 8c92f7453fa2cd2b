"""The ``audit_false_negatives`` stage's section."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from falcon_cli.config.paths import InputPath
from falcon_cli.config.schema.base import Section


class AuditConfig(Section):
    """The ``audit_false_negatives`` stage: judge the negatives a run used (``audit/``)."""

    judge: Literal["auto", "oracle", "blip", "checkpoint"] = "auto"
    """Who decides that a negative is a false negative: ``oracle`` (the shapes world's ground truth),
    ``blip`` (a BLIP ITM head, as in the paper's Figure 2), ``checkpoint`` (a falcon checkpoint's own
    ITM head); ``auto`` = the oracle where the dataset has one, else BLIP."""

    judge_model: Annotated[str | None, InputPath(when="exists")] = None
    """``blip``: a hub id or local directory (None = ``Salesforce/blip-itm-base-coco``); ``checkpoint``:
    a falcon run or checkpoint directory (None = the audited run's latest checkpoint)."""

    threshold: float = Field(0.5, ge=0.0, le=1.0)
    """A negative is a false negative when the judge's p(match) exceeds this (the paper: 0.5)."""

    negatives: list[Literal["chain", "itm"]] = ["chain", "itm"]
    """Which negatives: ``chain`` (each pair and the anchor it was chosen for, at quantile q) and
    ``itm`` (each anchor's hardest in-batch negative by ITC similarity, the ITM negative), both
    in both directions (image→text, text→image)."""

    max_pairs: int | None = Field(20000, ge=1)
    """Judge at most this many (anchor, negative) pairs: whole training steps, evenly spread over
    training; None = every step."""

    steps: int | None = Field(None, ge=1)
    """Audit at most this many training steps, evenly spread (with ``max_pairs``, the tighter wins)."""

    hardness_buckets: int = Field(5, ge=1)
    """Equal-width buckets of hardness (q) in [0, 1] for the false-negative rate table."""

    step_windows: int = Field(4, ge=1)
    """Equal ranges of audited training steps for the false-negative rate table."""

    filter_thresholds: list[Annotated[float, Field(ge=0, le=1)]] = [
        0.1,
        0.2,
        0.3,
        0.4,
        0.5,
        0.6,
        0.7,
        0.8,
        0.9,
        0.95,
        0.99,
    ]
    """Thresholds τ of the filter curve: negatives with judge score > τ are dropped, and the
    false-negative ratio of the rest is measured (by the oracle where there is one)."""

    examples: int = Field(12, ge=0)
    """How many missed false negatives (oracle: a match; judge: low score) ``missed_examples.png`` shows."""

    batch_size: int = Field(64, ge=1)
    """Pairs per forward pass of a model judge."""

    device: str = "auto"
    """Where a model judge runs: ``auto`` (the local GPU if any, else CPU), ``cpu`` or ``cuda[:n]``."""

    fp16: bool = False
    """Run a model judge in fp16 autocast (CUDA only)."""

    @model_validator(mode="after")
    def _check(self) -> "AuditConfig":
        if not self.negatives or len(set(self.negatives)) != len(self.negatives):
            raise ValueError(f"negatives must name chain and/or itm once each, got {self.negatives}")
        return self
