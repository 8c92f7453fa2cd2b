"""Model families ("frameworks") behind one seam: what the pretrain stage, retrieval and the checks need to
know about ALBEF, BLIP-2 or a dual encoder (CLIP / SigLIP on open_clip), so the composers, the embedding cache, the
scheduler, the batch log and the audit never learn which one they serve.

A framework says, for a model family:

* its model family (:attr:`Framework.family`, :mod:`falcon_cli.models.families`): the config class and the
  builder the registry entry's ``framework`` key picks, and what its models can do (an ITM head, ALBEF's
  fine-tuning heads); :func:`model_overrides` turns the stage's tokenizer and weight settings into that
  config's fields (:attr:`Framework.weight_fields`);
* its objective, built by the record (:attr:`Framework.objective`, :func:`build_objective`), and the
  pretrain settings it does not offer (:attr:`Framework.fixed_settings`);
* the training losses of one batch and the L2-normalised image/text features that fill the embedding
  cache: its objective (ALBEF's :class:`~falcon_cli.objectives.vlp.VlpObjective`, BLIP-2's
  :class:`~falcon_cli.objectives.qformer.Blip2Objective`) is an ``nn.Module`` whose ``forward`` gives a named tuple with
  ``loss``, one field per name in :attr:`Framework.losses`, ``image_feat``/``text_feat`` (one vector per
  pair: what the cache and the composers use), ``temperature`` and ``image_tokens``; its ``measure``
  computes any of :attr:`Framework.losses` (the reward's parts) on the same inputs without gradient;
* the rewards FALCON's scheduler may use with it (:attr:`Framework.rewards`: those of
  :data:`~falcon_cli.registry.REWARDS` that name it);
* how retrieval scores a pair: the models' ``encode_image``/``encode_text``, the one similarity function
  (:func:`falcon_cli.objectives.common.image_text_similarity`: a dot product, or BLIP-2's best query), and
  ``match_logits`` for ITM re-ranking, added to the ITC similarity where :attr:`Framework.rerank` says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from falcon_cli.method_weights import BLIP2_ITC_LABEL_SMOOTHING, ITC_CONSISTENCY_WEIGHT
from falcon_cli.models.families import FAMILIES, ModelFamily, model_family
from falcon_cli.models.registry import get_model_config
from falcon_cli.registry import REWARDS


@dataclass(frozen=True)
class Framework:
    """What differs between model families, as data; everything else asks this record."""

    name: str
    """``albef``, ``blip2`` or ``dual`` (the ``framework`` key of a model config)."""
    family: ModelFamily
    """The model side: config class, builder, capabilities (:mod:`falcon_cli.models.families`)."""
    losses: tuple[str, ...]
    """The training losses of a step (their sum is the loss), in the order the metrics log records them."""
    masked_language: bool
    """Whether each batch needs an MLM mask (drawn outside the model, so a reward re-scores the batch with
    the identical mask)."""
    rerank: str
    """Default ITM re-ranking score of retrieval: ``itm`` (ALBEF: the match logit alone), ``itm+itc``
    (LAVIS's BLIP-2: the match logit plus the ITC cosine) or ``none`` (a dual encoder has no ITM head:
    retrieval ranks by the embedding similarity alone)."""
    itc_label_smoothing: float
    """Label smoothing of the plain ITC (``false_negatives: none``): 0 (GRIT-VLP) or 0.1 (BLIP-2)."""
    itc_stop_gradient: bool
    """GRIT-VLP's per-direction stop-gradient in the plain ITC (True), or BLIP-2's plain InfoNCE (False)."""
    consistency_weight: float
    """Default weight of GRIT's ITC consistency term under ``false_negatives: none`` (0.2 GRIT-VLP, 0 BLIP-2)."""
    objective: Callable[[Any, Any, Any], Any]
    """``objective(model, losses, false_negatives)``: the training objective around a model, with the losses' settings
    (``pretrain.losses``; see :func:`build_objective`)."""
    weight_fields: dict[str, str | None]
    """Which model-config field each of the stage's weight sources sets (``vision_weights``, ``text_weights``;
    None: the framework has no such source)."""
    pad_token: bool
    """The model config takes the run tokenizer's padding id (``pad_token_id``)."""
    frozen_image_encoder: bool
    """Its image encoder is frozen in pretraining (BLIP-2), so ``encoders.vision_trainable_epochs`` applies."""
    fixed_settings: tuple[tuple[str, Any], ...] = ()
    """``pretrain`` settings its models do not offer, each with the only value allowed (ALBEF's momentum ITC,
    official-checkpoint ``init`` and ``compile``)."""
    unimodal_init: bool = False
    """Whether the ``unimodal`` stage's encoders (a timm ViT and a BERT, :mod:`falcon_cli.models.unimodal`) load into
    its models as ``vision_weights`` / ``text_weights``: ALBEF's do."""

    @property
    def rewards(self) -> tuple[str, ...]:
        """The ``pretrain.scheduler.reward.name`` values FALCON's scheduler may use with this framework: the registered
        rewards (:data:`~falcon_cli.registry.REWARDS`, plugins' too) that name it."""
        names = [name for name in REWARDS.names() if self.name in REWARDS.get(name).frameworks]
        return tuple(sorted(names, key=lambda name: REWARDS.get(name).score is not None))  # loss decreases first

    @property
    def title(self) -> str:
        """How messages name its models (``ALBEF``, ``BLIP-2``, ``dual-encoder``)."""
        return self.family.title

    def plain_itc(self) -> Any:
        """The framework's in-batch ITC without a false-negative method (``false_negatives: none``): a
        :class:`~falcon_cli.objectives.false_negatives.PlainItc` with its label smoothing and stop-gradient."""
        from falcon_cli.objectives.false_negatives import PlainItc  # (lazy: validating a config reads this module)

        return PlainItc(label_smoothing=self.itc_label_smoothing, stop_gradient=self.itc_stop_gradient)


