"""What a quantile composer chose, against what the oracle says it should have chosen.

The shapes world's oracle knows every anchor's false negatives, so the batch log of a quantile
composer (FALCON, fixed or progressive q) can be scored per chained slot
(:class:`~falcon_cli.sampling.composers.Batch`): the anchor's false-negative density in its search
space, the *safe* quantile (the highest q whose pick would have been a true negative) and whether
the pick was a false negative. :func:`composition_summary` reduces one epoch's rows to the numbers
``metrics.jsonl`` records per epoch (``kind: epoch_summary``) and the audit tabulates.

FALCON's claim, in these terms: a scheduler that has learned where false negatives are gives
anchors with many of them a lower q (``q_fn_density_corr`` < 0) and keeps q below the safe
quantile. A correlation means nothing without spread: a collapsed policy (every anchor the same
Beta) has none, so ``expected_q_std`` is reported beside it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from falcon_cli.sampling.composers import FIXED_Q_FIELDS, FIXED_Q_LEVELS


def pearson(x: np.ndarray, y: np.ndarray) -> float | None:
    """Pearson correlation of two equal-length vectors; None with fewer than 3 points or no spread."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) < 3 or x.std() == 0 or y.std() == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


def rank_auc(score: np.ndarray, positive: np.ndarray) -> float:
    """Area under the ROC curve of ``score`` for the bool labels ``positive`` (Mann-Whitney: the
    chance a positive outscores a negative, ties half); NaN without both kinds."""
    n_pos = int(positive.sum())
    n_neg = len(positive) - n_pos
    if not n_pos or not n_neg:
        return float("nan")
    ranks = pd.Series(score).rank(method="average").to_numpy()
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def judge_view(score: np.ndarray, false_pick: np.ndarray) -> tuple[float | None, float | None]:
    """How well ``score`` tells the false picks (``false_pick`` 1.0) from the true ones (0.0): their Pearson
    correlation and the chance a false pick outscores a true one (AUC); None where there is nothing to measure."""
    if not len(score):
        return None, None
    auc = rank_auc(score, false_pick > 0.5)
    return pearson(score, false_pick), None if auc != auc else auc


def expected_q(rows: pd.DataFrame) -> pd.Series:
    """E[q] = α / (α + β) of each chained slot's Beta (NaN where q did not come from a Beta)."""
    return rows["alpha"] / (rows["alpha"] + rows["beta"])


