"""What FALCON's scheduler sees of an anchor: its input row, built from the anchor's similarity row.

The paper feeds the policy Ŝ = softmax(Q / τ), Q the ``m`` sorted quantiles of the anchor's row of
``S = I Tᵀ + T Iᵀ`` (τ = 1). At τ = 1 those rows are nearly flat (entries in [0.0077, 0.0128] on the
shapes world, anchors differing by ~1% of the mean), so the policy cannot tell anchors apart
(docs/pretraining.md, "Making the scheduler learn"). ``pretrain.scheduler.features`` picks the input
from named groups, concatenated in the order given:

* ``softmax`` (m values): the paper's Ŝ = softmax(Q / τ), τ = ``pretrain.scheduler.quantile_temperature``.
* ``zscore`` (m values): the row's quantiles standardised, ``(Q − mean(Q)) / std(Q)``: the row's
  shape with its location and scale removed.
* ``positive`` (3 values): where the anchor's own pair sits in its row. ``above``: the share of
  candidates more similar to the anchor than its own pair (each is a likely false negative);
  ``log_above``: ``log(1 + count above) / log(1 + n)``; ``z``: the own pair's similarity in row
  standard deviations, ``(S_aa − mean(Q)) / std(Q)``.
* ``spread`` (2 values): the row's standard deviation and range, ``std(Q)`` and ``max(Q) − min(Q)``.

Means and standard deviations are those of the m quantiles (evenly spaced, so they are the row's
own up to the interpolation), which the composer has anyway: no extra pass over the row.
"""

from __future__ import annotations

from typing import Sequence

import torch

FEATURE_GROUPS: dict[str, int | None] = {"softmax": None, "zscore": None, "positive": 3, "spread": 2}
"""Feature group -> its width (None: m, the number of quantile levels)."""

STD_FLOOR = 1e-6
"""Rows with less spread than this (a space of one or two pairs) are standardised by it instead."""

Z_CLIP = 10.0
"""Standardised values are clipped to ±this: one degenerate row must not blow up the policy's input."""


class SchedulerFeatures:
    """The scheduler's input: the named groups of :data:`FEATURE_GROUPS`, concatenated.

    Args:
        names: the groups, in order (``["softmax"]``: the paper's input).
        quantiles: m, the quantile levels of a row.
        temperature: τ of ``softmax``.
    """

    def __init__(self, names: Sequence[str] = ("softmax",), quantiles: int = 100, temperature: float = 1.0):
        names = list(names)
        unknown = [n for n in names if n not in FEATURE_GROUPS]
        if unknown or not names or len(set(names)) != len(names):
            raise ValueError(f"scheduler features must be distinct names from {', '.join(FEATURE_GROUPS)}; got {names}")
        if quantiles < 2 or temperature <= 0:
            raise ValueError(f"quantiles must be >= 2 and temperature > 0, got {quantiles}, {temperature}")
        self.names, self.quantiles, self.temperature = names, int(quantiles), float(temperature)

    @property
    def dim(self) -> int:
        """Width of an input row (the policy's input size)."""
        return sum(self.quantiles if FEATURE_GROUPS[n] is None else FEATURE_GROUPS[n] for n in self.names)

    @property
    def needs_positive(self) -> bool:
        """Whether the rows need the anchor's own similarity and how many candidates beat it."""
        return "positive" in self.names

    def __call__(
        self,
        quantile_values: torch.Tensor,
        positive: torch.Tensor | None = None,
        above: torch.Tensor | None = None,
        candidates: int | torch.Tensor = 1,
    ) -> torch.Tensor:
        """Input rows ``[R, dim]`` (float32) from a block of anchors.

        Args:
            quantile_values: ``[R, m]`` the sorted quantiles Q of each anchor's row (raw similarity sums).
            positive: ``[R]`` the anchor's similarity to its own pair, ``S_aa`` (``positive`` only).
            above: ``[R]`` how many of its candidates are more similar than that (``positive`` only).
            candidates: n, the candidates of each row (an int or ``[R]``).
        """
        q = quantile_values.float()
        mean = q.mean(1, keepdim=True)
        std = q.std(1, unbiased=False, keepdim=True)
        scale = std.clamp(min=STD_FLOOR)
        parts = []
        for name in self.names:
            if name == "softmax":
                parts.append(torch.softmax(q / self.temperature, dim=1))
            elif name == "zscore":
                parts.append(((q - mean) / scale).clamp(-Z_CLIP, Z_CLIP))
            elif name == "spread":
                parts.append(torch.cat([std, q[:, -1:] - q[:, :1]], 1))
            else:  # positive
                if positive is None or above is None:
                    raise ValueError(
                        "the 'positive' scheduler features need each anchor's own similarity and count above it"
                    )
                n = torch.as_tensor(candidates, dtype=torch.float32, device=q.device).clamp(min=1).expand(len(q))
                count = above.float().to(q.device)
                z = ((positive.float().to(q.device)[:, None] - mean) / scale).clamp(-Z_CLIP, Z_CLIP)
                parts.append(torch.stack([count / n, torch.log1p(count) / torch.log1p(n), z[:, 0]], 1))
        return torch.cat(parts, 1)

    def describe(self) -> str:
        """e.g. ``softmax(τ=1)+positive`` — for logs and reports."""
        return "+".join(f"softmax(τ={self.temperature:g})" if n == "softmax" else n for n in self.names)


def feature_names_help() -> str:
    """One line listing the groups and their widths (for error messages and docs)."""
    return ", ".join(f"{n} ({'m' if w is None else w})" for n, w in FEATURE_GROUPS.items())


__all__ = ["FEATURE_GROUPS", "SchedulerFeatures", "feature_names_help"]
