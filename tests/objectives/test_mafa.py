"""MAFA's Efficient Connection Mining and S-ITC schedule (falcon_cli/objectives/mafa.py), on hand-made batches."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from falcon_cli.objectives.common import row_normalised_targets
from falcon_cli.objectives.itc import itc_grit
from falcon_cli.objectives.itm import itm_loss, itm_pair_indices
from falcon_cli.objectives.mafa import ConnectionMining, connection_mining, smoothing


class StubJudge:
    """Con-D stand-in: p(match) looked up by (image, text); records every call."""

    def __init__(self, table: dict[tuple[int, int], float], default: float | None = None):
        self.table, self.default = table, default
        self.calls: list[tuple[list[int], list[int]]] = []

    def __call__(self, image_index: torch.Tensor, text_index: torch.Tensor) -> torch.Tensor:
        assert not torch.is_grad_enabled()
        pairs = list(zip(image_index.tolist(), text_index.tolist()))
        self.calls.append(([i for i, _ in pairs], [t for _, t in pairs]))
        if self.default is None:
            return torch.tensor([self.table[p] for p in pairs])
        return torch.tensor([self.table.get(p, self.default) for p in pairs])


# Rows images / columns texts. The diagonal is the largest entry of every row, so forgetting
# to exclude it would change everything. Off-diagonal (k1, k2) per image anchor:
# 0: (1, 2)  1: (0, 3)  2: (4, 3)  3: (2, 0)  4: (3, 1)
SIM_I2T = torch.tensor(
    [
        [10.0, 5.0, 4.0, 1.0, 0.0],
        [5.0, 10.0, 1.0, 4.0, 0.0],
        [0.0, 1.0, 10.0, 4.0, 5.0],
        [4.0, 1.0, 5.0, 10.0, 0.0],
        [0.0, 4.0, 1.0, 5.0, 10.0],
    ]
)
# Rows texts / columns images. (k1, k2) per text anchor:
# 0: (1, 4)  1: (2, 0)  2: (0, 1)  3: (4, 2)  4: (3, 0)
SIM_T2I = torch.tensor(
    [
        [10.0, 5.0, 0.0, 1.0, 4.0],
        [4.0, 10.0, 5.0, 1.0, 0.0],
        [5.0, 4.0, 10.0, 0.0, 1.0],
        [0.0, 1.0, 4.0, 10.0, 5.0],
        [4.0, 0.0, 1.0, 5.0, 10.0],
    ]
)
# Con-D scores of the hardest candidates, keyed (image, text).
# image anchors: (0,1) conv, (1,0) conv, (2,4) ambiguous, (3,2) plain, (4,3) ambiguous
# text anchors:  (1,0) conv, (2,1) plain, (0,2) conv, (4,3) ambiguous, (3,4) ambiguous
SCORES = {(0, 1): 0.9, (1, 0): 0.95, (2, 4): 0.6, (3, 2): 0.2, (4, 3): 0.7, (2, 1): 0.1, (0, 2): 0.85, (3, 4): 0.55}


def _mask(b: int, extra: list[tuple[int, int]]) -> torch.Tensor:
    m = torch.eye(b, dtype=torch.bool)
    for r, c in extra:
        m[r, c] = True
    return m


@pytest.fixture
def mined() -> tuple[ConnectionMining, StubJudge]:
    judge = StubJudge(SCORES)
    return connection_mining(SIM_I2T, SIM_T2I, judge), judge


# ----------------------------------------------------------------------------------- ECM decisions


def test_masks_partners_labels_mlm_and_counts(mined):
    res, _ = mined
    # image anchors 0 -> text 1 and 1 -> text 0 converted
    assert torch.equal(res.positive_mask_i2t, _mask(5, [(0, 1), (1, 0)]))
    # text anchors 0 -> image 1 and 2 -> image 0 converted (rows texts, columns images)
    assert torch.equal(res.positive_mask_t2i, _mask(5, [(0, 1), (2, 0)]))
    # not symmetrised: the t2i mask is not the transpose of the i2t one
    assert not torch.equal(res.positive_mask_t2i, res.positive_mask_i2t.t())
    assert res.positive_mask_i2t.dtype == torch.bool and res.positive_mask_t2i.dtype == torch.bool

    # ITM partners: k1 for converted / plain, k2 for ambiguous
    assert res.neg_text_for_image.tolist() == [1, 0, 3, 2, 1]
    assert res.neg_image_for_text.tolist() == [1, 2, 0, 2, 0]
    assert res.neg_text_for_image.dtype == torch.long and res.neg_image_for_text.dtype == torch.long
    assert res.hardest_text_for_image.tolist() == [1, 0, 4, 2, 3]
    assert res.hardest_image_for_text.tolist() == [1, 2, 0, 4, 3]

    # text-anchor block first, then image-anchor block
    assert res.neg_labels.tolist() == [1, 0, 1, 0, 0, 1, 1, 0, 0, 0]
    assert res.neg_labels.dtype == torch.long

    # (image 1, text 0) is converted from both sides (text 0 is image 1's hardest and image 1 text 0's): MAFA's
    # code appends one MLM row per conversion, so it joins the MLM set twice; sorted by (image, text)
    assert res.mlm_image_index.tolist() == [0, 0, 1, 1]
    assert res.mlm_text_index.tolist() == [1, 2, 0, 0]
    assert res.mlm_image_index.dtype == torch.long and res.mlm_text_index.dtype == torch.long

    assert res.counts() == {"converted_i2t": 2, "converted_t2i": 2, "swapped_i2t": 2, "swapped_t2i": 2}
    assert (res.converted_i2t, res.converted_t2i, res.swapped_i2t, res.swapped_t2i) == (2, 2, 2, 2)
    assert all(isinstance(c, int) for c in res.counts().values())

    assert torch.allclose(res.scores_i2t, torch.tensor([0.9, 0.95, 0.6, 0.2, 0.7]))
    assert torch.allclose(res.scores_t2i, torch.tensor([0.95, 0.1, 0.85, 0.7, 0.55]))
    assert res.scores_i2t.dtype == torch.float32


def test_distinct_mlm_pairs_add_a_pair_converted_both_ways_once(mined):
    """mlm_pairs=distinct (falcon's behaviour before the option) de-duplicates; nothing else changes."""
    twice, _ = mined
    once = connection_mining(SIM_I2T, SIM_T2I, StubJudge(SCORES), mlm_pairs="distinct")
    assert once.mlm_image_index.tolist() == [0, 0, 1] and once.mlm_text_index.tolist() == [1, 2, 0]
    assert once.mlm_image_index.dtype == torch.long and once.mlm_text_index.dtype == torch.long
    for name in ("positive_mask_i2t", "positive_mask_t2i", "neg_text_for_image", "neg_image_for_text", "neg_labels"):
        assert torch.equal(getattr(once, name), getattr(twice, name)), name
    assert once.counts() == twice.counts()
    with pytest.raises(ValueError, match="mlm_pairs must be one of per_direction, distinct"):
        connection_mining(SIM_I2T, SIM_T2I, StubJudge(SCORES), mlm_pairs="once")


def test_score_called_once_with_the_2b_hardest_candidates(mined):
    _, judge = mined
    assert len(judge.calls) == 1
    images, texts = judge.calls[0]
    # image anchors (b, k1_i2t[b]) then text anchors (k1_t2i[b], b)
    assert images == [0, 1, 2, 3, 4, 1, 2, 0, 4, 3]
    assert texts == [1, 0, 4, 2, 3, 0, 1, 2, 3, 4]


def test_queue_extended_columns_are_ignored(mined):
    res, _ = mined
    extra = torch.full((5, 3), 100.0)  # queue columns more similar than anything in the batch
    res_q = connection_mining(torch.cat([SIM_I2T, extra], 1), torch.cat([SIM_T2I, extra], 1), StubJudge(SCORES))
    for name in (
        "positive_mask_i2t",
        "positive_mask_t2i",
        "neg_text_for_image",
        "neg_image_for_text",
        "neg_labels",
        "mlm_image_index",
        "mlm_text_index",
    ):
        assert torch.equal(getattr(res_q, name), getattr(res, name)), name


def test_similarities_keep_their_gradient_untouched():
    s_i2t, s_t2i = SIM_I2T.clone().requires_grad_(True), SIM_T2I.clone().requires_grad_(True)
    res = connection_mining(s_i2t, s_t2i, StubJudge(SCORES))
    assert not res.positive_mask_i2t.requires_grad and not res.scores_i2t.requires_grad
    assert res.neg_text_for_image.tolist() == [1, 0, 3, 2, 1]


def test_ties_go_to_the_lower_index():
    sim = torch.tensor([[9.0, 3.0, 3.0, 3.0], [3.0, 9.0, 3.0, 3.0], [3.0, 3.0, 9.0, 3.0], [3.0, 3.0, 3.0, 9.0]])
    judge = StubJudge({}, default=0.6)  # all ambiguous: partner is the second-lowest off-diagonal index
    res = connection_mining(sim, sim, judge)
    assert res.hardest_text_for_image.tolist() == [1, 0, 0, 0]
    assert res.neg_text_for_image.tolist() == [2, 2, 1, 1]
    assert res.neg_image_for_text.tolist() == [2, 2, 1, 1]
    assert res.swapped_i2t == res.swapped_t2i == 4 and res.converted_i2t == res.converted_t2i == 0


# ----------------------------------------------------------------------------------- ITC


def test_itc_targets_are_half_half_on_converted_rows(mined):
    res, _ = mined
    t_i2t = row_normalised_targets(res.positive_mask_i2t, 5, torch.device("cpu"))
    t_t2i = row_normalised_targets(res.positive_mask_t2i, 5, torch.device("cpu"))
    exp_i2t = torch.eye(5)
    exp_i2t[0] = torch.tensor([0.5, 0.5, 0, 0, 0])
    exp_i2t[1] = torch.tensor([0.5, 0.5, 0, 0, 0])
    exp_t2i = torch.eye(5)
    exp_t2i[0] = torch.tensor([0.5, 0.5, 0, 0, 0])
    exp_t2i[2] = torch.tensor([0.5, 0, 0.5, 0, 0])
    assert torch.allclose(t_i2t, exp_i2t) and torch.allclose(t_t2i, exp_t2i)
    smoothed = row_normalised_targets(res.positive_mask_t2i, 5, torch.device("cpu"), smoothing(3))
    assert torch.allclose(smoothed, 0.5 * exp_t2i + 0.1)


@pytest.mark.parametrize("epoch", [0, 1])
def test_itc_grit_loss_matches_hand_computed_ce(mined, epoch):
    res, _ = mined
    g = torch.Generator().manual_seed(0)
    v = F.normalize(torch.randn(5, 8, generator=g), dim=1)
    t = F.normalize(torch.randn(5, 8, generator=g), dim=1)
    eps = smoothing(epoch)
    out = itc_grit(
        v,
        t,
        0.07,
        consistency_weight=0.0,
        positive_mask=res.positive_mask_i2t,
        positive_mask_t2i=res.positive_mask_t2i,
        label_smoothing=eps,
    )
    logp_i2t = F.log_softmax(v @ t.t() / 0.07, dim=1)
    logp_t2i = F.log_softmax(t @ v.t() / 0.07, dim=1)

    def row_ce(logp, row, positives):
        target = torch.full((5,), eps / 5)
        for c in positives:
            target[c] += (1 - eps) / len(positives)
        return -(target * logp[row]).sum()

    pos_i2t = {0: [0, 1], 1: [0, 1], 2: [2], 3: [3], 4: [4]}
    pos_t2i = {0: [0, 1], 1: [1], 2: [0, 2], 3: [3], 4: [4]}
    ce_i2t = sum(row_ce(logp_i2t, r, c) for r, c in pos_i2t.items()) / 5
    ce_t2i = sum(row_ce(logp_t2i, r, c) for r, c in pos_t2i.items()) / 5
    expected = (ce_i2t + ce_t2i) / 2
    assert torch.allclose(out.hard, expected, atol=1e-5)
    assert torch.allclose(out.loss, expected, atol=1e-5)


# ----------------------------------------------------------------------------------- ITM


def test_itm_labels_line_up_with_itm_pair_indices(mined):
    res, _ = mined
    pairs = itm_pair_indices(res.neg_text_for_image, res.neg_image_for_text)
    assert pairs.image_index.tolist() == [0, 1, 2, 3, 4, 1, 2, 0, 2, 0, 0, 1, 2, 3, 4]
    assert pairs.text_index.tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 1, 0, 3, 2, 1]
    neg_pairs = list(zip(pairs.image_index[5:].tolist(), pairs.text_index[5:].tolist()))
    labelled_pos = [p for p, y in zip(neg_pairs, res.neg_labels.tolist()) if y == 1]
    # text anchors 0 and 2, then image anchors 0 and 1: exactly the converted pairs
    assert labelled_pos == [(1, 0), (0, 2), (0, 1), (1, 0)]
    # every relabelled ITM pair is one the judge scored above the high threshold
    assert all(SCORES[p] > 0.8 for p in labelled_pos)
    assert all(SCORES.get(p, 0.0) <= 0.8 for p, y in zip(neg_pairs, res.neg_labels.tolist()) if y == 0)
    # the MLM set is the set of converted pairs
    assert set(labelled_pos) == set(zip(res.mlm_image_index.tolist(), res.mlm_text_index.tolist()))

    full = res.itm_pairs()
    assert torch.equal(full.image_index, pairs.image_index) and torch.equal(full.text_index, pairs.text_index)
    assert full.labels.tolist() == [1] * 5 + res.neg_labels.tolist()


