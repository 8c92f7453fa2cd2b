"""The models of the three frameworks (ALBEF, BLIP-2 stage 1, open_clip dual encoders): a registry of JSON
configs (``models/configs/``), the networks, their configs, weight loaders and FLOP counts.

``create_model("albef-tiny", vocab_size=len(tokenizer))`` builds a model; see
:mod:`falcon_cli.models.registry` for names and overrides, :mod:`falcon_cli.models.albef`
for the forward API, :mod:`falcon_cli.models.weights` for loading and saving weights.

The names below are imported on first use (:mod:`falcon_cli.lazy_exports`): the config schema reads the model
configs (``models/config.py``, ``models/registry.py``) without importing torch, and importing any module of this
package runs this file first.
"""

from falcon_cli.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "albef": ("ALBEF", "Encodings"),
        "config": ("AlbefConfig",),
        "registry": (
            "add_model_config",
            "build_model",
            "create_model",
            "get_model_config",
            "list_models",
            "model_from_weights",
            "resolve_model_config",
        ),
        "weights": (
            "clean_state_dict",
            "load_bert_weights",
            "load_vision_weights",
            "load_weights",
            "read_weights_config",
            "save_weights",
        ),
    },
)
