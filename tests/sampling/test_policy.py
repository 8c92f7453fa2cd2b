"""Tests for the FALCON scheduler policy π_φ (falcon_cli.sampling.policy) against plain references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from falcon_cli.sampling.policy import (
    Q_CLAMP,
    RewardBaseline,
    SchedulerPolicy,
    beta_log_prob,
    build_policy_optimizer,
    reinforce_loss,
    sample_q,
)

INIT = F.softplus(torch.tensor(0.5)).item() + 1e-5  # ≈ 0.974


def _s_hat(*shape: int, seed: int = 0) -> torch.Tensor:
    """Softmax-normalised, ascending-sorted rows, like the composer's Ŝ."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * 3
    return torch.softmax(x, dim=-1).sort(dim=-1).values


def _ref_log_prob(a: float, b: float, q: float) -> float:
    """The log density, or at the clamp the log-probability of the event beyond it: ε^β / (β B(α, β)) at the top,
    ε^α / (α B(α, β)) at the bottom (their leading terms)."""
    log_b = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    if q >= 1 - Q_CLAMP:
        return b * math.log(Q_CLAMP) - math.log(b) - log_b
    if q <= Q_CLAMP:
        return a * math.log(Q_CLAMP) - math.log(a) - log_b
    return -log_b + (a - 1) * math.log(q) + (b - 1) * math.log(1 - q)


def _perturbed_policy(seed: int = 0) -> SchedulerPolicy:
    """A policy whose head is not at its (input-independent) initialisation."""
    torch.manual_seed(seed)
    policy = SchedulerPolicy()
    with torch.no_grad():
        policy.head.weight.normal_(0, 0.5)
    return policy


# --- architecture and initialisation ---------------------------------------------------------


def test_init_is_near_uniform_for_any_input():
    torch.manual_seed(0)
    policy = SchedulerPolicy()
    for s in (_s_hat(5, 100), torch.rand(7, 100) * 10, torch.zeros(1, 100)):
        alpha, beta = policy(s)
        assert torch.allclose(alpha, torch.full_like(alpha, INIT), atol=1e-3)
        assert torch.allclose(beta, torch.full_like(beta, INIT), atol=1e-3)
    assert abs(INIT - 0.974) < 1e-3


@pytest.mark.parametrize("shape", [(5, 100), (2, 3, 100)])
def test_output_shapes_and_dtype(shape):
    policy = _perturbed_policy()
    alpha, beta = policy(_s_hat(*shape))
    assert alpha.shape == shape[:-1] and beta.shape == shape[:-1]
    assert alpha.dtype == beta.dtype == torch.float32
    assert (alpha > 0).all() and (beta > 0).all()
    dist = policy.distribution(_s_hat(*shape))
    assert isinstance(dist, torch.distributions.Beta) and dist.batch_shape == shape[:-1]


def test_head_is_float32_under_bf16_autocast():
    policy = _perturbed_policy()
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        alpha, beta = policy(_s_hat(4, 100))
    assert alpha.dtype == beta.dtype == torch.float32


def test_rows_are_independent_and_order_equivariant():
    policy = _perturbed_policy()
    s = _s_hat(6, 100)
    alpha, beta = policy(s)
    per_row = [policy(s[i : i + 1]) for i in range(6)]
    assert torch.allclose(alpha, torch.cat([a for a, _ in per_row]), atol=1e-6)
    assert torch.allclose(beta, torch.cat([b for _, b in per_row]), atol=1e-6)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    alpha_p, beta_p = policy(s[perm])
    assert torch.allclose(alpha_p, alpha[perm], atol=1e-6)
    assert torch.allclose(beta_p, beta[perm], atol=1e-6)
    # The perturbed head really depends on the input (else the checks above are vacuous).
    assert alpha.std() > 1e-4