def test_itm_loss_accepts_the_labels(mined):
    res, _ = mined
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(15, 2, generator=g)
    loss = itm_loss(logits[:5], logits[5:], neg_labels=res.neg_labels)
    labels = torch.tensor([1] * 5 + [1, 0, 1, 0, 0, 1, 1, 0, 0, 0])
    assert torch.allclose(loss, F.cross_entropy(logits, labels))
    assert not torch.allclose(loss, itm_loss(logits[:5], logits[5:]))


# ----------------------------------------------------------------------------------- thresholds, edge cases


def _b4_sims() -> tuple[torch.Tensor, torch.Tensor]:
    # i2t (k1, k2): 0:(1,2) 1:(2,3) 2:(3,0) 3:(0,1); t2i is the same matrix
    s = torch.tensor([[9.0, 5.0, 4.0, 0.0], [0.0, 9.0, 5.0, 4.0], [4.0, 0.0, 9.0, 5.0], [5.0, 4.0, 0.0, 9.0]])
    return s, s.clone()


def test_scores_exactly_at_thresholds_are_plain_negatives():
    s_i2t, s_t2i = _b4_sims()
    # image anchors' hardest: (0,1) (1,2) (2,3) (3,0); text anchors' hardest: (1,0) (2,1) (3,2) (0,3)
    table = {
        (0, 1): 0.8,
        (1, 2): 0.5,
        (2, 3): 0.8000001,
        (3, 0): 0.5000001,
        (1, 0): 0.7999999,
        (2, 1): 0.4999999,
        (3, 2): 1.0,
        (0, 3): 0.0,
    }
    res = connection_mining(s_i2t, s_t2i, StubJudge(table))
    # p == high and p == low -> k1, label 0; just above high -> converted; just above low -> k2
    assert res.neg_text_for_image.tolist() == [1, 2, 3, 1]
    assert res.neg_labels[4:].tolist() == [0, 0, 1, 0]
    assert torch.equal(res.positive_mask_i2t, _mask(4, [(2, 3)]))
    assert (res.converted_i2t, res.swapped_i2t) == (1, 1)
    # text anchors: just below high -> k2; just below low -> k1; 1.0 -> converted; 0.0 -> k1
    assert res.neg_image_for_text.tolist() == [2, 2, 3, 0]
    assert res.neg_labels[:4].tolist() == [0, 0, 1, 0]
    assert torch.equal(res.positive_mask_t2i, _mask(4, [(2, 3)]))
    assert (res.converted_t2i, res.swapped_t2i) == (1, 1)
    assert res.mlm_image_index.tolist() == [2, 3] and res.mlm_text_index.tolist() == [3, 2]


