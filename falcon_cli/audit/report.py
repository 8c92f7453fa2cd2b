"""What an audit says: overall rates, the threshold-filter curve, the judge against the oracle.

All functions take the judged negatives of :func:`~falcon_cli.audit.negatives.judge_negatives`
(columns ``kind``, ``score``, ``is_false_negative``, ``oracle`` and, on the shapes world,
``caption_specificity``) and return small tables; :func:`audit_markdown` renders them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from falcon_cli.sampling.oracle_view import rank_auc


def truth_column(audit: pd.DataFrame) -> str:
    """``oracle`` when every row has the oracle's verdict, else ``is_false_negative`` (the judge's own)."""
    return "oracle" if len(audit) and audit["oracle"].notna().all() else "is_false_negative"


def overall_rates(audit: pd.DataFrame, same_image: np.ndarray | None = None) -> pd.DataFrame:
    """Per kind (and ``all``): ``negatives``, ``false_negatives`` (judge), ``rate`` and, where the
    data has an oracle, ``oracle_false_negatives`` / ``oracle_rate``. ``same_image`` (bool, one per
    row of ``audit``: the judged image and caption come from pairs that show the same image) adds
    ``same_image`` (how many such negatives), ``same_image_false_negatives`` (of those, the truly
    matching ones, by the oracle or else the judge) and ``same_image_share`` (their share of all the
    kind's false negatives)."""
    with_oracle = truth_column(audit) == "oracle"
    truth = audit["oracle"].astype(bool) if with_oracle else audit["is_false_negative"].astype(bool)
    same = pd.Series(np.asarray(same_image, dtype=bool), index=audit.index) if same_image is not None else None
    rows = []
    for kind, part in [*audit.groupby("kind", sort=True), ("all", audit)]:
        flagged = int(part["is_false_negative"].sum())
        row = {"kind": kind, "negatives": len(part), "false_negatives": flagged, "rate": flagged / max(1, len(part))}
        if with_oracle:
            true = int(part["oracle"].astype(bool).sum())
            row.update(oracle_false_negatives=true, oracle_rate=true / max(1, len(part)))
        if same is not None:
            shared, matching = same[part.index], truth[part.index]
            row.update(
                same_image=int(shared.sum()),
                same_image_false_negatives=int((shared & matching).sum()),
                same_image_share=float((shared & matching).sum() / matching.sum()) if matching.any() else None,
            )
        rows.append(row)
    return pd.DataFrame(rows)


def filter_curve(audit: pd.DataFrame, thresholds, *, truth: str | None = None) -> pd.DataFrame:
    """The paper's Figure 2 bottom-left: drop the negatives whose judge score exceeds τ, and
    measure what is left, per kind and threshold.

    ``truth``: the column that says which negatives truly match (default :func:`truth_column`).
    Columns: ``kind``, ``threshold``, ``negatives``, ``kept`` (score ≤ τ),
    ``false_negatives_kept``, ``fn_ratio`` (of the kept; NaN when none is kept),
    ``removed_true_negatives`` (dropped although they truly do not match).
    """
    truth = truth or truth_column(audit)
    rows = []
    for kind, part in audit.groupby("kind", sort=True):
        score = part["score"].to_numpy(np.float64)
        true = part[truth].to_numpy(bool)
        for tau in sorted(float(t) for t in thresholds):
            kept = score <= tau
            n_kept = int(kept.sum())
            fn_kept = int((kept & true).sum())
            rows.append(
                {
                    "kind": kind,
                    "threshold": tau,
                    "negatives": len(part),
                    "kept": n_kept,
                    "false_negatives_kept": fn_kept,
                    "fn_ratio": fn_kept / n_kept if n_kept else np.nan,
                    "removed_true_negatives": int((~kept & ~true).sum()),
                }
            )
    return pd.DataFrame(
        rows,
        columns=[
            "kind",
            "threshold",
            "negatives",
            "kept",
            "false_negatives_kept",
            "fn_ratio",
            "removed_true_negatives",
        ],
    )


def judge_agreement(audit: pd.DataFrame) -> pd.DataFrame:
    """The judge's flags against the oracle: ``tp``, ``fp``, ``fn``, ``tn``, ``precision``,
    ``recall``, ``f1`` and ``auc`` (threshold-free: the chance that a true false negative scores above
    a true negative, ties counting half) overall (``group`` = ``all``) and per caption specificity
    (``group`` = ``specificity k``, the number of predicates of the judged caption) where the audit has
    it. Empty when the data has no oracle."""
    if truth_column(audit) != "oracle":
        return pd.DataFrame(columns=["group", "negatives", "tp", "fp", "fn", "tn", "precision", "recall", "f1", "auc"])
    groups = [("all", audit)]
    if "caption_specificity" in audit.columns and audit["caption_specificity"].notna().any():
        groups += [(f"specificity {int(k)}", part) for k, part in audit.groupby("caption_specificity", sort=True)]
    rows = []
    for name, part in groups:
        flagged, true = part["is_false_negative"].to_numpy(bool), part["oracle"].to_numpy(bool)
        tp, fp = int((flagged & true).sum()), int((flagged & ~true).sum())
        fn, tn = int((~flagged & true).sum()), int((~flagged & ~true).sum())
        precision = tp / (tp + fp) if tp + fp else np.nan
        recall = tp / (tp + fn) if tp + fn else np.nan
        f1 = 2 * precision * recall / (precision + recall) if tp else (0.0 if fp + fn else np.nan)
        rows.append(
            {
                "group": name,
                "negatives": len(part),
                "tp": tp,
                "fp": fp,
                "fn": fn,
                "tn": tn,
                "precision": precision,
                "recall": recall,
                "f1": f1,
                "auc": rank_auc(part["score"].to_numpy(float), true),
            }
        )
    return pd.DataFrame(rows)


def missed_false_negatives(audit: pd.DataFrame, count: int) -> pd.DataFrame:
    """Up to ``count`` true false negatives (oracle) that the judge did not flag, lowest score
    first, one per judged caption (so the grid is not one caption many times)."""
    if truth_column(audit) != "oracle" or count <= 0:
        return audit.iloc[:0]
    missed = audit[audit["oracle"].astype(bool) & ~audit["is_false_negative"].astype(bool)]
    missed = missed.sort_values(["score", "train_step", "anchor", "direction"], kind="stable")
    return missed.drop_duplicates(subset=["caption_pair"]).head(count)


def markdown_table(frame: pd.DataFrame, percent: tuple[str, ...] = ()) -> str:
    """A GitHub markdown table; ``percent`` columns shown as percentages, floats with 3 decimals."""
    if frame.empty:
        return "(none)\n"
    header = "| " + " | ".join(frame.columns) + " |\n|" + "---|" * len(frame.columns) + "\n"

    def cell(column: str, value) -> str:
        if value is None or (isinstance(value, float) and np.isnan(value)):
            return "-"
        if column in percent:
            return f"{100 * float(value):.1f}%"
        if isinstance(value, (float, np.floating)):
            return f"{float(value):.3f}"
        return str(value)

    body = "".join(
        "| " + " | ".join(cell(c, v) for c, v in zip(frame.columns, row)) + " |\n"
        for row in frame.itertuples(index=False)
    )
    return header + body


def audit_markdown(
    *,
    run: str,
    judge: str,
    threshold: float,
    truth: str,
    steps: tuple[int, int, int],
    overall: pd.DataFrame,
    rates: pd.DataFrame,
    curve: pd.DataFrame,
    agreement: pd.DataFrame,
    notes: list[str],
    scheduler: pd.DataFrame | None = None,
    candidate_risk: pd.DataFrame | None = None,
) -> str:
    """``audit.md``: the audit's tables with one line of explanation each."""
    audited, first, last = steps
    lines = [
        f"# False-negative audit of {run}\n",
        f"- judge: `{judge}`; a negative is a false negative when p(match) > {threshold:g}",
        f"- truth for the filter curve and the judge's precision/recall: "
        f"{'the oracle' if truth == 'oracle' else 'the judge itself (the data has no oracle)'}",
        f"- audited: {audited} training steps, from step {first} to step {last}",
        *[f"- {note}" for note in notes],
        "",
        "## False-negative rate of the used negatives\n",
        "`same_image`: negatives whose image and caption come from pairs that show the same image (false "
        "by construction); `same_image_share`: their share of the false negatives.\n",
        markdown_table(overall, percent=("rate", "oracle_rate", "same_image_share")),
        "## By hardness (q) and training-step window (Figure 2, top left)\n",
        markdown_table(rates.drop(columns=["bucket"]), percent=("rate",)),
        "## Left after filtering by the judge's score (Figure 2, bottom left)\n",
        "Negatives with score > τ are dropped; `fn_ratio` is the false-negative share of the rest.\n",
        markdown_table(curve, percent=("fn_ratio",)),
        "## The judge against the oracle\n",
        "Flags at the threshold (precision, recall, F1); `auc`: how well the judge's score ranks the oracle's "
        "false negatives above its true negatives at any threshold (0.5: not at all).\n"
        if not agreement.empty
        else "",
        markdown_table(agreement, percent=("precision", "recall", "f1"))
        if not agreement.empty
        else "(no oracle for this data)\n",
    ]
    if candidate_risk is not None and not candidate_risk.empty:
        lines += [
            "## How risky the hard candidates are under the final model (the premise of Figure 2)\n",
            "The pairs cut into random search spaces of `space_size`; each anchor's candidates of other images "
            "ranked by the last epoch's similarity; the share that the oracle calls true matches at rank 1, "
            "rank 10, the median rank, and over all candidates (`random`: a uniform pick).\n",
            markdown_table(candidate_risk, percent=("top-1", "top-10", "median", "random")),
        ]
    if scheduler is not None and not scheduler.empty:
        lines += [
            "## The composer's q against the oracle, per epoch\n",
            "Over the chained slots: `q_fn_density_corr`, the correlation of E[q] (or the fixed q) with the "
            "anchor's false-negative density in its search space (FALCON's claim: below 0); `expected_q_std`, "
            "how much E[q] differs across anchors; `safe_q_mean`, the oracle's highest q whose pick is a true "
            "negative; `q_above_safe_share`, how often q went past it; `chain_fn_rate`, false-negative picks; "
            "`frontier_fn_rate`, the false-negative rate one fixed q for every anchor would have had on the same "
            "anchors at the same mean q (the fixed-q frontier), and `frontier_gap`, `chain_fn_rate` less it "
            "(below 0: fewer false negatives than the frontier at equal hardness).\n",
            markdown_table(scheduler),
        ]
    return "\n".join(lines)


__all__ = [
    "truth_column",
    "markdown_table",
    "overall_rates",
    "filter_curve",
    "judge_agreement",
    "rank_auc",
    "missed_false_negatives",
    "audit_markdown",
]
