"""ALBEF NLVR2: layer-pair initialisation, shared cross-attention key/value, text-assignment sampling."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from falcon_cli.models import create_model
from falcon_cli.models.nlvr2 import AlbefNLVR2
from falcon_cli.objectives.text_assignment import text_assignment_loss, text_assignment_pairs

VOCAB = 50
CLS, PAD = 2, 0


def _batch(b: int = 3, length: int = 8, seed: int = 0, image_size: int = 64):
    g = torch.Generator().manual_seed(seed)
    images0 = torch.randn(b, 3, image_size, image_size, generator=g)
    images1 = torch.randn(b, 3, image_size, image_size, generator=g)
    ids = torch.randint(5, VOCAB, (b, length), generator=g)
    ids[:, 0] = CLS
    mask = torch.ones(b, length, dtype=torch.long)
    mask[0, 5:] = 0
    ids[mask == 0] = PAD
    return images0, images1, ids, mask


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    albef = create_model("albef-tiny", vocab_size=VOCAB)
    return albef, AlbefNLVR2.from_albef(albef)


# --- initialisation and sharing --------------------------------------------------------------------


def test_from_albef_copies_fusion_layer_k_into_layers_2k_and_2k_plus_1(pair):
    albef, model = pair
    for name in ("visual_encoder", "text_encoder"):
        theirs = getattr(albef, name).state_dict()
        for key, value in getattr(model, name).state_dict().items():
            assert torch.equal(value, theirs[key]), f"{name}.{key}"
    layers = model.fusion_encoder.layers
    assert len(layers) == 2 * albef.config.fusion_layers
    for k, source in enumerate(albef.fusion_encoder.layers):
        for i in (2 * k, 2 * k + 1):
            for key, value in source.state_dict().items():
                if key.startswith(("cross_attn.key.", "cross_attn.value.")):
                    projection = model.fusion_encoder.cross_kv(i)[0 if ".key." in key else 1]
                    mine = getattr(projection, key.rsplit(".", 1)[1])
                else:
                    mine = layers[i].state_dict()[key]
                assert torch.equal(mine, value), f"layer {i} {key} from fusion layer {k}"
    # copies, not the pretrained tensors themselves
    assert layers[0].ffn_in.weight.data_ptr() != albef.fusion_encoder.layers[0].ffn_in.weight.data_ptr()
    assert model.ta_head.out_features == 3 and model.cls_head[-1].out_features == 2


def test_cross_key_value_are_one_parameter_per_pair(pair):
    _, model = pair
    encoder = model.fusion_encoder
    for k in range(len(encoder.layers) // 2):
        first, second = encoder.layers[2 * k], encoder.layers[2 * k + 1]
        assert second.cross_attn.key is None and second.cross_attn.value is None
        assert encoder.cross_kv(2 * k + 1)[0] is first.cross_attn.key
        assert encoder.cross_kv(2 * k + 1)[1] is first.cross_attn.value
    names = set(model.state_dict())
    assert "fusion_encoder.layers.0.cross_attn.key.weight" in names
    assert not any(n.startswith("fusion_encoder.layers.1.cross_attn.key") for n in names)
    # the partner's key really is what the odd layer computes with
    *_, mask = _batch()
    x = torch.randn(3, 8, model.config.text_width)
    image_tokens = torch.randn(3, 65, model.config.vision_width)
    layer = encoder.layers[1].eval()
    before = layer(x, mask, image_tokens, cross_kv=encoder.cross_kv(1))
    with torch.no_grad():
        encoder.layers[0].cross_attn.key.weight.add_(0.1)
    after = layer(x, mask, image_tokens, cross_kv=encoder.cross_kv(1))
    with torch.no_grad():
        encoder.layers[0].cross_attn.key.weight.sub_(0.1)
    assert not torch.allclose(before, after)
    with pytest.raises(ValueError, match="shared_kv"):
        layer(x, mask, image_tokens)


def test_a_gradient_step_moves_both_layers_effective_key():
    torch.manual_seed(1)
    model = AlbefNLVR2.from_albef(create_model("albef-tiny", vocab_size=VOCAB, vision_layers=1)).train()
    encoder = model.fusion_encoder
    key0, key1 = encoder.cross_kv(0)[0].weight, encoder.cross_kv(1)[0].weight
    assert key0 is key1
    before = key1.detach().clone()
    images0, images1, ids, mask = _batch()
    loss = F.cross_entropy(model(images0, images1, ids, mask), torch.tensor([0, 1, 1]))
    loss.backward()
    assert key0.grad is not None and key0.grad.abs().sum() > 0
    torch.optim.SGD(model.parameters(), lr=1.0).step()
    assert not torch.equal(encoder.cross_kv(0)[0].weight, before)
    assert torch.equal(encoder.cross_kv(0)[0].weight, encoder.cross_kv(1)[0].weight)


def test_state_dict_has_no_aliases_and_round_trips_through_safetensors(pair, tmp_path):
    _, model = pair
    model.eval()
    state = model.state_dict()
    assert len({t.data_ptr() for t in state.values()}) == len(state)
    save_file(state, tmp_path / "nlvr2.safetensors")
    torch.manual_seed(7)
    fresh = AlbefNLVR2(model.config).eval()
    fresh.load_state_dict(load_file(tmp_path / "nlvr2.safetensors"))
    images0, images1, ids, mask = _batch()
    with torch.no_grad():
        for head in ("nlvr", "ta"):
            torch.testing.assert_close(
                fresh(images0, images1, ids, mask, head=head),
                model(images0, images1, ids, mask, head=head),
                rtol=0,
                atol=0,
            )


def test_layers_see_different_images(pair):
    _, model = pair
    model.eval()
    images0, images1, ids, mask = _batch()
    with torch.no_grad():
        fused = model.encode_pair(images0, images1, ids, mask)
        swapped = model.encode_pair(images1, images0, ids, mask)
    assert fused.shape == (3, 8, model.config.text_width)
    assert not torch.allclose(fused, swapped, atol=1e-4)
    assert model.ta_logits(fused).shape == (3, 3) and model.nlvr_logits(fused).shape == (3, 2)
    with pytest.raises(ValueError, match="head"):
        model(images0, images1, ids, mask, head="itm")


def test_tiny_overfit_of_nlvr_logits():
    torch.manual_seed(2)
    albef = create_model(
        "albef-tiny", vocab_size=VOCAB, image_size=32, vision_layers=1, hidden_dropout=0.0, attention_dropout=0.0
    )
    model = AlbefNLVR2.from_albef(albef).train()
    images0, images1, ids, mask = _batch(b=4, seed=3, image_size=32)
    labels = torch.tensor([0, 1, 1, 0])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    losses = []
    for _ in range(20):
        loss = F.cross_entropy(model(images0, images1, ids, mask), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        predicted = model(images0, images1, ids, mask).argmax(dim=1)
    assert losses[-1] < 0.2 * losses[0]
    assert torch.equal(predicted, labels)


# --- text assignment --------------------------------------------------------------------------------


def test_text_assignment_labels_match_indices_and_fractions_are_thirds():
    b = 1500
    feat = F.normalize(torch.randn(b, 16, generator=torch.Generator().manual_seed(0)), dim=-1)
    first, second, labels = text_assignment_pairs(feat, generator=torch.Generator().manual_seed(1))
    own = torch.arange(b)
    assert first.dtype == second.dtype == labels.dtype == torch.int64
    neither, one, two = labels == 0, labels == 1, labels == 2
    assert (first[one] == own[one]).all() and (second[one] != own[one]).all()
    assert (second[two] == own[two]).all() and (first[two] != own[two]).all()
    assert (first[neither] != own[neither]).all() and (second[neither] != own[neither]).all()
    assert (first[neither] != second[neither]).all()
    for label in range(3):
        assert (labels == label).float().mean().item() == pytest.approx(1 / 3, abs=0.04)
    # the generator makes it reproducible
    again = text_assignment_pairs(feat, generator=torch.Generator().manual_seed(1))
    assert all(torch.equal(a, b) for a, b in zip((first, second, labels), again))


def test_text_assignment_draws_the_hard_neighbour():
    # images 2j and 2j+1 are identical, the pairs orthogonal: each image's weight sits on its twin
    feat = torch.eye(4).repeat_interleave(2, dim=0)
    twin = torch.arange(8) ^ 1
    for seed in range(5):
        first, second, labels = text_assignment_pairs(feat, generator=torch.Generator().manual_seed(seed))
        negative = torch.where(labels == 1, second, first)
        positive = labels > 0
        assert torch.equal(negative[positive], twin[positive])
        neither = labels == 0
        assert ((first[neither] == twin[neither]) | (second[neither] == twin[neither])).all()


def test_text_assignment_loss_and_shape_check():
    logits = torch.randn(5, 3, dtype=torch.bfloat16)
    labels = torch.tensor([0, 1, 2, 1, 0])
    loss = text_assignment_loss(logits, labels)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(F.cross_entropy(logits.float(), labels).item())
    with pytest.raises(ValueError):
        text_assignment_pairs(torch.randn(2, 4))
