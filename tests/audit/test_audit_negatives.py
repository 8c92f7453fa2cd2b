"""The negatives a run used, from its batch log, and false-negative rates by hardness and step."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from falcon_cli.audit.negatives import false_negative_rates, used_negatives
from falcon_cli.errors import FalconError


def batch_log(seed: int = 0, epochs: int = 2, steps: int = 5, batch: int = 4) -> pd.DataFrame:
    """A small log: epoch 0 uniform; later epochs chained batches, where each batch's first slot is
    chained from the previous batch's last pair (a GRIT-style link across batches: not a negative)."""
    rng = np.random.default_rng(seed)
    rows, pair = [], 0
    for epoch in range(epochs):
        previous = -1
        for step in range(steps):
            for slot in range(batch):
                anchor = -1 if epoch == 0 else (previous if slot > 0 or step > 0 else -1)
                q = float(rng.random()) if epoch > 0 and anchor >= 0 else math.nan
                rows.append(
                    dict(
                        epoch=epoch,
                        step=step,
                        rank=0,
                        slot=slot,
                        pair_id=pair % 40,
                        anchor_pair_id=anchor,
                        q=q,
                        alpha=math.nan,
                        beta=math.nan,
                        similarity_to_anchor=float(rng.random()),
                        quantile_rank=float(rng.random()),
                        sampler="uniform" if epoch == 0 else "falcon",
                    )
                )
                previous = pair % 40
                pair += 1
    return pd.DataFrame(rows)


def reference_negatives(log):
    """One row at a time: a chained slot whose anchor sits in the same batch gives two negatives."""
    members = {(r.epoch, r.step, r.rank): set() for r in log.itertuples()}
    for r in log.itertuples():
        members[(r.epoch, r.step, r.rank)].add(r.pair_id)
    out = []
    for r in log.itertuples():
        if r.anchor_pair_id >= 0 and r.anchor_pair_id in members[(r.epoch, r.step, r.rank)]:
            out.append((r.epoch, r.step, r.anchor_pair_id, r.pair_id, "i2t", r.anchor_pair_id, r.pair_id))
            out.append((r.epoch, r.step, r.anchor_pair_id, r.pair_id, "t2i", r.pair_id, r.anchor_pair_id))
    return sorted(out)


def test_used_negatives_match_a_plain_loop_and_skip_links_across_batches():
    log = batch_log()
    got = used_negatives(log, kinds=("chain",))
    rows = sorted(
        zip(
            got["epoch"],
            got["step"],
            got["anchor"],
            got["negative"],
            got["direction"],
            got["image_pair"],
            got["caption_pair"],
        )
    )
    assert rows == reference_negatives(log)
    assert len(got) == 2 * 5 * 3, "per chained batch: slots 1..3 (slot 0 links to the previous batch)"
    assert set(got["sampler"]) == {"falcon"} and got["q"].between(0, 1).all()
    assert (got["hardness"] == got["q"]).all()
    assert got["train_step"].min() == 5 and got["train_step"].max() == 9, "epoch 1 steps follow epoch 0's five"


def test_hardness_falls_back_to_the_quantile_rank_without_q():
    log = batch_log()
    log.loc[log["epoch"] == 1, "q"] = math.nan  # e.g. GRIT: no q, rank 1 (the argmax)
    got = used_negatives(log, kinds=("chain",))
    merged = got.merge(
        log[["epoch", "step", "pair_id", "quantile_rank"]],
        left_on=["epoch", "step", "negative"],
        right_on=["epoch", "step", "pair_id"],
    )
    assert np.allclose(merged["hardness"], merged["quantile_rank"])


def test_budget_keeps_whole_steps_evenly_spread():
    log = batch_log(epochs=3, steps=20)
    full = used_negatives(log, kinds=("chain",))
    cut = used_negatives(log, kinds=("chain",), max_pairs=60)
    assert 0 < len(cut) <= 60
    per_step = full.groupby("train_step").size()
    kept = sorted(set(cut["train_step"]))
    assert all(len(cut[cut["train_step"] == s]) == per_step[s] for s in kept), "whole steps only"
    assert kept[0] == per_step.index.min() and kept[-1] == per_step.index.max(), "from the first to the last step"
    gaps = np.diff(kept)
    assert gaps.max() - gaps.min() <= 1, "evenly spaced"
    assert used_negatives(log, kinds=("chain",), max_pairs=0).empty