def test_architecture_matches_reference_forward():
    policy = _perturbed_policy()
    linears = [m for m in policy.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 4
    assert policy.hidden == 256 and policy.input.out_features == 256 and policy.input.in_features == 100
    assert policy.head.out_features == 2
    # Plain re-computation of the spec'd forward.
    x = _s_hat(3, 100)
    l1, b1, b2, head = linears
    h0 = torch.relu(x @ l1.weight.T + l1.bias)
    h1 = h0 + torch.relu(h0 @ b1.weight.T + b1.bias)
    h2 = h1 + torch.relu(h1 @ b2.weight.T + b2.bias)
    raw = h2 @ head.weight.T + head.bias
    ref = torch.log1p(torch.exp(raw)) + 1e-5
    alpha, beta = policy(x)
    assert torch.allclose(alpha, ref[:, 0], atol=1e-5) and torch.allclose(beta, ref[:, 1], atol=1e-5)
    assert (
        len([m for m in SchedulerPolicy(quantiles=10, hidden=8, blocks=3).modules() if isinstance(m, nn.Linear)]) == 5
    )
    with pytest.raises(ValueError):
        policy(torch.rand(2, 99))


# --- log density -----------------------------------------------------------------------------


def test_beta_log_prob_matches_lgamma_reference():
    qs = [0.0, 1e-9, 0.01, 0.2, 0.5, 0.77, 0.99, 1.0]
    params = [(0.5, 0.5), (0.974, 0.974), (1.0, 1.0), (2.0, 5.0), (5.0, 0.5), (30.0, 2.0)]
    a = torch.tensor([p[0] for p in params], dtype=torch.float64)[:, None]
    b = torch.tensor([p[1] for p in params], dtype=torch.float64)[:, None]
    q = torch.tensor(qs, dtype=torch.float64)[None, :]
    got = beta_log_prob(a, b, q)
    assert got.shape == (len(params), len(qs))
    assert torch.isfinite(got).all()
    ref = torch.tensor([[_ref_log_prob(pa, pb, qq) for qq in qs] for pa, pb in params], dtype=torch.float64)
    assert torch.allclose(got, ref, rtol=1e-9, atol=1e-9)
    # float32 parameters and q too: the density is computed in float64 all the same (in float32 the clamp would
    # round to 1 and q = 1 would be infinite), equal to the reference where float32 holds q exactly
    got32 = beta_log_prob(a.float(), b.float(), q.float())
    assert got32.dtype == torch.float64 and torch.isfinite(got32).all()
    assert torch.allclose(got32[:, [0, 4, 7]], ref[:, [0, 4, 7]], rtol=1e-6, atol=1e-6)


def test_the_score_of_a_beta_near_the_top_is_unbiased():
    """E[∂ log p(q) / ∂(α, β)] = 0 for q ~ Beta(α, β): a clamp too close to the body of the density breaks it. At
    the 1e-6 clamp, Beta(1.75, 0.195) (mean 0.9: issue 70's start at the top) clamped 7.9% of its draws and the β score
    averaged +0.40, so a positive reward pushed q down with no signal at all; a draw at the clamp is now scored as the
    event beyond it (Beta(3, 0.1) puts 3.7% of its draws there)."""
    rng = np.random.default_rng(0)
    for a, b in [(1.753, 0.195), (0.195, 1.753), (0.974, 0.974), (5.0, 0.3), (3.0, 0.1)]:
        alpha, beta = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
        q = sample_q(
            torch.full((200_000,), a, dtype=torch.float64), torch.full((200_000,), b, dtype=torch.float64), rng
        )
        assert q.dtype == torch.float64
        beta_log_prob(alpha, beta, q).mean().backward()
        assert abs(float(alpha.grad)) < 0.03 and abs(float(beta.grad)) < 0.03, (a, b, alpha.grad, beta.grad)


# --- REINFORCE -------------------------------------------------------------------------------


def _log_prob_after_step(reward: float, perturbed: bool, baseline: float = 0.0) -> tuple[float, float]:
    """Summed log-prob of fixed sampled q before / after one SGD step on the REINFORCE loss.

    A fresh policy (zero head: only the head gets gradient) steps with lr 1e-2; a perturbed
    one (gradient through every layer, larger) with lr 1e-3 so the step stays first-order.
    """
    torch.manual_seed(1)
    policy = _perturbed_policy(1) if perturbed else SchedulerPolicy()
    s = _s_hat(8, 100, seed=3)
    with torch.no_grad():
        alpha, beta = policy(s)
    q = sample_q(alpha, beta, torch.Generator().manual_seed(11))
    opt = torch.optim.SGD(policy.parameters(), lr=1e-3 if perturbed else 1e-2)
    alpha, beta = policy(s)
    before = beta_log_prob(alpha, beta, q).sum()
    opt.zero_grad()
    reinforce_loss(reward, before, baseline=baseline).backward()
    opt.step()
    with torch.no_grad():
        after = beta_log_prob(*policy(s), q).sum()
    return before.item(), after.item()


@pytest.mark.parametrize("perturbed", [False, True])
def test_positive_reward_raises_log_prob(perturbed):
    before, after = _log_prob_after_step(+1.0, perturbed)
    assert after > before + 1e-3


@pytest.mark.parametrize("perturbed", [False, True])
def test_negative_reward_lowers_log_prob(perturbed):
    before, after = _log_prob_after_step(-1.0, perturbed)
    assert after < before - 1e-3


@pytest.mark.parametrize("perturbed", [False, True])
def test_reward_below_baseline_lowers_log_prob(perturbed):
    before, after = _log_prob_after_step(0.2, perturbed, baseline=0.7)
    assert after < before


def test_reward_at_baseline_gives_zero_gradient():
    policy = _perturbed_policy(1)
    s = _s_hat(8, 100, seed=3)
    alpha, beta = policy(s)
    q = sample_q(alpha, beta, torch.Generator().manual_seed(11))
    reinforce_loss(torch.tensor(0.3), beta_log_prob(alpha, beta, q).sum(), baseline=0.3).backward()
    for p in policy.parameters():
        assert p.grad is not None and torch.equal(p.grad, torch.zeros_like(p.grad))


def test_reinforce_loss_value_and_reward_detached():
    lp = torch.tensor(-2.5, requires_grad=True)
    reward = torch.tensor(1.5, requires_grad=True)
    loss = reinforce_loss(reward, lp, baseline=0.5)
    assert loss.item() == pytest.approx(-(1.5 - 0.5) * -2.5)
    loss.backward()
    assert reward.grad is None
    assert lp.grad.item() == pytest.approx(-1.0)
    assert reinforce_loss(2.0, lp).item() == pytest.approx(5.0)


def test_optimizer_settings():
    policy = SchedulerPolicy(quantiles=10, hidden=8)
    opt = build_policy_optimizer(policy)
    assert isinstance(opt, torch.optim.AdamW)
    group = opt.param_groups[0]
    assert group["lr"] == 1e-4 and group["weight_decay"] == 0.01 and group["betas"] == (0.9, 0.999)
    assert sum(p.numel() for p in group["params"]) == sum(p.numel() for p in policy.parameters())


# --- sampling --------------------------------------------------------------------------------


@pytest.mark.parametrize("a,b", [(0.5, 0.5), (0.974, 0.974), (5.0, 5.0), (0.5, 5.0), (5.0, 0.5), (2.0, 3.0)])
def test_sample_q_moments(a, b):
    n = 20_000
    q = sample_q(torch.full((n,), a), torch.full((n,), b), torch.Generator().manual_seed(0))
    assert q.shape == (n,) and q.dtype == torch.float32
    assert (q >= Q_CLAMP).all() and (q <= 1 - Q_CLAMP).all()
    mean = a / (a + b)
    var = a * b / ((a + b) ** 2 * (a + b + 1))
    # ~4.5 standard errors for the mean; ~10% relative for the variance.
    assert abs(q.mean().item() - mean) < 4.5 * math.sqrt(var / n)
    assert abs(q.var().item() - var) < 0.1 * var


@pytest.mark.parametrize("a,b", [(0.5, 0.5), (2.0, 5.0), (5.0, 0.5)])
def test_sample_q_histogram_matches_pdf(a, b):
    n = 40_000
    q = sample_q(
        torch.full((n,), a, dtype=torch.float64),
        torch.full((n,), b, dtype=torch.float64),
        torch.Generator().manual_seed(1),
    )
    edges = torch.linspace(0, 1, 21, dtype=torch.float64)
    counts = torch.histc(q, bins=20, min=0.0, max=1.0)
    # Expected bin mass by a fine midpoint rule on the density from beta_log_prob.
    fine = torch.linspace(0, 1, 20 * 400 + 1, dtype=torch.float64)
    mids = (fine[:-1] + fine[1:]) / 2
    dens = beta_log_prob(torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64), mids).exp()
    mass = (dens / dens.sum()).reshape(20, 400).sum(1)
    expected = mass * n
    assert edges.shape == (21,)
    # Loose: each bin within 5 sigma (binomial) + 1% of n of its expectation.
    sigma = torch.sqrt(n * mass * (1 - mass))
    assert ((counts - expected).abs() <= 5 * sigma + 0.01 * n).all(), (counts, expected)
    # And a chi-square-ish total that a wrong distribution would blow up.
    chi2 = (((counts - expected) ** 2) / expected.clamp_min(1)).sum().item()
    assert chi2 < 80, chi2


