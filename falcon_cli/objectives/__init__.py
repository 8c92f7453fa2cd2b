"""Losses of the three frameworks' pretraining (ITC, ITM, MLM; BLIP-2's ITG; the dual encoders' sigmoid and
captioning losses), FALCON's rewards, and the false-negative methods (MAFA, SRCL, DiHT, GloFND).

Pure tensor functions (features / logits / ids in, losses out): model-agnostic,
device-agnostic, vectorised, and bf16-autocast safe (softmax, log-softmax and
cross-entropy always run in float32).

* :mod:`~falcon_cli.objectives.itc` — GRIT-VLP ITC with consistency targets
  (:func:`itc_grit`, with a multi-positive ``positive_mask`` hook), ALBEF momentum
  distillation (:class:`MomentumQueue`, :func:`momentum_update`,
  :func:`itc_momentum_distillation`, :func:`alpha_ramp`).
* :mod:`~falcon_cli.objectives.itm` — hardest / sampled in-batch negatives, fusion-input
  index lists, the 3B-pair ITM loss.
* :mod:`~falcon_cli.objectives.mlm` — the reusable :class:`MlmMask` and :func:`mlm_loss`.
"""

from falcon_cli.objectives.common import positive_mask_from_ids, row_normalised_targets, soft_cross_entropy
from falcon_cli.objectives.itc import (
    ItcOutput,
    MomentumQueue,
    alpha_ramp,
    copy_to_momentum,
    itc_grit,
    itc_momentum_distillation,
    momentum_update,
)
from falcon_cli.objectives.itm import ItmPairs, hardest_negatives, itm_loss, itm_pair_indices, sample_negatives
from falcon_cli.objectives.mlm import IGNORE_INDEX, MlmMask, mlm_loss

__all__ = [
    "IGNORE_INDEX",
    "ItcOutput",
    "ItmPairs",
    "MlmMask",
    "MomentumQueue",
    "alpha_ramp",
    "copy_to_momentum",
    "hardest_negatives",
    "itc_grit",
    "itc_momentum_distillation",
    "itm_loss",
    "itm_pair_indices",
    "mlm_loss",
    "momentum_update",
    "positive_mask_from_ids",
    "row_normalised_targets",
    "sample_negatives",
    "soft_cross_entropy",
]
