"""What every framework's training objective is: the contract the pretrain stage, FALCON's reward step and the
FLOP count rely on, and the parts the three objectives share, written once.

An objective (ALBEF's :class:`~falcon_cli.objectives.vlp.VlpObjective`, BLIP-2's
:class:`~falcon_cli.objectives.qformer.Blip2Objective`, a dual encoder's
:class:`~falcon_cli.objectives.dual.DualObjective`) is a :class:`PretrainObjective`:

* ``model``: the network it trains (``encode_image`` gives ``(tokens, features)``);
* ``false_negatives``: the false-negative method its contrastive loss runs through (plain ITC by default);
* ``forward(images, input_ids, attention_mask, mask, distill_alpha, itm_generator, context)``: the training
  losses of one batch, a named tuple with ``loss`` (their sum), one field per name in its framework's
  ``losses``, ``image_feat`` / ``text_feat`` (one L2-normalised vector per pair: the embedding cache's),
  ``temperature`` and ``image_tokens``;
* :meth:`~PretrainObjective.checkpoint_parts`: what a checkpoint keeps besides the model;
* :meth:`~PretrainObjective.image_state`: the ``(tokens, features)`` of a forward's output that
  :meth:`~PretrainObjective.measure` can reuse instead of encoding the images again;
* :meth:`~PretrainObjective.measure`: any of the named losses without gradient (FALCON's reward parts);
* :meth:`~PretrainObjective.match_probability`: the ITM head's judgement of chosen pairs (ALBEF, BLIP-2), for
  FALCON's ``positive_margin+itm`` reward.
  The argument checks and the image reuse are here; each objective computes its parts in ``measure_parts``.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn


class PretrainObjective(nn.Module):
    """Base of the three frameworks' objectives (see the module docstring)."""

    generative: str
    """The reward part with a value per caption besides ``alignment`` (``mlm``, ``itg`` or ``caption``): the
    default part of :meth:`measure`, and with ``alignment`` the only one ``per_pair`` allows."""

    fixed_shapes: bool = False
    """Every loss over shapes that the batch's contents do not change (set by ``pretrain.runtime.graph_step``, whose
    captured step cannot hold a data-dependent shape): ALBEF's MLM weights the masked positions instead of
    gathering them."""

    def checkpoint_parts(self) -> dict[str, nn.Module]:
        """State a checkpoint keeps besides the model, as weight files (``{file stem: module}``): none by default;
        ALBEF's momentum encoders and queue under ``itc: momentum``."""
        return {}

    @staticmethod
    def image_state(out: Any) -> tuple[Tensor, Tensor]:
        """(image tokens, image features) of a forward's output: what :meth:`measure` takes as ``image``."""
        return out.image_tokens, out.image_feat

    def measure(
        self,
        images: Tensor,
        input_ids: Tensor,
        attention_mask: Tensor,
        mask: Any = None,
        parts: tuple[str, ...] | None = None,
        image: tuple[Tensor, Tensor] | None = None,
        same_image: Tensor | None = None,
        per_pair: bool = False,
    ) -> dict[str, Tensor]:
        """The named losses ``parts`` (default: the generative one) of a batch without gradient, in the model's
        current train/eval mode: FALCON's reward re-scores the batch it just trained on (ALBEF: with the
        identical MLM ``mask``). ``image``: (tokens, features) to use instead of encoding ``images`` again
        (``scheduler.reward.images: reuse``). ``same_image``: bool [B, B] of pairs sharing an image, removed as in
        training. ``per_pair``: one value per caption ``[B]`` (FALCON's per-step credit), for the generative
        part or ``alignment`` alone. ``alignment`` is minus each pair's own image-text cosine."""
        parts = (self.generative,) if parts is None else tuple(parts)
        if per_pair and set(parts) not in ({self.generative}, {"alignment"}):
            raise ValueError(
                f"per-pair losses are measured for the {self.generative} or alignment reward alone, not {parts}"
            )
        image_tokens, image_feat = self.model.encode_image(images) if image is None else image
        return self.measure_parts(
            image_tokens, image_feat, input_ids, attention_mask, mask, parts, same_image, per_pair
        )

    def match_probability(
        self, out: Any, input_ids: Tensor, attention_mask: Tensor, image_index: Tensor, text_index: Tensor
    ) -> Tensor:
        """The ITM head's match probability ``[P]`` (float32, no gradient) of P (image, caption) pairs of the batch a
        forward returned ``out`` for: image ``image_index[p]`` with caption ``text_index[p]``. The images are the
        forward's own tokens; the captions are encoded now. Only frameworks with an ITM head have one."""
        raise NotImplementedError(f"{type(self).__name__} has no image-text matching head")

    def measure_parts(
        self,
        image_tokens: Tensor,
        image_feat: Tensor,
        input_ids: Tensor,
        attention_mask: Tensor,
        mask: Any,
        parts: tuple[str, ...],
        same_image: Tensor | None,
        per_pair: bool,
    ) -> dict[str, Tensor]:
        """The objective's own computation of :meth:`measure`'s ``parts`` from the batch's image state."""
        raise NotImplementedError


__all__ = ["PretrainObjective"]