def composition_summary(
    rows: pd.DataFrame,
    rewards: Sequence[float] = (),
    credited: Sequence[Sequence[float]] = (),
    judged: Sequence[Sequence[float]] = (),
) -> dict:
    """One epoch of a quantile composer: the q's it used, FALCON's rewards, and the oracle's view.

    ``rows``: batch-log rows (:func:`~falcon_cli.sampling.batch_log.read_batch_log`, one epoch).
    Keys (None where the rows do not have what a key needs):

    - ``q_p10`` / ``q_p50`` / ``q_p90`` / ``q_mean``: the q's drawn (or fixed) for the chained slots.
    - ``reward_mean`` / ``reward_std`` / ``reward_count``: FALCON's per-step rewards Δ.
    - ``reward_fn_corr``: over FALCON's used steps (``credited``: [reward credited to the step's q, 1.0 if
      its pick was a false negative else 0.0]), the correlation of the two. A reward that can teach the
      scheduler to avoid false negatives pays less for them: this must be below 0.
    - ``itm_fn_corr`` / ``itm_fn_auc``: with ``reward: positive_margin+itm`` (``judged``: per pick [the ITM head's
      match probability with its anchor, 1.0 if a false negative else 0.0]), the correlation of the two and the
      chance a false pick outscores a true one (0.5: the judge sees nothing): the judge alone, apart from the margin.
      ``charge_fn_corr`` / ``charge_fn_auc``: the same for the charge the reward paid (``judged``' third column;
      with ``scheduler.reward.itm_charge: excess`` the probability's excess over picks of the same hardness).
    - ``expected_q_mean`` / ``expected_q_std``: E[q] of the Betas over the chained slots (std = how much
      the scheduler tells anchors apart).
    - ``q_fn_density_corr``: Pearson correlation over chained slots of E[q] (FALCON) or q (fixed /
      progressive: None, q does not vary) with the anchor's oracle false-negative density.
    - ``q_safe_corr``: the same with the anchor's safe quantile.
    - ``safe_q_mean``: mean safe quantile; ``q_above_safe_share``: share of slots whose q exceeded it
      (no safe q at all counts as exceeded).
    - ``chain_fn_rate``: share of the chained slots that are false negatives of their anchor.
    - ``fn_density_mean``: mean anchor false-negative density (what a random pick would hit).
    - ``hardness_fn_corr`` / ``hardness_fn_auc``: over the same slots, the pick's similarity to its anchor (the
      composer's S) against whether it was a false negative: how much hardness alone says about a false pick. A
      reward that pays for hardness pays for false negatives as much as this; a judge adds only what it sees
      beyond it (compare ``itm_fn_auc``).
    - ``fn_rate_at_q0`` … ``fn_rate_at_q100``: the share of the same slots whose pick would have been a false
      negative had one fixed q (0, 0.25, 0.5, 0.75, 1) chosen it for the same anchor among the same candidates:
      the fixed-q frontier on the anchors this composer saw.
    - ``frontier_fn_rate``: that frontier at the epoch's ``q_mean`` (linear between its levels), and
      ``frontier_gap`` = ``chain_fn_rate`` − ``frontier_fn_rate``: below 0, the composer's picks hold fewer false
      negatives than one q for every anchor at the same mean hardness (FALCON's claim, as one number).
    - ``best_by_density_fn_rate``: the fewest false picks any choice among those five q's could make at the same
      mean q if it knew each anchor's false-negative density (one mix of the five per density decile of the
      epoch's anchors: what a scheduler whose features told it the density exactly could reach; in-sample, so a
      little optimistic); ``best_by_anchor_fn_rate``: the same if it knew, for each anchor, which of the five
      picks are false (one mix per anchor: the most any per-anchor q could reach, with a perfect judge behind it).
      Between ``frontier_fn_rate`` and these lies what a scheduler can win (:func:`best_mix_fn_rate`).
    """
    chained = rows[rows["q"].notna()]
    q = chained["q"].astype(np.float64)
    summary: dict = {
        f"q_{name}": (float(q.quantile(level)) if len(q) else None)
        for name, level in (("p10", 0.1), ("p50", 0.5), ("p90", 0.9))
    }
    summary["q_mean"] = float(q.mean()) if len(q) else None
    r = np.asarray(list(rewards), dtype=np.float64)
    summary.update(
        reward_mean=float(r.mean()) if len(r) else None,
        reward_std=float(r.std(ddof=1)) if len(r) > 1 else None,
        reward_count=len(r),
    )
    pairs = np.asarray(list(credited), dtype=np.float64).reshape(-1, 2)
    pairs = pairs[~np.isnan(pairs).any(1)]
    summary["reward_fn_corr"] = pearson(pairs[:, 0], pairs[:, 1]) if len(pairs) else None
    # (older checkpoints keep [match, fn] only: their charge was the match)
    seen = np.asarray([[*j, j[0]] if len(j) == 2 else list(j) for j in judged], dtype=np.float64).reshape(-1, 3)
    seen = seen[~np.isnan(seen).any(1)]
    for key, column in (("itm", 0), ("charge", 2)):
        summary[f"{key}_fn_corr"], summary[f"{key}_fn_auc"] = judge_view(seen[:, column], seen[:, 1])

    mean_q = expected_q(chained).astype(np.float64) if len(chained) else pd.Series(dtype=np.float64)
    has_beta = mean_q.notna()
    summary.update(
        expected_q_mean=float(mean_q[has_beta].mean()) if has_beta.any() else None,
        expected_q_std=float(mean_q[has_beta].std(ddof=0)) if has_beta.any() else None,
    )
    # The policy's choice per slot: E[q] where q came from a Beta, else the q itself.
    choice = mean_q.where(has_beta, q)
    density = chained["anchor_fn_density"].astype(np.float64) if "anchor_fn_density" in chained else None
    if density is None or not density.notna().any():
        summary.update(
            q_fn_density_corr=None,
            q_safe_corr=None,
            safe_q_mean=None,
            q_above_safe_share=None,
            chain_fn_rate=None,
            fn_density_mean=None,
            hardness_fn_corr=None,
            hardness_fn_auc=None,
            **dict.fromkeys(FRONTIER_KEYS),
        )
        return summary
    known = density.notna()
    safe = chained["safe_q"].astype(np.float64)
    with_safe = known & safe.notna()
    summary.update(
        q_fn_density_corr=pearson(choice[known], density[known]),
        q_safe_corr=pearson(choice[with_safe], safe[with_safe]),
        safe_q_mean=float(safe[with_safe].mean()) if with_safe.any() else None,
        q_above_safe_share=float(((q > safe) | safe.isna())[known].mean()),
        chain_fn_rate=float(chained["chosen_is_fn"].astype(np.float64)[known].mean()),
        fn_density_mean=float(density[known].mean()),
    )
    fn = chained["chosen_is_fn"].astype(np.float64)
    hardness = chained["similarity_to_anchor"].astype(np.float64) if "similarity_to_anchor" in chained else fn * np.nan
    scored = known & fn.notna() & hardness.notna()
    summary["hardness_fn_corr"], summary["hardness_fn_auc"] = judge_view(
        hardness[scored].to_numpy(), fn[scored].to_numpy()
    )
    summary.update(frontier(chained[known], summary["chain_fn_rate"], summary["q_mean"]))
    return summary


