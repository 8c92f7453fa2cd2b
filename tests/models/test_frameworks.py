"""The framework seam: one similarity for one- and multi-vector image features, the ITC variants over BLIP-2's
query features, and the framework rules a recipe is validated against."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from falcon_cli.objectives.common import image_text_similarity, paired_image_feature


def _unit(*shape, seed=0):
    return F.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1)


def test_image_text_similarity_is_the_best_querys_and_a_dot_product_for_one_vector():
    queries, texts = _unit(3, 4, 8), _unit(5, 8, seed=1)
    got = image_text_similarity(queries, texts)
    for i in range(3):
        for j in range(5):
            assert got[i, j] == pytest.approx(max(float(queries[i, q] @ texts[j]) for q in range(4)), abs=1e-6)
    single = _unit(3, 8, seed=2)
    assert torch.equal(image_text_similarity(single, texts), single @ texts.t())
    with pytest.raises(ValueError, match="expected"):
        image_text_similarity(torch.zeros(2, 3, 4, 5), texts)


def test_the_paired_image_feature_is_the_query_closest_to_the_pairs_own_text():
    queries, texts = _unit(4, 6, 8), _unit(4, 8, seed=3)
    got = paired_image_feature(queries, texts)
    for b in range(4):
        best = max(range(6), key=lambda q: float(queries[b, q] @ texts[b]))
        assert torch.equal(got[b], queries[b, best])
    single = _unit(4, 8, seed=4)
    assert paired_image_feature(single, texts) is single


def _reference_itc(sim: torch.Tensor, smoothing: float) -> torch.Tensor:
    """LAVIS's BLIP-2 ITC written out: cross-entropy with smoothed targets in both directions."""
    targets = torch.arange(sim.shape[0])
    return (
        F.cross_entropy(sim, targets, label_smoothing=smoothing)
        + F.cross_entropy(sim.t(), targets, label_smoothing=smoothing)
    ) / 2


def test_blip2_itc_is_lavis_symmetric_infonce_over_the_best_query_with_gradient_to_both_sides():
    from falcon_cli.objectives.false_negatives import PlainItc

    queries = _unit(5, 4, 8).requires_grad_()
    texts = _unit(5, 8, seed=5).requires_grad_()
    tau = torch.tensor(0.07, requires_grad=True)
    out = PlainItc(label_smoothing=0.1, stop_gradient=False).itc(queries, texts, tau, 0.0, None)
    sim = torch.stack([torch.stack([(queries[i] @ texts[j]).max() for j in range(5)]) for i in range(5)]) / tau
    reference = _reference_itc(sim, 0.1)
    assert out.loss.item() == pytest.approx(reference.item(), rel=1e-6)
    grads = torch.autograd.grad(out.loss, (queries, texts, tau))
    expected = torch.autograd.grad(reference, (queries, texts, tau))
    for a, b in zip(grads, expected):
        assert torch.allclose(a, b, atol=1e-6)
    # GRIT's stop-gradient (the ALBEF default) sends each direction's gradient to its anchor only: different
    grit = PlainItc().itc(queries, texts, tau, 0.0, None)
    assert grit.loss.item() != pytest.approx(out.loss.item())


@pytest.mark.parametrize("method", ["diht", "glofnd", "srcl"])
def test_the_false_negative_methods_take_query_features(method):
    """Each method's ITC on [B, Q, D] image features equals the same method on the best query per (image,
    text), which is what image_text_similarity defines (checked on features where one query always wins)."""
    from falcon_cli.objectives import false_negatives as methods
    from falcon_cli.objectives.false_negatives import StepContext

    b, d = 6, 8
    # every feature in the positive orthant, so every similarity is positive and the other queries (the
    # winner scaled down) are beaten by the winner for every text
    winners, texts = F.normalize(_unit(b, d, seed=6).abs(), dim=-1), F.normalize(_unit(b, d, seed=7).abs(), dim=-1)
    queries = torch.cat(
        [winners.unsqueeze(1), winners.unsqueeze(1) * torch.tensor([0.3, 0.5, 0.9]).view(1, 3, 1)], dim=1
    )
    assert torch.equal(image_text_similarity(queries, texts), winners @ texts.t())
    ids = torch.arange(b)
    context = StepContext(ids, epoch=2, step=1, total_steps=4)

    def build():
        if method == "diht":
            return methods.Diht(beta=0.5)
        if method == "glofnd":
            return methods.Glofnd(list(range(b)), alpha=0.3, start_epoch=0)
        aux = (_unit(b, d, seed=8), _unit(b, d, seed=9))
        return methods.Srcl(lambda pair_ids: (aux[0][pair_ids], aux[1][pair_ids]), delta=2.0)

    multi = build().itc(queries, texts, torch.tensor(0.1), 0.0, context)
    single = build().itc(winners, texts, torch.tensor(0.1), 0.0, context)
    assert multi.loss.item() == pytest.approx(single.loss.item(), rel=1e-6)


