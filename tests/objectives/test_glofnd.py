"""GloFND thresholds and the filtered ITC against hand-written references (methods.md §4)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from falcon_cli.errors import FalconError
from falcon_cli.method_rules import DENSE, TUNED, method_settings
from falcon_cli.objectives import itc_grit
from falcon_cli.objectives.false_negatives import Glofnd, StepContext
from falcon_cli.objectives.glofnd import (
    GlofndThresholds,
    cosine_matrices,
    glofnd_active,
    glofnd_drop_masks,
    itc_glofnd,
)

STATE = ("lambda_image", "m_image", "v_image", "step_image", "lambda_text", "m_text", "v_text", "step_text")
IDS = [1000 + 7 * k for k in range(20)][::-1]  # not contiguous, not sorted


def _feats(b=6, d=4, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    v = F.normalize(torch.randn(b, d, generator=g, dtype=dtype), dim=1)
    t = F.normalize(torch.randn(b, d, generator=g, dtype=dtype), dim=1)
    return v, t


def _cos(b, seed):
    v, t = _feats(b, 8, seed)
    cos = v @ t.t()
    return cos, cos.t().contiguous()


def _snapshot(th, rows):
    return {name: getattr(th, name)[rows].clone() for name in STATE}


# ----------------------------------------------------------------------------------- thresholds


def test_buffers_init_and_lookup():
    th = GlofndThresholds(IDS, alpha=0.1)
    assert set(dict(th.named_buffers())) == {"ids", "adam_step_by_epoch", *STATE}
    assert set(th.state_dict()) == {"ids", "adam_step_by_epoch", *STATE}
    assert th.adam_step == "epoch" and bool(th.adam_step_by_epoch)  # the authors' bias correction by default
    assert torch.equal(th.ids, torch.tensor(sorted(IDS)))
    assert torch.equal(th.lambda_image, torch.ones(20)) and torch.equal(th.lambda_text, torch.ones(20))
    assert not th.m_image.any() and not th.v_text.any() and not th.step_image.any()
    rows = th.rows([IDS[3], IDS[0]])
    assert th.ids[rows].tolist() == [IDS[3], IDS[0]]
    lam_i, lam_t = th.thresholds(torch.tensor([IDS[5]]))
    assert lam_i.tolist() == [1.0] and lam_t.tolist() == [1.0]


def test_unknown_and_duplicate_ids_raise():
    with pytest.raises(ValueError, match="1007"):
        GlofndThresholds([5, 1007, 3, 1007], alpha=0.1)
    th = GlofndThresholds(IDS, alpha=0.1)
    before = _snapshot(th, slice(None))
    cos_i2t, cos_t2i = _cos(3, 0)
    with pytest.raises(ValueError, match="999"):
        th.update([IDS[0], 999, IDS[1]], cos_i2t, cos_t2i, epoch=0)
    with pytest.raises(ValueError, match="999"):
        th.thresholds([999])
    with pytest.raises(ValueError, match=str(IDS[1])):
        th.update([IDS[1], IDS[2], IDS[1]], cos_i2t, cos_t2i, epoch=0)
    with pytest.raises(ValueError):
        th.update([IDS[0]], cos_i2t[:1, :1], cos_t2i[:1, :1], epoch=0)  # B = 1: no negatives
    with pytest.raises(ValueError):
        th.update(IDS[:4], cos_i2t, cos_t2i, epoch=0)  # shape mismatch
    with pytest.raises(TypeError):
        th.update(torch.tensor([1.0, 2.0, 3.0]), cos_i2t, cos_t2i, epoch=0)
    for epoch in (None, -1, 1.0, True):  # adam_step=epoch needs the epoch
        with pytest.raises(ValueError, match="adam_step=epoch needs the 0-based training epoch"):
            th.update(IDS[:3], cos_i2t, cos_t2i, epoch=epoch)
    with pytest.raises(ValueError, match="adam_step must be one of epoch, count"):
        GlofndThresholds(IDS, alpha=0.1, adam_step="step")
    for name in STATE:  # failed calls change nothing
        assert torch.equal(getattr(th, name), before[name])


@pytest.mark.parametrize("adam_step", ["epoch", "count"])
@pytest.mark.parametrize("alpha", [0.1, 0.3])
def test_lambda_converges_to_quantile(alpha, adam_step):
    b, lr = 24, 0.01
    ids = torch.arange(b) * 5 - 40  # negative ids are fine too
    cos_i2t, cos_t2i = _cos(b, 1)
    th = GlofndThresholds(ids, alpha=alpha, lr=lr, dtype=torch.float64, adam_step=adam_step)
    for epoch in range(600):  # one update per pair and epoch
        lam_i, lam_t = th.update(ids, cos_i2t, cos_t2i, epoch=epoch + 3)
    k = math.ceil(alpha * (b - 1))
    off = ~torch.eye(b, dtype=torch.bool)
    for lam, cos in ((lam_i, cos_i2t), (lam_t, cos_t2i)):
        desc = cos[off].reshape(b, b - 1).sort(dim=1, descending=True).values
        hi, lo = desc[:, k - 1], desc[:, k]  # k-th and (k+1)-th largest
        assert ((lam >= lo - 2 * lr) & (lam <= hi + 2 * lr)).all(), (lam, lo, hi)
        # and the thresholds flag about alpha of the negatives (at most one entry off per row)
        flagged = ((cos > lam[:, None]) & off).sum(dim=1)
        assert ((flagged - k).abs() <= 1).all()
    assert torch.equal(th.thresholds(ids)[0], lam_i)


def test_at_the_papers_schedule_momentum_carries_the_thresholds_past_the_quantile():
    """docs/results.md (issue 67): GloFND at its rule settings in `dense` flags about 45% of the negatives for α 0.179.
    Its thresholds start at 1 and take one Adam step an epoch from epoch 15 of 36 (the rule's lr, β 0.9 / 0.98): on a
    batch that never changes, they cross the (1 − α) quantile late and Adam's first moment carries them on, to about
    1.8 α by the last epoch. Without the momentum (β1 0) the same steps stop at α."""
    key = "pretrain.false_negatives.glofnd."
    start = TUNED["glofnd"][key + "start_epoch"]
    rule = method_settings("glofnd", start, DENSE)  # (the settings the `dense` arm trained with)
    b, alpha = 64, rule[key + "alpha"]
    ids = torch.arange(b)
    cos_i2t, cos_t2i = _cos(b, 1)
    off = ~torch.eye(b, dtype=torch.bool)

    def shares(beta1: float) -> list[float]:
        th = GlofndThresholds(ids, alpha=alpha, lr=rule[key + "lr"], betas=(beta1, 0.98), dtype=torch.float64)
        out = []
        for epoch in range(start, DENSE.epochs):
            lam = th.update(ids, cos_i2t, cos_t2i, epoch=epoch)[0]
            out.append(float(((cos_i2t > lam[:, None]) & off).sum() / off.sum()))
        return out

    paper, plain = shares(0.9), shares(0.0)
    crossed = next(k for k, share in enumerate(paper) if share > alpha)
    assert 10 <= crossed <= len(paper) - 4  # (late: after more than half of the 21 steps)
    assert all(later > earlier for earlier, later in zip(paper[crossed:-2], paper[crossed + 1 : -1]))  # still rising
    assert paper[-1] > 1.5 * alpha
    assert all(abs(share - alpha) < 0.02 for share in plain[-5:])


def test_entries_outside_batch_bit_for_bit_unchanged():
    th = GlofndThresholds(IDS, alpha=0.2, lr=0.05)
    g = torch.Generator().manual_seed(3)
    first = IDS[:6]
    cos_i2t, cos_t2i = _cos(6, 0)
    th.update(first, 0.5 * cos_i2t, 0.5 * cos_t2i, epoch=0)
    th.update(first, cos_i2t, cos_t2i, epoch=1)  # m, v now non-zero for `first`
    held_out = th.rows(first[:3] + IDS[14:])
    before = _snapshot(th, held_out)
    assert before["m_image"][:3].abs().min() > 0 and before["step_text"][:3].tolist() == [2, 2, 2]
    pool = IDS[3:14]
    for step in range(25):
        pick = torch.randperm(len(pool), generator=g)[:5].tolist()
        batch = [pool[p] for p in pick]
        c_i2t, c_t2i = _cos(5, 10 + step)
        th.update(batch, c_i2t, c_t2i, epoch=2 + step)
    after = _snapshot(th, held_out)
    for name in STATE:
        assert torch.equal(after[name], before[name]), name
    assert (th.step_image[th.rows(pool)] > 0).all()


def _ref_adam(grads, lr, b1, b2, eps):
    lam, m, v, out = 1.0, 0.0, 0.0, []
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
        lam = min(1.0, max(-1.0, lam - lr * m_hat / (math.sqrt(v_hat) + eps)))
        out.append(lam)
    return out


def test_count_mode_is_per_index_adam_with_the_pairs_own_step_count():
    """adam_step=count: each pair's Adam is torch.optim.Adam on that one index (falcon's behaviour before adam_step)."""
    alpha, lr, betas, eps = 0.15, 0.05, (0.9, 0.98), 1e-8
    th = GlofndThresholds(IDS, alpha=alpha, lr=lr, betas=betas, eps=eps, dtype=torch.float64, adam_step="count")
    target = IDS[4]
    p = torch.nn.Parameter(torch.ones((), dtype=torch.float64))  # torch.optim.Adam on the one index
    opt = torch.optim.Adam([p], lr=lr, betas=betas, eps=eps)
    grads, seen, got = [], 0, []
    g = torch.Generator().manual_seed(7)
    for step in range(30):
        include = step % 3 != 1  # the index misses some steps
        others = [IDS[k] for k in torch.randperm(20, generator=g).tolist() if IDS[k] != target][:5]
        batch = others[:2] + [target] + others[2:] if include else others
        c_i2t, c_t2i = _cos(len(batch), 100 + step)
        if include:
            lam_before = th.thresholds([target])[0].item()
            row = c_i2t[2]
            above = sum(1 for j in range(len(batch)) if j != 2 and row[j].item() > lam_before)
            grads.append(alpha - above / (len(batch) - 1))
            seen += 1
        lam_i, _ = th.update(batch, c_i2t, c_t2i)
        if include:
            got.append(lam_i[2].item())
            assert th.step_image[th.rows([target])].item() == seen  # its own step count
            opt.zero_grad()
            p.grad = torch.tensor(grads[-1], dtype=torch.float64)
            opt.step()
            with torch.no_grad():
                p.clamp_(-1.0, 1.0)
            assert got[-1] == pytest.approx(p.item(), abs=1e-12)
    assert len(set(grads)) > 1  # the subgradient actually varied
    assert got == pytest.approx(_ref_adam(grads, lr, *betas, eps), abs=1e-12)
    assert min(got) < 0.9  # lambda really moved


def test_projection_to_unit_interval():
    ids = list(range(6))
    cos_i2t, cos_t2i = _cos(6, 2)
    low = GlofndThresholds(ids, alpha=1.0, lr=0.5, dtype=torch.float64)  # g = 1 - frac >= 0: lambda goes down
    trace = [low.update(ids, cos_i2t, cos_t2i, epoch=e)[0] for e in range(12)]
    assert all(bool((lam >= -1.0).all()) for lam in trace)
    assert torch.equal(trace[-1], torch.full((6,), -1.0, dtype=torch.float64))
    high = GlofndThresholds(ids, alpha=0.0, lr=0.5, dtype=torch.float64)
    high.lambda_image.fill_(0.9)
    high.lambda_text.fill_(0.9)
    full = torch.full((6, 6), 0.95, dtype=torch.float64)  # every negative above lambda: g = -1
    lam_i, lam_t = high.update(ids, full, full, epoch=4)
    assert torch.equal(lam_i, torch.ones(6, dtype=torch.float64)) and torch.equal(lam_t, lam_i)
    assert torch.equal(high.lambda_image, torch.ones(6, dtype=torch.float64))


@pytest.mark.parametrize("adam_step", ["epoch", "count"])
def test_state_dict_round_trip_gives_identical_updates(adam_step):
    a = GlofndThresholds(IDS, alpha=0.2, adam_step=adam_step)
    for step in range(5):
        a.update(IDS[step : step + 6], *_cos(6, 20 + step), epoch=1 + step // 2)
    b = GlofndThresholds(list(reversed(IDS)), alpha=0.2, adam_step=adam_step)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    for step in range(5):
        batch = IDS[2 * step : 2 * step + 7]
        out_a = a.update(batch, *_cos(7, 40 + step), epoch=3 + step)
        out_b = b.update(batch, *_cos(7, 40 + step), epoch=3 + step)
        assert torch.equal(out_a[0], out_b[0]) and torch.equal(out_a[1], out_b[1])
    for name in STATE:
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    other = GlofndThresholds([i + 1 for i in IDS], alpha=0.2)
    with pytest.raises(RuntimeError, match="other pair ids"):
        other.load_state_dict(a.state_dict())


def test_update_returns_the_thresholds_it_stored_and_masks_use_them():
    th = GlofndThresholds(IDS, alpha=0.3, lr=0.2)
    v, t = _feats(8, 4, 5, torch.float32)
    batch = IDS[5:13]
    for epoch in range(4):
        cos_i2t, cos_t2i = cosine_matrices(v, t)
        lam_i, lam_t = th.update(batch, cos_i2t, cos_t2i, epoch=epoch)
    assert torch.equal(cos_t2i, cos_i2t.t())
    stored = th.thresholds(batch)
    assert torch.equal(stored[0], lam_i) and torch.equal(stored[1], lam_t)
    lam_i[0] = 5.0  # a copy, not a view of the buffer
    assert th.thresholds(batch)[0][0] != 5.0
    _, drop_i2t, drop_t2i = itc_glofnd(v, t, 0.07, lambda_image=stored[0], lambda_text=stored[1])
    ref_i2t, ref_t2i = glofnd_drop_masks(cos_i2t, cos_t2i, *stored)
    assert torch.equal(drop_i2t, ref_i2t) and torch.equal(drop_t2i, ref_t2i)
    assert drop_i2t.any() and drop_t2i.any() and not drop_i2t.diagonal().any()


# ------------------------------------------------------------- the authors' bias correction (adam_step)


def _authors_updates(steps, *, alpha, lr, start_epoch, adam_step, betas=(0.9, 0.98), eps=1e-8):
    """Plain-Python float64 reference of GloFND's threshold updates as the authors' code makes them
    (reference-code.md §7, methods.md §4.3-§4.5; ``LambdaThreshold.update``): every threshold starts at 1
    with m = v = 0; from ``start_epoch`` on, each anchor of a batch takes
        g = alpha - #{j != i : cos_ij > lambda_i} / (B - 1)
        m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2
        lambda = clamp(lambda - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps), -1, 1)
    with t = epoch + 1 (the authors, ``adam_step="epoch"``) or t = the anchor's own update count
    (``"count"``); negatives above the updated lambda are dropped. Returns, per step, None before
    ``start_epoch`` or ({side: [lambda per batch row]}, {side: drop mask as nested lists})."""
    b1, b2 = betas
    state = {}  # (side, pair id) -> (lambda, m, v, count)
    out = []
    for epoch, ids, cos_i2t, cos_t2i in steps:
        if epoch < start_epoch:
            out.append(None)
            continue
        lams, masks = {}, {}
        for side, cos in (("image", cos_i2t.tolist()), ("text", cos_t2i.tolist())):
            b, new = len(ids), []
            for i, pid in enumerate(ids):
                lam, m, v, count = state.get((side, pid), (1.0, 0.0, 0.0, 0))
                above = sum(1 for j in range(b) if j != i and cos[i][j] > lam)
                g = alpha - above / (b - 1)
                m = b1 * m + (1 - b1) * g
                v = b2 * v + (1 - b2) * g * g
                t = epoch + 1 if adam_step == "epoch" else count + 1
                m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
                lam = min(1.0, max(-1.0, lam - lr * m_hat / (math.sqrt(v_hat) + eps)))
                state[(side, pid)] = (lam, m, v, count + 1)
                new.append(lam)
            lams[side] = new
            masks[side] = [[j != i and cos[i][j] > new[i] for j in range(b)] for i in range(b)]
        out.append((lams, masks))
    return out


def _epochs_of_batches(n=24, b=8, epochs=6, seed=0):
    """(epoch, batch pair ids, cos_i2t, cos_t2i) of every step: a shuffled pass over n pairs per epoch,
    features drifting from epoch to epoch (float64, 4-d so that similarities spread widely)."""
    g = torch.Generator().manual_seed(seed)
    image, text = (F.normalize(torch.randn(n, 4, generator=g, dtype=torch.float64), dim=1) for _ in range(2))
    ids = [500 + 3 * k for k in range(n)]
    steps = []
    for epoch in range(epochs):
        image = F.normalize(image + 0.3 * torch.randn(n, 4, generator=g, dtype=torch.float64), dim=1)
        text = F.normalize(text + 0.3 * torch.randn(n, 4, generator=g, dtype=torch.float64), dim=1)
        order = torch.randperm(n, generator=g).tolist()
        for k in range(0, n, b):
            rows = order[k : k + b]
            cos = image[rows] @ text[rows].t()
            steps.append((epoch, [ids[r] for r in rows], cos, cos.t().contiguous()))
    return ids, steps


def _run_thresholds(ids, steps, *, alpha, lr, start_epoch, adam_step):
    th = GlofndThresholds(ids, alpha=alpha, lr=lr, dtype=torch.float64, adam_step=adam_step)
    out = []
    for epoch, batch, cos_i2t, cos_t2i in steps:
        if not glofnd_active(epoch, start_epoch):
            out.append(None)
            continue
        lam_i, lam_t = th.update(batch, cos_i2t, cos_t2i, epoch=epoch)
        drop_i2t, drop_t2i = glofnd_drop_masks(cos_i2t, cos_t2i, lam_i, lam_t)
        out.append(
            ({"image": lam_i.tolist(), "text": lam_t.tolist()}, {"image": drop_i2t.tolist(), "text": drop_t2i.tolist()})
        )
    return out


def _compare(got, ref):
    """(largest |lambda difference|, number of updating steps whose drop masks differ, number of updating steps)."""
    worst, differ, active = 0.0, 0, 0
    for a, r in zip(got, ref, strict=True):
        assert (a is None) == (r is None)
        if a is None:
            continue
        active += 1
        worst = max([worst] + [abs(x - y) for side in a[0] for x, y in zip(a[0][side], r[0][side], strict=True)])
        differ += any(a[1][side] != r[1][side] for side in a[1])
    return worst, differ, active


def test_epoch_mode_reproduces_the_authors_threshold_updates_from_start_epoch_1():
    """The COCO recipe's setting (start_epoch 1, lr 0.05): adam_step=epoch gives the authors' lambdas and
    drop masks at every step of five updating epochs; count mode (falcon's old behaviour) does not."""
    ids, steps = _epochs_of_batches()
    settings = dict(alpha=0.1, lr=0.05, start_epoch=1)
    authors = _authors_updates(steps, adam_step="epoch", **settings)
    worst, differ, active = _compare(_run_thresholds(ids, steps, adam_step="epoch", **settings), authors)
    assert active == 15 and worst == 0.0 and differ == 0, (worst, differ)  # bit for bit
    assert sum(any(any(row) for row in step[1]["image"]) for step in authors if step) >= 10, "the masks drop something"
    # count mode is the textbook per-index Adam, exactly; it is not the authors' update
    counted = _run_thresholds(ids, steps, adam_step="count", **settings)
    assert _compare(counted, _authors_updates(steps, adam_step="count", **settings))[:2] == (
        pytest.approx(0.0, abs=1e-12),
        0,
    )
    worst, differ, _ = _compare(counted, authors)
    assert worst > 0.01 and differ >= 3, (worst, differ)


def test_the_pretrain_method_passes_the_epoch_and_its_mode():
    """Glofnd (what the stage builds) gates on start_epoch and hands the step's epoch to the thresholds."""
    ids, steps = _epochs_of_batches(epochs=4, seed=1)
    for adam_step in ("epoch", "count"):
        method = Glofnd(ids, alpha=0.1, lr=0.05, start_epoch=1, adam_step=adam_step)
        direct = GlofndThresholds(ids, alpha=0.1, lr=0.05, adam_step=adam_step)
        assert method.thresholds.adam_step == adam_step
        for epoch, batch, cos_i2t, cos_t2i in steps:
            v, t = F.normalize(torch.randn(len(batch), 6), dim=1), F.normalize(torch.randn(len(batch), 6), dim=1)
            method.itc(v, t, torch.tensor(0.07), 0.0, StepContext(torch.tensor(batch), epoch=epoch))
            if epoch >= 1:
                direct.update(batch, *cosine_matrices(v, t), epoch=epoch)
            for name in STATE:
                assert torch.equal(getattr(method.thresholds, name), getattr(direct, name)), (adam_step, epoch, name)
        assert (method.thresholds.step_image == 3).all() and (method.thresholds.lambda_image < 1).all()


def test_thresholds_continue_only_in_the_mode_they_were_learned_in():
    epoch_mode = GlofndThresholds(IDS, alpha=0.2)
    epoch_mode.update(IDS[:6], *_cos(6, 3), epoch=2)
    count_mode = GlofndThresholds(IDS, alpha=0.2, adam_step="count")
    with pytest.raises(
        FalconError,
        match="learned with adam_step=epoch, this run uses adam_step=count; "
        "continue them with pretrain.false_negatives.glofnd.adam_step=epoch",
    ):
        count_mode.load_state_dict(epoch_mode.state_dict())
    # a state dict saved before adam_step existed was learned in count mode: loads there, refused in epoch mode
    old = {k: v for k, v in count_mode.state_dict().items() if k != "adam_step_by_epoch"}
    old["lambda_image"] = torch.full((20,), 0.5)
    count_mode.load_state_dict(old)
    assert torch.equal(count_mode.lambda_image, torch.full((20,), 0.5)) and not bool(count_mode.adam_step_by_epoch)
    with pytest.raises(FalconError, match="learned with adam_step=count"):
        GlofndThresholds(IDS, alpha=0.2).load_state_dict(old)


def test_glofnd_active():
    assert not glofnd_active(14, 15) and glofnd_active(15, 15) and glofnd_active(30, 15)


# ----------------------------------------------------------------------------------- filtered ITC


@pytest.mark.parametrize("w", [0.0, 0.2])
def test_itc_glofnd_without_drops_equals_itc_grit(w):
    v, t = _feats(7, 8, 11)
    v1, t1 = v.clone().requires_grad_(), t.clone().requires_grad_()
    v2, t2 = v.clone().requires_grad_(), t.clone().requires_grad_()
    tau1 = torch.tensor(0.07, dtype=torch.float64, requires_grad=True)
    tau2 = torch.tensor(0.07, dtype=torch.float64, requires_grad=True)
    ones = torch.ones(7)
    out, drop_i2t, drop_t2i = itc_glofnd(v1, t1, tau1, lambda_image=ones, lambda_text=ones, consistency_weight=w)
    ref = itc_grit(v2, t2, tau2, consistency_weight=w)
    assert not drop_i2t.any() and not drop_t2i.any() and drop_i2t.dtype == torch.bool
    for name in ("loss", "hard", "soft", "sim_i2t", "sim_t2i"):
        torch.testing.assert_close(getattr(out, name), getattr(ref, name), rtol=1e-6, atol=1e-6)
    # plain InfoNCE, both directions averaged
    s = (v.float() @ t.float().t()) / 0.07
    info_nce = (F.cross_entropy(s, torch.arange(7)) + F.cross_entropy(s.t(), torch.arange(7))) / 2
    torch.testing.assert_close(out.hard, info_nce, rtol=1e-6, atol=1e-6)
    out.loss.backward()
    ref.loss.backward()
    for a, b in ((v1, v2), (t1, t2), (tau1, tau2)):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)