def test_custom_thresholds_and_empty_ambiguous_band():
    s_i2t, s_t2i = _b4_sims()
    judge = StubJudge({}, default=0.9)
    res = connection_mining(s_i2t, s_t2i, judge, high=0.98, low=0.5)  # FALCON's COCO setting
    assert res.converted_i2t == res.converted_t2i == 0 and res.swapped_i2t == res.swapped_t2i == 4
    assert res.neg_text_for_image.tolist() == [2, 3, 0, 1]
    res = connection_mining(s_i2t, s_t2i, judge, high=0.9, low=0.9)  # empty band, p == high
    assert res.counts() == {"converted_i2t": 0, "converted_t2i": 0, "swapped_i2t": 0, "swapped_t2i": 0}
    assert res.neg_text_for_image.tolist() == [1, 2, 3, 0] and res.neg_labels.sum() == 0
    assert res.mlm_image_index.numel() == 0 and res.mlm_text_index.numel() == 0
    assert res.mlm_image_index.dtype == torch.long


def test_batch_of_two_has_no_second_hardest():
    sim = torch.tensor([[5.0, 1.0], [1.0, 5.0]])
    # image 0 / text 1 pair ambiguous from both sides; image 1 / text 0 converted from both sides
    judge = StubJudge({(0, 1): 0.7, (1, 0): 0.9})
    res = connection_mining(sim, sim, judge)
    assert len(judge.calls) == 1 and judge.calls[0] == ([0, 1, 1, 0], [1, 0, 0, 1])
    assert res.neg_text_for_image.tolist() == [1, 0] and res.neg_image_for_text.tolist() == [1, 0]
    assert res.swapped_i2t == res.swapped_t2i == 0
    assert res.converted_i2t == res.converted_t2i == 1
    # ITM order: text anchors (image 1, text 0) conv, (image 0, text 1) plain; image anchors likewise
    assert res.neg_labels.tolist() == [1, 0, 0, 1]
    assert torch.equal(res.positive_mask_i2t, _mask(2, [(1, 0)]))
    assert torch.equal(res.positive_mask_t2i, _mask(2, [(0, 1)]))
    assert res.mlm_image_index.tolist() == [1, 1] and res.mlm_text_index.tolist() == [0, 0]  # once per direction
    once = connection_mining(sim, sim, StubJudge({(0, 1): 0.7, (1, 0): 0.9}), mlm_pairs="distinct")
    assert once.mlm_image_index.tolist() == [1] and once.mlm_text_index.tolist() == [0]


