"""The negatives a run actually used, from its batch log, and their false-negative rates.

A chained slot of ``batches.parquet`` (``anchor_pair_id >= 0``) says: pair ``b`` was chosen for
the batch because of anchor ``a``, at quantile ``q``. Inside that batch the two are each
other's hardest kind of negative, in both directions of the contrastive and matching losses:

* ``i2t``: a's image against b's caption;
* ``t2i``: b's image against a's caption.

Only pairs that sit in the same batch are negatives of each other (a GRIT chain continues
across batch boundaries: its link into the next batch is not a negative). The hardness of a
negative is its ``q`` where a quantile composer chose it, else its ``quantile_rank`` among
the anchor's remaining candidates (GRIT: 1, the argmax).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd

from falcon_cli.errors import FalconError
from falcon_cli.judges import DEFAULT_THRESHOLD, Judge, JudgedPair, is_false_negative

DIRECTIONS = ("i2t", "t2i")


def used_negatives(log: pd.DataFrame, *, max_pairs: int | None = None) -> pd.DataFrame:
    """Chain-neighbour negatives of a batch log, one row per (anchor, negative, direction).

    Columns: ``epoch``, ``step``, ``rank``, ``train_step`` (0-based position of the batch's step
    in training order), ``anchor``, ``negative``, ``direction``, ``image_pair`` / ``caption_pair``
    (whose image and whose caption the judged pair combines), ``q``, ``hardness``,
    ``similarity``, ``sampler``. ``max_pairs``: keep whole training steps, evenly spaced over
    training, so that at most this many rows remain (a long run audits in bounded time).
    """
    chained = log[log["anchor_pair_id"] >= 0]
    members = log[["epoch", "step", "rank", "pair_id"]].rename(columns={"pair_id": "anchor_pair_id"})
    chained = chained.merge(members.assign(_same_batch=True), on=["epoch", "step", "rank", "anchor_pair_id"], how="left")
    chained = chained[chained["_same_batch"].fillna(False).astype(bool)]
    steps = log[["epoch", "step"]].drop_duplicates().sort_values(["epoch", "step"]).reset_index(drop=True)
    steps["train_step"] = np.arange(len(steps), dtype=np.int64)
    chained = chained.merge(steps, on=["epoch", "step"], how="left")
    if max_pairs is not None:
        chained = _evenly_spaced_steps(chained, max(0, int(max_pairs) // len(DIRECTIONS)))
    q = chained["q"].astype("float64")
    base = pd.DataFrame({
        "epoch": chained["epoch"].astype("int64"), "step": chained["step"].astype("int64"),
        "rank": chained["rank"].astype("int64"), "train_step": chained["train_step"].astype("int64"),
        "anchor": chained["anchor_pair_id"].astype("int64"), "negative": chained["pair_id"].astype("int64"),
        "q": q, "hardness": q.where(q.notna(), chained["quantile_rank"].astype("float64")),
        "similarity": chained["similarity_to_anchor"].astype("float64"), "sampler": chained["sampler"].astype(str),
    })
    i2t = base.assign(direction="i2t", image_pair=base["anchor"], caption_pair=base["negative"])
    t2i = base.assign(direction="t2i", image_pair=base["negative"], caption_pair=base["anchor"])
    out = pd.concat([i2t, t2i], ignore_index=True)
    return out.sort_values(["train_step", "rank", "anchor", "direction"], kind="stable").reset_index(drop=True)


def _evenly_spaced_steps(chained: pd.DataFrame, budget: int) -> pd.DataFrame:
    """Whole training steps, evenly spaced from first to last, with at most ``budget`` rows in total."""
    if len(chained) <= budget:
        return chained
    per_step = chained.groupby("train_step").size()
    keep = max(1, budget // max(1, int(np.ceil(per_step.mean())))) if budget else 0
    while keep > 0:
        chosen = per_step.index.to_numpy()[np.unique(np.linspace(0, len(per_step) - 1, keep).round().astype(int))]
        if per_step.loc[chosen].sum() <= budget:
            return chained[chained["train_step"].isin(chosen)]
        keep -= 1
    return chained.iloc[:0]


def false_negative_rates(audit: pd.DataFrame, *, hardness_buckets: int = 5, step_windows: int = 4,
                         flag: str = "is_false_negative") -> pd.DataFrame:
    """False-negative rate of judged negatives per hardness bucket per training-step window.

    ``audit`` needs ``train_step``, ``hardness`` and the boolean column ``flag``. Buckets split
    [0, 1] into ``hardness_buckets`` equal intervals (the last closed); windows split the
    audited training steps into ``step_windows`` equal ranges. Returns one row per non-empty
    cell: ``window``, ``first_step``, ``last_step``, ``bucket``, ``hardness_low``,
    ``hardness_high``, ``negatives``, ``false_negatives``, ``rate``.
    """
    frame = audit.dropna(subset=["hardness"])
    edges = np.linspace(0.0, 1.0, hardness_buckets + 1)
    bucket = np.clip(np.searchsorted(edges, frame["hardness"].to_numpy(), side="right") - 1, 0, hardness_buckets - 1)
    steps = frame["train_step"].to_numpy()
    lo, hi = (int(steps.min()), int(steps.max())) if len(steps) else (0, 0)
    window = np.minimum(((steps - lo) * step_windows) // max(1, hi - lo + 1), step_windows - 1)
    grouped = pd.DataFrame({"window": window, "bucket": bucket, "step": steps, "fn": frame[flag].to_numpy(bool)})
    rows = grouped.groupby(["window", "bucket"]).agg(first_step=("step", "min"), last_step=("step", "max"),
                                                     negatives=("fn", "size"), false_negatives=("fn", "sum")).reset_index()
    rows["hardness_low"], rows["hardness_high"] = edges[rows["bucket"]], edges[rows["bucket"] + 1]
    rows["rate"] = rows["false_negatives"] / rows["negatives"]
    return rows[["window", "first_step", "last_step", "bucket", "hardness_low", "hardness_high", "negatives",
                 "false_negatives", "rate"]]


def judge_negatives(negatives: pd.DataFrame, pairs: Mapping[int, JudgedPair], judge: Judge, *,
                    threshold: float = DEFAULT_THRESHOLD, oracle: Judge | None = None) -> pd.DataFrame:
    """``negatives`` (from :func:`used_negatives`) with what ``judge`` says of each: the judged pair
    combines ``image_pair``'s image with ``caption_pair``'s caption (``pairs``: pair id -> the
    pair's image, caption and ids). Adds ``judge``, ``score``, ``is_false_negative`` (score above
    ``threshold``) and ``oracle`` (the ground truth from ``oracle`` where given, else null)."""
    missing = sorted({int(p) for p in pd.concat([negatives["image_pair"], negatives["caption_pair"]])} - set(pairs))
    if missing:
        raise FalconError(f"the batch log names pair_id {missing[0]} ({len(missing)} such) that the run's dataset does not "
                          "have; audit a run with the dataset it was trained on")
    judged = [JudgedPair(image=pairs[int(i)].image, caption=pairs[int(c)].caption, image_id=pairs[int(i)].image_id,
                         caption_id=pairs[int(c)].caption_id)
              for i, c in zip(negatives["image_pair"], negatives["caption_pair"])]
    scores = judge.score(judged) if judged else np.zeros(0)
    out = negatives.assign(judge=judge.name, score=scores.astype("float32"),
                           is_false_negative=is_false_negative(scores, threshold))
    out["oracle"] = (pd.array(oracle.score(judged) > 0.5, dtype="boolean") if oracle is not None and judged
                     else pd.array([None] * len(out), dtype="boolean"))
    return out


__all__ = ["DIRECTIONS", "used_negatives", "false_negative_rates", "judge_negatives"]