def test_recipes_are_checked_against_their_models_framework():
    from falcon_cli.config.recipes import load_recipe
    from falcon_cli.errors import FalconError

    with pytest.raises(FalconError, match="whose rewards are"):
        load_recipe("shapes-falcon", ["pretrain.scheduler.reward.name=itg"])
    config, _ = load_recipe("shapes-falcon", [])
    assert config.pretrain.losses.itc_consistency_weight == 0.2
    with pytest.raises(FalconError, match="unknown model 'albef-tinyy'"):
        load_recipe("shapes-falcon", ["pretrain.model=albef-tinyy"])


# --- the records say what the code used to ask by name or by probing --------------------------------------------


@pytest.mark.parametrize("name", ["albef-tiny", "blip2-tiny", "dual-tiny"])
def test_a_family_record_says_what_its_models_can_do(name):
    """The capabilities the stages ask the record for are the models' own: a record that lies fails here."""
    from falcon_cli.frameworks import framework_of, model_framework
    from falcon_cli.models.families import model_family
    from falcon_cli.models.registry import create_model, get_model_config

    config = get_model_config(name)
    family = model_family(config)
    assert isinstance(config, family.config_class())
    model = create_model(name, vocab_size=40)
    assert framework_of(model) is model_framework(name) and framework_of(model).family is family
    assert family.itm_head == hasattr(model, "match_logits") == hasattr(model, "pair_itm_logits")
    assert family.downstream == (family.name == "albef")
    assert family.tokenizer_vocabulary(model.config) == 40 - family.appended_tokens


def test_model_overrides_put_each_source_in_its_frameworks_field():
    from falcon_cli.frameworks import FRAMEWORKS, model_overrides

    def overrides(name, **extra):
        return model_overrides(FRAMEWORKS[name], 100, vision_weights="V", text_weights="T", image_size=None, **extra)

    assert overrides("albef", pad_token_id=0) == {"vocab_size": 100, "vision_weights": "V", "text_weights": "T"}
    assert overrides("blip2") == {"vocab_size": 101, "vision_weights": "V", "qformer_weights": "T"}  # + [DEC]
    assert overrides("dual", pad_token_id=3) == {"vocab_size": 100, "open_clip_weights": "V", "pad_token_id": 3}
    assert model_overrides(FRAMEWORKS["dual"], 9, vision_weights=None, text_weights=None, image_size=64) == {
        "vocab_size": 9,
        "open_clip_weights": None,
        "image_size": 64,
    }


def test_the_record_builds_each_frameworks_objective_with_its_plain_itc():
    from falcon_cli.config.recipes import load_recipe
    from falcon_cli.frameworks import build_objective, model_framework
    from falcon_cli.models.registry import create_model
    from falcon_cli.objectives.contract import PretrainObjective

    for name, kind, smoothing, stop in (
        ("albef-tiny", "VlpObjective", 0.0, True),
        ("blip2-tiny", "Blip2Objective", 0.1, False),
        ("dual-tiny", "DualObjective", 0.0, False),
    ):
        framework = model_framework(name)
        config, _ = load_recipe("shapes-demo", [f"pretrain.model={name}", "pretrain.losses.caption_weight=0"])
        objective = build_objective(framework, create_model(name, vocab_size=40), config.pretrain.losses)
        assert type(objective).__name__ == kind and isinstance(objective, PretrainObjective)
        plain = objective.false_negatives
        assert (plain.name, plain.label_smoothing, plain.stop_gradient) == ("none", smoothing, stop)
        assert objective.generative in framework.rewards