def _naive(v, t, tau, lam_i, lam_t, w):
    """Float64 loop reference of the filtered ITC (stop-gradient on the non-anchor modality)."""
    b = v.shape[0]
    cos = [[float(v[i].detach() @ t[j].detach()) for j in range(b)] for i in range(b)]
    drop_i2t = [[j != i and cos[i][j] > float(lam_i[i]) for j in range(b)] for i in range(b)]
    drop_t2i = [[j != i and cos[j][i] > float(lam_t[i]) for j in range(b)] for i in range(b)]

    def masked_log_softmax(anchor, others, drop_row):
        logits = [anchor @ others[j].detach() / tau for j in range(len(others))]
        kept = [j for j in range(len(others)) if not drop_row[j]]
        log_z = torch.logsumexp(torch.stack([logits[j] for j in kept]), dim=0)
        return {j: logits[j] - log_z for j in kept}

    lp_i2t = [masked_log_softmax(v[i], t, drop_i2t[i]) for i in range(b)]
    lp_t2i = [masked_log_softmax(t[i], v, drop_t2i[i]) for i in range(b)]
    hard = -(sum(lp_i2t[i][i] for i in range(b)) / b + sum(lp_t2i[i][i] for i in range(b)) / b) / 2
    soft_terms = []
    for own, other in ((lp_i2t, lp_t2i), (lp_t2i, lp_i2t)):
        total = 0.0
        for i in range(b):
            target = {j: math.exp(float(other[i][j].detach())) for j in own[i] if j in other[i]}
            z = sum(target.values())
            total = total - sum(target[j] / z * own[i][j] for j in target)
        soft_terms.append(total / b)
    soft = (soft_terms[0] + soft_terms[1]) / 2
    return hard + w * soft, hard, soft, torch.tensor(drop_i2t), torch.tensor(drop_t2i)