def test_sample_q_is_deterministic_per_generator_and_broadcasts():
    alpha = torch.tensor([[0.3], [1.0], [4.0]])
    beta = torch.tensor([0.5, 2.0, 7.0, 0.974])
    q1 = sample_q(alpha, beta, torch.Generator().manual_seed(123))
    q2 = sample_q(alpha, beta, torch.Generator().manual_seed(123))
    q3 = sample_q(alpha, beta, torch.Generator().manual_seed(124))
    assert q1.shape == (3, 4)
    assert torch.equal(q1, q2)
    assert not torch.equal(q1, q3)
    # Resumable: continuing a generator from a saved state reproduces the continuation.
    g = torch.Generator().manual_seed(5)
    sample_q(alpha, beta, g)
    state = g.get_state()
    nxt = sample_q(alpha, beta, g)
    g2 = torch.Generator()
    g2.set_state(state)
    assert torch.equal(sample_q(alpha, beta, g2), nxt)
    # The global RNG is not consumed.
    torch.manual_seed(0)
    ref = torch.rand(3)
    torch.manual_seed(0)
    sample_q(alpha, beta, torch.Generator().manual_seed(1))
    assert torch.equal(torch.rand(3), ref)


def test_sample_q_tiny_shape_stays_in_range():
    q = sample_q(torch.full((1000,), 1e-3), torch.full((1000,), 1e-3), torch.Generator().manual_seed(0))
    assert torch.isfinite(q).all() and (q >= Q_CLAMP).all() and (q <= 1).all()
    with pytest.raises(ValueError):
        sample_q(torch.tensor([0.0]), torch.tensor([1.0]), torch.Generator())
    with pytest.raises(ValueError):
        sample_q(torch.tensor([float("nan")]), torch.tensor([1.0]), torch.Generator())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_device_agnostic():
    policy = _perturbed_policy().cuda()
    alpha, beta = policy(_s_hat(4, 100).cuda())
    q = sample_q(alpha, beta, torch.Generator().manual_seed(0))
    assert q.device.type == "cuda"
    lp = beta_log_prob(alpha, beta, q)
    assert lp.device.type == "cuda" and torch.isfinite(lp).all()
    reinforce_loss(1.0, lp.sum()).backward()
    assert policy.head.bias.grad is not None


