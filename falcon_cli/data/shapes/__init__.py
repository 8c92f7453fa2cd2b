"""The shapes world: generated images with exactly known captions, and the oracle that judges them.

It is the project's ground truth for false negatives: every caption has a logical form, so
:class:`ShapesOracle` decides for any image-caption pair whether the caption truly
describes the image. See docs/shapes.md.

The names below are imported on first use (:mod:`falcon_cli.lazy_exports`): the config schema reads
:class:`ShapesConfig` (``shapes/config.py``) without importing the world's writers (pandas, pyarrow, PIL), and
importing any module of this package runs this file first.
"""

from falcon_cli.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "config": ("ShapesConfig",),
        "oracle": ("ShapesOracle", "evaluate"),
        "world": ("WorldSummary", "generate_world", "load_world_summary"),
    },
)
