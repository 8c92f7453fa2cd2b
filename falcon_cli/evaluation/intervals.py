"""95% intervals of retrieval recalls: each query either finds its positive in the top K or not, so R@K over
n queries is a binomial proportion, and its interval is Wilson's (well behaved near 0% and 100%, where the
normal approximation is not)."""

from __future__ import annotations

import math
from typing import Mapping, NamedTuple, Sequence

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


# --- over seeds: Student's t ------------------------------------------------------------------------------------
# A method's mean over seeds, and the difference of two methods seed by seed (paired), get Student's t interval:
# with n seeds the standard error is estimated from the same n numbers, so the normal's 1.96 would be too narrow
# (with five seeds the right factor is 2.776). Every table of differences in falcon uses these functions.


def _regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, by its continued fraction (modified Lentz), taken on
    the side where it converges fast."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _regularized_beta(1.0 - x, b, a)
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 10_000):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= c * d
        if abs(c * d - 1.0) < 1e-16:
            break
    return math.exp(log_front) * fraction / a


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _regularized_beta(df / (df + t * t), df / 2.0, 0.5)
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (``df`` = inf: the normal's), found by
    bisection on :func:`t_cdf` to double precision."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile: p must lie in (0, 1), got {p}")
    if df <= 0:
        raise ValueError(f"t_quantile: df must be positive, got {df}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if math.isinf(df):
        return _normal_quantile(p)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return 0.5 * (lo + hi)


def _normal_quantile(p: float) -> float:
    """The standard normal's ``p`` quantile, by bisection on its CDF (erf)."""
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if 0.5 * math.erfc(-mid / math.sqrt(2.0)) < p else (lo, mid)
    return 0.5 * (lo + hi)


class MeanInterval(NamedTuple):
    """A mean over ``n`` values (seeds) with its two-sided t interval; ``lo``/``hi`` are nan with one value."""

    n: int
    mean: float
    std: float
    """Standard deviation over the values (ddof 1; nan with one value)."""
    lo: float
    hi: float


def mean_interval(values: Sequence[float], level: float = 0.95) -> MeanInterval:
    """The mean of ``values`` with its ``level`` t interval: mean ± t(1 - (1 - level)/2, n - 1) · std / sqrt(n)."""
    values = [float(v) for v in values]
    n = len(values)
    if n == 0:
        raise ValueError("mean_interval: no values")
    mean = sum(values) / n
    if n == 1:
        return MeanInterval(1, mean, float("nan"), float("nan"), float("nan"))
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile(1.0 - (1.0 - level) / 2.0, n - 1) * std / math.sqrt(n)
    return MeanInterval(n, mean, std, mean - half, mean + half)


class PairedDifference(NamedTuple):
    """``a - b`` seed by seed: the mean difference with its paired-t interval, and how the seeds split."""

    n: int
    mean: float
    std: float
    lo: float
    hi: float
    positive: int
    """Seeds on which ``a`` is above ``b``."""
    negative: int
    t: float
    """The paired t statistic (mean / (std / sqrt(n))); nan with one seed or no spread."""
    per_seed: tuple[float, ...]

    @property
    def verdict(self) -> str:
        """``higher`` or ``lower`` where the interval excludes zero, ``no difference`` where it holds it, and
        ``one seed: no verdict`` with a single pair."""
        return interval_verdict(self.lo, self.hi, self.n)


def paired_difference(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> PairedDifference:
    """``a[i] - b[i]`` over aligned seeds i, with the paired t interval at ``level``."""
    if len(a) != len(b):
        raise ValueError(f"paired_difference: {len(a)} values against {len(b)}; pair them by seed first")
    diff = [float(x) - float(y) for x, y in zip(a, b)]
    m = mean_interval(diff, level)
    t = m.mean / (m.std / math.sqrt(m.n)) if m.n > 1 and m.std > 0 else float("nan")
    return PairedDifference(
        m.n, m.mean, m.std, m.lo, m.hi, sum(d > 0 for d in diff), sum(d < 0 for d in diff), t, tuple(diff)
    )


def interval_verdict(lo: float, hi: float, n: int) -> str:
    """A difference's verdict from its interval: a direction only when the interval excludes zero."""
    if n < 2 or lo != lo or hi != hi:
        return "one seed: no verdict"
    if lo > 0:
        return "higher"
    if hi < 0:
        return "lower"
    return "no difference"


def paired_by_seed(a: Mapping, b: Mapping, level: float = 0.95) -> PairedDifference | None:
    """:func:`paired_difference` of two methods' values keyed by seed, over the seeds both have (in seed order);
    None when they share none. Missing values (None, nan) leave their seed out."""

    def present(values: Mapping) -> dict:
        return {seed: float(v) for seed, v in values.items() if v is not None and v == v}

    a, b = present(a), present(b)
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None
    return paired_difference([a[s] for s in seeds], [b[s] for s in seeds], level)


class RatioInterval(NamedTuple):
    """``mean(a) / mean(b)`` over ``n`` seeds with Fieller's interval; ``lo``/``hi`` are nan with one seed, and
    -inf/+inf where the interval is unbounded (``mean(b)`` is not away from zero by its own t interval)."""

    n: int
    ratio: float
    lo: float
    hi: float

    @property
    def bounded(self) -> bool:
        """Whether the interval is finite: only then is the ratio a measurement rather than noise over noise."""
        return math.isfinite(self.lo) and math.isfinite(self.hi)


def paired_ratio(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> RatioInterval:
    """Fieller's ``level`` interval for the ratio of means ``mean(a) / mean(b)``, where ``a[i]`` and ``b[i]`` come
    from the same seed i (a method's gain and its ceiling's gain, say): every ratio r for which the paired t interval
    of ``a[i] - r·b[i]`` holds zero. With q = t²/n that is (ā − r·b̄)² ≤ q·var(a − r·b), a quadratic in r whose set
    is a finite interval exactly when b̄ is away from zero by its own t interval (b̄² > q·var(b)); otherwise the set
    is unbounded and so is the interval."""
    if len(a) != len(b):
        raise ValueError(f"paired_ratio: {len(a)} values against {len(b)}; pair them by seed first")
    a, b = [float(x) for x in a], [float(y) for y in b]
    n = len(a)
    if n == 0:
        raise ValueError("paired_ratio: no values")
    mean_a, mean_b = sum(a) / n, sum(b) / n
    ratio = mean_a / mean_b if mean_b != 0 else float("nan")
    if n == 1:
        return RatioInterval(1, ratio, float("nan"), float("nan"))
    var_a = sum((x - mean_a) ** 2 for x in a) / (n - 1)
    var_b = sum((y - mean_b) ** 2 for y in b) / (n - 1)
    cov = sum((x - mean_a) * (y - mean_b) for x, y in zip(a, b)) / (n - 1)
    q = t_quantile(1.0 - (1.0 - level) / 2.0, n - 1) ** 2 / n
    # (ā − r·b̄)² − q·(var_a − 2r·cov + r²·var_b) ≤ 0  ⇔  A·r² − 2B·r + C ≤ 0
    A, B, C = mean_b**2 - q * var_b, mean_a * mean_b - q * cov, mean_a**2 - q * var_a
    if A <= 0:
        return RatioInterval(n, ratio, -math.inf, math.inf)
    root = math.sqrt(max(B * B - A * C, 0.0))  # ≥ 0: r = ā/b̄ satisfies the inequality
    return RatioInterval(n, ratio, (B - root) / A, (B + root) / A)
