"""The models of the three frameworks (ALBEF, BLIP-2 stage 1, open_clip dual encoders): a registry of JSON
configs (``models/configs/``), the networks, their configs, weight loaders and FLOP counts.

``create_model("albef-tiny", vocab_size=len(tokenizer))`` builds a model; see
:mod:`falcon_cli.models.registry` for names and overrides, :mod:`falcon_cli.models.albef`
for the forward API, :mod:`falcon_cli.models.weights` for loading and saving weights.
"""

from falcon_cli.models.albef import ALBEF, Encodings
from falcon_cli.models.config import AlbefConfig
from falcon_cli.models.registry import (
    add_model_config,
    build_model,
    create_model,
    get_model_config,
    list_models,
    model_from_weights,
    resolve_model_config,
)
from falcon_cli.models.weights import (
    clean_state_dict,
    load_bert_weights,
    load_vision_weights,
    load_weights,
    read_weights_config,
    save_weights,
)

__all__ = [
    "ALBEF",
    "AlbefConfig",
    "Encodings",
    "add_model_config",
    "build_model",
    "clean_state_dict",
    "create_model",
    "get_model_config",
    "list_models",
    "load_bert_weights",
    "load_vision_weights",
    "load_weights",
    "model_from_weights",
    "read_weights_config",
    "resolve_model_config",
    "save_weights",
]