@pytest.mark.parametrize("w", [0.0, 0.3])
def test_itc_glofnd_matches_naive_reference_with_drops(w):
    b = 8
    v, t = _feats(b, 3, 4)
    cos = v @ t.t()
    lam_i = torch.quantile(cos, 0.7, dim=1)  # some entries above, some below
    lam_t = torch.quantile(cos.t(), 0.6, dim=1)
    v1, t1 = v.clone().requires_grad_(), t.clone().requires_grad_()
    v2, t2 = v.clone().requires_grad_(), t.clone().requires_grad_()
    tau1 = torch.tensor(0.1, dtype=torch.float64, requires_grad=True)
    tau2 = torch.tensor(0.1, dtype=torch.float64, requires_grad=True)
    out, drop_i2t, drop_t2i = itc_glofnd(v1, t1, tau1, lambda_image=lam_i, lambda_text=lam_t, consistency_weight=w)
    loss, hard, soft, ref_i2t, ref_t2i = _naive(v2, t2, tau2.double(), lam_i, lam_t, w)
    assert torch.equal(drop_i2t, ref_i2t) and torch.equal(drop_t2i, ref_t2i)
    assert 0 < int(drop_i2t.sum()) < b * (b - 1) and 0 < int(drop_t2i.sum()) < b * (b - 1)
    assert not torch.equal(drop_i2t, drop_t2i.t())  # the two directions really differ
    torch.testing.assert_close(out.hard, hard.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.soft, soft.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.loss, loss.float(), rtol=1e-5, atol=1e-5)
    assert out.hard.item() < itc_grit(v, t, 0.1, consistency_weight=0.0).hard.item()  # fewer negatives, lower loss
    torch.testing.assert_close(out.sim_i2t, (v @ t.t() / 0.1).float())  # unmasked logits
    out.loss.backward()
    loss.backward()
    for a, r in ((v1, v2), (t1, t2), (tau1, tau2)):
        assert torch.isfinite(a.grad).all()
        torch.testing.assert_close(a.grad.double(), r.grad, rtol=1e-4, atol=1e-5)


