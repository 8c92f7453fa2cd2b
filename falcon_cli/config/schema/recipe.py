"""A recipe: which stages run, in order, and one section per stage."""

from __future__ import annotations

from pydantic import Field, model_validator

from falcon_cli.config.schema.audit import AuditConfig
from falcon_cli.config.schema.base import STAGE_ORDER, Section, StageName
from falcon_cli.config.schema.data import DataConfig
from falcon_cli.config.schema.embed import EmbedConfig, SearchSpacesConfig
from falcon_cli.config.schema.evaluate import EvaluateConfig
from falcon_cli.config.schema.finetune import FinetuneConfig
from falcon_cli.config.schema.pretrain import PretrainConfig
from falcon_cli.config.schema.unimodal import UnimodalConfig


class Recipe(Section):
    """A recipe: which stages to run, in order, and one config section per stage."""

    name: str = "recipe"
    """The recipe's name (defaults to the file stem); the default run directory is ``runs/<name>``."""

    description: str = ""
    """One line saying what this recipe is for (shown by ``falcon recipes list``)."""

    seed: int = Field(0, ge=0)
    """Global seed; each distributed rank uses ``seed + rank``."""

    stages: list[StageName] = ["data"]
    """Stages that ``falcon run`` executes, in order."""

    data: DataConfig
    """The ``data`` stage: dataset spec, optional shapes-world generation, check and tokenizer."""

    unimodal: UnimodalConfig = UnimodalConfig()
    """The ``unimodal`` stage: the image and text encoders' starting points on a shapes world."""

    embed: EmbedConfig = EmbedConfig()
    """The ``embed`` stage."""

    search_spaces: SearchSpacesConfig = SearchSpacesConfig()
    """The ``build_search_spaces`` stage."""

    pretrain: PretrainConfig = PretrainConfig()
    """The ``pretrain`` stage."""

    audit: AuditConfig = AuditConfig()
    """The ``audit_false_negatives`` stage."""

    finetune: FinetuneConfig = FinetuneConfig()
    """The ``finetune`` stage: retrieval, VQA and NLVR2 fine-tuning."""

    evaluate: EvaluateConfig = EvaluateConfig()
    """The ``evaluate`` stage: retrieval (with false-negative-aware metrics), VQA and NLVR2 results."""

    @model_validator(mode="after")
    def _stages_in_order(self) -> "Recipe":
        order = [STAGE_ORDER.index(s) for s in self.stages]
        if order != sorted(order) or len(set(order)) != len(order):
            raise ValueError(f"stages must be distinct and in pipeline order {list(STAGE_ORDER)}, got {self.stages}")
        return self