def test_false_negative_rates_equal_a_direct_count():
    rng = np.random.default_rng(1)
    audit = pd.DataFrame(
        {
            "train_step": rng.integers(0, 100, 500),
            "hardness": rng.random(500),
            "is_false_negative": rng.random(500) < 0.3,
        }
    )
    audit.loc[0, "hardness"] = 1.0  # the top edge belongs to the last bucket
    rates = false_negative_rates(audit, hardness_buckets=4, step_windows=2)
    lo, hi = audit["train_step"].min(), audit["train_step"].max()
    for row in rates.itertuples():
        in_bucket = (audit["hardness"] >= row.hardness_low) & (
            (audit["hardness"] < row.hardness_high) | (row.bucket == 3)
        )
        window = ((audit["train_step"] - lo) * 2) // (hi - lo + 1)
        cell = audit[in_bucket & (window == row.window)]
        assert row.negatives == len(cell) and row.false_negatives == cell["is_false_negative"].sum()
        assert row.rate == pytest.approx(cell["is_false_negative"].mean())
    assert rates["negatives"].sum() == 500 and set(rates["kind"]) == {"all"}
    unbucketed = false_negative_rates(audit.assign(hardness=np.nan), hardness_buckets=None, step_windows=2)
    assert unbucketed["negatives"].sum() == 500 and set(unbucketed["bucket"]) == {0}, (
        "None: every row, NaN hardness too"
    )


class CaptionLengthJudge:
    """A deterministic stand-in judge for the table's plumbing: p(match) from the pair's ids."""

    name = "test"

    def score(self, pairs):
        return np.array([((p.image_id * 7 + p.caption_id) % 10) / 10 for p in pairs], dtype=np.float64)


class SameIdOracle:
    name = "oracle"

    def score(self, pairs):
        return np.array([float(p.image_id % 3 == p.caption_id % 3) for p in pairs])


def test_judge_negatives_pairs_the_right_image_with_the_right_caption():
    from pathlib import Path

    from falcon_cli.audit.negatives import judge_negatives
    from falcon_cli.errors import FalconError
    from falcon_cli.judges import JudgedPair

    log = batch_log()
    negatives = used_negatives(log, kinds=("chain",))
    pairs = {
        i: JudgedPair(image=Path(f"img{i}.png"), caption=f"caption {i}", image_id=i, caption_id=100 + i)
        for i in range(40)
    }
    pair_at = lambda epoch, pair_id: pairs[pair_id]  # noqa: E731
    audit = judge_negatives(negatives, pair_at, CaptionLengthJudge(), threshold=0.45, oracle=SameIdOracle())
    for row in audit.itertuples():
        image, caption = (row.anchor, row.negative) if row.direction == "i2t" else (row.negative, row.anchor)
        expected = ((image * 7 + 100 + caption) % 10) / 10
        assert row.score == pytest.approx(expected) and row.is_false_negative == (expected > 0.45)
        assert row.oracle == (image % 3 == (100 + caption) % 3)
        assert row.judge == "test"
    no_oracle = judge_negatives(negatives, pair_at, CaptionLengthJudge())
    assert no_oracle["oracle"].isna().all() and (no_oracle["is_false_negative"] == (no_oracle["score"] > 0.5)).all()
    gone = int(negatives["anchor"].min())
    with pytest.raises(FalconError, match=f"pair_id {gone} .* the run's dataset does not have"):
        judge_negatives(
            negatives,
            lambda epoch, pair_id: {k: v for k, v in pairs.items() if k != gone}[pair_id],
            CaptionLengthJudge(),
        )