def test_positive_never_dropped_and_everything_else_can_be():
    v, t = _feats(5, 4, 9, torch.float32)
    v.requires_grad_()
    t.requires_grad_()
    minus = torch.full((5,), -1.0)
    out, drop_i2t, drop_t2i = itc_glofnd(v, t, 0.05, lambda_image=minus, lambda_text=minus, consistency_weight=0.2)
    off = ~torch.eye(5, dtype=torch.bool)
    assert torch.equal(drop_i2t, off) and torch.equal(drop_t2i, off)
    assert out.hard.item() == pytest.approx(0.0, abs=1e-7) and out.soft.item() == pytest.approx(0.0, abs=1e-7)
    out.loss.backward()
    assert torch.isfinite(v.grad).all() and torch.isfinite(t.grad).all()


def test_itc_glofnd_under_autocast_and_bad_shapes():
    v, t = _feats(6, 8, 12, torch.float32)
    ones = torch.ones(6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _, _ = itc_glofnd(v, t, 0.07, lambda_image=ones * 0.2, lambda_text=ones * 0.2)
    assert out.loss.dtype == torch.float32 and out.sim_i2t.dtype == torch.float32 and torch.isfinite(out.loss)
    with pytest.raises(ValueError):
        itc_glofnd(v, t, 0.07, lambda_image=torch.ones(5), lambda_text=ones)
    with pytest.raises(ValueError):
        itc_glofnd(v, t[:5], 0.07, lambda_image=ones, lambda_text=ones)


def test_ties_are_kept_not_flagged():
    """A negative exactly at the threshold is kept (S~ = {sim <= lambda}) and not counted in the subgradient."""
    cos = torch.tensor([[1.0, 0.5, 0.2], [0.5, 1.0, 0.5], [0.1, 0.3, 1.0]], dtype=torch.float64)
    lam = torch.tensor([0.5, 0.5, 0.3], dtype=torch.float64)
    drop_i2t, drop_t2i = glofnd_drop_masks(cos, cos, lam, lam)
    assert not drop_i2t.any() and not drop_t2i.any()
    drop_i2t, _ = glofnd_drop_masks(cos, cos, lam - 1e-9, lam)
    assert drop_i2t.tolist() == [[False, True, False], [True, False, True], [False, True, False]]
    th = GlofndThresholds([3, 1, 2], alpha=0.25, lr=0.1, dtype=torch.float64)
    th.lambda_image.fill_(0.5)
    lam_i, _ = th.update([1, 2, 3], cos, cos, epoch=0)  # rows 0, 1: ties only -> g = alpha > 0
    assert lam_i.tolist() == pytest.approx([0.4, 0.4, 0.4], abs=1e-7)  # first Adam step has size lr