# The objectives, imported when built (lazy): every config validation reads this module (`falcon recipes
# validate` included) and needs no loss.
def _albef_objective(model: Any, losses: Any, false_negatives: Any) -> Any:
    """ALBEF's ITC (GRIT's in-batch or a momentum queue) + ITM + MLM."""
    from falcon_cli.objectives.vlp import VlpObjective  # (lazy: see above)

    return VlpObjective(
        model,
        itc=losses.itc,
        consistency_weight=losses.itc_consistency_weight,
        itm_negatives=losses.itm_negatives,
        momentum=losses.momentum,
        queue_size=losses.queue_size,
        false_negatives=false_negatives,
    )


def _blip2_objective(model: Any, losses: Any, false_negatives: Any) -> Any:
    """BLIP-2 stage 1 (LAVIS): ITC + ITM + ITG."""
    from falcon_cli.objectives.qformer import Blip2Objective  # (lazy: see above)

    return Blip2Objective(
        model,
        consistency_weight=losses.itc_consistency_weight,
        itm_negatives=losses.itm_negatives,
        false_negatives=false_negatives,
    )


def _dual_objective(model: Any, losses: Any, false_negatives: Any) -> Any:
    """A dual encoder's sigmoid or InfoNCE contrastive loss + its decoder's captioning loss."""
    from falcon_cli.objectives.dual import DualObjective  # (lazy: see above)

    return DualObjective(model, caption_weight=losses.caption_weight, false_negatives=false_negatives)


NOT_ALBEF = (("losses.itc", "grit"), ("encoders.init", None), ("runtime.compile", False))
"""ALBEF-only pretrain settings (dotted keys below ``pretrain``) and the value other frameworks must leave them at."""