# --- reward baseline -------------------------------------------------------------------------


def test_reward_baseline_update_rule_and_state():
    bl = RewardBaseline(decay=0.9)
    assert bl.value == 0.0
    assert bl.update(2.0) == pytest.approx(2.0)
    assert bl.update(1.0) == pytest.approx(0.9 * 2.0 + 0.1 * 1.0)
    ref = 0.9 * 2.0 + 0.1 * 1.0
    for r in (3.0, -1.0, 0.5):
        ref = 0.9 * ref + 0.1 * r
        bl.update(r)
    assert bl.value == pytest.approx(ref)
    restored = RewardBaseline(decay=0.5)
    restored.load_state_dict(bl.state_dict())
    assert restored.decay == 0.9 and restored.value == pytest.approx(bl.value)
    assert restored.update(4.0) == pytest.approx(bl.update(4.0))
    # A fresh baseline restored from a fresh state still takes the first reward as is.
    fresh = RewardBaseline()
    fresh.load_state_dict(RewardBaseline().state_dict())
    assert fresh.update(7.0) == pytest.approx(7.0)
    with pytest.raises(ValueError):
        RewardBaseline(decay=1.0)


def _flag_counts_reference(flagged, truth):
    tp = fp = fn = negatives = 0
    for i in range(len(flagged)):
        for j in range(len(flagged)):
            if i != j:
                negatives += 1
                tp += bool(flagged[i][j]) and bool(truth[i][j])
                fp += bool(flagged[i][j]) and not bool(truth[i][j])
                fn += not bool(flagged[i][j]) and bool(truth[i][j])
    return [tp, fp, fn, negatives]


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))],
)
def test_flag_counts_match_a_loop_and_stay_on_the_flags_device(device):
    """The flagged-vs-oracle counts: the oracle's truth comes from the CPU, the flags from the step's device."""
    from falcon_cli.objectives.false_negatives import flag_counts

    g = torch.Generator().manual_seed(3)
    flagged, truth = torch.rand(9, 9, generator=g) < 0.3, torch.rand(9, 9, generator=g) < 0.4
    counts = flag_counts(flagged.to(device), truth)
    assert counts.device.type == device and counts.dtype == torch.long
    assert counts.tolist() == _flag_counts_reference(flagged.tolist(), truth.tolist())
    running = torch.zeros(4, dtype=torch.long, device=device)
    running += counts  # the stage's per-epoch total lives on the step's device


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_scheduler_update_takes_cpu_records_on_a_cuda_policy():
    """A lagged feed composes in CPU workers: its records reach a CUDA policy as CPU tensors."""
    from falcon_cli.sampling.scheduler import NegativeScheduler

    torch.manual_seed(0)
    scheduler = NegativeScheduler(quantiles=100, hidden=8, lr=1e-2, device="cuda")
    record = {"s_hat": _s_hat(5, 100), "q": torch.tensor([0.1, float("nan"), 0.5, 0.9, 0.3], dtype=torch.float64)}
    before = [p.detach().clone() for p in scheduler.policy.parameters()]
    out = scheduler.update(record, reward=1.0)
    assert out["advantage"] == 1.0 and out["log_prob"] == out["log_prob"]
    assert any(not torch.equal(a, b) for a, b in zip(before, scheduler.policy.parameters()))


