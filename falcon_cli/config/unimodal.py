"""Which unimodal weights a run's config means: one function for the stage that trains them and the
pretraining stage that loads them, so both compute the same cache entry."""

from __future__ import annotations

import json
from pathlib import Path

from falcon_cli.config.schema import Recipe
from falcon_cli.errors import FalconError
from falcon_cli.frameworks import model_framework, model_overrides
from falcon_cli.models.config import AlbefConfig
from falcon_cli.models.registry import resolve_model_config
from falcon_cli.models.unimodal import CACHE_DIR, UnimodalWeights


def unimodal_model_config(config: Recipe, tokenizer_length: int) -> AlbefConfig:
    """The architecture the unimodal encoders take: ``pretrain.model`` at ``pretrain.encoders.image_size`` with the run
    tokenizer's vocabulary, as pretraining builds it (no weight sources)."""
    p = config.pretrain
    framework = model_framework(p.model)
    return resolve_model_config(
        p.model,
        **model_overrides(
            framework, tokenizer_length, vision_weights=None, text_weights=None, image_size=p.encoders.image_size
        ),
    )


def world_config(dataset: Path) -> dict:
    """The shapes world's config from its ``world.json`` (the unimodal tasks need the world's scenes)."""
    path = Path(dataset) / "world.json"
    if not path.is_file():
        raise FalconError(
            f"unimodal: {dataset} is not a shapes world (no world.json); the unimodal stage learns the "
            "world's scene attributes, so it needs data.shapes or a generated world as data.dataset"
        )
    return json.loads(path.read_text(encoding="utf-8"))["config"]


def unimodal_seed(config: Recipe) -> int:
    """The seed the unimodal encoders are trained with: ``unimodal.seed``, else the run's."""
    return config.seed if config.unimodal.seed is None else config.unimodal.seed


def unimodal_weights(config: Recipe, vocabulary: dict[str, int]) -> UnimodalWeights:
    """The cache entry of ``config``'s world, model, tokenizer (``vocabulary``), unimodal settings and seed."""
    u = config.unimodal
    settings = u.model_dump(mode="json", exclude={"cache_dir", "device", "seed"})
    settings["max_text_length"] = (
        config.pretrain.encoders.max_text_length
    )  # captions are cut where pretraining cuts them
    return UnimodalWeights.for_run(
        u.cache_dir or Path(config.data.dataset) / CACHE_DIR,
        world=world_config(config.data.dataset),
        model=unimodal_model_config(config, len(vocabulary)),
        vocabulary=vocabulary,
        settings=settings,
        seed=unimodal_seed(config),
    )
