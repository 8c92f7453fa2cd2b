"""ALBEF models: registry, shapes, attention semantics, weight loading (BERT, timm), save/load."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch
from torch import nn

from falcon_cli.errors import FalconError
from falcon_cli.field_docs import field_docstrings
from falcon_cli.models import (
    ALBEF,
    AlbefConfig,
    add_model_config,
    clean_state_dict,
    create_model,
    get_model_config,
    list_models,
    load_weights,
    model_from_weights,
    read_weights_config,
    save_weights,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VOCAB = 120


@pytest.fixture(scope="module")
def tiny() -> ALBEF:
    torch.manual_seed(0)
    return create_model("albef-tiny", vocab_size=VOCAB).eval()


def _batch(b: int = 4, length: int = 12, image_size: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(b, 3, image_size, image_size, generator=g)
    ids = torch.randint(5, VOCAB, (b, length), generator=g)
    ids[:, 0] = 2  # [CLS]
    mask = torch.ones(b, length, dtype=torch.long)
    mask[1 % b, 8:] = 0
    mask[3 % b, 5:] = 0
    ids[mask == 0] = 0
    return images, ids, mask


# --- registry -------------------------------------------------------------------------------------


def test_registry_lists_both_and_configs_are_data():
    names = list_models()
    assert {"albef-base", "albef-tiny"} <= set(names)
    base, tiny_cfg = get_model_config("albef-base"), get_model_config("albef-tiny")
    assert isinstance(base, AlbefConfig)
    assert (base.image_size, base.patch_size, base.vision_width, base.text_layers, base.fusion_layers) == (
        256,
        16,
        768,
        6,
        6,
    )
    assert (tiny_cfg.image_size, tiny_cfg.patch_size, tiny_cfg.vision_width, tiny_cfg.embed_dim) == (64, 8, 192, 256)
    assert all(field_docstrings(AlbefConfig).get(f) for f in AlbefConfig.model_fields), (
        "every config field has a docstring"
    )
    tiny_cfg.image_size = 32  # a copy: the registry is unchanged
    assert get_model_config("albef-tiny").image_size == 64


def test_unknown_model_lists_valid_ones():
    with pytest.raises(FalconError) as err:
        create_model("albef-tinny")
    msg = str(err.value)
    assert "albef-tinny" in msg and "albef-base" in msg and "albef-tiny" in msg and "\n" not in msg


def test_unknown_override_names_nearest_key():
    with pytest.raises(FalconError) as err:
        create_model("albef-tiny", image_sise=32)
    assert "image_sise" in str(err.value) and "did you mean 'image_size'" in str(err.value)


def test_bad_override_value_is_one_line():
    with pytest.raises(FalconError) as err:
        create_model("albef-tiny", image_size=60)  # not a multiple of patch 8
    assert "patch_size" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(FalconError, match="vocab_size"):
        create_model("albef-tiny", vocab_size="many")


def test_add_model_config(tmp_path):
    path = tmp_path / "albef-micro.json"
    path.write_text(
        json.dumps(
            {**get_model_config("albef-tiny").model_dump(), "vision_layers": 1, "text_layers": 1, "fusion_layers": 1}
        )
    )
    assert add_model_config(path) == ["albef-micro"]
    assert "albef-micro" in list_models()
    assert len(create_model("albef-micro").fusion_encoder.layers) == 1
    bad = tmp_path / "bad.json"
    bad.write_text('{"image_size": 64, "depht": 2}')
    with pytest.raises(FalconError, match="bad.json.*depht"):
        add_model_config(bad)
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(FalconError, match="not valid JSON"):
        add_model_config(tmp_path / "broken.json")


# --- albef-base -----------------------------------------------------------------------------------


def test_albef_base_parameter_count():
    torch.manual_seed(0)
    model = create_model("albef-base")
    n = model.num_parameters()
    print(f"albef-base parameters: {n:,}")
    assert abs(n - 210e6) / 210e6 < 0.03, n
    # No pooler, no classifier head; the MLM decoder is tied (not a separate parameter).
    names = [k for k, _ in model.named_parameters()]
    assert not any("pooler" in k or k.startswith("visual_encoder.head.") or "decoder" in k for k in names)
    assert model.num_image_tokens == 257


# --- albef-tiny forward ---------------------------------------------------------------------------


def test_tiny_forward_shapes_and_unit_features(tiny):
    images, ids, mask = _batch()
    with torch.no_grad():
        image_tokens, image_feat = tiny.encode_image(images)
        text_tokens, text_feat = tiny.encode_text(ids, mask)
        fused = tiny.fuse(text_tokens, mask, image_tokens)
        itm, mlm = tiny.itm_logits(fused), tiny.mlm_logits(fused)
    assert image_tokens.shape == (4, 65, 192) and image_feat.shape == (4, 256)
    assert text_tokens.shape == (4, 12, 192) and text_feat.shape == (4, 256)
    assert fused.shape == (4, 12, 192) and itm.shape == (4, 2) and mlm.shape == (4, 12, VOCAB)
    assert image_feat.dtype == text_feat.dtype == torch.float32
    torch.testing.assert_close(image_feat.norm(dim=-1), torch.ones(4))
    torch.testing.assert_close(text_feat.norm(dim=-1), torch.ones(4))
    # mlm_logits works on any leading shape (e.g. only the masked positions).
    assert tiny.mlm_logits(fused[mask.bool()]).shape == (int(mask.sum()), VOCAB)


def test_forward_returns_encodings_and_backward_reaches_every_parameter():
    torch.manual_seed(0)
    model = create_model("albef-tiny", vocab_size=VOCAB).train()
    images, ids, mask = _batch(b=8)
    enc = model(images, ids, mask)
    fused = model.fuse(enc.text_tokens, mask, enc.image_tokens)
    sim = enc.image_feat @ enc.text_feat.T / enc.temperature
    loss = (
        sim.logsumexp(-1).mean()
        + model.itm_logits(fused).logsumexp(-1).mean()
        + model.mlm_logits(fused).logsumexp(-1).mean()
    )
    loss.backward()
    no_grad = [k for k, p in model.named_parameters() if p.grad is None]
    assert no_grad == [], no_grad
    # The MLM decoder is tied: its gradient lands in the word embeddings (rows of unseen ids too).
    assert model.text_encoder.embeddings.word.weight.grad[1].abs().sum() > 0


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_itc_features_pool_as_configured(pooling):
    """Plain reference: [CLS] token, or the mean of the patch tokens / of the unpadded text tokens."""
    torch.manual_seed(0)
    model = create_model("albef-tiny", vocab_size=VOCAB, pooling=pooling).eval()
    images, ids, mask = _batch()
    with torch.no_grad():
        image_tokens, image_feat = model.encode_image(images)
        text_tokens, text_feat = model.encode_text(ids, mask)
        if pooling == "cls":
            image_pooled, text_pooled = image_tokens[:, 0], text_tokens[:, 0]
        else:
            image_pooled = torch.stack([image_tokens[i, 1:].mean(0) for i in range(len(ids))])
            text_pooled = torch.stack([text_tokens[i, : int(mask[i].sum())].mean(0) for i in range(len(ids))])
        expected_image = nn.functional.normalize(model.vision_proj(image_pooled), dim=-1)
        expected_text = nn.functional.normalize(model.text_proj(text_pooled), dim=-1)
    assert torch.allclose(image_feat, expected_image, atol=1e-5)
    assert torch.allclose(text_feat, expected_text, atol=1e-5)
    if pooling == "mean":  # padding never reaches the feature
        padded = ids.clone()
        padded[mask == 0] = 7
        assert torch.allclose(model.encode_text(padded, mask)[1], text_feat, atol=1e-5)


def test_temperature_is_clamped(tiny):
    model = create_model("albef-tiny", vocab_size=VOCAB)
    assert model.temperature().item() == pytest.approx(0.07)
    with torch.no_grad():
        model.temp.fill_(3.0)
    assert model.temperature().item() == pytest.approx(0.5)  # clamped where used
    model(*_batch(b=2))  # forward clamps the parameter in place, like ALBEF
    assert model.temp.item() == pytest.approx(0.5)
    with torch.no_grad():
        model.temp.fill_(1e-6)
    model.clamp_temperature_()
    assert model.temp.item() == pytest.approx(0.001) and model.temperature().item() == pytest.approx(0.001)
    t = model.temperature()
    t.backward()
    assert model.temp.grad is not None and model.temp.grad.item() == 1.0  # gradient flows at the bound


def test_autocast_bf16(tiny):
    images, ids, mask = _batch()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        image_tokens, image_feat = tiny.encode_image(images)
        text_tokens, text_feat = tiny.encode_text(ids, mask)
        fused = tiny.fuse(text_tokens, mask, image_tokens)
        logits = tiny.mlm_logits(fused)
    assert image_feat.dtype == torch.float32 and torch.isfinite(fused).all() and torch.isfinite(logits).all()
    torch.testing.assert_close(text_feat.norm(dim=-1), torch.ones(4))


# --- attention semantics --------------------------------------------------------------------------


def test_fusion_self_attention_is_bidirectional_and_respects_padding(tiny):
    images, ids, mask = _batch()
    with torch.no_grad():
        image_tokens, _ = tiny.encode_image(images)
        text_tokens, _ = tiny.encode_text(ids, mask)
        fused = tiny.fuse(text_tokens, mask, image_tokens)
        # Change a LATER real token: [CLS] (position 0) must change, in the fusion encoder alone too.
        later = text_tokens.clone()
        later[:, 4] = torch.randn_like(later[:, 4])
        fused_later = tiny.fuse(later, mask, image_tokens)
        assert (fused_later[:, 0] - fused[:, 0]).abs().max() > 1e-3
        ids_later = ids.clone()
        ids_later[:, 4] = (ids[:, 4] + 1 - 5) % (VOCAB - 5) + 5
        tt, _ = tiny.encode_text(ids_later, mask)
        assert ((tiny.fuse(tt, mask, image_tokens)[:, 0] - fused[:, 0]).abs().amax(-1) > 1e-3).all()
        # Change the ids at padded positions: nothing at real positions changes.
        ids_pad = ids.clone()
        ids_pad[mask == 0] = 7
        tt_pad, tf_pad = tiny.encode_text(ids_pad, mask)
        fused_pad = tiny.fuse(tt_pad, mask, image_tokens)
        real = mask.bool()
        torch.testing.assert_close(fused_pad[real], fused[real], atol=1e-6, rtol=0)
        torch.testing.assert_close(tf_pad, tiny.encode_text(ids, mask)[1], atol=1e-6, rtol=0)
        assert (fused_pad[~real] - fused[~real]).abs().max() > 1e-3  # the padded queries themselves did change


def test_cross_attention_reads_the_image(tiny):
    images, ids, mask = _batch()
    with torch.no_grad():
        text_tokens, _ = tiny.encode_text(ids, mask)
        a = tiny.fuse(text_tokens, mask, tiny.encode_image(images)[0])
        b = tiny.fuse(text_tokens, mask, tiny.encode_image(images.flip(0))[0])
    assert ((a[:, 0] - b[:, 0]).abs().amax(-1) > 1e-3).all()
    assert ((tiny.itm_logits(a) - tiny.itm_logits(b)).abs().amax(-1) > 0).all()


# --- BERT weights ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_bert_dir(tmp_path_factory):
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(1)
    config = BertConfig(
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=2,
        intermediate_size=128,
        vocab_size=100,
        max_position_embeddings=64,
    )
    path = tmp_path_factory.mktemp("bert")
    BertForMaskedLM(config).save_pretrained(path)
    return path


def _bert_sized(**extra):
    return dict(
        text_width=64,
        text_heads=2,
        text_layers=2,
        fusion_layers=2,
        intermediate_size=128,
        vocab_size=100,
        max_position_embeddings=64,
        **extra,
    )


def test_bert_weights_load_into_text_and_fusion_encoders(tiny_bert_dir, caplog):
    from transformers import BertForMaskedLM, BertModel

    torch.manual_seed(0)
    with caplog.at_level(logging.INFO, logger="falcon"):
        model = create_model("albef-tiny", **_bert_sized(text_weights=str(tiny_bert_dir))).eval()
    assert "text weights from" in caplog.text and "cross-attention newly initialised" in caplog.text
    bert = BertModel.from_pretrained(tiny_bert_dir).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 100, (3, 10), generator=g)
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[1, 6:] = 0
    with torch.no_grad():
        ours, _ = model.encode_text(ids, mask)
        hidden = bert(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[2]
    real = mask.bool()
    torch.testing.assert_close(ours[real], hidden[real], atol=1e-5, rtol=1e-5)

    bert_sd = bert.state_dict()
    for i in range(2):
        ours_layer = model.fusion_encoder.layers[i]
        for mine, theirs in [
            ("self_attn.query", "attention.self.query"),
            ("self_attn.key", "attention.self.key"),
            ("self_attn.value", "attention.self.value"),
            ("self_attn.out", "attention.output.dense"),
            ("ffn_in", "intermediate.dense"),
            ("ffn_out", "output.dense"),
        ]:
            torch.testing.assert_close(
                ours_layer.get_submodule(mine).weight, bert_sd[f"encoder.layer.{2 + i}.{theirs}.weight"], atol=0, rtol=0
            )
        assert ours_layer.cross_attn.query.weight.std().item() == pytest.approx(0.02, rel=0.2)
    mlm = BertForMaskedLM.from_pretrained(tiny_bert_dir).eval()
    with torch.no_grad():
        torch.testing.assert_close(
            model.mlm_head.dense.weight, mlm.cls.predictions.transform.dense.weight, atol=0, rtol=0
        )
        h = torch.randn(2, 5, 64)
        torch.testing.assert_close(model.mlm_logits(h), mlm.cls(h), atol=1e-5, rtol=1e-5)


def test_bert_weights_errors(tiny_bert_dir, tmp_path):
    with pytest.raises(FalconError, match="vocab_size=100"):
        create_model("albef-tiny", **{**_bert_sized(text_weights=str(tiny_bert_dir)), "vocab_size": 99})
    with pytest.raises(FalconError, match="text_layers \\+ fusion_layers = 6"):
        create_model(
            "albef-tiny", **{**_bert_sized(text_weights=str(tiny_bert_dir)), "text_layers": 3, "fusion_layers": 3}
        )
    with pytest.raises(FalconError, match="no such directory"):
        create_model("albef-tiny", **_bert_sized(text_weights=str(tmp_path / "missing")))


def test_bert_model_without_mlm_head(tiny_bert_dir, tmp_path, caplog):
    from transformers import BertModel

    BertModel.from_pretrained(tiny_bert_dir).save_pretrained(tmp_path / "base")
    with caplog.at_level(logging.INFO, logger="falcon"):
        model = create_model("albef-tiny", **_bert_sized(text_weights=str(tmp_path / "base")))
    assert "mlm_head" in caplog.text  # reported as kept fresh
    assert torch.isfinite(model.mlm_head.dense.weight).all()


# --- timm weights ---------------------------------------------------------------------------------


def _tiny_timm_vit(image_size: int):
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(2)
    return VisionTransformer(
        img_size=image_size, patch_size=8, embed_dim=192, depth=4, num_heads=3, num_classes=10
    ).eval()


def test_timm_weights_load_by_path(tmp_path, caplog):
    from safetensors.torch import save_file

    vit = _tiny_timm_vit(32)
    path = tmp_path / "vit.safetensors"
    save_file(vit.state_dict(), str(path))
    images = torch.randn(2, 3, 32, 32)

    # Same size: identical outputs.
    with caplog.at_level(logging.INFO, logger="falcon"):
        same = create_model("albef-tiny", vocab_size=VOCAB, image_size=32, vision_weights=str(path)).eval()
    assert "vision weights from" in caplog.text and "head.weight" in caplog.text
    with torch.no_grad():
        torch.testing.assert_close(same.encode_image(images)[0], vit.forward_features(images), atol=1e-5, rtol=1e-5)

    # Different size: position embeddings resized (4x4 -> 8x8 grid), outputs finite.
    resized = create_model("albef-tiny", vocab_size=VOCAB, vision_weights=str(path)).eval()
    assert resized.visual_encoder.pos_embed.shape == (1, 65, 192)
    torch.testing.assert_close(resized.visual_encoder.blocks[0].attn.qkv.weight, vit.blocks[0].attn.qkv.weight)
    with torch.no_grad():
        tokens, feat = resized.encode_image(torch.randn(2, 3, 64, 64))
    assert tokens.shape == (2, 65, 192) and torch.isfinite(tokens).all() and torch.isfinite(feat).all()

    # .pth wrapped as {"model": state_dict}, read with weights_only=True.
    pth = tmp_path / "vit.pth"
    torch.save({"model": vit.state_dict()}, pth)
    again = create_model("albef-tiny", vocab_size=VOCAB, image_size=32, vision_weights=str(pth)).eval()
    with torch.no_grad():
        torch.testing.assert_close(again.encode_image(images)[0], vit.forward_features(images), atol=1e-5, rtol=1e-5)


def test_timm_weights_errors(tmp_path):
    from safetensors.torch import save_file
    from timm.models.vision_transformer import VisionTransformer

    with pytest.raises(FalconError, match="no such file"):
        create_model("albef-tiny", vision_weights=str(tmp_path / "nope.safetensors"))
    with pytest.raises(FalconError, match="timm:not_a_real_model"):
        create_model("albef-tiny", vision_weights="timm:not_a_real_model")
    wide = VisionTransformer(img_size=32, patch_size=8, embed_dim=96, depth=4, num_heads=3, num_classes=0)
    save_file(wide.state_dict(), str(tmp_path / "wide.safetensors"))
    with pytest.raises(FalconError, match="vision_width"):
        create_model("albef-tiny", vision_weights=str(tmp_path / "wide.safetensors"))
    torch.save({"weights": [1, 2]}, tmp_path / "odd.pth")
    with pytest.raises(FalconError, match="odd.pth"):
        create_model("albef-tiny", vision_weights=str(tmp_path / "odd.pth"))


def _albef_resize(pos_embed: torch.Tensor, grid: int) -> torch.Tensor:
    """The reference: ALBEF's interpolate_pos_embed written out (bicubic, no antialias, [CLS] row kept)."""
    old = int((pos_embed.shape[1] - 1) ** 0.5)
    patch = pos_embed[:, 1:].reshape(1, old, old, -1).permute(0, 3, 1, 2)
    patch = torch.nn.functional.interpolate(
        patch, size=(grid, grid), mode="bicubic", align_corners=False, antialias=False
    )
    return torch.cat([pos_embed[:, :1], patch.permute(0, 2, 3, 1).flatten(1, 2)], dim=1)


