"""The judge interface: score image–caption pairs with the probability that the caption matches.

A judge answers one question for aligned lists of pairs: *does this caption describe this
image?* It returns ``p(match)`` in [0, 1] per pair. The false-negative audit (methods §1.10,
the paper's Fig. 2) feeds it the (anchor, negative) pairs a run used and counts a negative as a
false negative when ``p(match) > 0.5`` (:func:`is_false_negative`).

Model judges (BLIP, a falcon checkpoint) read the image file and the caption text; the shapes
oracle reads the ids, so :class:`JudgedPair` carries both.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol, Sequence, runtime_checkable

import numpy as np

from falcon_cli.errors import FalconError
from falcon_cli.runtime.progress import track

if TYPE_CHECKING:
    import torch

DEFAULT_THRESHOLD = 0.5
"""A pair counts as matched (a negative as a false negative) when ``p(match)`` exceeds this."""


@dataclass(frozen=True)
class JudgedPair:
    """One image–caption pair to judge."""

    image: Path
    """The image file (read by model judges)."""
    caption: str
    """The caption text (read by model judges)."""
    image_id: int | None = None
    """The dataset's image id (needed by the shapes oracle)."""
    caption_id: int | None = None
    """The dataset's caption id (needed by the shapes oracle)."""


@runtime_checkable
class Judge(Protocol):
    """Scores image–caption pairs: ``score(pairs)[i]`` is the probability that pair i matches."""

    name: str
    """What judged (e.g. ``blip:Salesforce/blip-itm-base-coco``, ``oracle:worlds/shapes``)."""

    def score(self, pairs: Sequence[JudgedPair]) -> np.ndarray:
        """``float64[len(pairs)]`` of match probabilities in [0, 1], in the order of ``pairs``."""
        ...


def is_false_negative(scores, threshold: float = DEFAULT_THRESHOLD) -> np.ndarray:
    """``bool`` array: which judged negatives are false negatives (``p(match) > threshold``)."""
    if not 0.0 <= threshold <= 1.0:
        raise FalconError(
            f"false-negative threshold {threshold} is not a probability; use a value in [0, 1] (the paper uses 0.5)"
        )
    return np.asarray(scores, dtype=np.float64) > threshold


def itm_scores(
    pairs: Sequence[JudgedPair],
    batch_size: int,
    label: str,
    itm_logits: Callable[[Sequence[JudgedPair]], "torch.Tensor"],
) -> np.ndarray:
    """``float64[len(pairs)]`` of ``softmax(itm_logits(batch))[:, 1]`` (p(match) of a matched /
    not-matched head), over consecutive batches of at most ``batch_size`` pairs, with a progress bar."""
    import torch

    scores = np.zeros(len(pairs), dtype=np.float64)
    with torch.no_grad():
        for start in track(range(0, len(pairs), batch_size), label):
            logits = itm_logits(pairs[start : start + batch_size])
            scores[start : start + len(logits)] = logits.float().softmax(dim=-1)[:, 1].cpu().double().numpy()
    return scores


def check_batch_size(batch_size: int) -> int:
    """``batch_size`` if it is a positive integer, else a one-line :class:`FalconError`."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise FalconError(f"judge batch_size must be a positive integer, got {batch_size!r}")
    return batch_size


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


__all__ = ["DEFAULT_THRESHOLD", "JudgedPair", "Judge", "is_false_negative", "itm_scores", "check_batch_size"]