def _loop_reference(s_i2t, s_t2i, p_of, high, low):
    """Plain per-anchor implementation of methods.md §2.2 (with p == threshold -> k1 negative)."""
    b = s_i2t.shape[0]
    out = {
        "mask_i2t": torch.eye(b, dtype=torch.bool),
        "mask_t2i": torch.eye(b, dtype=torch.bool),
        "neg_t": [],
        "neg_i": [],
        "lab_i2t": [],
        "lab_t2i": [],
        "mlm": [],
        "swap_i2t": 0,
        "swap_t2i": 0,
    }
    for direction, s in (("i2t", s_i2t), ("t2i", s_t2i)):
        for a in range(b):
            cands = sorted((j for j in range(b) if j != a), key=lambda j: (-float(s[a, j]), j))
            k1, k2 = cands[0], cands[1] if len(cands) > 1 else cands[0]
            pair = (a, k1) if direction == "i2t" else (k1, a)
            p = p_of(*pair)
            partner, label = k1, 0
            if p > high:
                out[f"mask_{direction}"][a, k1] = True
                label = 1
                out["mlm"].append(pair)  # MAFA's code: one MLM row per conversion
            elif low < p < high and len(cands) > 1:
                partner = k2
                out[f"swap_{direction}"] += 1
            out["neg_t" if direction == "i2t" else "neg_i"].append(partner)
            out[f"lab_{direction}"].append(label)
    return out


