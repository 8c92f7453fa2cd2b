"""DiHT's HN-NCE (Radenovic et al., 2023): importance-weighted hard negatives (docs/methods.md)."""

from __future__ import annotations

from pydantic import Field

from falcon_cli.config.section import Section
from falcon_cli.method_weights import ITC_CONSISTENCY_WEIGHT
from falcon_cli.registry import false_negative_method


class DihtConfig(Section):
    """DiHT's HN-NCE (``pretrain.false_negatives.method: diht``): importance-weighted hard negatives."""

    beta: float = Field(0.5, ge=0.0)
    """Hardness β of both directions: negatives weighted by ``(N - 1) softmax_j(β · logits)``; 0 = InfoNCE."""

    alpha: float = Field(1.0, gt=0.0, le=1.0)
    """Weight α of the positive in the denominator (1 = InfoNCE's)."""


@false_negative_method(
    "diht",
    consistency_weight=ITC_CONSISTENCY_WEIGHT["diht"],
    config=DihtConfig,
    description="HN-NCE: hard negatives weighted up",
)
def build(settings: DihtConfig, context):
    """HN-NCE with the section's β and α."""
    # (lazy: the schema imports this file to read the settings; torch and the losses load when built)
    from falcon_cli.objectives.false_negatives import Diht

    return Diht(beta=settings.beta, alpha=settings.alpha)