def test_position_embeddings_resize_like_albef(tmp_path):
    """Every resize (the function, image weights from a file, a checkpoint at another resolution) is ALBEF's."""
    from safetensors.torch import save_file

    from falcon_cli.models.pretrained import at_resolution
    from falcon_cli.models.vision import resize_pos_embed

    table = torch.randn(1, 1 + 4 * 4, 192, generator=torch.Generator().manual_seed(3))
    for grid in (8, 6, 3, 4):
        expected = _albef_resize(table, grid) if grid != 4 else table
        torch.testing.assert_close(resize_pos_embed(table, grid), expected, atol=1e-6, rtol=0)
    with pytest.raises(FalconError, match="square grid"):
        resize_pos_embed(table[:, :-1], 8)

    vit = _tiny_timm_vit(32)  # a 4x4 grid of 8-pixel patches
    with torch.no_grad():
        vit.pos_embed.copy_(table)
    save_file(vit.state_dict(), str(tmp_path / "vit.safetensors"))
    model = create_model("albef-tiny", vocab_size=VOCAB, vision_weights=str(tmp_path / "vit.safetensors"))  # 64 px: 8x8
    torch.testing.assert_close(model.visual_encoder.pos_embed.detach(), _albef_resize(table, 8), atol=1e-6, rtol=0)

    state, config = at_resolution(model.state_dict(), model.config, 96)  # fine-tuning at a higher resolution: 12x12
    torch.testing.assert_close(
        state["visual_encoder.pos_embed"], _albef_resize(model.visual_encoder.pos_embed.detach(), 12), atol=1e-6, rtol=0
    )
    assert config.image_size == 96


