"""SRCL (Liu et al., 2023): negatives weighted by a frozen auxiliary model's and the current model's similarity
(a reconstruction; docs/methods.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field

from falcon_cli.config.paths import InputPath
from falcon_cli.config.section import Section
from falcon_cli.method_weights import ITC_CONSISTENCY_WEIGHT
from falcon_cli.registry import false_negative_method


class SrclConfig(Section):
    """SRCL (``pretrain.false_negatives.method: srcl``): negatives weighted by a frozen auxiliary model's and
    the current model's similarity (a reconstruction; docs/methods.md)."""

    aux_embeddings: Annotated[Path | None, InputPath()] = None
    """The frozen auxiliary model's features of every pretraining pair, an ``embeddings.h5`` from
    ``falcon embed``; None = the run's own ``embeddings/embeddings.h5``."""

    delta: float = Field(5.0, ge=0.0)
    """Sharpness of the weights ``w = (N - 1) softmax_j(-delta * cos_mix)``: 0 = plain InfoNCE; larger
    down-weights negatives that look like the anchor more strongly."""

    mix_until: float = Field(1.0, gt=0.0)
    """The auxiliary model's share α falls linearly from 1 to 0 over this fraction of training."""


@false_negative_method(
    "srcl",
    consistency_weight=ITC_CONSISTENCY_WEIGHT["srcl"],
    config=SrclConfig,
    description="similarity-regulated negative weights",
)
def build(settings: SrclConfig, context):
    """SRCL reading the auxiliary model's features of every pair, checked to be this dataset's."""
    import torch

    # (lazy: the schema imports this file to read the settings; torch and the losses load when built)
    from falcon_cli.artifacts.embeddings import check_fingerprint, read_embeddings
    from falcon_cli.data.pairs import records_fingerprint
    from falcon_cli.errors import FalconError
    from falcon_cli.objectives.false_negatives import Srcl
    from falcon_cli.sampling.cache import EmbeddingCache

    dataset = context.dataset
    path = (
        Path(settings.aux_embeddings)
        if settings.aux_embeddings is not None
        else context.run_path / "embeddings" / "embeddings.h5"
    )
    if not path.exists():
        raise FalconError(
            f"{path}: not found; SRCL needs the frozen auxiliary model's features of every pair: make them "
            "with `falcon embed` (embed.split=pretrain) or set pretrain.false_negatives.srcl.aux_embeddings=PATH"
        )
    aux = read_embeddings(path)
    warning = check_fingerprint(
        path, aux.attrs, records_fingerprint(dataset.records, context.spec.base_dir), context.data_dir
    )
    if warning is not None:
        context.warn(warning)
    cache = EmbeddingCache(torch.tensor(dataset.pair_ids, dtype=torch.long), aux.image.shape[1], device=context.device)
    cache.load(path, aux)
    missing = cache.pair_ids[~cache.filled]
    if len(missing):
        raise FalconError(
            f"{path}: no features for pair_id {int(missing.min())} ({len(missing)} pairs); embed this "
            "dataset's pretraining split (embed.split=pretrain)"
        )
    return Srcl(cache.get, delta=settings.delta, until=settings.mix_until)