def embeddings_for(log, dim: int = 8, seed: int = 3):
    """Random unit features for every pair of the log, per epoch (pair ids deliberately out of order)."""
    from falcon_cli.artifacts.embeddings import Embeddings

    rng = np.random.default_rng(seed)
    ids = np.unique(log["pair_id"])[::-1].copy()
    caches = {}
    for epoch in sorted(set(log["epoch"])):
        image, text = rng.normal(size=(2, len(ids), dim))
        image /= np.linalg.norm(image, axis=1, keepdims=True)
        text /= np.linalg.norm(text, axis=1, keepdims=True)
        caches[int(epoch)] = Embeddings(
            image=image.astype(np.float16), text=text.astype(np.float16), pair_id=ids, attrs={}
        )
    return caches


def reference_itm(log, caches):
    """Per batch and anchor, the most similar other caption (i2t) and other image (t2i), one loop at a time."""
    out = []
    for (epoch, step, rank), batch in log.groupby(["epoch", "step", "rank"]):
        cache = caches[epoch]
        row = {int(p): i for i, p in enumerate(cache.pair_id)}
        members = [int(p) for p in batch["pair_id"]]
        for a in members:
            others = [b for b in members if b != a]
            ia, ta = cache.image[row[a]].astype(np.float32), cache.text[row[a]].astype(np.float32)
            best_text = max(
                others, key=lambda b: (float(ia @ cache.text[row[b]].astype(np.float32)), -members.index(b))
            )
            best_image = max(
                others, key=lambda b: (float(cache.image[row[b]].astype(np.float32) @ ta), -members.index(b))
            )
            out.append((epoch, step, a, best_text, "i2t", a, best_text))
            out.append((epoch, step, a, best_image, "t2i", best_image, a))
    return sorted(out)


def test_itm_negatives_are_each_anchors_most_similar_other_pair():
    log = batch_log()
    caches = embeddings_for(log)
    got = used_negatives(log, kinds=("itm",), features=caches.__getitem__)
    assert set(got["kind"]) == {"itm"}
    rows = sorted(
        zip(
            got["epoch"],
            got["step"],
            got["anchor"],
            got["negative"],
            got["direction"],
            got["image_pair"],
            got["caption_pair"],
        )
    )
    assert rows == reference_itm(log, caches)
    slots = log.set_index(["epoch", "step", "pair_id"])
    anchor_q = slots.loc[list(zip(got["epoch"], got["step"], got["anchor"])), "q"].to_numpy()
    assert np.allclose(got["q"], anchor_q, equal_nan=True), "an ITM row carries its anchor's slot q"
    first = got.iloc[0]
    cache = caches[int(first.epoch)]
    row = {int(p): i for i, p in enumerate(cache.pair_id)}
    expected = cache.image[row[first.image_pair]].astype(np.float32) @ cache.text[row[first.caption_pair]].astype(
        np.float32
    )
    assert first.similarity == pytest.approx(float(expected), abs=1e-5)

    both = used_negatives(log, features=caches.__getitem__)
    assert len(both) == len(got) + len(used_negatives(log, kinds=("chain",)))
    with pytest.raises(FalconError, match="embedding cache of epoch 1 has no features for pair_id"):
        short = dict(caches)
        short[1] = type(caches[1])(
            image=caches[1].image[:3], text=caches[1].text[:3], pair_id=caches[1].pair_id[:3], attrs={}
        )
        used_negatives(log, kinds=("itm",), features=short.__getitem__)
    with pytest.raises(FalconError, match="unknown kind"):
        used_negatives(log, kinds=("random",))


def test_budgets_count_both_kinds_and_cap_the_steps():
    log = batch_log(epochs=3, steps=20)
    caches = embeddings_for(log)
    full = used_negatives(log, features=caches.__getitem__)
    cut = used_negatives(log, features=caches.__getitem__, max_pairs=300)
    assert 0 < len(cut) <= 300
    per_step = full.groupby("train_step").size()
    assert all(len(cut[cut["train_step"] == s]) == per_step[s] for s in set(cut["train_step"])), "whole steps only"
    few = used_negatives(log, features=caches.__getitem__, max_steps=4)
    kept = sorted(set(few["train_step"]))
    assert len(kept) == 4 and kept[0] == per_step.index.min() and kept[-1] == per_step.index.max()
    chain_only = used_negatives(log, kinds=("chain",), max_steps=3)
    assert chain_only["epoch"].min() >= 1, "steps without a negative of the audited kind do not spend the budget"
