"""``pretrain.false_negatives``: which method treats likely false negatives, and each registered method's own
section (``.mafa``, ``.srcl``, ``.diht``, ``.glofnd``, and a plugin's: :mod:`falcon_cli.registry`).

The section is built when the schema is imported, from the methods registered then (falcon's own, from
``falcon_cli/methods/``, and those of ``$FALCON_PLUGINS`` and installed entry points), so a contributor's method is
validated, resolved and recorded like a built-in one."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, create_model, model_validator

from falcon_cli.config.section import Section
from falcon_cli.registry import FALSE_NEGATIVE_METHODS, unknown_name_message

NO_METHOD = "none"
"""``false_negatives.method: none``: the framework's plain ITC, no method."""


def _registered(name: str) -> str:
    if name != NO_METHOD and name not in FALSE_NEGATIVE_METHODS:
        raise ValueError(
            unknown_name_message("false-negative method", name, [NO_METHOD, *FALSE_NEGATIVE_METHODS.names()])
        )
    return name


FalseNegativeMethod = Annotated[str, AfterValidator(_registered)]
"""The values of ``pretrain.false_negatives.method``: ``none`` or a registered method's name."""


class FalseNegativesBase(Section):
    """``pretrain.false_negatives``: the method that treats likely false negatives (it combines with any composer),
    the same-image pairs, the oracle's diagnostic masks; :data:`FalseNegativesConfig` adds each registered method's
    own settings."""

    method: FalseNegativeMethod = NO_METHOD
    """How the losses treat likely false negatives (combines with any composer): ``mafa`` (connection
    mining + S-ITC), ``srcl`` (similarity-regulated weights), ``diht`` (HN-NCE), ``glofnd`` (learned
    thresholds), or a plugin's (docs/extending.md); ``none`` = plain ITC. All need ``losses.itc: grit``."""
    same_image: Literal["negative", "mask"] = "negative"
    """Pairs of a batch that show the same image (COCO: five captions per image; entries with the same
    ``image_id``, or else the same image file): ``negative`` treats them as every other in-batch pair, as
    ALBEF, GRIT-VLP and FALCON do, although each is a false negative by construction; ``mask`` removes them
    from the ITC softmax denominators and from ITM negative mining (and from FALCON's ITC/ITM rewards).
    ``mask`` needs ``losses.itc: grit`` and ``false_negatives.method`` ``none`` or ``glofnd``."""
    oracle: Literal["keep", "mask", "mask_itc"] = "keep"
    """A diagnostic on a shapes world, not a method: ``mask`` removes every in-batch pair that the world's oracle
    says truly matches (pairs that show the same image included) from the ITC denominators and ITM mining, as
    ``false_negatives.same_image: mask`` does for shared images. It reads the ground truth no real run has, so it
    measures what the false negatives cost a composer: the most any false-negative method could win back.
    ``mask_itc`` removes them from the ITC denominators alone (ITM mines its negatives as usual): the ceiling of a
    method that changes only the ITC (GloFND, SRCL, DiHT). ``keep``: train as usual. Both masks need a shapes
    world, ``losses.itc: grit`` and ``false_negatives.method: none``."""

    def settings(self):
        """The chosen method's own section (None for ``none``)."""
        return None if self.method == NO_METHOD else getattr(self, self.method)

    @model_validator(mode="after")
    def _check_method_and_masks(self) -> "FalseNegativesBase":
        """The masks beside the methods."""
        if self.same_image == "mask" and self.method != NO_METHOD:
            if not FALSE_NEGATIVE_METHODS.get(self.method).same_image_mask:
                raise ValueError(
                    f"same_image=mask works with method none or glofnd (got {self.method}): MAFA, SRCL and DiHT "
                    "handle false negatives their own way"
                )
        if self.oracle != "keep" and self.method != NO_METHOD:
            raise ValueError(
                f"oracle={self.oracle} works with method none (got {self.method}): it is the bound the "
                "false-negative methods are measured against, not one to combine with them"
            )
        if self.oracle == "mask_itc" and self.same_image == "mask":
            raise ValueError(
                "oracle=mask_itc keeps ITM's mining as it is, and same_image=mask would change it: set one of "
                "them (the oracle's ITC mask already holds every same-image pair)"
            )
        return self


def _with_method_sections() -> type[FalseNegativesBase]:
    """:class:`FalseNegativesBase` with one section per registered method, named for it."""
    FALSE_NEGATIVE_METHODS.names()  # (loads the plugins: falcon's own methods first)
    fields = {
        name: (
            method.config,
            Field(
                default_factory=method.config,
                description=f"{name}'s settings ({method.description}; {FALSE_NEGATIVE_METHODS.origins[name]}).",
            ),
        )
        for name, method in FALSE_NEGATIVE_METHODS.entries.items()
    }
    return create_model("FalseNegativesConfig", __base__=FalseNegativesBase, __module__=__name__, **fields)


FalseNegativesConfig = _with_method_sections()
"""``pretrain.false_negatives``, with a section for each registered method (``.mafa``, ``.glofnd``, ...)."""
