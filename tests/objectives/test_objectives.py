"""Objectives (ITC / ITM / MLM) against plain, loop-based references written here."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from falcon_cli.errors import FalconError
from falcon_cli.objectives import (
    IGNORE_INDEX,
    MlmMask,
    MomentumQueue,
    alpha_ramp,
    copy_to_momentum,
    hardest_negatives,
    itc_grit,
    itc_momentum_distillation,
    itm_loss,
    itm_pair_indices,
    mlm_loss,
    momentum_update,
    positive_mask_from_ids,
    sample_negatives,
)


def _feats(b=5, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    v = F.normalize(torch.randn(b, d, generator=g, dtype=torch.float64), dim=1)
    t = F.normalize(torch.randn(b, d, generator=g, dtype=torch.float64), dim=1)
    return v, t


# ----------------------------------------------------------------------------------- references


def _dot(a, b):
    return sum(a[k] * b[k] for k in range(len(a)))


def _softmax(row):
    m = max(float(x.detach()) if torch.is_tensor(x) else float(x) for x in row)
    e = [torch.exp(x - m) for x in row]
    s = sum(e)
    return [x / s for x in e]


def _ce(target, logits_row):
    """-sum_k y_k log softmax(logits)_k, with explicit formulas."""
    m = max(float(x.detach()) if torch.is_tensor(x) else float(x) for x in logits_row)
    lse = m + torch.log(sum(torch.exp(x - m) for x in logits_row))
    return -sum(target[k] * (logits_row[k] - lse) for k in range(len(logits_row)))


def _ref_grit(v, t, v_sg, t_sg, tau, w, targets_i2t=None, targets_t2i=None):
    """Loop reference of methods.md §0; v_sg / t_sg are the stop-gradient copies.

    Returns (hard_i2t, hard_t2i, cons_i2t, cons_t2i) as scalars (means over anchors).
    """
    b = len(v)
    eye = [[1.0 if i == j else 0.0 for j in range(b)] for i in range(b)]
    targets_i2t = targets_i2t or eye
    targets_t2i = targets_t2i or eye
    s_i2t = [[_dot(v[i], t_sg[j]) / tau for j in range(b)] for i in range(b)]
    s_t2i = [[_dot(t[i], v_sg[j]) / tau for j in range(b)] for i in range(b)]
    p_i2t_sg = [[x.detach() for x in _softmax(row)] for row in s_i2t]
    p_t2i_sg = [[x.detach() for x in _softmax(row)] for row in s_t2i]
    hard_i2t = sum(_ce(targets_i2t[i], s_i2t[i]) for i in range(b)) / b
    hard_t2i = sum(_ce(targets_t2i[i], s_t2i[i]) for i in range(b)) / b
    cons_i2t = sum(_ce(p_t2i_sg[i], s_i2t[i]) for i in range(b)) / b
    cons_t2i = sum(_ce(p_i2t_sg[i], s_t2i[i]) for i in range(b)) / b
    return hard_i2t, hard_t2i, cons_i2t, cons_t2i


# ----------------------------------------------------------------------------------- ITC (GRIT)


def test_itc_grit_matches_loop_reference():
    v, t = _feats()
    tau = 0.07
    out = itc_grit(v, t, tau)
    hi, ht, ci, ct = _ref_grit(v, t, v, t, tau, 0.2)
    hard, cons = (hi + ht) / 2, (ci + ct) / 2
    assert torch.allclose(out.hard.double(), hard, atol=1e-5)
    assert torch.allclose(out.consistency.double(), cons, atol=1e-5)
    assert torch.allclose(out.loss.double(), hard + 0.2 * cons, atol=1e-5)
    assert out.consistency is out.soft
    # similarity logits are returned for ITM mining, in float32, rows = anchors
    assert out.sim_i2t.dtype == torch.float32 and out.sim_i2t.shape == (5, 5)
    assert torch.allclose(out.sim_i2t.double(), v @ t.T / tau, atol=1e-4)
    assert torch.allclose(out.sim_t2i.double(), t @ v.T / tau, atol=1e-4)
    # the consistency weight is honoured
    out0 = itc_grit(v, t, tau, consistency_weight=0.0)
    assert torch.allclose(out0.loss.double(), hard, atol=1e-5)
    # consistency term is a real, non-trivial quantity here (not equal to the hard part)
    assert abs(float(cons) - float(hard)) > 1e-3


def test_itc_grit_gradients_flow_only_to_the_anchor_modality():
    v0, t0 = _feats(b=4, d=6, seed=3)
    v0, t0 = v0.float(), t0.float()
    tau0 = torch.tensor(0.1)
    v, t = v0.clone().requires_grad_(), t0.clone().requires_grad_()
    tau = tau0.clone().requires_grad_()
    itc_grit(v, t, tau).loss.backward()

    # reference: image grads come only from the i2t terms with the texts constant;
    # text grads only from the t2i terms with the images constant.
    vr = v0.clone().double().requires_grad_()
    hi, _, ci, _ = _ref_grit(vr, t0.double(), vr.detach(), t0.double(), 0.1, 0.2)
    ((hi + 0.2 * ci) / 2).backward()
    tr = t0.clone().double().requires_grad_()
    _, ht, _, ct = _ref_grit(v0.double(), tr, v0.double(), tr.detach(), 0.1, 0.2)
    ((ht + 0.2 * ct) / 2).backward()
    assert torch.allclose(v.grad.double(), vr.grad, atol=1e-5)
    assert torch.allclose(t.grad.double(), tr.grad, atol=1e-5)

    # a reference WITHOUT the stop-gradient would differ (so the test can fail)
    vf, tf = v0.clone().double().requires_grad_(), t0.clone().double().requires_grad_()
    hi, ht, ci, ct = _ref_grit(vf, tf, vf, tf, 0.1, 0.2)
    ((hi + ht) / 2 + 0.2 * (ci + ct) / 2).backward()
    assert not torch.allclose(v.grad.double(), vf.grad, atol=1e-4)

    # the temperature gets gradient from both directions
    tau_r = torch.tensor(0.1, dtype=torch.float64, requires_grad=True)
    hi, ht, ci, ct = _ref_grit(v0.double(), t0.double(), v0.double(), t0.double(), tau_r, 0.2)
    ((hi + ht) / 2 + 0.2 * (ci + ct) / 2).backward()
    assert torch.allclose(tau.grad.double(), tau_r.grad, rtol=1e-4, atol=1e-5)


def test_itc_grit_identity_mask_equals_none_and_multi_positive_targets_row_normalised():
    v, t = _feats(b=4)
    base = itc_grit(v, t, 0.05)
    ident = itc_grit(v, t, 0.05, positive_mask=torch.eye(4, dtype=torch.bool))
    assert torch.allclose(base.loss, ident.loss) and torch.allclose(base.hard, ident.hard)
    # an all-False mask is also the identity (the diagonal is always positive)
    assert torch.allclose(base.loss, itc_grit(v, t, 0.05, positive_mask=torch.zeros(4, 4, dtype=torch.bool)).loss)

    mask = torch.eye(4, dtype=torch.bool)
    mask[0, 2] = True  # image 0 also matches text 2
    mask[1, 2] = mask[1, 3] = True
    out = itc_grit(v, t, 0.05, positive_mask=mask, consistency_weight=0.0)
    y = mask.double()
    y_i2t = (y / y.sum(1, keepdim=True)).tolist()
    y_t2i = (y.T / y.T.sum(1, keepdim=True)).tolist()
    assert y_i2t[1] == [0.0, 1 / 3, 1 / 3, 1 / 3]
    hi, ht, _, _ = _ref_grit(v, t, v, t, 0.05, 0.0, y_i2t, y_t2i)
    assert torch.allclose(out.hard.double(), (hi + ht) / 2, atol=1e-5)
    assert not torch.allclose(out.hard, base.hard)

    # direction-specific mask (MAFA) and label smoothing
    m_t2i = torch.eye(4, dtype=torch.bool)
    m_t2i[3, 0] = True
    out = itc_grit(v, t, 0.05, positive_mask=mask, positive_mask_t2i=m_t2i, label_smoothing=0.5, consistency_weight=0.0)
    yt = m_t2i.double()
    yt = yt / yt.sum(1, keepdim=True)
    y_i2t_s = [[0.5 * x + 0.5 / 4 for x in row] for row in y_i2t]
    y_t2i_s = [[0.5 * float(x) + 0.5 / 4 for x in row] for row in yt]
    hi, ht, _, _ = _ref_grit(v, t, v, t, 0.05, 0.0, y_i2t_s, y_t2i_s)
    assert torch.allclose(out.hard.double(), (hi + ht) / 2, atol=1e-5)


def test_itc_grit_bf16_autocast_computes_in_float32():
    v, t = _feats(b=6, d=16)
    v, t = v.float(), t.float()
    ref = itc_grit(v, t, 0.01)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = itc_grit(v, t, 0.01)
    assert out.loss.dtype == torch.float32 and out.sim_i2t.dtype == torch.float32
    assert torch.allclose(out.loss, ref.loss, atol=1e-5)


def test_itc_grit_rejects_bad_shapes():
    v, t = _feats(b=4)
    with pytest.raises(ValueError):
        itc_grit(v, t[:3], 0.07)
    with pytest.raises(ValueError):
        itc_grit(v, t, 0.07, positive_mask=torch.eye(3, dtype=torch.bool))


# ----------------------------------------------------------------------------------- momentum distillation


def test_momentum_distillation_matches_hand_computation():
    b, d, k = 3, 5, 6
    g = torch.Generator().manual_seed(1)
    v, t = _feats(b, d, seed=4)
    v, t = v.float(), t.float()
    v_m = F.normalize(v + 0.1 * torch.randn(b, d, generator=g), dim=1)
    t_m = F.normalize(t + 0.1 * torch.randn(b, d, generator=g), dim=1)
    q = MomentumQueue(d, k, generator=g)
    tau, alpha = 0.07, 0.4
    out = itc_momentum_distillation(v, t, v_m, t_m, q, tau, alpha)

    img_all = [v_m[i] for i in range(b)] + [q.image_queue[:, j] for j in range(k)]
    txt_all = [t_m[i] for i in range(b)] + [q.text_queue[:, j] for j in range(k)]
    n = b + k
    total = 0.0
    for anchors, anchors_m, cands in ((v, v_m, txt_all), (t, t_m, img_all)):
        direction = 0.0
        for i in range(b):
            s = [_dot(anchors[i], cands[j]) / tau for j in range(n)]
            s_m = [_dot(anchors_m[i], cands[j]) / tau for j in range(n)]
            p_m = _softmax(s_m)
            y = [alpha * p_m[j] + (1 - alpha) * (1.0 if j == i else 0.0) for j in range(n)]
            direction = direction + _ce(y, s) / b
        total = total + direction / 2
    assert out.sim_i2t.shape == (b, b + k)
    assert torch.allclose(out.loss, total, atol=1e-5)
    assert torch.allclose(out.loss, (1 - alpha) * out.hard + alpha * out.soft, atol=1e-6)


def test_momentum_distillation_alpha_zero_is_plain_infonce_and_momentum_gets_no_grad():
    b, d, k = 4, 6, 8
    v, t = _feats(b, d, seed=5)
    v, t = v.float().requires_grad_(), t.float()
    v_m, t_m = _feats(b, d, seed=6)
    v_m, t_m = v_m.float().requires_grad_(), t_m.float()
    q = MomentumQueue(d, k, generator=torch.Generator().manual_seed(2))
    out = itc_momentum_distillation(v, t, v_m, t_m, q, 0.1, 0.0)
    text_all = torch.cat([t_m.detach().T, q.text_queue], 1)
    img_all = torch.cat([v_m.detach().T, q.image_queue], 1)
    labels = torch.arange(b)
    ref = (F.cross_entropy(v @ text_all / 0.1, labels) + F.cross_entropy(t @ img_all / 0.1, labels)) / 2
    assert torch.allclose(out.loss, ref, atol=1e-6)
    out.loss.backward()
    assert v.grad is not None and v_m.grad is None
    # without a queue: in-batch only
    out = itc_momentum_distillation(v, t, v_m, t_m, None, 0.1, 0.0)
    assert out.sim_i2t.shape == (b, b)


def test_momentum_distillation_with_idx_queue_uses_id_positives():
    b, d, k = 2, 4, 4
    v, t = _feats(b, d, seed=7)
    v, t = v.float(), t.float()
    q = MomentumQueue(d, k, with_idx=True, generator=torch.Generator().manual_seed(0))
    q.enqueue(v, t, idx=torch.tensor([7, 9]))  # queue columns 0,1 now hold ids 7, 9
    out = itc_momentum_distillation(v, t, v, t, q, 0.2, 0.0, idx=torch.tensor([7, 8]))
    text_all = torch.cat([t.T, q.text_queue], 1)
    y0 = torch.tensor([1, 0, 1, 0, 0, 0.0]) / 2
    y1 = torch.tensor([0, 1, 0, 0, 0, 0.0])
    s = v @ text_all / 0.2
    ref_i2t = -(torch.stack([y0, y1]) * F.log_softmax(s, 1)).sum(1).mean()
    s = t @ torch.cat([v.T, q.image_queue], 1) / 0.2
    ref_t2i = -(torch.stack([y0, y1]) * F.log_softmax(s, 1)).sum(1).mean()
    assert torch.allclose(out.loss, (ref_i2t + ref_t2i) / 2, atol=1e-6)


def test_queue_enqueue_wraps_pointer_and_checks_divisibility():
    d, k, b = 3, 6, 2
    q = MomentumQueue(d, k, with_idx=True)
    batches = [
        (torch.full((b, d), float(s)), torch.full((b, d), -float(s)), torch.tensor([10 * s, 10 * s + 1]))
        for s in range(4)
    ]
    for s, (vi, ti, ii) in enumerate(batches):
        assert int(q.ptr) == (s * b) % k
        q.enqueue(vi, ti, ii)
    assert int(q.ptr) == (4 * b) % k == 2
    # batch 3 overwrote columns 0-1, batches 1 and 2 sit in columns 2-5
    assert q.image_queue[:, 0:2].eq(3.0).all() and q.text_queue[:, 0:2].eq(-3.0).all()
    assert q.image_queue[:, 2:4].eq(1.0).all() and q.image_queue[:, 4:6].eq(2.0).all()
    assert q.idx_queue.tolist() == [[30, 31, 10, 11, 20, 21]]
    assert q.ptr.dtype == torch.long
    sd = q.state_dict()
    assert set(sd) == {"image_queue", "text_queue", "idx_queue", "ptr"}
    with pytest.raises(FalconError, match="not a multiple"):
        q.enqueue(torch.zeros(4, d), torch.zeros(4, d), torch.zeros(4))


def test_momentum_update_is_ema_and_copy_freezes():
    torch.manual_seed(0)
    online, mom = nn.Linear(3, 2), nn.Linear(3, 2)
    copy_to_momentum(online, mom)
    assert all(not p.requires_grad for p in mom.parameters())
    assert torch.equal(online.weight, mom.weight)
    with torch.no_grad():
        online.weight.add_(1.0)
        online.bias.mul_(-2.0)
    old = [p.detach().clone() for p in mom.parameters()]
    new = [p.detach().clone() for p in online.parameters()]
    m = 0.9
    momentum_update(online, mom, m)
    for o, n_, p in zip(old, new, mom.parameters()):
        assert torch.allclose(p, m * o + (1 - m) * n_, atol=1e-7)
    assert online.weight.grad is None
    with pytest.raises(ValueError):
        momentum_update(online, nn.Linear(3, 2, bias=False), m)


def test_alpha_ramp():
    assert alpha_ramp(0.4, 0, 100, 0) == 0.0
    assert math.isclose(alpha_ramp(0.4, 25, 100, 0), 0.1)
    assert alpha_ramp(0.4, 150, 100, 0) == 0.4
    assert alpha_ramp(0.4, 0, 100, 1) == 0.4


# ----------------------------------------------------------------------------------- ITM


def _ref_hardest(sim, excluded):
    out = []
    for i, row in enumerate(sim.tolist()):
        best, best_j = -math.inf, None
        for j, s in enumerate(row[: len(sim)]):
            if j == i or excluded[i][j]:
                continue
            if s > best:
                best, best_j = s, j
        out.append(best_j)
    return out


def test_hardest_negatives_equals_loop_argmax_without_the_diagonal():
    g = torch.Generator().manual_seed(0)
    b = 7
    none = [[False] * b for _ in range(b)]
    for _ in range(5):
        sim_i2t = torch.randn(b, b, generator=g)
        sim_i2t += 5 * torch.eye(b)  # the diagonal is the most similar: must never be picked
        sim_t2i = sim_i2t.T.clone()
        neg_t, neg_i = hardest_negatives(sim_i2t, sim_t2i)
        assert neg_t.tolist() == _ref_hardest(sim_i2t, none)
        assert neg_i.tolist() == _ref_hardest(sim_t2i, none)
        assert (neg_t != torch.arange(b)).all() and (neg_i != torch.arange(b)).all()
    # queue-extended [B, B+K] sims: only the batch columns are candidates
    wide = torch.cat([sim_i2t, 100 + torch.zeros(b, 3)], 1)
    neg_t, _ = hardest_negatives(wide, wide)
    assert neg_t.tolist() == _ref_hardest(sim_i2t, none)


def test_hardest_negatives_respects_positive_mask_and_duplicates():
    b = 5
    sim = torch.arange(b * b, dtype=torch.float32).reshape(b, b)  # the last column is always hardest
    ids = torch.tensor([0, 1, 2, 3, 3])  # pairs 3 and 4 are duplicates
    mask = positive_mask_from_ids(ids)
    neg_t, neg_i = hardest_negatives(sim, sim, positive_mask=mask)
    ex = mask.tolist()
    assert neg_t.tolist() == _ref_hardest(sim, ex)
    assert neg_t.tolist() == [4, 4, 4, 2, 2]
    ex_t = mask.T.tolist()
    assert neg_i.tolist() == _ref_hardest(sim, ex_t)
    # the semantic mask is transposed for the t2i direction: image 0 matches text 1 ->
    # text 1 must not get image 0, and image 0 must not get text 1
    sim2 = torch.zeros(3, 3)
    sim2[0, 1] = sim2[1, 0] = 5.0
    m = torch.zeros(3, 3, dtype=torch.bool)
    m[0, 1] = True
    neg_t, neg_i = hardest_negatives(sim2, sim2, positive_mask=m)
    assert neg_t[0] != 1 and neg_i[1] != 0
    # a row with nothing left falls back to "anything but itself"
    neg_t, neg_i = hardest_negatives(sim[:2, :2], sim[:2, :2], positive_mask=torch.ones(2, 2, dtype=torch.bool))
    assert neg_t.tolist() == [1, 0] and neg_i.tolist() == [1, 0]
    with pytest.raises(ValueError):
        hardest_negatives(torch.zeros(1, 1), torch.zeros(1, 1))


def test_sample_negatives_never_samples_the_diagonal_and_is_reproducible():
    b = 4
    # a huge diagonal: softmax puts ~all mass there; zeroing the softmax prob must still exclude it
    sim = torch.randn(b, b, generator=torch.Generator().manual_seed(0)) + 50 * torch.eye(b)
    seen = torch.zeros(b, b, dtype=torch.long)
    g = torch.Generator().manual_seed(123)
    for _ in range(300):
        neg_t, neg_i = sample_negatives(sim, sim.T, g)
        assert (neg_t != torch.arange(b)).all() and (neg_i != torch.arange(b)).all()
        seen[torch.arange(b), neg_t] += 1
    assert (seen.diagonal() == 0).all()
    assert (seen.sum(1) == 300).all()
    a = sample_negatives(sim, sim.T, torch.Generator().manual_seed(7))
    c = sample_negatives(sim, sim.T, torch.Generator().manual_seed(7))
    assert torch.equal(a[0], c[0]) and torch.equal(a[1], c[1])
    # the weights follow the softmax: a dominant off-diagonal candidate is drawn most often
    sim = torch.zeros(b, b)
    sim[:, 2] = 6.0
    sim[2, 3] = 6.0
    counts = torch.zeros(b, dtype=torch.long)
    for _ in range(200):
        counts[sample_negatives(sim, sim, g)[0][0]] += 1
    assert counts[2] > 150


def test_sample_negatives_respects_positive_mask():
    b = 4
    mask = positive_mask_from_ids(torch.tensor([0, 0, 1, 2]))
    sim = torch.zeros(b, b)
    sim[0, 1] = sim[1, 0] = 30.0  # the duplicate would dominate
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        neg_t, neg_i = sample_negatives(sim, sim, g, positive_mask=mask)
        assert neg_t[0] != 1 and neg_t[1] != 0 and neg_i[0] != 1 and neg_i[1] != 0
        assert (neg_t != torch.arange(b)).all()


def test_itm_pair_indices_and_loss():
    neg_t = torch.tensor([2, 0, 1])
    neg_i = torch.tensor([1, 2, 0])
    pairs = itm_pair_indices(neg_t, neg_i)
    img, txt, lab = pairs.image_index.tolist(), pairs.text_index.tolist(), pairs.labels.tolist()
    assert list(zip(img, txt, lab)) == [
        (0, 0, 1),
        (1, 1, 1),
        (2, 2, 1),
        (1, 0, 0),
        (2, 1, 0),
        (0, 2, 0),
        (0, 2, 0),
        (1, 0, 0),
        (2, 1, 0),
    ]
    g = torch.Generator().manual_seed(0)
    pos = torch.randn(3, 2, generator=g, requires_grad=True)
    neg = torch.randn(6, 2, generator=g)
    loss = itm_loss(pos, neg)
    manual = 0.0
    for row, y in [(r, 1) for r in pos] + [(r, 0) for r in neg]:
        manual = manual - (row[y] - torch.log(torch.exp(row[0]) + torch.exp(row[1])))
    assert torch.allclose(loss, manual / 9, atol=1e-6)
    loss.backward()
    assert pos.grad is not None
    # MAFA-style relabelling of negatives
    nl = torch.tensor([0, 1, 0, 0, 0, 1])
    manual = 0.0
    for row, y in [(r, 1) for r in pos] + list(zip(neg, nl.tolist())):
        manual = manual - (row[y] - torch.log(torch.exp(row[0]) + torch.exp(row[1])))
    assert torch.allclose(itm_loss(pos, neg, neg_labels=nl), manual / 9, atol=1e-6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert itm_loss(pos.bfloat16(), neg.bfloat16()).dtype == torch.float32


# ----------------------------------------------------------------------------------- MLM

PAD, CLS, SEP, MASK, VOCAB = 0, 101, 102, 103, 1000


def _batch(b=64, length=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 30000, (b, length), generator=g) % VOCAB
    ids[ids < 200] += 200  # no accidental special tokens
    lengths = torch.randint(5, length + 1, (b,), generator=g)
    att = (torch.arange(length)[None] < lengths[:, None]).long()
    ids[:, 0] = CLS
    ids[torch.arange(b), lengths - 1] = SEP
    ids[att == 0] = PAD
    return ids, att


def _sample(ids, att, seed=0, p=0.5, **kw):
    g = torch.Generator().manual_seed(seed) if seed is not None else None
    return MlmMask.sample(
        ids,
        att,
        vocab_size=VOCAB,
        mask_token_id=MASK,
        pad_token_id=PAD,
        cls_token_id=CLS,
        probability=p,
        generator=g,
        **kw,
    )


def test_mlm_mask_never_masks_pad_or_cls_and_follows_the_rates():
    ids, att = _batch(b=400)
    m = _sample(ids, att)
    sel = m.labels != IGNORE_INDEX
    assert not sel[ids == PAD].any() and not sel[ids == CLS].any()
    assert torch.equal(m.masked_ids[~sel], ids[~sel])  # unselected tokens untouched
    assert torch.equal(m.labels[sel], ids[sel])  # labels are the originals
    assert sel[ids == SEP].any()  # [SEP] is maskable (GRIT/ALBEF)
    eligible = (ids != PAD) & (ids != CLS)
    frac = sel.sum().item() / eligible.sum().item()
    assert abs(frac - 0.5) < 0.02, frac
    n = sel.sum().item()
    to_mask = (m.masked_ids[sel] == MASK).sum().item() / n
    unchanged = (m.masked_ids[sel] == ids[sel]).sum().item() / n
    random_ = 1 - to_mask - unchanged
    assert abs(to_mask - 0.8) < 0.02 and abs(unchanged - 0.1) < 0.015 and abs(random_ - 0.1) < 0.015
    assert ((m.masked_ids >= 0) & (m.masked_ids < VOCAB)).all()
    # other probabilities
    m15 = _sample(ids, att, p=0.15)
    assert abs(m15.selected.sum().item() / eligible.sum().item() - 0.15) < 0.02
    assert not _sample(ids, att, p=0.0).selected.any()


def test_mlm_mask_respects_attention_mask_even_without_pad_ids():
    ids, att = _batch(b=50)
    ids2 = ids.clone()
    ids2[att == 0] = 500  # padding positions carry a normal id
    m = _sample(ids2, att, p=1.0)
    assert not m.selected[att == 0].any()
    assert m.selected[(att == 1) & (ids2 != CLS)].all()


def test_mlm_mask_is_deterministic_reusable_and_serialisable():
    ids, att = _batch(b=8)
    a, b = _sample(ids, att, seed=11), _sample(ids, att, seed=11)
    assert torch.equal(a.masked_ids, b.masked_ids) and torch.equal(a.labels, b.labels)
    c = _sample(ids, att, seed=12)
    assert not torch.equal(a.labels, c.labels)
    # reusing one mask object: the "before" and "after" forwards see identical inputs and labels
    emb = torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(0))
    before = mlm_loss(emb[a.masked_ids], a.labels)
    after = mlm_loss(emb[a.masked_ids], a.labels)
    assert torch.equal(before, after)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.labels = c.labels
    sd = a.state_dict()
    assert set(sd) == {"masked_ids", "labels"} and all(isinstance(x, torch.Tensor) for x in sd.values())
    r = MlmMask.from_state_dict(sd, device="cpu")
    assert torch.equal(r.masked_ids, a.masked_ids) and torch.equal(r.labels, a.labels)
    moved = a.to("cpu")
    assert torch.equal(moved.labels, a.labels)
    assert a.num_selected.tolist() == a.selected.sum(1).tolist()
    # input ids are not modified in place
    ids_before = ids.clone()
    _sample(ids, att, seed=3)
    assert torch.equal(ids, ids_before)


def test_mlm_loss_equals_manual_ce_over_masked_positions():
    b, length, v = 3, 6, 11
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(b, length, v, generator=g, requires_grad=True)
    labels = torch.full((b, length), IGNORE_INDEX)
    labels[0, 1], labels[0, 4], labels[1, 2], labels[2, 0], labels[2, 3], labels[2, 5] = 3, 7, 0, 10, 1, 1
    total, count, per = 0.0, 0, []
    for i in range(b):
        s_i, n_i = 0.0, 0
        for j in range(length):
            y = int(labels[i, j])
            if y == IGNORE_INDEX:
                continue
            row = logits[i, j]
            ce = -(row[y] - torch.log(sum(torch.exp(row[k]) for k in range(v))))
            s_i, n_i = s_i + ce, n_i + 1
        total, count = total + s_i, count + n_i
        per.append(s_i / n_i)
    loss = mlm_loss(logits, labels)
    assert torch.allclose(loss, total / count, atol=1e-5)
    ps = mlm_loss(logits, labels, per_sample=True)
    assert ps.shape == (b,)
    assert torch.allclose(ps, torch.stack(per), atol=1e-5)
    n_b = (labels != IGNORE_INDEX).sum(1).float()
    assert torch.allclose((ps * n_b).sum() / n_b.sum(), loss, atol=1e-6)
    # the same as transformers' BertForMaskedLM reduction
    assert torch.allclose(loss, F.cross_entropy(logits.reshape(-1, v), labels.reshape(-1)), atol=1e-6)
    loss.backward()
    assert logits.grad[1, 0].abs().sum() == 0 and logits.grad[0, 1].abs().sum() > 0


def test_mlm_loss_edge_cases_and_bf16():
    logits = torch.randn(2, 4, 5, requires_grad=True)
    labels = torch.full((2, 4), IGNORE_INDEX)
    assert mlm_loss(logits, labels).item() == 0.0
    labels[0, 0] = 2
    ps = mlm_loss(logits, labels, per_sample=True)
    assert ps[1].item() == 0.0 and torch.isfinite(ps).all()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mlm_loss(logits.bfloat16(), labels)
    assert out.dtype == torch.float32
    with pytest.raises(ValueError):
        mlm_loss(logits, labels[:, :3])


def test_mlm_mask_excludes_pad_ids_without_attention_mask():
    ids, _ = _batch(b=50)
    m = MlmMask.sample(
        ids,
        None,
        vocab_size=VOCAB,
        mask_token_id=MASK,
        pad_token_id=PAD,
        cls_token_id=CLS,
        probability=1.0,
        generator=torch.Generator().manual_seed(0),
    )
    assert not m.selected[ids == PAD].any() and not m.selected[ids == CLS].any()
    assert m.selected[(ids != PAD) & (ids != CLS)].all()


# ----------------------------------------------------------------------------------- CUDA (skipped without a GPU)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
def test_cuda_objectives_match_cpu_and_are_autocast_safe():
    dev = torch.device("cuda")
    v, t = _feats(b=16, d=32, seed=9)
    v, t = v.float(), t.float()
    ref = itc_grit(v, t, 0.02)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = itc_grit(v.to(dev).bfloat16(), t.to(dev).bfloat16(), torch.tensor(0.02, device=dev))
        neg = hardest_negatives(out.sim_i2t, out.sim_t2i)
        smp = sample_negatives(out.sim_i2t, out.sim_t2i, torch.Generator(dev).manual_seed(0))
    assert out.loss.dtype == torch.float32 and out.sim_i2t.dtype == torch.float32
    assert torch.allclose(out.loss.cpu(), ref.loss, atol=0.05)  # bf16 inputs, fp32 math
    for a in (*neg, *smp):
        assert a.device.type == "cuda" and (a.cpu() != torch.arange(16)).all()
    q = MomentumQueue(32, 64).to(dev)
    md = itc_momentum_distillation(v.to(dev), t.to(dev), v.to(dev), t.to(dev), q, 0.07, 0.4)
    q.enqueue(v.to(dev), t.to(dev))
    assert md.sim_i2t.shape == (16, 80) and int(q.ptr) == 16
    ids, att = _batch(b=8)
    m_cpu = _sample(ids, att, seed=5)
    m_gpu = _sample(ids.to(dev), att.to(dev), seed=5)  # CPU generator, CUDA batch: same mask
    assert m_gpu.labels.device.type == "cuda"
    assert torch.equal(m_gpu.labels.cpu(), m_cpu.labels) and torch.equal(m_gpu.masked_ids.cpu(), m_cpu.masked_ids)
    logits = torch.randn(8, ids.shape[1], VOCAB, device=dev)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        l_gpu = mlm_loss(logits.bfloat16(), m_gpu.labels)
    assert l_gpu.dtype == torch.float32
    assert torch.allclose(mlm_loss(logits, m_gpu.labels).cpu(), mlm_loss(logits.cpu(), m_cpu.labels), atol=1e-4)
