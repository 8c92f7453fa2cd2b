"""The negatives a run actually used, from its batch log, and their false-negative rates.

Two kinds of negatives are audited, each in both directions of the contrastive and matching
losses (``i2t``: an image against a wrong caption; ``t2i``: a caption against a wrong image):

* ``chain``: a chained slot of ``batches.parquet`` (``anchor_pair_id >= 0``) says pair ``b``
  was chosen for the batch because of anchor ``a``, at quantile ``q``. Inside that batch the
  two are each other's negatives: ``i2t`` judges a's image with b's caption, ``t2i`` b's
  image with a's caption. Only pairs in the same batch are negatives of each other (a GRIT
  chain continues across batch boundaries: its link into the next batch is not a negative).
  The hardness of a chain negative is its ``q`` where a quantile composer chose it, else its
  ``quantile_rank`` among the anchor's remaining candidates (GRIT: 1, the argmax).
* ``itm``: the negative the ITM loss used for each anchor of a batch, the hardest in-batch
  pair by ITC similarity (:func:`~falcon_cli.objectives.itm.hardest_negatives`, the same
  function training calls), from the epoch's embedding cache ``embeddings/epoch_<e>.h5``,
  which pretraining fills from the training forward of that very step. (A run trained with
  ``losses.itm_negatives: sample`` drew its ITM negatives from the softmax of these similarities;
  the audit takes the most likely draw.) Its hardness is the anchor's own slot hardness: the
  q at which the batch around it was composed.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd
import torch

from falcon_cli.artifacts.embeddings import Embeddings
from falcon_cli.errors import FalconError
from falcon_cli.judges import DEFAULT_THRESHOLD, Judge, JudgedPair, is_false_negative
from falcon_cli.objectives.itm import hardest_negatives
from falcon_cli.runtime.progress import track

DIRECTIONS = ("i2t", "t2i")
KINDS = ("chain", "itm")
BATCH_KEYS = ["epoch", "step", "rank"]
COLUMNS = [
    "epoch",
    "step",
    "rank",
    "train_step",
    "kind",
    "anchor",
    "negative",
    "direction",
    "image_pair",
    "caption_pair",
    "q",
    "hardness",
    "similarity",
    "sampler",
]


def used_negatives(
    log: pd.DataFrame,
    *,
    kinds: tuple[str, ...] | list[str] = KINDS,
    features: Callable[[int], Embeddings] | None = None,
    max_pairs: int | None = None,
    max_steps: int | None = None,
    same_image: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> pd.DataFrame:
    """The negatives of a batch log, one row per (kind, anchor, negative, direction).

    Columns (:data:`COLUMNS`): ``epoch``, ``step``, ``rank``, ``train_step`` (0-based position of
    the batch's step in training order), ``kind`` (``chain`` / ``itm``), ``anchor``,
    ``negative``, ``direction``, ``image_pair`` / ``caption_pair`` (whose image and whose
    caption the judged pair combines), ``q``, ``hardness``, ``similarity`` (chain: the
    composer's similarity to the anchor; itm: the ITC cosine of the judged pair), ``sampler``.
    ``features(epoch)``: that epoch's embedding cache (needed for ``itm``). ``same_image(pair_ids)``:
    bool [B, B] of the batch's pairs that share an image, for a run that kept them out of ITM mining
    (``pretrain.false_negatives.same_image: mask``; :meth:`~falcon_cli.data.shared_images.SharedImages.mask`).
    ``max_pairs`` / ``max_steps``: keep whole training steps, evenly spaced from the first to the last, so that
    at most this many rows / steps remain (a long run audits in bounded time).
    """
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise FalconError(f"unknown kind of negatives {unknown or kinds!r}; use chain and/or itm")
    if "itm" in kinds and features is None:
        raise FalconError("itm negatives need the run's per-epoch embedding caches (embeddings/epoch_<e>.h5)")
    steps = log[["epoch", "step"]].drop_duplicates().sort_values(["epoch", "step"]).reset_index(drop=True)
    steps["train_step"] = np.arange(len(steps), dtype=np.int64)
    log = log.merge(steps, on=["epoch", "step"], how="left")
    chained = _chained_in_batch(log) if "chain" in kinds else log.iloc[:0]
    if max_pairs is not None or max_steps is not None:
        rows = pd.Series(0, index=steps["train_step"], dtype=np.int64)
        rows = rows.add(chained.groupby("train_step").size() * len(DIRECTIONS), fill_value=0)
        if "itm" in kinds:  # one negative per anchor and direction, in batches of two or more
            sizes = log.groupby(BATCH_KEYS + ["train_step"]).size()
            rows = rows.add((sizes[sizes > 1] * len(DIRECTIONS)).groupby("train_step").sum(), fill_value=0)
        keep = _evenly_spaced_steps(rows.astype(np.int64), max_pairs, max_steps)
        log, chained = log[log["train_step"].isin(keep)], chained[chained["train_step"].isin(keep)]
    parts = []
    if "chain" in kinds:
        parts.append(_chain_rows(chained))
    if "itm" in kinds:
        parts.append(_itm_rows(log, features, same_image))
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=COLUMNS)
    return out.sort_values(["train_step", "rank", "kind", "anchor", "direction"], kind="stable").reset_index(drop=True)


def _chained_in_batch(log: pd.DataFrame) -> pd.DataFrame:
    """The chained slots whose anchor sits in the same batch."""
    chained = log[log["anchor_pair_id"] >= 0]
    members = log[BATCH_KEYS + ["pair_id"]].rename(columns={"pair_id": "anchor_pair_id"}).assign(_same_batch=True)
    chained = chained.merge(members, on=BATCH_KEYS + ["anchor_pair_id"], how="left")
    return chained[chained["_same_batch"].fillna(False).astype(bool)]


def _hardness(slots: pd.DataFrame) -> pd.Series:
    q = slots["q"].astype("float64")
    return q.where(q.notna(), slots["quantile_rank"].astype("float64"))


def _both_directions(base: pd.DataFrame) -> pd.DataFrame:
    """``base`` (one row per anchor/negative) as i2t and t2i rows (whose image, whose caption)."""
    i2t = base.assign(direction="i2t", image_pair=base["anchor"], caption_pair=base["negative"])
    t2i = base.assign(direction="t2i", image_pair=base["negative"], caption_pair=base["anchor"])
    return pd.concat([i2t, t2i], ignore_index=True)[COLUMNS]


def _chain_rows(chained: pd.DataFrame) -> pd.DataFrame:
    base = pd.DataFrame(
        {
            "epoch": chained["epoch"].astype("int64"),
            "step": chained["step"].astype("int64"),
            "rank": chained["rank"].astype("int64"),
            "train_step": chained["train_step"].astype("int64"),
            "kind": "chain",
            "anchor": chained["anchor_pair_id"].astype("int64"),
            "negative": chained["pair_id"].astype("int64"),
            "q": chained["q"].astype("float64"),
            "hardness": _hardness(chained),
            "similarity": chained["similarity_to_anchor"].astype("float64"),
            "sampler": chained["sampler"].astype(str),
        }
    )
    return _both_directions(base)


def _itm_rows(
    log: pd.DataFrame,
    features: Callable[[int], Embeddings],
    same_image: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> pd.DataFrame:
    """Each anchor's hardest in-batch negative by ITC similarity, from the epoch's embedding cache (never a
    pair that shares its image, with ``same_image``, as in training)."""
    parts = []
    for epoch, slots in track(list(log.groupby("epoch", sort=True)), "in-batch ITM negatives (per epoch)"):
        cache = features(int(epoch))
        order = np.argsort(cache.pair_id, kind="stable")
        ids = slots["pair_id"].to_numpy(np.int64)
        pos = np.minimum(np.searchsorted(cache.pair_id, ids, sorter=order), len(order) - 1)
        found = cache.pair_id[order[pos]] == ids if len(order) else np.zeros(len(ids), bool)
        if not found.all():
            raise FalconError(
                f"the embedding cache of epoch {epoch} has no features for pair_id {int(ids[~found][0])} "
                f"({int((~found).sum())} such); it does not belong to this batch log"
            )
        rows = order[pos]
        for _, batch in slots.assign(_row=rows).groupby(BATCH_KEYS, sort=False):
            if len(batch) < 2:
                continue  # a batch of one pair has no in-batch negative
            image = torch.from_numpy(np.asarray(cache.image[batch["_row"].to_numpy()], dtype=np.float32))
            text = torch.from_numpy(np.asarray(cache.text[batch["_row"].to_numpy()], dtype=np.float32))
            sim = image @ text.t()  # [images, texts]; the ITC logits up to the temperature, which argmax ignores
            pairs = batch["pair_id"].to_numpy(np.int64)
            shared = same_image(torch.from_numpy(pairs)) if same_image is not None else None
            neg_text, neg_image = hardest_negatives(sim, sim.t(), positive_mask=shared)
            common = dict(
                epoch=batch["epoch"].astype("int64").to_numpy(),
                step=batch["step"].astype("int64").to_numpy(),
                rank=batch["rank"].astype("int64").to_numpy(),
                train_step=batch["train_step"].to_numpy(np.int64),
                kind="itm",
                anchor=pairs,
                q=batch["q"].astype("float64").to_numpy(),
                hardness=_hardness(batch).to_numpy(),
                sampler=batch["sampler"].astype(str).to_numpy(),
            )
            index = np.arange(len(pairs))
            parts.append(
                pd.DataFrame(
                    {
                        **common,
                        "negative": pairs[neg_text.numpy()],
                        "direction": "i2t",
                        "image_pair": pairs,
                        "caption_pair": pairs[neg_text.numpy()],
                        "similarity": sim[index, neg_text].double().numpy(),
                    }
                )
            )
            parts.append(
                pd.DataFrame(
                    {
                        **common,
                        "negative": pairs[neg_image.numpy()],
                        "direction": "t2i",
                        "image_pair": pairs[neg_image.numpy()],
                        "caption_pair": pairs,
                        "similarity": sim[neg_image, index].double().numpy(),
                    }
                )
            )
    return pd.concat(parts, ignore_index=True)[COLUMNS] if parts else pd.DataFrame(columns=COLUMNS)


def _evenly_spaced_steps(rows_per_step: pd.Series, max_pairs: int | None, max_steps: int | None) -> np.ndarray:
    """Training steps, evenly spaced from first to last, with at most ``max_pairs`` rows and
    ``max_steps`` steps in total (``rows_per_step``: rows of each training step)."""
    rows_per_step = rows_per_step[rows_per_step > 0]
    steps = rows_per_step.index.to_numpy()
    budget = np.inf if max_pairs is None else max(0, int(max_pairs))
    keep = len(steps) if max_steps is None else min(len(steps), max(0, int(max_steps)))
    if rows_per_step.sum() <= budget and keep == len(steps):
        return steps
    if budget < np.inf:
        keep = min(keep, max(1, int(budget // max(1, int(np.ceil(rows_per_step.mean()))))) if budget else 0)
    while keep > 0:
        chosen = steps[np.unique(np.linspace(0, len(steps) - 1, keep).round().astype(int))]
        if rows_per_step.loc[chosen].sum() <= budget:
            return chosen
        keep -= 1
    return steps[:0]


def false_negative_rates(
    audit: pd.DataFrame, *, hardness_buckets: int | None = 5, step_windows: int = 4, flag: str = "is_false_negative"
) -> pd.DataFrame:
    """False-negative rate of judged negatives per kind, hardness bucket and training-step window.

    ``audit`` needs ``train_step``, ``hardness``, the boolean column ``flag`` and optionally
    ``kind``. Buckets split [0, 1] into ``hardness_buckets`` equal intervals (the last closed;
    rows without a hardness are left out); ``None`` puts every row in one bucket 0 whose edges
    are NaN. Windows split the audited training steps into ``step_windows`` equal ranges.
    Returns one row per non-empty cell: ``kind``, ``window``, ``first_step``, ``last_step``,
    ``bucket``, ``hardness_low``, ``hardness_high``, ``negatives``, ``false_negatives``, ``rate``.
    """
    frame = audit if hardness_buckets is None else audit.dropna(subset=["hardness"])
    steps_all = audit["train_step"].to_numpy()
    lo, hi = (int(steps_all.min()), int(steps_all.max())) if len(steps_all) else (0, 0)
    steps = frame["train_step"].to_numpy()
    window = np.minimum(((steps - lo) * step_windows) // max(1, hi - lo + 1), step_windows - 1)
    if hardness_buckets is None:
        edges, bucket = np.array([np.nan, np.nan]), np.zeros(len(frame), dtype=np.int64)
    else:
        edges = np.linspace(0.0, 1.0, hardness_buckets + 1)
        bucket = np.clip(
            np.searchsorted(edges, frame["hardness"].to_numpy(float), side="right") - 1, 0, hardness_buckets - 1
        )
    kind = frame["kind"].astype(str).to_numpy() if "kind" in frame.columns else np.full(len(frame), "all", dtype=object)
    grouped = pd.DataFrame(
        {"kind": kind, "window": window, "bucket": bucket, "step": steps, "fn": frame[flag].to_numpy(bool)}
    )
    rows = (
        grouped.groupby(["kind", "window", "bucket"])
        .agg(
            first_step=("step", "min"),
            last_step=("step", "max"),
            negatives=("fn", "size"),
            false_negatives=("fn", "sum"),
        )
        .reset_index()
    )
    rows["hardness_low"], rows["hardness_high"] = edges[rows["bucket"]], edges[rows["bucket"] + 1]
    rows["rate"] = rows["false_negatives"] / rows["negatives"]
    return rows[
        [
            "kind",
            "window",
            "first_step",
            "last_step",
            "bucket",
            "hardness_low",
            "hardness_high",
            "negatives",
            "false_negatives",
            "rate",
        ]
    ]


def judge_negatives(
    negatives: pd.DataFrame,
    pair_at: Callable[[int, int], JudgedPair],
    judge: Judge,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    oracle: Judge | None = None,
) -> pd.DataFrame:
    """``negatives`` (from :func:`used_negatives`) with what ``judge`` says of each: the judged pair
    combines ``image_pair``'s image with ``caption_pair``'s caption, as the run saw them in that
    epoch (``pair_at(epoch, pair_id)``: the pair's image, caption and ids; ``KeyError`` for a pair
    the dataset lacks). Adds ``judge``, ``score``, ``is_false_negative`` (score above
    ``threshold``) and ``oracle`` (the ground truth from ``oracle`` where given, else null)."""
    known: dict[tuple[int, int], JudgedPair | None] = {}
    missing: set[int] = set()

    def lookup(epoch: int, pair_id: int) -> JudgedPair | None:
        key = (int(epoch), int(pair_id))
        if key not in known:
            try:
                known[key] = pair_at(*key)
            except KeyError:
                known[key] = None
                missing.add(key[1])
        return known[key]

    judged = []
    for epoch, i, c in zip(negatives["epoch"], negatives["image_pair"], negatives["caption_pair"]):
        image, caption = lookup(epoch, i), lookup(epoch, c)
        if image is not None and caption is not None:
            judged.append(
                JudgedPair(
                    image=image.image, caption=caption.caption, image_id=image.image_id, caption_id=caption.caption_id
                )
            )
    if missing:
        raise FalconError(
            f"the batch log names pair_id {min(missing)} ({len(missing)} such) that the run's dataset does not "
            "have; audit a run with the dataset it was trained on"
        )
    scores = judge.score(judged) if judged else np.zeros(0)
    out = negatives.assign(
        judge=judge.name, score=scores.astype("float32"), is_false_negative=is_false_negative(scores, threshold)
    )
    out["oracle"] = (
        pd.array(oracle.score(judged) > 0.5, dtype="boolean")
        if oracle is not None and judged
        else pd.array([None] * len(out), dtype="boolean")
    )
    return out


__all__ = ["COLUMNS", "DIRECTIONS", "KINDS", "used_negatives", "false_negative_rates", "judge_negatives"]
