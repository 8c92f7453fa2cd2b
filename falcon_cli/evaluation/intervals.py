"""95% intervals of retrieval recalls: each query either finds its positive in the top K or not, so R@K over
n queries is a binomial proportion, and its interval is Wilson's (well behaved near 0% and 100%, where the
normal approximation is not)."""

from __future__ import annotations

import math

Z95 = 1.959963984540054
"""The standard normal's 97.5% quantile."""


def wilson_interval(percent: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval (percent) of a proportion ``percent`` (in percent) observed over ``n`` trials."""
    if n <= 0:
        return (float("nan"), float("nan"))
    p = percent / 100.0
    denominator = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return (100.0 * max(0.0, centre - half), 100.0 * min(1.0, centre + half))


def with_intervals(metrics: dict[str, float], key: str, n: int) -> dict[str, float]:
    """``metrics`` with ``{key}_lo`` and ``{key}_hi``: the 95% interval of ``metrics[key]`` over ``n`` queries."""
    lo, hi = wilson_interval(metrics[key], n)
    metrics[f"{key}_lo"], metrics[f"{key}_hi"] = lo, hi
    return metrics