@pytest.mark.parametrize("mlm_pairs", ["per_direction", "distinct"])
@pytest.mark.parametrize("b,seed", [(3, 0), (7, 1), (12, 2)])
def test_matches_loop_reference_on_random_batches(b, seed, mlm_pairs):
    g = torch.Generator().manual_seed(seed)
    s_i2t, s_t2i = torch.randn(b, b, generator=g), torch.randn(b, b, generator=g)
    table = torch.rand(b, b, generator=g)
    res = connection_mining(s_i2t, s_t2i, lambda i, t: table[i, t], high=0.7, low=0.3, mlm_pairs=mlm_pairs)
    ref = _loop_reference(s_i2t, s_t2i, lambda i, t: float(table[i, t]), 0.7, 0.3)
    assert torch.equal(res.positive_mask_i2t, ref["mask_i2t"]) and torch.equal(res.positive_mask_t2i, ref["mask_t2i"])
    assert res.neg_text_for_image.tolist() == ref["neg_t"] and res.neg_image_for_text.tolist() == ref["neg_i"]
    assert res.neg_labels.tolist() == ref["lab_t2i"] + ref["lab_i2t"]
    mlm = sorted(ref["mlm"]) if mlm_pairs == "per_direction" else sorted(set(ref["mlm"]))
    assert list(zip(res.mlm_image_index.tolist(), res.mlm_text_index.tolist())) == mlm
    assert (res.swapped_i2t, res.swapped_t2i) == (ref["swap_i2t"], ref["swap_t2i"])
    assert res.converted_i2t == sum(ref["lab_i2t"]) and res.converted_t2i == sum(ref["lab_t2i"])


