"""Model families ("frameworks") behind one seam: what the pretrain stage, retrieval and the checks need to
know about ALBEF, BLIP-2 or a dual encoder (CLIP / SigLIP on open_clip), so the composers, the embedding cache, the scheduler, the batch log and the
audit never learn which one they serve.

A framework says, for a model family:

* how its model is built: the registry entry's ``framework`` key picks the config class and the model
  (:func:`falcon_cli.models.registry.build_model`), and :func:`model_overrides` turns the stage's
  tokenizer and weight settings into that config's fields;
* the training losses of one batch and the L2-normalised image/text features that fill the embedding
  cache: its objective (ALBEF's :class:`~falcon_cli.objectives.vlp.VlpObjective`, BLIP-2's
  :class:`~falcon_cli.objectives.qformer.Blip2Objective`) is an ``nn.Module`` whose ``forward`` gives a named tuple with
  ``loss``, one field per name in :attr:`Framework.losses`, ``image_feat``/``text_feat`` (one vector per
  pair: what the cache and the composers use), ``temperature`` and ``image_tokens``; its ``measure``
  computes any of :attr:`Framework.losses` (the reward's parts) on the same inputs without gradient;
* the rewards FALCON's scheduler may use with it (:attr:`Framework.rewards`);
* how retrieval scores a pair: the models' ``encode_image``/``encode_text``, the one similarity function
  (:func:`falcon_cli.objectives.common.image_text_similarity`: a dot product, or BLIP-2's best query), and
  ``match_logits`` for ITM re-ranking, added to the ITC similarity where :attr:`Framework.rerank` says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from falcon_cli.errors import FalconError
from falcon_cli.method_weights import BLIP2_ITC_LABEL_SMOOTHING, ITC_CONSISTENCY_WEIGHT


@dataclass(frozen=True)
class Framework:
    """What differs between model families, as data."""

    name: str
    """``albef``, ``blip2`` or ``dual`` (the ``framework`` key of a model config)."""
    losses: tuple[str, ...]
    """The training losses of a step (their sum is the loss), in the order the metrics log records them."""
    rewards: tuple[str, ...]
    """The ``pretrain.reward`` values FALCON's scheduler may use with this framework."""
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


FRAMEWORKS: dict[str, Framework] = {
    "albef": Framework("albef", losses=("itc", "itm", "mlm"),
                       rewards=("mlm", "itc+itm", "itc+itm+mlm", "alignment", "positive_margin"),
                       masked_language=True, rerank="itm", itc_label_smoothing=0.0, itc_stop_gradient=True,
                       consistency_weight=ITC_CONSISTENCY_WEIGHT["none"]),  # GRIT-VLP's 0.2
    "blip2": Framework("blip2", losses=("itc", "itm", "itg"),
                       rewards=("itg", "itc+itm", "itc+itm+itg", "alignment", "positive_margin"),
                       masked_language=False, rerank="itm+itc", itc_label_smoothing=BLIP2_ITC_LABEL_SMOOTHING,
                       itc_stop_gradient=False,
                       consistency_weight=0.0),
    "dual": Framework("dual", losses=("itc", "caption"),
                      rewards=("caption", "itc", "itc+caption", "alignment", "positive_margin"),
                      masked_language=False, rerank="none", itc_label_smoothing=0.0, itc_stop_gradient=False,
                      consistency_weight=0.0),
}


def framework_of(model_or_config: Any) -> Framework:
    """The :class:`Framework` of a model, a model config, or a framework name."""
    name = model_or_config if isinstance(model_or_config, str) else getattr(
        getattr(model_or_config, "config", model_or_config), "framework", "albef")
    if name not in FRAMEWORKS:
        raise FalconError(f"unknown framework {name!r}; valid: {', '.join(FRAMEWORKS)}")
    return FRAMEWORKS[name]


def model_framework(model_name: str) -> Framework:
    """The framework of the registered model ``model_name`` (an unknown name: one FalconError naming the valid ones)."""
    from falcon_cli.models.registry import get_model_config

    return framework_of(get_model_config(model_name))


def build_objective(framework: Framework, model: Any, p: Any, false_negatives: Any = None) -> Any:
    """The training objective of ``framework`` around ``model``, with the pretrain settings ``p`` (a
    ``PretrainConfig``, or anything with its fields): BLIP-2's ITC + ITM + ITG (LAVIS's stage 1), a dual
    encoder's sigmoid or InfoNCE contrastive loss + its decoder's captioning loss, ALBEF's ITC + ITM + MLM.
    ``false_negatives``: the method's :class:`~falcon_cli.objectives.false_negatives.FalseNegatives` (None: the
    framework's plain ITC)."""
    # (imported here: every config validation reads this module, `falcon --help` included, and needs no loss)
    if framework.name == "blip2":
        from falcon_cli.objectives.qformer import Blip2Objective

        return Blip2Objective(model, consistency_weight=p.itc_consistency_weight, itm_negatives=p.itm_negatives,
                              false_negatives=false_negatives)
    if framework.name == "dual":
        from falcon_cli.objectives.dual import DualObjective

        return DualObjective(model, caption_weight=p.caption_weight, false_negatives=false_negatives)
    from falcon_cli.objectives.vlp import VlpObjective

    return VlpObjective(model, itc=p.itc, consistency_weight=p.itc_consistency_weight, itm_negatives=p.itm_negatives,
                        momentum=p.momentum, queue_size=p.queue_size, false_negatives=false_negatives)


def model_overrides(framework: Framework, tokenizer_length: int, *, vision_weights: str | None,
                    text_weights: str | None, image_size: int | None, pad_token_id: int | None = None) -> dict[str, Any]:
    """The registry overrides the pretrain stage builds its model with: the run tokenizer's vocabulary (BLIP-2:
    plus its ``[DEC]`` token, appended), the weight sources (BLIP-2: ``text_weights`` are the Q-Former's: a
    BLIP-2 checkpoint, or BERT for a fresh Q-Former; a dual encoder: ``vision_weights`` are the whole open_clip
    model's, a pretrained tag or file) and the resolution. A dual encoder also takes the tokenizer's padding id."""
    if framework.name == "dual":
        overrides: dict[str, Any] = {"vocab_size": tokenizer_length, "open_clip_weights": vision_weights}
        if pad_token_id is not None:
            overrides["pad_token_id"] = pad_token_id
        if image_size is not None:
            overrides["image_size"] = image_size
        return overrides
    overrides = {"vision_weights": vision_weights}
    if framework.name == "blip2":
        overrides.update(vocab_size=tokenizer_length + 1, qformer_weights=text_weights)
    else:
        overrides.update(vocab_size=tokenizer_length, text_weights=text_weights)
    if image_size is not None:
        overrides["image_size"] = image_size
    return overrides


__all__ = ["FRAMEWORKS", "Framework", "framework_of", "model_framework", "model_overrides"]
