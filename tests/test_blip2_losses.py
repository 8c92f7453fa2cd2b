"""BLIP-2 losses (falcon_cli/objectives/blip2.py): ITG against a token-by-token loop, and ITM through ALBEF's itm_loss."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from falcon_cli.objectives.blip2 import ITG_LABEL_SMOOTHING, itg_loss
from falcon_cli.objectives.itm import itm_loss


def _reference_token_losses(logits, input_ids, attention_mask, smoothing):
    """Per caption, the list of (1 - s) * -log p(y) + s * mean_v -log p(v) for each predicted next token."""
    out = []
    b, length, vocab = logits.shape
    for i in range(b):
        losses = []
        for t in range(length - 1):
            if not attention_mask[i, t + 1]:
                continue
            logp = [x - math.log(sum(math.exp(v) for v in logits[i, t].tolist())) for x in logits[i, t].tolist()]
            y = int(input_ids[i, t + 1])
            losses.append((1 - smoothing) * -logp[y] + smoothing * sum(-v for v in logp) / vocab)
        out.append(losses)
    return out


def _batch(seed=0, b=4, length=7, vocab=11):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, length, vocab, generator=g, dtype=torch.float64) * 2
    input_ids = torch.randint(1, vocab, (b, length), generator=g)
    lengths = torch.tensor([length, 4, 1, 6])[:b]  # caption 2 is [CLS] alone: nothing to predict
    attention_mask = (torch.arange(length)[None] < lengths[:, None]).long()
    input_ids = input_ids * attention_mask  # padding id 0
    return logits, input_ids, attention_mask


@pytest.mark.parametrize("smoothing", [ITG_LABEL_SMOOTHING, 0.0, 0.3])
def test_itg_loss_equals_a_token_by_token_loop_with_label_smoothing(smoothing):
    logits, input_ids, attention_mask = _batch()
    ref = _reference_token_losses(logits, input_ids, attention_mask, smoothing)
    flat = [x for row in ref for x in row]
    scalar = itg_loss(logits, input_ids, attention_mask, label_smoothing=smoothing)
    assert scalar.dtype == torch.float32
    assert scalar.item() == pytest.approx(sum(flat) / len(flat), rel=1e-5)
    per = itg_loss(logits, input_ids, attention_mask, label_smoothing=smoothing, per_sample=True)
    assert per.shape == (4,)
    expected = [sum(row) / len(row) if row else 0.0 for row in ref]
    assert per.tolist() == pytest.approx(expected, rel=1e-5)
    assert per[2].item() == 0.0  # no predicted token: 0, not NaN
    # the scalar is the token-weighted mean of the per-caption losses
    counts = torch.tensor([len(row) for row in ref], dtype=torch.float32)
    assert scalar.item() == pytest.approx(((per * counts).sum() / counts.sum()).item(), rel=1e-6)


def test_itg_default_smoothing_is_lavis_and_equals_torch_ce_with_ignore_index():
    logits, input_ids, attention_mask = _batch(seed=1)
    labels = input_ids.masked_fill(attention_mask == 0, -100)[:, 1:]
    lavis = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                            ignore_index=-100, label_smoothing=0.1)
    assert itg_loss(logits, input_ids, attention_mask).item() == pytest.approx(lavis.item(), rel=1e-6)


def test_itg_gradient_reaches_only_predicting_positions_and_ignores_padding_logits():
    logits, input_ids, attention_mask = _batch(seed=2)
    logits = logits.float().requires_grad_()
    itg_loss(logits, input_ids, attention_mask).backward()
    predicting = torch.zeros_like(attention_mask, dtype=torch.bool)
    predicting[:, :-1] = attention_mask[:, 1:].bool()
    norms = logits.grad.abs().sum(-1)
    assert (norms[predicting] > 0).all() and (norms[~predicting] == 0).all()
    # padding positions' logits and ids do not change the loss
    changed_logits = logits.detach().clone()
    changed_logits[~predicting] = 100.0
    changed_ids = input_ids.masked_fill(attention_mask == 0, 5)
    assert itg_loss(changed_logits, changed_ids, attention_mask).item() == pytest.approx(
        itg_loss(logits.detach(), input_ids, attention_mask).item(), rel=1e-6)


def test_itg_loss_is_float32_under_autocast_and_zero_without_predicted_tokens():
    logits, input_ids, attention_mask = _batch(seed=3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = itg_loss(logits.bfloat16(), input_ids, attention_mask)
    assert loss.dtype == torch.float32
    ref = itg_loss(logits.bfloat16().float(), input_ids, attention_mask)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    empty = torch.zeros_like(attention_mask)
    empty[:, 0] = 1
    x = logits.float().requires_grad_()
    zero = itg_loss(x, input_ids, empty)
    assert zero.item() == 0.0 and zero.requires_grad
    with pytest.raises(ValueError):
        itg_loss(logits[:, :-1], input_ids, attention_mask)


def test_blip2_itm_is_albef_itm_loss_on_lavis_order():
    """LAVIS: labels [1]*B + [0]*2B on [pos; neg images; neg texts], mean CE; itm_loss does exactly that,
    so BLIP-2 reuses it (falcon_cli/objectives/blip2.py defines no ITM loss of its own)."""
    g = torch.Generator().manual_seed(4)
    b = 5
    logits = torch.randn(3 * b, 2, generator=g)
    lavis = F.cross_entropy(logits, torch.cat([torch.ones(b, dtype=torch.long), torch.zeros(2 * b, dtype=torch.long)]))
    assert itm_loss(logits[:b], logits[b:]).item() == pytest.approx(lavis.item(), rel=1e-6)
    import falcon_cli.objectives.blip2 as blip2_objectives

    assert "itm_loss(logits[:B], logits[B:])" in blip2_objectives.__doc__
