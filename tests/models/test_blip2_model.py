"""BLIP-2 stage 1 (falcon_cli/models/qformer.py, objectives/qformer.py): the three Q-Former passes, the
losses against straightforward references, and weights from HF BLIP-2 and BERT checkpoints saved here."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from falcon_cli.errors import FalconError
from falcon_cli.models.qformer import Blip2Config, Blip2QFormer, build_blip2
from falcon_cli.objectives.common import image_text_similarity
from falcon_cli.objectives.qformer import Blip2Objective, itg_loss

TINY = dict(
    vision="timm",
    image_size=32,
    patch_size=8,
    vision_width=24,
    vision_layers=1,
    vision_heads=2,
    vision_mlp_ratio=2.0,
    qformer_width=32,
    qformer_layers=2,
    qformer_heads=2,
    qformer_intermediate_size=64,
    num_query_tokens=4,
    vocab_size=51,
    embed_dim=16,
)


def tiny_model(seed: int = 0, **overrides) -> Blip2QFormer:
    torch.manual_seed(seed)
    return Blip2QFormer(Blip2Config(**{**TINY, **overrides})).eval()


def batch(b: int = 3, length: int = 6, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    images = torch.rand(b, 3, 32, 32, generator=g)
    ids = torch.randint(3, 50, (b, length), generator=g)
    ids[:, 0] = 1  # [CLS]
    mask = torch.ones_like(ids)
    mask[0, length - 2 :] = 0
    ids[0, length - 2 :] = 0
    return images, ids, mask


def test_itg_is_causal_over_the_text_and_grounded_in_the_image_through_the_queries():
    model = tiny_model()
    images, ids, mask = batch()
    with torch.no_grad():
        embeds = model.image_embeddings(images)
        logits = model.itg_logits(embeds, ids, mask)
        later = ids.clone()
        later[1:, 4] = 7  # a later token of the unpadded captions
        changed = model.itg_logits(embeds, later, mask)
        assert torch.allclose(logits[:, :4], changed[:, :4], atol=1e-6), "earlier positions must not see later tokens"
        assert not torch.allclose(logits[1:, 4:], changed[1:, 4:])
        other = model.itg_logits(model.image_embeddings(images.roll(1, 0)), ids, mask)
        assert not torch.allclose(logits[1], other[1]), "every text position sees the image through the queries"
        # the queries never see the text: their outputs are those of the query-only pass
        hidden = model._joint(embeds, ids, model.generation_mask(mask))
        alone = model.qformer(
            query_embeds=model._queries(3), query_length=4, encoder_hidden_states=embeds
        ).last_hidden_state
        assert torch.allclose(hidden[:, :4], alone, atol=1e-5)
        # [DEC] replaces the first token whatever it was
        first = ids.clone()
        first[:, 0] = 9
        assert torch.equal(model.itg_logits(embeds, first, mask), logits)


def test_itg_mask_layout():
    model = tiny_model(num_query_tokens=2)
    m = model.generation_mask(torch.tensor([[1, 1, 1, 0]]))[0, 0]
    expected = torch.tensor(
        [
            [1, 1, 0, 0, 0, 0],  # queries: the queries only
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],  # text: every query, the text up to itself
            [1, 1, 1, 1, 0, 0],
            [1, 1, 1, 1, 1, 0],
            [1, 1, 1, 1, 1, 0],
        ],
        dtype=torch.bool,
    )  # (a padding row: never a target)
    assert torch.equal(m, expected)


def test_the_itg_mask_reaches_attention_unchanged_and_cross_attention_is_unmasked(monkeypatch):
    """transformers hands a 4-D mask through as it is: every Q-Former self-attention gets exactly ours."""
    model = tiny_model()
    images, ids, mask = batch()
    real, seen = F.scaled_dot_product_attention, []

    def spy(query, key, value, attn_mask=None, **kwargs):
        seen.append((query.shape[-2], key.shape[-2], attn_mask, kwargs.get("is_causal", False)))
        return real(query, key, value, attn_mask=attn_mask, **kwargs)

    with torch.no_grad():
        embeds = model.image_embeddings(images)
        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
        model.itg_logits(embeds, ids, mask)
    total = 4 + ids.shape[1]
    self_calls = [call for call in seen if call[0] == total]
    cross_calls = [call for call in seen if call[0] == 4]
    assert len(self_calls) == 2 and len(cross_calls) == 1  # two layers; cross-attention every other layer
    for _, keys, attn_mask, is_causal in self_calls:
        assert keys == total and not is_causal and torch.equal(attn_mask, model.generation_mask(mask))
    assert cross_calls[0][1] == model.num_image_tokens and cross_calls[0][2] is None


def test_itg_padding_changes_nothing_before_it():
    model = tiny_model()
    images, ids, mask = batch()
    with torch.no_grad():
        embeds = model.image_embeddings(images)
        padded = ids.clone()
        padded[0, 4:] = 17  # other tokens in the padding of caption 0
        a, b = model.itg_logits(embeds, ids, mask), model.itg_logits(embeds, padded, mask)
    assert torch.allclose(a[0, :4], b[0, :4], atol=1e-6)


def test_itg_loss_matches_a_token_by_token_reference():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 6, 11, generator=g)
    ids = torch.randint(1, 11, (3, 6), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 3:] = 0
    per_caption, every = [], []
    for b in range(3):
        losses = []
        for t in range(5):
            if mask[b, t + 1]:
                log_p = F.log_softmax(logits[b, t], dim=-1)
                target = torch.full((11,), 0.1 / 11)
                target[ids[b, t + 1]] += 0.9
                losses.append(-(target * log_p).sum())
        per_caption.append(torch.stack(losses).mean())
        every += losses
    assert torch.allclose(itg_loss(logits, ids, mask, per_sample=True), torch.stack(per_caption), atol=1e-6)
    assert itg_loss(logits, ids, mask).item() == pytest.approx(torch.stack(every).mean().item(), rel=1e-6)


def test_itm_scores_each_pair_alone_and_reads_the_image():
    model = tiny_model()
    images, ids, mask = batch()
    with torch.no_grad():
        embeds = model.image_embeddings(images)
        together = model.itm_logits(embeds, ids, mask)
        alone = torch.cat([model.itm_logits(embeds[i : i + 1], ids[i : i + 1], mask[i : i + 1]) for i in range(3)])
        swapped = model.itm_logits(embeds.flip(0), ids, mask)
        # the head averaged over the query outputs of the joint pass
        hidden = model._joint(embeds, ids, torch.cat([torch.ones(3, 4, dtype=mask.dtype), mask], 1))
        manual = torch.stack([sum(model.itm_head(hidden[i, q]) for q in range(4)) / 4 for i in range(3)])
    assert torch.allclose(together, alone, atol=1e-5)
    assert torch.allclose(together, manual, atol=1e-6)
    assert not torch.allclose(together[0], swapped[0])
    assert torch.equal(model.match_logits(embeds, None, ids, mask), together[:, 1])


def test_unimodal_passes_see_one_modality_and_similarity_is_the_best_query():
    model = tiny_model()
    images, ids, mask = batch()
    with torch.no_grad():
        _, text = model.encode_text(ids, mask)
        _, text_again = model.encode_text(ids, mask)
        _, queries = model.encode_image(images)
        _, other = model.encode_image(images.flip(0))
    assert torch.equal(text, text_again)
    assert queries.shape == (3, 4, 16) and torch.allclose(queries.norm(dim=-1), torch.ones(3, 4))
    assert torch.allclose(queries.flip(0), other, atol=1e-6), "an image's queries do not depend on the batch"
    sim = model.similarity(queries, text)
    for i in range(3):
        for j in range(3):
            assert sim[i, j] == pytest.approx(max(float(queries[i, q] @ text[j]) for q in range(4)), abs=1e-6)


def test_the_image_encoder_is_frozen_and_stays_in_eval_mode_unless_made_trainable():
    model = tiny_model().train()
    assert not model.visual_encoder.training and model.qformer.training
    objective = Blip2Objective(model)
    images, ids, mask = batch()
    objective(images, ids, mask).loss.backward()
    assert all(p.grad is None for p in model.visual_encoder.parameters())
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f"parameters without a gradient from ITC + ITM + ITG: {missing}"
    assert "ln_vision.weight" in trainable and not any(n.startswith("visual_encoder") for n in trainable)
    model.set_image_encoder_trainable(True)
    model.zero_grad()
    assert model.visual_encoder.training
    objective(images, ids, mask).loss.backward()
    assert all(p.grad is not None for p in model.visual_encoder.parameters() if p.requires_grad)
    model.set_image_encoder_trainable(False)
    assert not model.visual_encoder.training and not any(p.requires_grad for p in model.visual_encoder.parameters())


def test_training_losses_and_the_rewards_measure_agree_in_eval_mode():
    model = tiny_model()
    objective = Blip2Objective(model).eval()
    images, ids, mask = batch(4)
    with torch.no_grad():
        out = objective(images, ids, mask)
        measured = objective.measure(images, ids, mask, parts=("itc", "itm", "itg"))
        reused = objective.measure(images, ids, mask, parts=("itc", "itm", "itg"), image=objective.image_state(out))
        per_caption = objective.measure(images, ids, mask, parts=("itg",), per_pair=True)
    for name in ("itc", "itm", "itg"):
        assert measured[name].item() == pytest.approx(getattr(out, name).item(), rel=1e-5), name
        assert reused[name].item() == pytest.approx(measured[name].item(), rel=1e-5), name
    assert per_caption["itg"].shape == (4,)
    alignment = objective.measure(images, ids, mask, parts=("alignment",), per_pair=True)["alignment"]
    own = image_text_similarity(out.image_queries, out.text_feat).diagonal()
    assert torch.allclose(alignment, -own, atol=1e-6), "minus the best query's cosine to the pair's own caption"
    # the cache's one vector per pair: the query closest to the pair's own caption
    queries = out.image_queries
    best = torch.einsum("bqd,bd->bq", queries, out.text_feat).argmax(1)
    assert torch.equal(out.image_feat, queries[torch.arange(4), best])
    with pytest.raises(ValueError, match="per-pair"):
        objective.measure(images, ids, mask, parts=("itc",), per_pair=True)


def test_temperature_is_clamped_in_place_with_a_straight_through_gradient():
    model = tiny_model()
    with torch.no_grad():
        model.temp.fill_(0.9)
    assert model.temperature().item() == pytest.approx(0.5)
    model.temperature().backward()
    assert model.temp.grad.item() == pytest.approx(1.0)
    images, ids, mask = batch()
    model(images, ids, mask)
    assert model.temp.item() == pytest.approx(0.5)


# --- weights ----------------------------------------------------------------------------------------


def _hf_retrieval(tmp_path):
    from transformers import Blip2Config as HfBlip2Config
    from transformers import Blip2ForImageTextRetrieval

    torch.manual_seed(0)
    config = HfBlip2Config(
        vision_config=dict(
            hidden_size=24,
            intermediate_size=48,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
        ),
        qformer_config=dict(
            vocab_size=51,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            cross_attention_frequency=2,
            encoder_hidden_size=24,
            use_qformer_text_input=True,
        ),
        num_query_tokens=4,
        image_text_hidden_size=16,
    )
    hf = Blip2ForImageTextRetrieval(config).eval()
    with torch.no_grad():  # no zero or default-valued tensors: every weight must really be copied
        for name, param in hf.named_parameters():
            param.copy_(
                torch.randn_like(param) * 0.05
                + (
                    1.0
                    if name.endswith("norm.weight") or "LayerNorm.weight" in name or name.endswith("layernorm.weight")
                    else 0.0
                )
            )
    hf.save_pretrained(tmp_path / "blip2")
    return hf, tmp_path / "blip2"


def test_a_hf_blip2_checkpoint_gives_hfs_own_itm_and_itc(tmp_path):
    hf, directory = _hf_retrieval(tmp_path)
    ours = build_blip2(
        Blip2Config(**{**TINY, "vision": "hf", "vision_weights": str(directory), "qformer_weights": str(directory)})
    ).eval()
    images, ids, mask = batch()
    with torch.no_grad():
        hf_itm = hf(pixel_values=images, input_ids=ids, attention_mask=mask, use_image_text_matching_head=True)
        hf_itc = hf(pixel_values=images, input_ids=ids, attention_mask=mask, use_image_text_matching_head=False)
        embeds, queries = ours.encode_image(images)
        _, text = ours.encode_text(ids, mask)
        itm = ours.itm_logits(embeds, ids, mask)
    assert torch.allclose(itm, hf_itm.logits_per_image, atol=1e-5)
    assert torch.allclose(image_text_similarity(queries, text), hf_itc.logits_per_image, atol=1e-5)


def test_a_fresh_qformer_is_initialised_from_bert(tmp_path):
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    bert = BertForMaskedLM(
        BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    )
    bert.save_pretrained(tmp_path / "bert")
    model = build_blip2(Blip2Config(**{**TINY, "qformer_weights": str(tmp_path / "bert")}))
    sd = bert.state_dict()
    layer = "qformer.encoder.layer.1."
    assert torch.equal(
        model.state_dict()[layer + "intermediate_query.dense.weight"],
        sd["bert.encoder.layer.1.intermediate.dense.weight"],
    )
    assert torch.equal(
        model.state_dict()[layer + "intermediate.dense.weight"], sd["bert.encoder.layer.1.intermediate.dense.weight"]
    )
    assert torch.equal(
        model.state_dict()[layer + "attention.attention.key.bias"], sd["bert.encoder.layer.1.attention.self.key.bias"]
    )
    assert torch.equal(model.embeddings.word_embeddings.weight[:50], sd["bert.embeddings.word_embeddings.weight"])
    assert torch.equal(model.qformer.layernorm.weight, sd["bert.embeddings.LayerNorm.weight"])
    assert torch.equal(model.lm_head.bias[:50], sd["cls.predictions.bias"])
    assert model.config.dec_id == 50


def test_bad_weight_sources_are_one_line(tmp_path):
    with pytest.raises(FalconError, match="not a directory"):
        build_blip2(Blip2Config(**{**TINY, "qformer_weights": str(tmp_path / "missing")}))
    _, directory = _hf_retrieval(tmp_path)
    with pytest.raises(FalconError, match=r"is \(512, 32\) in the checkpoint but \(512, 64\) in the model"):
        build_blip2(Blip2Config(**{**TINY, "qformer_width": 64, "qformer_weights": str(directory)}))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FalconError, match=r"no \*\.safetensors files"):
        build_blip2(Blip2Config(**{**TINY, "vision": "hf", "vision_weights": str(tmp_path / "empty")}))
    from safetensors.torch import save_file

    (tmp_path / "other").mkdir()
    save_file({"encoder.weight": torch.zeros(2)}, str(tmp_path / "other" / "model.safetensors"))
    with pytest.raises(FalconError, match="no vision_model"):
        build_blip2(Blip2Config(**{**TINY, "vision": "hf", "vision_weights": str(tmp_path / "other")}))
    with pytest.raises(FalconError, match="Blip2ForImageTextRetrieval"):
        build_blip2(Blip2Config(**{**TINY, "qformer_weights": str(tmp_path / "other")}))


def test_config_errors_name_the_problem():
    with pytest.raises(ValueError, match="qformer_heads 5 does not divide"):
        Blip2Config(**{**TINY, "qformer_heads": 5})
    with pytest.raises(ValueError, match="dec_token_id 60 is outside"):
        Blip2Config(**{**TINY, "dec_token_id": 60})


def test_match_probability_is_the_itm_heads_judgement_of_each_chosen_pair():
    """BLIP-2's judgement for FALCON's ``positive_margin+itm`` reward: the Q-Former's ITM head on each pair."""
    from falcon_cli.sampling.scheduler import chain_pairs

    model = tiny_model()
    objective = Blip2Objective(model).eval()
    images, ids, mask = batch(4)
    image_index, text_index = chain_pairs(4)
    with torch.no_grad():
        out = objective(images, ids, mask)
        got = objective.match_probability(out, ids, mask, image_index, text_index)
        for p, (i, j) in enumerate(zip(image_index.tolist(), text_index.tolist())):
            want = torch.softmax(model.itm_logits(out.image_tokens[i : i + 1], ids[j : j + 1], mask[j : j + 1]), -1)[
                0, 1
            ]
            assert got[p].item() == pytest.approx(want.item(), abs=1e-5), (i, j)
    assert got.shape == (6,)
