"""falcon's batch composers, registered by name (``pretrain.composer.name``): uniform, GRIT-VLP's chain, and the
quantile composers (a fixed q, a progressive q, FALCON's learned q). Their code is in :mod:`falcon_cli.sampling`;
each builder imports it when called (this file stays light: the schema reads the names)."""

from __future__ import annotations

from falcon_cli.registry import composer


@composer("uniform", search_spaces=False, description="random batches")
def uniform(p, truth=None, source=None):
    """Random batches of ``batch_size``."""
    # (lazy: the schema imports this file to read the settings; torch and the losses load when built)
    from falcon_cli.sampling.composers import UniformComposer

    return UniformComposer(p.batch_size, drop_last=p.composer.drop_last)


@composer("grit", description="GRIT-VLP's hardest-negative chain in each search space")
def grit(p, truth=None, source=None):
    """GRIT-VLP: each batch chained through the hardest negatives of one search space."""
    # (lazy: the schema imports this file to read the settings; torch and the losses load when built)
    from falcon_cli.sampling.composers import GritComposer

    return GritComposer(p.batch_size, p.composer.search_space_size, drop_last=p.composer.drop_last)


def _quantile(p, truth, source):
    """FALCON's Algorithm 1 with the q the composer's name says where it comes from."""
    # (lazy: the schema imports this file to read the settings; torch and the losses load when built)
    from falcon_cli.sampling.quantile_composer import QuantileComposer
    from falcon_cli.sampling.scheduler import level_grid

    falcon = p.composer.name == "falcon"
    return QuantileComposer(
        p.composer.name,
        p.batch_size,
        p.composer.search_space_size,
        drop_last=p.composer.drop_last,
        quantile=p.composer.quantile,
        progressive=(p.composer.progressive_start, p.composer.progressive_end, p.epochs),
        source=source,
        level=p.scheduler.level if falcon else "instance",
        quantiles=p.scheduler.quantile_levels,
        temperature=p.scheduler.quantile_temperature,
        features=p.scheduler.features,
        truth=truth,
        scale=p.composer.quantile_scale,
        credit_levels=level_grid(p.scheduler.update.levels)
        if falcon and p.scheduler.update.credit == "levels"
        else None,
    )


composer("quantile", draws_q=True, description="a fixed quantile q (composer.quantile)")(_quantile)
composer("progressive", draws_q=True, description="q moving linearly over the epochs")(_quantile)
composer("falcon", draws_q=True, description="q per anchor from FALCON's learned scheduler")(_quantile)
