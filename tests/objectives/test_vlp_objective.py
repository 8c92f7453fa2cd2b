"""VlpObjective: the whole pretraining loss in one forward (what DDP and the training loop call)."""

from __future__ import annotations

import pytest
import torch

from falcon_cli.models.registry import create_model
from falcon_cli.objectives.mlm import MlmMask
from falcon_cli.objectives.vlp import VlpObjective

VOCAB = 120


def batch(b=6, length=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(b, 3, 64, 64, generator=g)
    ids = torch.randint(5, VOCAB, (b, length), generator=g)
    ids[:, 0] = 2
    attention = torch.ones_like(ids)
    attention[0, -3:] = 0
    ids[0, -3:] = 0
    mask = MlmMask.sample(
        ids,
        attention,
        vocab_size=VOCAB,
        mask_token_id=4,
        pad_token_id=0,
        cls_token_id=2,
        generator=torch.Generator().manual_seed(seed),
    )
    return images, ids, attention, mask


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return create_model("albef-tiny", vocab_size=VOCAB)


def test_loss_is_the_sum_and_every_part_gets_gradient(model):
    objective = VlpObjective(model)
    out = objective(*batch())
    assert torch.allclose(out.loss, out.itc + out.itm + out.mlm)
    assert out.image_feat.shape == (6, 256) and not out.image_feat.requires_grad
    out.loss.backward()
    for name in (
        "visual_encoder",
        "text_encoder",
        "fusion_encoder",
        "vision_proj",
        "text_proj",
        "itm_head",
        "mlm_head",
    ):
        grads = [p.grad for p in getattr(model, name).parameters() if p.requires_grad]
        assert grads and all(g is not None for g in grads) and any(g.abs().sum() > 0 for g in grads), name
    assert model.temp.grad is not None
    model.zero_grad()


def test_same_mask_same_mlm_loss(model):
    """FALCON's reward evaluates the same batch with the identical mask twice."""
    objective = VlpObjective(model).eval()
    images, ids, attention, mask = batch(seed=1)
    with torch.no_grad():
        tokens, _ = model.encode_image(images)
        first = objective.mlm_loss(tokens, attention, mask)
        second = objective.mlm_loss(tokens, attention, MlmMask.from_state_dict(mask.state_dict()))
        per_sample = objective.mlm_loss(tokens, attention, mask, per_sample=True)
    assert torch.equal(first, second)
    n = mask.num_selected.float()
    assert torch.allclose((per_sample * n).sum() / n.sum(), first, atol=1e-6)


def test_measure_matches_the_forward_and_reuses_given_image_tokens(model):
    """The reward pass: eval-mode measure() equals the eval forward's losses; given the image
    encoding (reward_images: reuse) it skips the image encoder and gives the same numbers."""
    objective = VlpObjective(model).eval()
    images, ids, attention, mask = batch(seed=2)
    with torch.no_grad():
        out = objective(images, ids, attention, mask)
        parts = ("itc", "itm", "mlm")
        fresh = objective.measure(images, ids, attention, mask, parts=parts)
        encoding = (out.image_tokens, out.image_feat)
        calls = []
        hook = model.visual_encoder.register_forward_hook(lambda *a: calls.append(1))
        reused = objective.measure(images, ids, attention, mask, parts=parts, image=encoding)
        hook.remove()
    assert not calls, "the image encoder must not run when its output is given"
    for name in parts:
        assert torch.allclose(fresh[name], getattr(out, name), atol=1e-5), name
        assert torch.allclose(reused[name], fresh[name], atol=1e-5), name
    objective.train()


def test_momentum_distillation_path(model):
    objective = VlpObjective(model, itc="momentum", queue_size=12, momentum=0.5)
    before = objective.momentum_encoders.vision_proj.weight.clone()
    with torch.no_grad():
        model.vision_proj.weight.add_(1.0)  # the online model moves; the EMA must follow halfway
    out = objective(*batch(), distill_alpha=0.4)
    assert torch.isfinite(out.loss) and int(objective.queue.ptr) == 6
    expected = 0.5 * before + 0.5 * model.vision_proj.weight
    assert torch.allclose(objective.momentum_encoders.vision_proj.weight, expected, atol=1e-6)
    assert not any(p.requires_grad for p in objective.momentum_encoders.parameters())
    objective(*batch(seed=2))
    assert int(objective.queue.ptr) == 0, "12-slot queue wraps after two batches of 6"
    # The momentum features pool exactly like the online model's (albef-tiny: mean pooling).
    images, ids, attention, _ = batch()
    copy = VlpObjective(model, itc="momentum", queue_size=12)
    model.eval()
    with torch.no_grad():
        _, image_feat = model.encode_image(images)
        _, text_feat = model.encode_text(ids, attention)
    image_m, text_m = copy.momentum_encoders.eval().features(images, ids, attention)
    model.train()
    assert model.config.pooling == "mean"
    assert torch.allclose(image_m, image_feat, atol=1e-5) and torch.allclose(text_m, text_feat, atol=1e-5)
    with torch.no_grad():
        model.vision_proj.weight.sub_(1.0)


# --- false-negative methods: neutral settings reproduce plain ITC; active ones change what they say ---------


def _losses(model, method, context, seed=3, consistency_weight=0.2):
    """One forward in eval mode (no dropout), so two objectives see identical activations. The
    consistency weight is fixed, so that only the method differs (each method's own default differs)."""
    objective = VlpObjective(model, false_negatives=method, consistency_weight=consistency_weight).eval()
    with torch.no_grad():
        return objective(*batch(seed=seed), context=context)


def test_each_false_negative_method_trains_its_papers_consistency_weight(model):
    """Without an explicit weight the objective trains the method's own ITC: GRIT's consistency term at
    0.2 for plain ITC, none for MAFA, SRCL, DiHT, GloFND; an explicit weight wins."""
    from falcon_cli.objectives.false_negatives import Diht, Glofnd, Mafa, PlainItc, Srcl, StepContext
    from falcon_cli.objectives.itc import itc_grit

    aux = torch.nn.functional.normalize(torch.randn(6, 16, generator=torch.Generator().manual_seed(0)), dim=1)
    methods = {
        "none": PlainItc(),
        "diht": Diht(beta=0.0),
        "srcl": Srcl(lambda pair_ids: (aux, aux), delta=0.0),
        "glofnd": Glofnd(torch.arange(100, 110), alpha=0.1, start_epoch=5),
        "mafa": Mafa(lambda i, t, epoch: torch.zeros(len(i))),
    }
    expected = {"none": 0.2, "diht": 0.0, "srcl": 0.0, "glofnd": 0.0, "mafa": 0.0}
    assert VlpObjective(model).consistency_weight == 0.2
    context = StepContext(torch.arange(100, 106), epoch=0, step=0, total_steps=10)
    for name, method in methods.items():
        objective = VlpObjective(model, false_negatives=method).eval()
        assert objective.consistency_weight == expected[name], name
        assert VlpObjective(model, false_negatives=method, consistency_weight=0.3).consistency_weight == 0.3
        # what the forward trains: these neutral settings reduce every method to GRIT's ITC at that weight
        with torch.no_grad():
            out = objective(*batch(seed=3), context=context)
        for weight in (0.0, 0.2):
            same = torch.allclose(
                out.itc,
                itc_grit(out.image_feat, out.text_feat, out.temperature, consistency_weight=weight).loss,
                atol=1e-5,
            )
            assert same == (weight == expected[name]), (name, weight)
    model.train()


def test_an_extra_mlm_pair_listed_twice_counts_twice(model):
    """MAFA's extra MLM pairs (mlm_pairs=per_direction lists a pair converted both ways twice): each entry is one
    more (image, masked caption) row in the token mean, with the caption's own mask."""
    objective = VlpObjective(model).eval()
    images, ids, attention, mask = batch(seed=4)
    one, two = (torch.tensor([1]), torch.tensor([2])), (torch.tensor([1, 1]), torch.tensor([2, 2]))
    with torch.no_grad():
        image_tokens, _ = model.encode_image(images)
        plain = objective.mlm_loss(image_tokens, attention, mask)
        once = objective.mlm_loss(image_tokens, attention, mask, extra=one)
        twice = objective.mlm_loss(image_tokens, attention, mask, extra=two)
    n_batch, n_pair = int(mask.selected.sum()), int(mask.selected[2].sum())
    assert n_pair > 0
    total = plain * n_batch
    pair = once * (n_batch + n_pair) - total  # the extra row's summed token loss
    assert torch.allclose(twice, (total + 2 * pair) / (n_batch + 2 * n_pair), atol=1e-5)
    assert not torch.allclose(twice, once)
    model.train()


def test_neutral_false_negative_methods_equal_plain_itc(model):
    from falcon_cli.objectives.false_negatives import Diht, Glofnd, Mafa, PlainItc, Srcl, StepContext

    ids = torch.arange(100, 106)
    context = StepContext(ids, epoch=0, step=0, total_steps=10)
    plain = _losses(model, PlainItc(), context)
    aux = torch.nn.functional.normalize(torch.randn(6, 16, generator=torch.Generator().manual_seed(0)), dim=1)
    neutral = {
        "diht beta 0": Diht(beta=0.0, alpha=1.0),
        "srcl delta 0": Srcl(lambda pair_ids: (aux, aux), delta=0.0),
        "glofnd before its start epoch": Glofnd(torch.arange(100, 110), alpha=0.1, start_epoch=1),
        "mafa, nothing matches": Mafa(lambda i, t, epoch: torch.zeros(len(i))),
    }
    for name, method in neutral.items():
        out = _losses(model, method, context)
        for part in ("itc", "itm", "mlm"):
            assert torch.allclose(getattr(out, part), getattr(plain, part), atol=1e-5), (name, part)
    model.train()


def test_active_false_negative_methods_change_the_loss_and_report(model):
    from falcon_cli.objectives.false_negatives import Diht, Glofnd, Mafa, PlainItc, StepContext

    ids = torch.arange(100, 106)
    context = StepContext(ids, epoch=1, step=5, total_steps=10)
    plain = _losses(model, PlainItc(), context)
    assert not torch.allclose(_losses(model, Diht(beta=1.0), context).itc, plain.itc)

    calls = []

    def everything_matches(image_pairs, text_pairs, epoch):
        calls.append((image_pairs.tolist(), text_pairs.tolist(), epoch))
        return torch.ones(len(image_pairs))

    mafa = Mafa(everything_matches, high=0.8, low=0.5, smoothing=0.5)
    out = _losses(model, mafa, context)
    assert len(calls) == 1 and len(calls[0][0]) == 12 and calls[0][2] == 1, (
        "one discriminator pass, 2B pairs, by pair id"
    )
    assert set(calls[0][0]) <= set(ids.tolist()) and set(calls[0][1]) <= set(ids.tolist())
    assert mafa.stats["fn_converted_i2t"] == 6 and mafa.stats["fn_converted_t2i"] == 6
    assert mafa.mining.neg_labels.tolist() == [1] * 12, "converted pairs are ITM matches"
    assert len(mafa.mining.mlm_image_index) == 12 and int(mafa.flagged[0].sum()) == 6, "an MLM pair per conversion"
    for part in ("itc", "itm", "mlm"):
        assert not torch.allclose(getattr(out, part), getattr(plain, part)), part

    glofnd = Glofnd(torch.arange(100, 110), alpha=0.5, lr=0.9, start_epoch=1)
    before = glofnd.thresholds.lambda_image.clone()
    _losses(model, glofnd, context)
    after = glofnd.thresholds.lambda_image
    assert (after[:6] < before[:6]).all() and torch.equal(after[6:], before[6:]), "only the batch's thresholds move"
    assert glofnd.stats["glofnd_lambda_image"] < 1.0
    model.train()


def test_alignment_reward_is_minus_each_pairs_own_cosine(model):
    """``alignment``: minus cos(image_i, text_i) of each pair (per pair), or its mean; per-pair losses are
    refused for a mix of parts."""
    objective = VlpObjective(model).eval()
    images, ids, attention, mask = batch(seed=4)
    with torch.no_grad():
        per_pair = objective.measure(images, ids, attention, mask, parts=("alignment",), per_pair=True)["alignment"]
        mean = objective.measure(images, ids, attention, mask, parts=("alignment",))["alignment"]
        _, image = model.encode_image(images)
        _, text = model.encode_text(ids, attention)
    plain = torch.stack([-torch.dot(image[i], text[i]) / (image[i].norm() * text[i].norm()) for i in range(len(ids))])
    assert per_pair.shape == (6,) and torch.allclose(per_pair, plain, atol=1e-5)
    assert torch.allclose(mean, plain.mean(), atol=1e-5)
    with pytest.raises(ValueError, match="mlm or alignment"):
        objective.measure(images, ids, attention, mask, parts=("alignment", "mlm"), per_pair=True)
    objective.train()


def test_match_probability_is_the_itm_heads_judgement_of_each_chosen_pair(model):
    """FALCON's ``positive_margin+itm`` reward asks the model whether each chained pick matches its anchor: the
    ITM head's softmax match probability of (image i, caption j), as a plain per-pair fusion pass gives it."""
    from falcon_cli.sampling.scheduler import chain_pairs

    objective = VlpObjective(model).eval()
    images, ids, attention, mask = batch(b=5, seed=2)
    image_index, text_index = chain_pairs(5)
    with torch.no_grad():
        out = objective(images, ids, attention, mask)
        got = objective.match_probability(out, ids, attention, image_index, text_index)
        text_tokens, _ = model.encode_text(ids, attention)
        for p, (i, j) in enumerate(zip(image_index.tolist(), text_index.tolist())):
            fused = model.fuse(text_tokens[j : j + 1], attention[j : j + 1], out.image_tokens[i : i + 1])
            want = torch.softmax(model.itm_logits(fused), -1)[0, 1]
            assert got[p].item() == pytest.approx(want.item(), abs=1e-5), (i, j)
    assert got.shape == (8,) and not got.requires_grad
