"""Named world regimes: how often a negative is a false one, and how hard the hard ones are.

A preset fills the knobs that set a world's false-negative regime (caption mix, how specific the
captions are, objects per scene, vocabulary, near misses); knobs given next to it win, and the
world's size, seed, image size and splits stay the caller's. ``world.json`` records the preset
name with every value it resolved to. The measured rates of each preset are in docs/shapes.md.

- ``coco-like``: mostly whole-scene captions, as COCO's: of an image's five, four describe the
  whole scene (each listing the objects in another order) and one names a relation between two of
  them, every object by size, colour and shape; 2-4 objects from 8 colours and 6 shapes. A training
  image keeps one of its five captions, as in the web corpora the papers pretrain on. A random
  in-batch negative is almost never a false one (COCO: about 0.15% caption→image). Each drawn scene
  comes with three near misses (one attribute, one cell or one relation changed), so the top
  candidates of a search space are close, and sometimes true (a near miss about one time in ten,
  where the relation caption does not mention what changed). Until issue 34's gate the preset drew
  relations, positions and one whole-scene description per image (``caption_mix.position=1
  caption_mix.relation=3 caption_mix.full=1 scene_captions=0``: a near miss false 27.7% of the
  time); there GRIT lost to uniform (docs/results.md). Then every training image kept its five
  captions (``train_captions_per_image=null``), and GRIT's chain walked between captions of one
  image, false negatives by construction.
- ``medium``: the same scenes, with relations, positions and one whole-scene description per
  image, objects named by 1-3 attributes, one caption per training image: a random negative is
  false a few percent of the time, a near miss often.
- ``dense``: the default world (every caption kind, 1-4 objects, 6 colours, 4 shapes): a random
  negative is false about one time in six. The sweeps up to issue 33 ran in it.

``coco-like`` and ``medium`` share their scenes (same seed, same images), so the two differ in the
captions alone: the density axis of the phase diagram, with everything else held.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class WorldPreset:
    """One named regime: what it is for, and the ShapesConfig values it sets."""

    description: str
    settings: dict = field(default_factory=dict)


_NEAR_MISS_SCENES = {"min_objects": 2, "max_objects": 4, "num_colors": 8, "num_shapes": 6, "near_misses": 3}
"""The scenes of the two sparse regimes: 2-4 objects from a larger vocabulary, each drawn scene with three near
misses."""
_WEB_PAIRS = {"train_captions_per_image": 1}
"""Training pairs of the two sparse regimes: one caption per training image (its captions' first, so the same mix as
the test split's), as in the web corpora the papers pretrain on, so a batch never holds the anchor's own image twice."""
_SPECIFIC_KINDS = {"attribute": 0.0, "combination": 0.0, "position": 1.0, "relation": 3.0, "count": 0.0, "full": 1.0}
"""Caption kinds that name objects with their cells or relations, and whole-scene descriptions."""
_SCENE_CAPTIONS = {"attribute": 0.0, "combination": 0.0, "position": 0.0, "relation": 1.0, "count": 0.0, "full": 0.0}
"""Beside ``scene_captions``: the captions that are not whole-scene descriptions name a relation."""

PRESETS: dict[str, WorldPreset] = {
    "coco-like": WorldPreset(
        "four whole-scene captions and one relation per image, one of them kept per training image: a random negative "
        "is false ~0.02% of the time (COCO: ~0.15%); near misses are the hard negatives",
        {**_NEAR_MISS_SCENES, **_WEB_PAIRS, "min_attributes": 3, "caption_mix": _SCENE_CAPTIONS, "scene_captions": 4},
    ),
    "medium": WorldPreset(
        "the same scenes with broader captions (objects named by 1-3 attributes), one per training image: "
        "a random negative is false ~3.3% of the time",
        {**_NEAR_MISS_SCENES, **_WEB_PAIRS, "min_attributes": 1, "caption_mix": _SPECIFIC_KINDS},
    ),
    "dense": WorldPreset(
        "the default world (every caption kind, 1-4 objects, 6 colours, 4 shapes): "
        "a random negative is false ~18% of the time",
        {
            "min_objects": 1,
            "max_objects": 4,
            "num_colors": 6,
            "num_shapes": 4,
            "near_misses": 0,
            "min_attributes": 0,
            "caption_mix": {
                kind: 1.0 for kind in ("attribute", "combination", "position", "relation", "count", "full")
            },
        },
    ),
}
"""Every preset by name (the values of ``ShapesConfig.preset``)."""


def apply_preset(raw: dict) -> dict:
    """``raw`` (a ShapesConfig mapping) with its preset's settings filled in where ``raw`` gives none.

    ``caption_mix`` merges key by key, so ``preset=coco-like caption_mix.count=1`` keeps the
    preset's other weights. An unknown name is left as it is, for the ``preset`` field to reject
    (so the error names the key).
    """
    name = raw.get("preset")
    if not isinstance(name, str) or name not in PRESETS:
        return raw
    out = dict(raw)
    for key, value in PRESETS[name].settings.items():
        if key == "caption_mix" and isinstance(raw.get(key), dict):
            out[key] = {**value, **raw[key]}
        elif key not in raw:
            out[key] = value
    return out
