"""Model families as data: what the model layer needs to know of ALBEF, BLIP-2 and a dual encoder.

A model config's ``framework`` key names its family. The family says which config class validates it, which
function builds the network, and what the network can do (an ITM head to re-rank and judge with, ALBEF's
fine-tuning heads, tokens it appends after the tokenizer's vocabulary). Everything in ``models/`` asks this
record instead of comparing framework names; the training side of a framework (losses, rewards, objective,
re-ranking rule) is :class:`falcon_cli.frameworks.Framework`, which carries its family.

The config class and the builder are named by import path (``module:attribute``) and imported on first use:
reading a model config (which validating a recipe does) must not import the networks, and the networks
themselves import the config modules.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from falcon_cli.errors import FalconError


@dataclass(frozen=True)
class ModelFamily:
    """A model family (``framework`` key of a model config)."""

    name: str
    """``albef``, ``blip2`` or ``dual``."""
    title: str
    """How messages name its models (``ALBEF``, ``BLIP-2``, ``dual-encoder``)."""
    config: str
    """Import path (``module:Class``) of its pydantic config class."""
    builder: str
    """Import path (``module:function``) of ``build(config) -> nn.Module``: random init, then the pretrained
    sources the config names are loaded."""
    itm_head: bool
    """Its models have an image-text matching head (``match_logits``, ``pair_itm_logits``): they re-rank
    retrieval by ITM and can judge pairs in the audit and MAFA."""
    downstream: bool
    """ALBEF's fine-tuning heads (retrieval, VQA, NLVR2) are built on its models."""
    appended_tokens: int
    """Tokens its models append after the run tokenizer's vocabulary (BLIP-2's ``[DEC]``) when the config does
    not place them inside it (``dec_token_id`` unset)."""

    def config_class(self) -> type:
        """The config class (imported now)."""
        return _resolve(self.config)

    def build(self, config: Any) -> Any:
        """The model of ``config`` (its builder imported now)."""
        return _resolve(self.builder)(config)

    def tokenizer_vocabulary(self, config: Any) -> int:
        """The run tokenizer's length ``config`` was built for: its ``vocab_size`` less the appended tokens."""
        appended = self.appended_tokens if getattr(config, "dec_token_id", None) is None else 0
        return config.vocab_size - appended


FAMILIES: dict[str, ModelFamily] = {
    "albef": ModelFamily(
        "albef",
        "ALBEF",
        "falcon_cli.models.config:AlbefConfig",
        "falcon_cli.models.albef:build_albef",
        itm_head=True,
        downstream=True,
        appended_tokens=0,
    ),
    "blip2": ModelFamily(
        "blip2",
        "BLIP-2",
        "falcon_cli.models.blip2_config:Blip2Config",
        "falcon_cli.models.qformer:build_blip2",
        itm_head=True,
        downstream=False,
        appended_tokens=1,
    ),
    "dual": ModelFamily(
        "dual",
        "dual-encoder",
        "falcon_cli.models.dual_config:DualConfig",
        "falcon_cli.models.dual:build_dual",
        itm_head=False,
        downstream=False,
        appended_tokens=0,
    ),
}


def model_family(model_or_config: Any, source: str = "model config") -> ModelFamily:
    """The family of a model, a model config, or a framework name (``source`` names the input in the one
    line an unknown name gets)."""
    name = (
        model_or_config
        if isinstance(model_or_config, str)
        else getattr(getattr(model_or_config, "config", model_or_config), "framework", "albef")
    )
    if name not in FAMILIES:
        raise FalconError(f"{source}: unknown framework {name!r}; valid: {', '.join(FAMILIES)}")
    return FAMILIES[name]


def _resolve(path: str) -> Any:
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


__all__ = ["FAMILIES", "ModelFamily", "model_family"]
