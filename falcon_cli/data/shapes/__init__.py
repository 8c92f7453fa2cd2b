"""The shapes world: generated images with exactly known captions, and the oracle that judges them.

It is the project's ground truth for false negatives: every caption has a logical form, so
:class:`ShapesOracle` decides for any image-caption pair whether the caption truly
describes the image. See docs/shapes.md.
"""

from falcon_cli.data.shapes.config import ShapesConfig
from falcon_cli.data.shapes.oracle import ShapesOracle, evaluate
from falcon_cli.data.shapes.world import WorldSummary, generate_world, load_world_summary

__all__ = ["ShapesConfig", "ShapesOracle", "WorldSummary", "evaluate", "generate_world", "load_world_summary"]