# ----------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"high": 1.5}, "high"),
        ({"high": -0.1}, "high"),
        ({"low": -0.1}, "low"),
        ({"low": 1.2}, "low"),
        ({"low": math.nan}, "low"),
        ({"high": math.nan}, "high"),
        ({"high": 0.4, "low": 0.5}, "low must not exceed high"),
        ({"high": "x"}, "high"),
    ],
)
def test_invalid_thresholds_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        connection_mining(SIM_I2T, SIM_T2I, StubJudge(SCORES), **kwargs)


def test_invalid_shapes_and_score_raise():
    judge = StubJudge(SCORES)
    with pytest.raises(ValueError, match="sim_i2t"):
        connection_mining(SIM_I2T[0], SIM_T2I, judge)
    with pytest.raises(ValueError, match="same B"):
        connection_mining(SIM_I2T, SIM_T2I[:4], judge)
    with pytest.raises(ValueError, match="at least 2"):
        connection_mining(SIM_I2T[:1, :1], SIM_T2I[:1, :1], judge)
    with pytest.raises(ValueError, match="sim_t2i needs at least B=5 columns"):
        connection_mining(SIM_I2T, SIM_T2I[:, :4], judge)
    with pytest.raises(ValueError, match="score must be callable"):
        connection_mining(SIM_I2T, SIM_T2I, None)
    with pytest.raises(ValueError, match="score must return 2B=10"):
        connection_mining(SIM_I2T, SIM_T2I, lambda i, t: torch.zeros(5))
    assert judge.calls == []


# ----------------------------------------------------------------------------------- S-ITC schedule


def test_smoothing_schedule():
    assert smoothing(0) == 0.0
    assert smoothing(1) == 0.5 and smoothing(19) == 0.5
    assert smoothing(0, 0.2) == 0.0 and smoothing(5, 0.2) == 0.2
    assert isinstance(smoothing(2), float)
    for bad in ({"epoch": -1}, {"epoch": 1.5}, {"epoch": True}):
        with pytest.raises(ValueError, match="epoch"):
            smoothing(**bad)
    for alpha in (-0.1, 1.1, math.nan):
        with pytest.raises(ValueError, match="alpha"):
            smoothing(1, alpha)