def test_flags_and_weights_scored_in_both_directions_against_a_loop():
    """FlagsAgainstOracle over two steps: a text anchor's flags are scored against the transposed truth (caption i
    against image j), weights by the mean over the truly matching and over the true negatives, each direction and
    pooled; an old checkpoint's image-only counts load as the image direction."""
    from falcon_cli.objectives.false_negatives import FalseNegatives, FlagsAgainstOracle

    g = torch.Generator().manual_seed(5)
    truth = torch.rand(7, 7, generator=g) < 0.35  # rows images, columns captions
    method = FalseNegatives()
    flags = FlagsAgainstOracle(method, lambda ids: truth, torch.device("cpu"))
    assert method.watched
    steps = [tuple(torch.rand(7, 7, generator=g) < 0.3 for _ in range(2)) for _ in range(2)]
    weights = [tuple(torch.rand(7, 7, generator=g) * 2 for _ in range(2)) for _ in range(2)]
    for flagged, weight in zip(steps, weights):
        method.flagged, method.weights = flagged, weight
        flags.observe(torch.arange(7))
    summary = flags.epoch_summary()
    totals = {}
    for d, matrix in enumerate((truth.tolist(), truth.t().tolist())):
        tp = fp = fn = 0
        w_false = w_true = n_false = n_true = 0.0
        for flagged, weight in zip(steps, weights):
            for i in range(7):
                for j in range(7):
                    if i == j:
                        continue
                    f, t, w = bool(flagged[d][i, j]), matrix[i][j], float(weight[d][i, j])
                    tp, fp, fn = tp + (f and t), fp + (f and not t), fn + (t and not f)
                    w_false, n_false = (w_false + w, n_false + 1) if t else (w_false, n_false)
                    w_true, n_true = (w_true + w, n_true + 1) if not t else (w_true, n_true)
        key = ("i2t", "t2i")[d]
        assert summary[f"{key}_flagged"] == tp + fp and summary[f"{key}_true_false_negatives"] == tp + fn
        assert summary[f"{key}_precision"] == pytest.approx(tp / (tp + fp))
        assert summary[f"{key}_recall"] == pytest.approx(tp / (tp + fn))
        assert summary[f"{key}_weight_false"] == pytest.approx(w_false / n_false)
        assert summary[f"{key}_weight_true"] == pytest.approx(w_true / n_true)
        totals[key] = (tp, fp, fn)
    tp, fp, fn = (sum(v) for v in zip(*totals.values()))
    assert summary["precision"] == pytest.approx(tp / (tp + fp)) and summary["recall"] == pytest.approx(tp / (tp + fn))
    assert summary["negatives"] == 2 * 2 * 42
    assert flags.epoch_summary() is None  # the counts start again at zero
    flags.load_state_dict({"counts": [3, 1, 2, 42]})  # (image anchors only, as checkpoints before both directions)
    assert flags.counts.tolist() == [[3, 1, 2, 42], [0, 0, 0, 0]]
    restored = FlagsAgainstOracle(FalseNegatives(), lambda ids: truth, torch.device("cpu"))
    flags.load_state_dict(flags.state_dict())
    restored.load_state_dict(flags.state_dict())
    assert restored.counts.equal(flags.counts) and restored.sums.equal(flags.sums)