FRONTIER_KEYS = (
    *(f"fn_rate_at_{name[len('fn_at_') :]}" for name in FIXED_Q_FIELDS),
    "frontier_fn_rate",
    "frontier_gap",
    "best_by_density_fn_rate",
    "best_by_anchor_fn_rate",
)
"""The epoch summary's fixed-q frontier keys (:func:`composition_summary`)."""


def frontier(slots: pd.DataFrame, chain_fn_rate: float | None, q_mean: float | None) -> dict:
    """The fixed-q frontier on ``slots`` (chained, with the oracle's view): the false-negative rate of each fixed
    q's counterfactual pick, that curve at ``q_mean`` and the composer's distance to it (all None where the
    slots carry no counterfactual picks, e.g. a batch log from before they were recorded)."""
    out = dict.fromkeys(FRONTIER_KEYS)
    columns = [name for name in FIXED_Q_FIELDS if name in slots]
    scored = slots[columns].astype(np.float64).notna().all(axis=1) if len(columns) == len(FIXED_Q_FIELDS) else None
    if scored is None or not scored.any():
        return out
    picks = slots.loc[scored, columns].astype(np.float64).to_numpy()
    rates = picks.mean(0)
    out.update({key: float(rate) for key, rate in zip(FRONTIER_KEYS, rates)})
    if q_mean is not None and chain_fn_rate is not None:
        out["frontier_fn_rate"] = float(np.interp(q_mean, FIXED_Q_LEVELS, rates))
        out["frontier_gap"] = chain_fn_rate - out["frontier_fn_rate"]
    if q_mean is not None:
        # per anchor: its five verdicts (at most 32 patterns); per density decile: their rates in the decile
        patterns, count = np.unique(picks, axis=0, return_counts=True)
        out["best_by_anchor_fn_rate"] = best_mix_fn_rate(patterns, count, q_mean)
        density = slots.loc[scored, "anchor_fn_density"].astype(np.float64).to_numpy()
        decile = np.minimum(np.argsort(np.argsort(density, kind="stable"), kind="stable") * 10 // len(density), 9)
        groups = [decile == d for d in range(10) if (decile == d).any()]
        out["best_by_density_fn_rate"] = best_mix_fn_rate(
            np.stack([picks[g].mean(0) for g in groups]), np.array([g.sum() for g in groups]), q_mean
        )
    return out


def best_mix_fn_rate(
    rates: np.ndarray, weights: np.ndarray, q_mean: float, levels: Sequence[float] = FIXED_Q_LEVELS
) -> float:
    """The lowest mean false-negative rate a policy reaches at mean q ``q_mean`` when it may mix the fixed q
    ``levels`` differently for each group of anchors, knowing each group's rate at each level (``rates``
    ``[groups, levels]``, ``weights`` ``[groups]``: anchors per group). Exact: each group's lower convex hull of
    (q, rate), and the groups' hull segments taken flattest first (the most q bought per false negative), from
    every group at the lowest level until the mean q is reached."""
    levels = np.asarray(levels, dtype=np.float64)
    share = np.asarray(weights, dtype=np.float64) / np.sum(weights)
    rate = float(share @ rates[:, 0])
    segments = []  # (slope, mean-q length, rate change) of every group's lower hull
    for row, w in zip(np.asarray(rates, dtype=np.float64), share):
        hull = [0]
        for k in range(1, len(levels)):  # monotone chain: keep the hull convex from below
            while len(hull) > 1 and (
                (row[hull[-1]] - row[hull[-2]]) * (levels[k] - levels[hull[-1]])
                >= (row[k] - row[hull[-1]]) * (levels[hull[-1]] - levels[hull[-2]])
            ):
                hull.pop()
            hull.append(k)
        for a, b in zip(hull, hull[1:]):
            segments.append(
                ((row[b] - row[a]) / (levels[b] - levels[a]), w * (levels[b] - levels[a]), w * (row[b] - row[a]))
            )
    need = q_mean - levels[0]
    for slope, length, change in sorted(segments, key=lambda seg: seg[0]):
        if need <= 0:
            break
        take = min(1.0, need / length)
        rate, need = rate + take * change, need - take * length
    return float(rate)


SUMMARY_COLUMNS = (
    "epoch",
    "chained_slots",
    "q_mean",
    "expected_q_mean",
    "expected_q_std",
    "q_fn_density_corr",
    "q_safe_corr",
    "safe_q_mean",
    "q_above_safe_share",
    "chain_fn_rate",
    "fn_density_mean",
    "hardness_fn_corr",
    "hardness_fn_auc",
    "frontier_fn_rate",
    "frontier_gap",
    "best_by_density_fn_rate",
    "best_by_anchor_fn_rate",
)
"""The per-epoch table of :func:`summary_by_epoch` (the audit's ``scheduler_vs_oracle.csv``)."""


def summary_by_epoch(log: pd.DataFrame) -> pd.DataFrame:
    """:func:`composition_summary` of every epoch of a batch log that has the oracle's view (rows with
    ``anchor_fn_density``), one row per epoch with :data:`SUMMARY_COLUMNS`; empty when none has it."""
    rows = []
    seen = log[log["anchor_fn_density"].notna()] if "anchor_fn_density" in log else log.iloc[:0]
    for epoch, part in seen.groupby("epoch", sort=True):
        summary = composition_summary(log[log["epoch"] == epoch])
        rows.append(
            {"epoch": int(epoch), "chained_slots": int(len(part)), **{k: summary[k] for k in SUMMARY_COLUMNS[2:]}}
        )
    return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))


__all__ = [
    "FRONTIER_KEYS",
    "SUMMARY_COLUMNS",
    "best_mix_fn_rate",
    "composition_summary",
    "expected_q",
    "frontier",
    "judge_view",
    "pearson",
    "rank_auc",
    "summary_by_epoch",
]
