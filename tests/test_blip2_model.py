"""BLIP-2 stage-1 model (falcon_cli/models/blip2.py) on tiny configs: the ITG mask, ITM, ITC features, the frozen
image tower, the temperature, gradients of the combined loss, and weights from HF BLIP-2 and BERT checkpoints."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from falcon_cli.errors import FalconError
from falcon_cli.models.blip2 import Blip2Config, Blip2QFormer, build_blip2, itg_attention_mask
from falcon_cli.objectives.blip2 import itg_loss
from falcon_cli.objectives.common import image_text_similarity
from falcon_cli.objectives.itm import itm_loss

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CONFIGS = Path(__file__).resolve().parents[1] / "falcon_cli" / "models" / "configs"

TINY = dict(vision="timm", image_size=32, patch_size=8, vision_width=48, vision_layers=1, vision_heads=3,
            vision_mlp_ratio=2.0, qformer_width=32, qformer_layers=3, qformer_heads=2, qformer_intermediate_size=64,
            cross_attention_frequency=2, num_query_tokens=4, vocab_size=40, max_position_embeddings=16, embed_dim=16)
"""Timm tower; Q-Former layers 0 and 2 cross-attend, layer 1 does not."""

HF_TINY = dict(TINY, vision="hf", vision_layers=2, qformer_layers=2, vocab_size=60, max_position_embeddings=32)
Q = TINY["num_query_tokens"]


@torch.no_grad()
def _scramble(model: torch.nn.Module, seed: int = 0, std: float = 0.1) -> None:
    """Noise on every parameter (LayerNorms stay near 1), so outputs react clearly to every input."""
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.add_(torch.randn(p.shape, generator=g) * std)


def _model(seed: int = 0, **overrides) -> Blip2QFormer:
    torch.manual_seed(seed)
    model = Blip2QFormer(Blip2Config(**{**TINY, **overrides}))
    _scramble(model, seed)
    return model.eval()


def _inputs(b: int = 3, length: int = 7, vocab: int = 40, seed: int = 0, image_size: int = 32):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(b, 3, image_size, image_size, generator=g)
    ids = torch.randint(2, vocab - 1, (b, length), generator=g)
    lengths = torch.tensor([length, 4, 5, 2, 6, 3][:b])
    mask = (torch.arange(length)[None] < lengths[:, None]).long()
    ids = ids * mask  # [PAD] = 0
    ids[:, 0] = 1     # a [CLS]
    return images, ids, mask


@pytest.fixture(scope="module")
def model():
    return _model()


# --- config ----------------------------------------------------------------------------------------

def test_config_checks_ranges_and_resolves_dec_id():
    config = Blip2Config(**TINY)
    assert config.framework == "blip2" and config.dec_id == 39
    assert Blip2Config(**TINY, dec_token_id=3).dec_id == 3
    bad = [dict(qformer_heads=3), dict(vision_heads=5), dict(image_size=30), dict(hidden_dropout=1.0),
           dict(attention_dropout=-0.1), dict(temp_min=0.07), dict(temp_init=0.6), dict(dec_token_id=40),
           dict(num_query_tokens=0), dict(vocab_size=1), dict(layer_norm_eps=0.0)]
    for values in bad:
        with pytest.raises(ValueError):
            Blip2Config(**{**TINY, **values})
    with pytest.raises(ValueError):
        Blip2Config(**TINY, text_width=32)  # extra keys are refused
    with pytest.raises(ValueError):
        config.qformer_heads = 5  # assignments are validated
    for name, field in Blip2Config.model_fields.items():
        assert field.description, f"{name} has no docstring"


def test_shipped_configs_validate_and_blip2_base_has_the_stage1_sizes():
    base = Blip2Config.model_validate(json.loads((CONFIGS / "blip2-base.json").read_text()))
    assert (base.vision, base.image_size, base.patch_size, base.vision_width, base.vision_layers,
            base.vision_heads) == ("hf", 224, 14, 1408, 39, 16)
    assert round(base.vision_width * base.vision_mlp_ratio) == 6144
    assert (base.qformer_width, base.qformer_layers, base.qformer_heads, base.qformer_intermediate_size,
            base.cross_attention_frequency, base.num_query_tokens, base.vocab_size, base.embed_dim,
            base.dec_id) == (768, 12, 12, 3072, 2, 32, 30523, 256, 30522)
    assert base.vision_weights is None and base.qformer_weights is None
    tiny = Blip2Config.model_validate(json.loads((CONFIGS / "blip2-tiny.json").read_text()))
    assert tiny.vision == "timm"
    torch.manual_seed(0)
    model = Blip2QFormer(tiny).eval()
    images, ids, mask = _inputs(2, 5, tiny.vocab_size, image_size=tiny.image_size)
    with torch.no_grad():
        enc = model(images, ids, mask)
    assert enc.image_embeds.shape == (2, model.num_image_tokens, tiny.vision_width)
    assert enc.image_feat.shape == (2, tiny.num_query_tokens, tiny.embed_dim)


# --- ITG: the 4-D mask -----------------------------------------------------------------------------

def test_itg_mask_layout():
    mask = torch.tensor([[1, 1, 1, 0]])
    m = itg_attention_mask(mask, 2)[0, 0]
    assert m.shape == (6, 6) and m.dtype == torch.bool
    expected = torch.tensor([[1, 1, 0, 0, 0, 0],
                             [1, 1, 0, 0, 0, 0],
                             [1, 1, 1, 0, 0, 0],
                             [1, 1, 1, 1, 0, 0],
                             [1, 1, 1, 1, 1, 0],
                             [1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    assert torch.equal(m, expected)


def test_itg_mask_reaches_sdpa_unchanged_and_cross_attention_is_unmasked(model, monkeypatch):
    """transformers returns a 4-D mask as it is: every Q-Former self-attention gets exactly our boolean mask."""
    images, ids, mask = _inputs()
    real = F.scaled_dot_product_attention
    seen = []

    def spy(query, key, value, attn_mask=None, **kwargs):
        seen.append((query.shape[-2], key.shape[-2], attn_mask, kwargs.get("is_causal", False)))
        return real(query, key, value, attn_mask=attn_mask, **kwargs)

    with torch.no_grad():
        image_embeds = model.image_embeddings(images)
        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
        model.itg_logits(image_embeds, ids, mask)
    expected = itg_attention_mask(mask, Q)
    t = Q + ids.shape[1]
    self_calls = [s for s in seen if s[0] == t]
    cross_calls = [s for s in seen if s[0] == Q]
    assert len(self_calls) == TINY["qformer_layers"] and len(cross_calls) == 2  # layers 0 and 2 cross-attend
    for _, k, attn_mask, is_causal in self_calls:
        assert k == t and not is_causal and attn_mask.dtype == torch.bool and torch.equal(attn_mask, expected)
    for _, k, attn_mask, _ in cross_calls:
        assert k == model.num_image_tokens and attn_mask is None


def test_itg_is_causal_over_text(model):
    images, ids, mask = _inputs()
    mask = torch.ones_like(mask)
    ids = torch.where(ids == 0, torch.full_like(ids, 7), ids)
    with torch.no_grad():
        image_embeds = model.image_embeddings(images)
        full = model.itg_logits(image_embeds, ids, mask)
        for k in (1, 3, 6):
            changed = ids.clone()
            changed[:, k] = (changed[:, k] + 5) % 38 + 1
            out = model.itg_logits(image_embeds, changed, mask)
            torch.testing.assert_close(out[:, :k], full[:, :k], rtol=0, atol=1e-5)
            assert ((out[:, k:] - full[:, k:]).abs().amax(dim=-1) > 1e-4).all()
        # a prefix alone gives the same logits: later tokens are invisible, not merely down-weighted
        for length in (1, 4):
            prefix = model.itg_logits(image_embeds, ids[:, :length], mask[:, :length])
            torch.testing.assert_close(prefix, full[:, :length], rtol=0, atol=1e-5)


def test_itg_first_input_is_dec_whatever_token_zero_is(model):
    images, ids, mask = _inputs()
    with torch.no_grad():
        image_embeds = model.image_embeddings(images)
        a = model.itg_logits(image_embeds, ids, mask)
        other = ids.clone()
        other[:, 0] = 5
        b = model.itg_logits(image_embeds, other, mask)
        dec = ids.clone()
        dec[:, 0] = model.config.dec_id
        c = model.itg_logits(image_embeds, dec, mask)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(a, c, rtol=0, atol=0)


def test_itg_image_changes_every_text_position_and_queries_ignore_the_text(model):
    images, ids, mask = _inputs()
    captured = []
    hook = model.qformer.register_forward_hook(lambda m, args, out: captured.append(out.last_hidden_state))
    try:
        with torch.no_grad():
            image_embeds = model.image_embeddings(images)
            base = model.itg_logits(image_embeds, ids, mask)
            other = model.itg_logits(model.image_embeddings(images.roll(1, 0)), ids, mask)
            model.itg_logits(image_embeds, ids.roll(1, 0), mask.roll(1, 0))
            model.query_features(image_embeds)
    finally:
        hook.remove()
    assert ((other - base).abs().amax(dim=-1) > 1e-4).all()  # every text position sees the (other) image
    itg_a, itg_b, queries_alone = captured[0][:, :Q], captured[2][:, :Q], captured[3]
    # in the ITG pass the queries see only queries: bidirectionally, exactly as in the query-only pass
    torch.testing.assert_close(itg_a, queries_alone, rtol=0, atol=1e-5)
    torch.testing.assert_close(itg_b, queries_alone, rtol=0, atol=1e-5)


def test_itg_padding_does_not_change_the_real_positions(model):
    images, ids, mask = _inputs()
    with torch.no_grad():
        image_embeds = model.image_embeddings(images)
        base = model.itg_logits(image_embeds, ids, mask)
        noisy = torch.where(mask.bool(), ids, torch.full_like(ids, 9))
        longer = torch.cat([noisy, torch.full_like(ids[:, :3], 11)], dim=1)
        longer_mask = torch.cat([mask, torch.zeros_like(mask[:, :3])], dim=1)
        out = model.itg_logits(image_embeds, longer, longer_mask)
    real = mask.bool()
    torch.testing.assert_close(out[:, :ids.shape[1]][real], base[real], rtol=0, atol=1e-5)


# --- ITM, ITC ----------------------------------------------------------------------------------------

def test_itm_logits_are_the_head_averaged_over_the_query_outputs(model):
    images, ids, mask = _inputs()
    with torch.no_grad():
        image_embeds = model.image_embeddings(images)
        logits = model.itm_logits(image_embeds, ids, mask)
        # by hand: [queries; word + position embeddings], bidirectional with padding masked, one head per query
        words = model.embeddings.word_embeddings(ids) + model.embeddings.position_embeddings.weight[:ids.shape[1]]
        tokens = torch.cat([model.query_tokens.expand(ids.shape[0], -1, -1), words], dim=1)
        full_mask = torch.cat([torch.ones(ids.shape[0], Q, dtype=mask.dtype), mask], dim=1)
        hidden = model.qformer(query_embeds=tokens, query_length=Q, attention_mask=full_mask,
                               encoder_hidden_states=image_embeds).last_hidden_state
        manual = sum(model.itm_head(hidden[:, q]) for q in range(Q)) / Q
        assert logits.shape == (3, 2) and logits.dtype == torch.float32
        torch.testing.assert_close(logits, manual, rtol=0, atol=1e-5)
        torch.testing.assert_close(model.match_logits(image_embeds, None, ids, mask), logits[:, 1])
        torch.testing.assert_close(model.pair_itm_logits(image_embeds, None, ids, mask), logits)
        # the text attends to the queries and they to the image: another image, other logits
        other = model.itm_logits(model.image_embeddings(images.roll(1, 0)), ids, mask)
        assert ((other - logits).abs().amax(dim=-1) > 1e-4).all()
        # padding is masked: other padding ids and extra padding change nothing
        padded = torch.cat([torch.where(mask.bool(), ids, torch.full_like(ids, 9)), torch.full_like(ids[:, :2], 3)], 1)
        padded_mask = torch.cat([mask, torch.zeros_like(mask[:, :2])], dim=1)
        torch.testing.assert_close(model.itm_logits(image_embeds, padded, padded_mask), logits, rtol=0, atol=1e-5)


def test_text_features_ignore_images_query_features_ignore_texts_and_similarity_is_the_best_query(model):
    images, ids, mask = _inputs()
    with torch.no_grad():
        a = model(images, ids, mask)
        b = model(images.roll(1, 0), ids, mask)
        c = model(images, ids.roll(1, 0), mask.roll(1, 0))
    torch.testing.assert_close(a.text_tokens, b.text_tokens, rtol=0, atol=0)
    torch.testing.assert_close(a.text_feat, b.text_feat, rtol=0, atol=0)
    torch.testing.assert_close(a.image_feat, c.image_feat, rtol=0, atol=0)
    assert a.image_feat.dtype == a.text_feat.dtype == torch.float32
    torch.testing.assert_close(a.image_feat.norm(dim=-1), torch.ones(3, Q))
    torch.testing.assert_close(a.text_feat.norm(dim=-1), torch.ones(3))
    # the [CLS] state, projected and normalised
    torch.testing.assert_close(a.text_feat, F.normalize(model.text_proj(a.text_tokens[:, 0]), dim=-1))
    sim = model.similarity(a.image_feat, a.text_feat)
    loop = torch.tensor([[max(float(a.image_feat[i, q] @ a.text_feat[t]) for q in range(Q)) for t in range(3)]
                         for i in range(3)])
    torch.testing.assert_close(sim, loop, rtol=0, atol=1e-6)
    pooled = model.pooled_image_feature(a.image_feat)
    torch.testing.assert_close(pooled, F.normalize(a.image_feat.mean(dim=1), dim=-1))
    # padding does not reach the text features
    padded = torch.where(mask.bool(), ids, torch.full_like(ids, 9))
    with torch.no_grad():
        _, feat = model.encode_text(padded, mask)
    torch.testing.assert_close(feat, a.text_feat, rtol=0, atol=1e-6)


def test_mean_pooling_reads_the_non_padding_text_states():
    model = _model(pooling="mean")
    _, ids, mask = _inputs()
    with torch.no_grad():
        hidden, feat = model.encode_text(ids, mask)
    keep = mask[..., None].float()
    expected = F.normalize(model.text_proj((hidden * keep).sum(1) / keep.sum(1)), dim=-1)
    torch.testing.assert_close(feat, expected)


# --- frozen tower, temperature, gradients ----------------------------------------------------------------

def test_image_tower_is_frozen_and_stays_in_eval_mode():
    model = _model(hidden_dropout=0.0, attention_dropout=0.0)
    model.train()
    assert model.training and model.qformer.training and not model.visual_encoder.training
    assert not any(m.training for m in model.visual_encoder.modules())
    assert not any(p.requires_grad for p in model.visual_encoder.parameters())
    images, ids, mask = _inputs()
    enc = model(images, ids, mask)
    enc.image_feat.sum().backward()
    assert all(p.grad is None for p in model.visual_encoder.parameters())
    assert model.ln_vision.weight.grad is not None and model.ln_vision.weight.grad.abs().sum() > 0
    assert model.num_parameters(trainable_only=True) == model.num_parameters() - sum(
        p.numel() for p in model.visual_encoder.parameters())
    model.eval()
    assert not model.training and not model.visual_encoder.training
    # unfreezing (runs without a pretrained tower) and freezing again
    model.set_image_encoder_trainable(True)
    model.train()
    assert model.visual_encoder.training and all(p.requires_grad for p in model.visual_encoder.parameters())
    model.set_image_encoder_trainable(False)
    assert not model.visual_encoder.training and not any(p.requires_grad for p in model.visual_encoder.parameters())


def test_temperature_clamp_semantics_match_albef():
    model = _model()
    with torch.no_grad():
        model.temp.fill_(0.9)
    t = model.temperature()
    assert t.item() == pytest.approx(0.5) and model.temp.item() == pytest.approx(0.9)
    t.backward()
    assert model.temp.grad.item() == pytest.approx(1.0)  # straight through, even on the bound
    model.clamp_temperature_()
    assert model.temp.item() == pytest.approx(0.5)
    with torch.no_grad():
        model.temp.fill_(1e-5)
    images, ids, mask = _inputs()
    with torch.no_grad():
        enc = model(images, ids, mask)  # forward clamps in place first
    assert model.temp.item() == pytest.approx(0.001) and enc.temperature.item() == pytest.approx(0.001)


def test_every_trainable_parameter_gets_a_gradient_from_itc_itm_itg():
    model = _model()
    model.train()
    images, ids, mask = _inputs(b=4)
    enc = model(images, ids, mask)
    sim = image_text_similarity(enc.image_feat, enc.text_feat) / enc.temperature
    target = torch.arange(4)
    itc = (F.cross_entropy(sim, target) + F.cross_entropy(sim.t(), target)) / 2
    neg = torch.tensor([1, 2, 3, 0])
    image_index = torch.cat([torch.arange(4), neg, torch.arange(4)])
    text_index = torch.cat([torch.arange(4), torch.arange(4), neg])
    logits = model.itm_logits(enc.image_embeds[image_index], ids[text_index], mask[text_index])
    itm = itm_loss(logits[:4], logits[4:])
    itg = itg_loss(model.itg_logits(enc.image_embeds, ids, mask), ids, mask)
    (itc + itm + itg).backward()
    for name, p in model.named_parameters():
        if not p.requires_grad:
            assert name.startswith("visual_encoder.")
            continue
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        if not name.endswith("key.bias"):  # softmax is invariant to a key bias: its gradient is ~0 by design
            assert p.grad.abs().sum() > 0, name


def test_autocast_gives_float32_unit_features():
    model = _model()
    images, ids, mask = _inputs()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        enc = model(images, ids, mask)
        itg = model.itg_logits(enc.image_embeds, ids, mask)
        itm = model.itm_logits(enc.image_embeds, ids, mask)
    assert enc.image_feat.dtype == enc.text_feat.dtype == itm.dtype == torch.float32
    torch.testing.assert_close(enc.text_feat.norm(dim=-1), torch.ones(3))
    assert torch.isfinite(itg).all() and itg.shape == (3, 7, 40)
    assert itg_loss(itg, ids, mask).dtype == torch.float32


# --- weights -------------------------------------------------------------------------------------------

def _hf_retrieval_checkpoint(directory: Path):
    """A tiny HF Blip2ForImageTextRetrieval with random (non-default) weights, saved with save_pretrained."""
    from transformers import Blip2Config as HfBlip2Config
    from transformers import Blip2ForImageTextRetrieval

    c = HF_TINY
    config = HfBlip2Config(
        vision_config=dict(hidden_size=c["vision_width"], intermediate_size=round(c["vision_width"] * c["vision_mlp_ratio"]),
                           num_hidden_layers=c["vision_layers"], num_attention_heads=c["vision_heads"],
                           image_size=c["image_size"], patch_size=c["patch_size"]),
        qformer_config=dict(vocab_size=c["vocab_size"], hidden_size=c["qformer_width"],
                            num_hidden_layers=c["qformer_layers"], num_attention_heads=c["qformer_heads"],
                            intermediate_size=c["qformer_intermediate_size"],
                            cross_attention_frequency=c["cross_attention_frequency"],
                            encoder_hidden_size=c["vision_width"], use_qformer_text_input=True,
                            max_position_embeddings=c["max_position_embeddings"]),
        num_query_tokens=c["num_query_tokens"], image_text_hidden_size=c["embed_dim"])
    torch.manual_seed(1)
    hf = Blip2ForImageTextRetrieval(config)
    _scramble(hf, seed=1)
    hf.save_pretrained(directory)
    return hf.eval()


def test_hf_blip2_checkpoint_loads_and_reproduces_hf_itm_and_itc(tmp_path):
    hf = _hf_retrieval_checkpoint(tmp_path / "blip2")
    source = str(tmp_path / "blip2")
    model = build_blip2(Blip2Config(**HF_TINY, vision_weights=source, qformer_weights=source)).eval()
    images, ids, mask = _inputs(b=3, length=6, vocab=60)
    with torch.no_grad():
        hf_itm = hf(pixel_values=images, input_ids=ids, attention_mask=mask, use_image_text_matching_head=True)
        hf_itc = hf(pixel_values=images, input_ids=ids, attention_mask=mask, use_image_text_matching_head=False)
        image_embeds, image_feat = model.encode_image(images)
        _, text_feat = model.encode_text(ids, mask)
        itm = model.itm_logits(image_embeds, ids, mask)
        sim = model.similarity(image_feat, text_feat)
        hf_tokens = hf.vision_model(pixel_values=images).last_hidden_state
    assert torch.equal(model.ln_vision.weight, hf.vision_model.post_layernorm.weight)
    torch.testing.assert_close(image_embeds, hf_tokens, rtol=0, atol=1e-5)
    torch.testing.assert_close(itm, hf_itm.logits_per_image, rtol=0, atol=1e-5)
    torch.testing.assert_close(image_feat, hf_itc.image_embeds, rtol=0, atol=1e-5)
    torch.testing.assert_close(text_feat, hf_itc.text_embeds, rtol=0, atol=1e-5)
    torch.testing.assert_close(sim, hf_itc.logits_per_image, rtol=0, atol=1e-5)
    assert (itm[:, 1] - itm[:, 0]).abs().max() > 1e-3  # not a degenerate comparison
    # the Q-Former alone from the checkpoint (another tower)
    qformer_only = build_blip2(Blip2Config(**HF_TINY, qformer_weights=source))
    assert torch.equal(qformer_only.query_tokens, hf.query_tokens)
    assert torch.equal(qformer_only.vision_proj.weight, hf.vision_projection.weight)
    assert not torch.equal(qformer_only.ln_vision.weight, hf.vision_model.post_layernorm.weight)


def test_qformer_initialised_from_bert_as_blip2_does(tmp_path):
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(2)
    bert = BertForMaskedLM(BertConfig(vocab_size=39, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                                      intermediate_size=64, max_position_embeddings=16))
    _scramble(bert, seed=2)
    bert.save_pretrained(tmp_path / "bert")
    sd = bert.state_dict()
    torch.manual_seed(5)
    fresh = Blip2QFormer(Blip2Config(**TINY))
    torch.manual_seed(5)
    model = build_blip2(Blip2Config(**TINY, qformer_weights=str(tmp_path / "bert")))
    ours = model.state_dict()
    for i in range(TINY["qformer_layers"]):
        layer = f"qformer.encoder.layer.{i}."
        assert torch.equal(ours[layer + "attention.attention.query.weight"],
                           sd[f"bert.encoder.layer.{i}.attention.self.query.weight"])
        for copy in ("", "_query"):
            assert torch.equal(ours[f"{layer}intermediate{copy}.dense.weight"],
                               sd[f"bert.encoder.layer.{i}.intermediate.dense.weight"])
            assert torch.equal(ours[f"{layer}output{copy}.LayerNorm.bias"],
                               sd[f"bert.encoder.layer.{i}.output.LayerNorm.bias"])
    assert torch.equal(ours["qformer.layernorm.weight"], sd["bert.embeddings.LayerNorm.weight"])
    assert torch.equal(ours["embeddings.position_embeddings.weight"], sd["bert.embeddings.position_embeddings.weight"])
    word = ours["embeddings.word_embeddings.weight"]
    assert torch.equal(word[:39], sd["bert.embeddings.word_embeddings.weight"])
    assert torch.equal(word[39], fresh.state_dict()["embeddings.word_embeddings.weight"][39])  # [DEC] keeps its init
    assert torch.equal(ours["lm_head.dense.weight"], sd["cls.predictions.transform.dense.weight"])
    assert torch.equal(ours["lm_head.bias"][:39], sd["cls.predictions.bias"])
    # cross-attention, queries and projections stay as initialised
    for key in ("qformer.encoder.layer.0.crossattention.attention.key.weight", "query_tokens", "vision_proj.weight",
                "itm_head.weight"):
        assert torch.equal(ours[key], fresh.state_dict()[key]), key


def test_bad_weight_sources_are_one_line_errors(tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)

    def error(**overrides) -> str:
        with pytest.raises(FalconError) as info:
            build_blip2(Blip2Config(**{**TINY, **overrides}))
        message = str(info.value)
        assert "\n" not in message
        return message

    assert "no such directory" in error(qformer_weights=str(tmp_path / "absent"))
    (tmp_path / "weights.bin").write_bytes(b"")
    assert "a file" in error(qformer_weights=str(tmp_path / "weights.bin"))
    (tmp_path / "empty").mkdir()
    assert "no config.json" in error(qformer_weights=str(tmp_path / "empty"))
    message = error(qformer_weights="falcon-test/absent-blip2")
    assert "falcon-test/absent-blip2" in message and "HF_HUB_OFFLINE=1" in message and "local directory" in message
    message = error(vision="hf", vision_layers=2, vision_weights="falcon-test/absent-blip2")
    assert "vision_weights 'falcon-test/absent-blip2'" in message
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps({"model_type": "clip"}))
    assert "model_type 'clip'" in error(qformer_weights=str(tmp_path / "other"))


def test_a_checkpoint_of_other_sizes_names_the_first_mismatching_key(tmp_path):
    _hf_retrieval_checkpoint(tmp_path / "blip2")
    source = str(tmp_path / "blip2")
    with pytest.raises(FalconError) as info:
        build_blip2(Blip2Config(**{**HF_TINY, "qformer_intermediate_size": 80}, qformer_weights=source))
    message = str(info.value)
    assert "\n" not in message and "intermediate" in message and "(64, 32)" in message and "(80, 32)" in message
    with pytest.raises(FalconError) as info:
        build_blip2(Blip2Config(**{**HF_TINY, "vision_width": 24}, vision_weights=source))
    message = str(info.value)
    assert "\n" not in message and "visual_encoder." in message and "48" in message and "24" in message
    with pytest.raises(FalconError) as info:  # heads do not show in shapes: read from config.json
        build_blip2(Blip2Config(**{**HF_TINY, "qformer_heads": 4}, qformer_weights=source))
    assert "num_attention_heads=2" in str(info.value) and "qformer_heads=4" in str(info.value)
    with pytest.raises(FalconError) as info:  # a BLIP-2 checkpoint is no BERT, and vice versa
        build_blip2(Blip2Config(**HF_TINY, vision_weights=source, qformer_weights=source, num_query_tokens=5))
    assert "query_tokens" in str(info.value) and "(1, 4, 32)" in str(info.value)
