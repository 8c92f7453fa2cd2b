"""Reweighted in-batch ITC (DiHT HN-NCE, SRCL) against plain InfoNCE and loop-based float64 references."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from falcon_cli.objectives import itc_grit
from falcon_cli.objectives.reweighted_itc import itc_hn_nce, itc_srcl, srcl_mix, srcl_weights


def _feats(b=6, d=8, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    v = F.normalize(torch.randn(b, d, generator=g, dtype=torch.float64), dim=1).to(dtype)
    t = F.normalize(torch.randn(b, d, generator=g, dtype=torch.float64), dim=1).to(dtype)
    return v, t


def _infonce(v, t, tau):
    """Plain InfoNCE (CE against the identity), directions averaged."""
    labels = torch.arange(v.shape[0])
    return (F.cross_entropy(v @ t.t() / tau, labels) + F.cross_entropy(t @ v.t() / tau, labels)) / 2


# ----------------------------------------------------------------------------------- references


def _ref_direction(logits, weights, alpha=1.0):
    """-1/N sum_i log[exp(l_ii) / (alpha exp(l_ii) + sum_{j != i} w_ij exp(l_ij))], explicit loops, float64."""
    n = len(logits)
    total = 0.0
    for i in range(n):
        den = alpha * math.exp(logits[i][i])
        for j in range(n):
            if j != i:
                den += weights[i][j] * math.exp(logits[i][j])
        total += -math.log(math.exp(logits[i][i]) / den)
    return total / n


def _ref_weights(scores):
    """w_ij = (N - 1) exp(s_ij) / sum_{k != i} exp(s_ik) for j != i (diagonal 0), explicit loops."""
    n = len(scores)
    w = [[0.0] * n for _ in range(n)]
    for i in range(n):
        z = sum(math.exp(scores[i][k]) for k in range(n) if k != i)
        for j in range(n):
            if j != i:
                w[i][j] = (n - 1) * math.exp(scores[i][j]) / z
    return w


def _matmul(a, b):
    """a @ b^T for lists of rows, explicit loops."""
    return [[sum(x * y for x, y in zip(ra, rb)) for rb in b] for ra in a]


def _rows(x):
    return x.detach().double().tolist()


def _ref_hn_nce(v, t, tau, beta_i2t, beta_t2i, alpha):
    cos_i2t = _matmul(_rows(v), _rows(t))
    cos_t2i = _matmul(_rows(t), _rows(v))
    out = 0.0
    for cos, beta in ((cos_i2t, beta_i2t), (cos_t2i, beta_t2i)):
        logits = [[c / tau for c in row] for row in cos]
        w = _ref_weights([[beta * x for x in row] for row in logits])
        out += _ref_direction(logits, w, alpha)
    return out / 2


def _ref_srcl_weights(v, t, av, at, mix, delta):
    cur = _matmul(_rows(v), _rows(t))
    aux = _matmul(_rows(av), _rows(at))
    n = len(cur)
    mixed = [[mix * aux[i][j] + (1 - mix) * cur[i][j] for j in range(n)] for i in range(n)]
    mixed_t = [[mixed[j][i] for j in range(n)] for i in range(n)]
    return (
        _ref_weights([[-delta * x for x in row] for row in mixed]),
        _ref_weights([[-delta * x for x in row] for row in mixed_t]),
    )


def _ref_srcl(v, t, av, at, tau, mix, delta):
    w_i2t, w_t2i = _ref_srcl_weights(v, t, av, at, mix, delta)
    logits_i2t = [[c / tau for c in row] for row in _matmul(_rows(v), _rows(t))]
    logits_t2i = [[c / tau for c in row] for row in _matmul(_rows(t), _rows(v))]
    return (_ref_direction(logits_i2t, w_i2t) + _ref_direction(logits_t2i, w_t2i)) / 2


def _aux(b=6, d=5, seed=1):
    return _feats(b, d, seed)


# ----------------------------------------------------------------------------------- HN-NCE


def test_hn_nce_neutral_is_infonce():
    v, t = _feats()
    out = itc_hn_nce(v, t, 0.07, beta_i2t=0.0, beta_t2i=0.0, alpha=1.0)
    torch.testing.assert_close(out.hard, _infonce(v, t, 0.07), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out.loss, out.hard)
    grit = itc_grit(v, t, 0.07, consistency_weight=0.0)
    torch.testing.assert_close(out.hard, grit.hard, rtol=1e-6, atol=1e-6)
    assert out.sim_i2t.shape == (6, 6) and out.sim_i2t.dtype == torch.float32
    torch.testing.assert_close(out.sim_i2t, grit.sim_i2t)
    torch.testing.assert_close(out.sim_t2i, grit.sim_t2i)


@pytest.mark.parametrize("detach", [True, False])
@pytest.mark.parametrize("beta_i2t,beta_t2i,alpha", [(0.5, 0.5, 1.0), (1.0, 0.25, 0.999), (0.3, 0.0, 0.5)])
def test_hn_nce_matches_loop_reference(beta_i2t, beta_t2i, alpha, detach):
    v, t = _feats(seed=3)
    tau = 0.1
    out = itc_hn_nce(
        v.double(), t.double(), tau, beta_i2t=beta_i2t, beta_t2i=beta_t2i, alpha=alpha, detach_weights=detach
    )
    ref = _ref_hn_nce(v, t, tau, beta_i2t, beta_t2i, alpha)
    assert out.hard.item() == pytest.approx(ref, rel=1e-5, abs=1e-6)
    if alpha == 1.0:  # beta > 0 up-weights hard negatives (Chebyshev): the loss exceeds InfoNCE
        assert out.hard.item() > _infonce(v, t, tau).item()


def test_hn_nce_consistency_term_matches_grit():
    v, t = _feats(seed=4)
    grit = itc_grit(v, t, 0.07, consistency_weight=0.2)
    out = itc_hn_nce(v, t, 0.07, beta_i2t=0.0, beta_t2i=0.0, consistency_weight=0.2)
    torch.testing.assert_close(out.soft, grit.soft)
    torch.testing.assert_close(out.loss, grit.loss, rtol=1e-6, atol=1e-6)
    hn = itc_hn_nce(v, t, 0.07, consistency_weight=0.2)
    torch.testing.assert_close(hn.loss, hn.hard + 0.2 * hn.soft)
    torch.testing.assert_close(hn.soft, grit.soft)


def test_hn_nce_detach_changes_gradient_not_value():
    v, t = _feats(seed=5)
    grads = []
    for detach in (True, False):
        vv = v.clone().requires_grad_(True)
        out = itc_hn_nce(vv, t, 0.1, beta_i2t=1.0, detach_weights=detach)
        out.loss.backward()
        grads.append((out.loss.detach(), vv.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0])
    assert not torch.allclose(grads[0][1], grads[1][1])


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"alpha": 0.0}, "alpha"),
        ({"alpha": 1.5}, "alpha"),
        ({"beta_i2t": -0.1}, "beta_i2t"),
        ({"beta_t2i": -1.0}, "beta_t2i"),
        ({"beta_i2t": float("nan")}, "beta_i2t"),
    ],
)
def test_hn_nce_validates_arguments(kwargs, name):
    v, t = _feats()
    with pytest.raises(ValueError, match=name):
        itc_hn_nce(v, t, 0.07, **kwargs)


def test_batch_size_and_shape_validation():
    v, t = _feats(b=1)
    with pytest.raises(ValueError, match="B"):
        itc_hn_nce(v, t, 0.07)
    with pytest.raises(ValueError, match="B"):
        itc_srcl(v, t, 0.07, aux_image_feat=v, aux_text_feat=t, mix=1.0)
    v, t = _feats()
    with pytest.raises(ValueError):
        itc_hn_nce(v, t[:5], 0.07)
    av, at = _aux(b=5)
    with pytest.raises(ValueError, match="auxiliary"):
        itc_srcl(v, t, 0.07, aux_image_feat=av, aux_text_feat=at, mix=1.0)


# ----------------------------------------------------------------------------------- SRCL


def test_srcl_delta_zero_is_infonce():
    v, t = _feats()
    av, at = _aux()
    out = itc_srcl(v, t, 0.07, aux_image_feat=av, aux_text_feat=at, mix=0.3, delta=0.0)
    torch.testing.assert_close(out.hard, _infonce(v, t, 0.07), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out.loss, out.hard)


@pytest.mark.parametrize("mix,delta", [(1.0, 1.0), (0.5, 3.0), (0.0, 10.0), (0.2, 0.5)])
def test_srcl_matches_loop_reference(mix, delta):
    v, t = _feats(seed=7)
    av, at = _aux(seed=8)
    tau = 0.1
    out = itc_srcl(v.double(), t.double(), tau, aux_image_feat=av, aux_text_feat=at, mix=mix, delta=delta)
    assert out.hard.item() == pytest.approx(_ref_srcl(v, t, av, at, tau, mix, delta), rel=1e-5, abs=1e-6)
    w_i2t, w_t2i = srcl_weights(v, t, aux_image_feat=av, aux_text_feat=at, mix=mix, delta=delta)
    ref_i2t, ref_t2i = _ref_srcl_weights(v, t, av, at, mix, delta)
    torch.testing.assert_close(w_i2t.double(), torch.tensor(ref_i2t, dtype=torch.float64), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w_t2i.double(), torch.tensor(ref_t2i, dtype=torch.float64), rtol=1e-5, atol=1e-6)


def test_srcl_downweights_near_duplicate_negative():
    v, t = _feats()
    av, at = _aux()
    at = at.clone()
    at[1] = F.normalize(av[0] + 0.01 * at[1], dim=0)  # text 1 describes image 0 too: a false negative
    w_i2t, w_t2i = srcl_weights(v, t, aux_image_feat=av, aux_text_feat=at, mix=1.0, delta=5.0)
    assert w_i2t[0, 1] < 1.0 and w_i2t[0, 1] == w_i2t[0, 1:].min()  # the smallest negative weight of row 0
    assert w_t2i[1, 0] < 1.0  # symmetric: for text anchor 1, image 0 is down-weighted
    off = ~torch.eye(6, dtype=torch.bool)
    torch.testing.assert_close(w_i2t[off].reshape(6, 5).mean(dim=1), torch.ones(6))
    torch.testing.assert_close(w_t2i[off].reshape(6, 5).mean(dim=1), torch.ones(6))
    assert (w_i2t.diagonal() == 0).all() and (w_t2i.diagonal() == 0).all()
    # the false negative's weight is lower with larger delta
    w_big, _ = srcl_weights(v, t, aux_image_feat=av, aux_text_feat=at, mix=1.0, delta=20.0)
    assert w_big[0, 1] < w_i2t[0, 1]
    # the loss is below InfoNCE when the down-weighted negative is a hard one for the current model
    vv = v.clone()
    t2 = t.clone()
    t2[1] = F.normalize(v[0] + 0.05 * t[1], dim=0)
    out = itc_srcl(vv, t2, 0.07, aux_image_feat=av, aux_text_feat=at, mix=1.0, delta=5.0)
    assert out.hard < _infonce(vv, t2, 0.07)


def test_srcl_mix_one_ignores_current_features_in_weights():
    v, t = _feats(seed=11)
    v2, t2 = _feats(seed=12)
    av, at = _aux(seed=13)
    w1 = srcl_weights(v, t, aux_image_feat=av, aux_text_feat=at, mix=1.0, delta=4.0)
    w2 = srcl_weights(v2, t2, aux_image_feat=av, aux_text_feat=at, mix=1.0, delta=4.0)
    torch.testing.assert_close(w1[0], w2[0])
    torch.testing.assert_close(w1[1], w2[1])
    # the loss with other current features uses the aux-only weights with the new logits
    ref_w_i2t, ref_w_t2i = _ref_srcl_weights(v, t, av, at, 1.0, 4.0)
    tau = 0.1
    logits_i2t = [[c / tau for c in row] for row in _matmul(_rows(v2), _rows(t2))]
    logits_t2i = [[c / tau for c in row] for row in _matmul(_rows(t2), _rows(v2))]
    ref = (_ref_direction(logits_i2t, ref_w_i2t) + _ref_direction(logits_t2i, ref_w_t2i)) / 2
    out = itc_srcl(v2.double(), t2.double(), tau, aux_image_feat=av, aux_text_feat=at, mix=1.0, delta=4.0)
    assert out.hard.item() == pytest.approx(ref, rel=1e-5, abs=1e-6)
    # with mix < 1 the current features do matter
    w3 = srcl_weights(v, t, aux_image_feat=av, aux_text_feat=at, mix=0.5, delta=4.0)
    w4 = srcl_weights(v2, t2, aux_image_feat=av, aux_text_feat=at, mix=0.5, delta=4.0)
    assert not torch.allclose(w3[0], w4[0])


def test_srcl_consistency_and_sims():
    v, t = _feats(seed=2)
    av, at = _aux()
    grit = itc_grit(v, t, 0.07, consistency_weight=0.2)
    out = itc_srcl(v, t, 0.07, aux_image_feat=av, aux_text_feat=at, mix=0.5, delta=2.0, consistency_weight=0.2)
    torch.testing.assert_close(out.soft, grit.soft)
    torch.testing.assert_close(out.loss, out.hard + 0.2 * out.soft)
    torch.testing.assert_close(out.sim_i2t, grit.sim_i2t)
    torch.testing.assert_close(out.sim_t2i, grit.sim_t2i)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"mix": -0.1}, "mix"),
        ({"mix": 1.1}, "mix"),
        ({"delta": -1.0}, "delta"),
        ({"delta": float("inf")}, "delta"),
    ],
)
def test_srcl_validates_arguments(kwargs, name):
    v, t = _feats()
    av, at = _aux()
    args = {"mix": 0.5, **kwargs}
    with pytest.raises(ValueError, match=name):
        itc_srcl(v, t, 0.07, aux_image_feat=av, aux_text_feat=at, **args)


def test_srcl_mix_schedule():
    assert srcl_mix(0, 100) == 1.0
    assert srcl_mix(50, 100) == pytest.approx(0.5)
    assert srcl_mix(100, 100) == 0.0
    assert srcl_mix(150, 100) == 0.0
    assert srcl_mix(0, 100, until=0.5) == 1.0
    assert srcl_mix(25, 100, until=0.5) == pytest.approx(0.5)
    assert srcl_mix(50, 100, until=0.5) == 0.0
    assert srcl_mix(80, 100, until=0.5) == 0.0
    values = [srcl_mix(s, 10) for s in range(12)]
    assert values == sorted(values, reverse=True)
    for bad, name in [((-1, 10), "step"), ((1.5, 10), "step"), ((0, 0), "total_steps")]:
        with pytest.raises(ValueError, match=name):
            srcl_mix(*bad)
    with pytest.raises(ValueError, match="until"):
        srcl_mix(0, 10, until=0.0)


# ----------------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("which", ["hn_nce", "hn_nce_nodetach", "srcl"])
def test_gradients_reach_features_and_temperature(which):
    v, t = _feats(seed=21)
    av, at = _aux(seed=22)
    v = v.clone().requires_grad_(True)
    t = t.clone().requires_grad_(True)
    tau = torch.tensor(0.07, requires_grad=True)
    if which == "srcl":
        out = itc_srcl(v, t, tau, aux_image_feat=av, aux_text_feat=at, mix=0.5, delta=3.0, consistency_weight=0.2)
    else:
        out = itc_hn_nce(
            v,
            t,
            tau,
            beta_i2t=0.5,
            beta_t2i=1.0,
            alpha=0.999,
            detach_weights=(which == "hn_nce"),
            consistency_weight=0.2,
        )
    out.loss.backward()
    for g in (v.grad, t.grad, tau.grad):
        assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0


def test_tiny_temperature_is_stable():
    v, t = _feats(seed=31)
    av, at = _aux()
    for out in (
        itc_hn_nce(v, t, 0.001, beta_i2t=1.0, beta_t2i=1.0, alpha=0.5),
        itc_srcl(v, t, 0.001, aux_image_feat=av, aux_text_feat=at, mix=0.5, delta=10.0),
    ):
        assert torch.isfinite(out.loss)