# --- checkpoints ----------------------------------------------------------------------------------


def test_safetensors_roundtrip_identical_outputs(tiny, tmp_path):
    from safetensors.torch import load_model, save_model

    images, ids, mask = _batch()

    def outputs(model):
        with torch.no_grad():
            it, imf = model.encode_image(images)
            tt, tf = model.encode_text(ids, mask)
            fused = model.fuse(tt, mask, it)
            return imf, tf, model.itm_logits(fused), model.mlm_logits(fused)

    path = save_weights(tiny, tmp_path / "model.safetensors")
    assert read_weights_config(path) == tiny.config
    rebuilt = model_from_weights(path).eval()
    for a, b in zip(outputs(tiny), outputs(rebuilt)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)

    # safetensors' own save_model/load_model work too (no shared tensors: the MLM decoder is tied by construction).
    save_model(tiny, str(tmp_path / "plain.safetensors"))
    other = create_model("albef-tiny", vocab_size=VOCAB).eval()
    load_model(other, str(tmp_path / "plain.safetensors"))
    for a, b in zip(outputs(tiny), outputs(other)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)

    wrong = create_model("albef-tiny", vocab_size=VOCAB + 1)
    with pytest.raises(FalconError, match="shapes differ"):
        load_weights(wrong, path)


def test_clean_state_dict_strips_wrapper_prefixes(tiny):
    class Wrapper(nn.Module):  # what DDP looks like to state_dict()
        def __init__(self, module):
            super().__init__()
            self.module = module

    plain = tiny.state_dict()
    wrapped = Wrapper(tiny).state_dict()
    assert all(k.startswith("module.") for k in wrapped)
    assert list(clean_state_dict(wrapped)) == list(plain)
    odd = {
        "_orig_mod.module.temp": 1,
        "module._orig_mod.text_proj.weight": 2,
        "visual_encoder._orig_mod.cls_token": 3,
        "text_encoder.layers.0.ffn_in.bias": 4,
    }
    assert list(clean_state_dict(odd)) == [
        "temp",
        "text_proj.weight",
        "visual_encoder.cls_token",
        "text_encoder.layers.0.ffn_in.bias",
    ]
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in plain)