FRAMEWORKS: dict[str, Framework] = {
    "albef": Framework(
        "albef",
        FAMILIES["albef"],
        losses=("itc", "itm", "mlm"),
        masked_language=True,
        rerank="itm",
        itc_label_smoothing=0.0,
        itc_stop_gradient=True,
        consistency_weight=ITC_CONSISTENCY_WEIGHT["none"],  # GRIT-VLP's 0.2
        objective=_albef_objective,
        weight_fields={"vision": "vision_weights", "text": "text_weights"},
        pad_token=False,
        frozen_image_encoder=False,
        unimodal_init=True,
    ),
    "blip2": Framework(
        "blip2",
        FAMILIES["blip2"],
        losses=("itc", "itm", "itg"),
        masked_language=False,
        rerank="itm+itc",
        itc_label_smoothing=BLIP2_ITC_LABEL_SMOOTHING,
        itc_stop_gradient=False,
        consistency_weight=0.0,
        objective=_blip2_objective,
        # text weights are the Q-Former's: a BLIP-2 checkpoint, or BERT for a fresh Q-Former
        weight_fields={"vision": "vision_weights", "text": "qformer_weights"},
        pad_token=False,
        frozen_image_encoder=True,
        fixed_settings=NOT_ALBEF,
    ),
    "dual": Framework(
        "dual",
        FAMILIES["dual"],
        losses=("itc", "caption"),
        masked_language=False,
        rerank="none",
        itc_label_smoothing=0.0,
        itc_stop_gradient=False,
        consistency_weight=0.0,
        objective=_dual_objective,
        # the whole open_clip model's weights (a pretrained tag or file); no separate text source
        weight_fields={"vision": "open_clip_weights", "text": None},
        pad_token=True,
        frozen_image_encoder=False,
        fixed_settings=NOT_ALBEF,
    ),
}


def framework_of(model_or_config: Any) -> Framework:
    """The :class:`Framework` of a model, a model config, or a framework name."""
    return FRAMEWORKS[model_family(model_or_config, "framework").name]


def model_framework(model_name: str) -> Framework:
    """The framework of the registered model ``model_name`` (an unknown name: one FalconError naming the valid ones)."""
    return framework_of(get_model_config(model_name))


def build_objective(framework: Framework, model: Any, losses: Any, false_negatives: Any = None) -> Any:
    """The training objective of ``framework`` around ``model``, with the losses' settings ``losses``
    (``pretrain.losses``, a :class:`~falcon_cli.config.schema.LossesConfig`, or anything with its fields): BLIP-2's ITC
    + ITM + ITG (LAVIS's stage 1), a dual encoder's sigmoid or InfoNCE contrastive loss + its decoder's captioning loss,
    ALBEF's ITC + ITM + MLM. ``false_negatives``: the method's
    :class:`~falcon_cli.objectives.false_negatives.FalseNegatives` (None: the framework's plain ITC,
    :meth:`Framework.plain_itc`)."""
    return framework.objective(model, losses, false_negatives if false_negatives is not None else framework.plain_itc())


def model_overrides(
    framework: Framework,
    tokenizer_length: int,
    *,
    vision_weights: str | None,
    text_weights: str | None,
    image_size: int | None,
    pad_token_id: int | None = None,
) -> dict[str, Any]:
    """The registry overrides the pretrain stage builds its model with: the run tokenizer's vocabulary (plus the
    tokens the family appends after it: BLIP-2's ``[DEC]``), the weight sources in the fields the framework
    names (:attr:`Framework.weight_fields`), the resolution, and the padding id where the model takes it."""
    overrides: dict[str, Any] = {"vocab_size": tokenizer_length + framework.family.appended_tokens}
    for source, value in (("vision", vision_weights), ("text", text_weights)):
        if framework.weight_fields[source] is not None:
            overrides[framework.weight_fields[source]] = value
    if framework.pad_token and pad_token_id is not None:
        overrides["pad_token_id"] = pad_token_id
    if image_size is not None:
        overrides["image_size"] = image_size
    return overrides


__all__ = ["FRAMEWORKS", "Framework", "build_objective", "framework_of", "model_framework", "model_overrides"]
