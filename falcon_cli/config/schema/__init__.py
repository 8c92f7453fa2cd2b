"""Typed configuration: one section per stage, a docstring on every field.

A recipe (``recipes/*.yaml``) is validated against :class:`Recipe`. Unknown keys are
rejected (with the nearest valid key, see :mod:`falcon_cli.config.recipes`), values are
parsed to the field's type, and the resolved config is written into the run directory.
Each stage's section lives in a module of its own (``schema/pretrain.py``, ``schema/finetune.py``, ...); every
name is also here, where code imports it from."""

from __future__ import annotations

from falcon_cli.config.schema.audit import AuditConfig
from falcon_cli.config.schema.base import STAGE_ORDER, Loggers, Section, StageName, TaskName
from falcon_cli.config.schema.data import DataConfig
from falcon_cli.config.schema.embed import EmbedConfig, SearchSpacesConfig
from falcon_cli.config.schema.evaluate import EvaluateConfig, Nlvr2EvalConfig, RetrievalEvalConfig, VqaEvalConfig
from falcon_cli.config.schema.false_negatives import FalseNegativeMethod, FalseNegativesConfig
from falcon_cli.config.schema.finetune import (
    FinetuneConfig,
    Nlvr2FinetuneConfig,
    RetrievalFinetuneConfig,
    TaskTraining,
    VqaFinetuneConfig,
)
from falcon_cli.config.schema.pretrain import (
    CheckpointsConfig,
    ComposerConfig,
    EncodersConfig,
    LoaderConfig,
    LoggingConfig,
    LossesConfig,
    OptimizerConfig,
    PretrainConfig,
    PretrainEvalConfig,
    RuntimeConfig,
)
from falcon_cli.config.schema.recipe import Recipe
from falcon_cli.config.schema.scheduler import RewardConfig, SchedulerConfig, SchedulerUpdateConfig
from falcon_cli.config.schema.unimodal import UnimodalConfig

__all__ = [
    "AuditConfig",
    "CheckpointsConfig",
    "ComposerConfig",
    "DataConfig",
    "EmbedConfig",
    "EncodersConfig",
    "EvaluateConfig",
    "FalseNegativeMethod",
    "FalseNegativesConfig",
    "FinetuneConfig",
    "LoaderConfig",
    "Loggers",
    "LoggingConfig",
    "LossesConfig",
    "Nlvr2EvalConfig",
    "Nlvr2FinetuneConfig",
    "OptimizerConfig",
    "PretrainConfig",
    "PretrainEvalConfig",
    "Recipe",
    "RetrievalEvalConfig",
    "RetrievalFinetuneConfig",
    "RewardConfig",
    "RuntimeConfig",
    "SchedulerConfig",
    "SchedulerUpdateConfig",
    "SearchSpacesConfig",
    "Section",
    "STAGE_ORDER",
    "StageName",
    "TaskName",
    "TaskTraining",
    "UnimodalConfig",
    "VqaEvalConfig",
    "VqaFinetuneConfig",
]
