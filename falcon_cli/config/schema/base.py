"""The pieces every section shares: :class:`Section` (unknown keys refused), the stage names, the loggers."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator

from falcon_cli.config.section import Section
from falcon_cli.runtime.loggers import LoggerName

__all__ = ["STAGE_ORDER", "Loggers", "Section", "StageName", "TaskName"]

StageName = Literal[
    "data", "unimodal", "embed", "build_search_spaces", "pretrain", "audit_false_negatives", "finetune", "evaluate"
]
"""The stages a recipe can chain, in the order they may run."""

STAGE_ORDER: tuple[str, ...] = (
    "data",
    "unimodal",
    "embed",
    "build_search_spaces",
    "pretrain",
    "audit_false_negatives",
    "finetune",
    "evaluate",
)

TaskName = Literal["retrieval", "vqa", "nlvr2"]
"""ALBEF's downstream tasks: image-text retrieval, VQA and NLVR2."""


def _distinct_loggers(names: list[str]) -> list[str]:
    if len(set(names)) != len(names):
        raise ValueError(f"loggers must be distinct, got {names}")
    return names


Loggers = Annotated[list[LoggerName], AfterValidator(_distinct_loggers)]
"""``pretrain.logging.loggers`` / ``finetune.loggers``: where the metrics go (:mod:`falcon_cli.runtime.loggers`)."""
