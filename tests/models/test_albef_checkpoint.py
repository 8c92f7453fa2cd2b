"""Official ALBEF / GRIT-VLP / MAFA checkpoint files (``.pth``, their key layout) loaded into falcon's ALBEF."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from falcon_cli.errors import FalconError
from falcon_cli.models import create_model
from falcon_cli.models.albef_checkpoint import (
    SKIPPED,
    albef_config_from_state,
    albef_from_file,
    albef_key_mapping,
    load_albef_checkpoint,
)
from falcon_cli.models.pretrained import albef_from_checkpoint, find_checkpoint
from tests.albef_files import albef_layout, write_albef_checkpoint

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VOCAB = 120


@pytest.fixture(scope="module")
def source():
    """A tiny ALBEF in ALBEF's own settings ([CLS] pooling), random weights."""
    torch.manual_seed(5)
    return create_model("albef-tiny", vocab_size=VOCAB, pooling="cls").eval()


@pytest.fixture(scope="module")
def albef_pth(source, tmp_path_factory):
    return write_albef_checkpoint(source, tmp_path_factory.mktemp("albef") / "ALBEF.pth")


def assert_same_weights(model, source, skip=()):
    ours, theirs = model.state_dict(), source.state_dict()
    assert set(ours) == set(theirs)
    for key, value in theirs.items():
        if not key.startswith(skip):
            assert torch.equal(ours[key], value), key


def test_every_tensor_of_an_albef_file_loads(albef_pth, source, caplog):
    with caplog.at_level(logging.INFO, logger="falcon"):
        model = albef_from_file(albef_pth).eval()
    assert_same_weights(model, source)
    for field in (
        "image_size",
        "patch_size",
        "vision_width",
        "vision_layers",
        "vision_heads",
        "vocab_size",
        "text_width",
        "text_layers",
        "fusion_layers",
        "text_heads",
        "intermediate_size",
        "embed_dim",
    ):
        assert getattr(model.config, field) == getattr(source.config, field), field
    assert model.config.pooling == "cls"
    # Momentum copies (perturbed in the file), queues, position ids and the tied decoder were skipped, and said so.
    copies = sum(k.split(".")[0].endswith("_m") for k in albef_layout(source))
    assert f"momentum copies: {copies}" in caplog.text and "feature queues: 4" in caplog.text
    assert "tied to the word embeddings" in caplog.text and "position ids" in caplog.text
    images, ids = torch.randn(2, 3, 64, 64), torch.randint(5, VOCAB, (2, 9))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        a, b = model(images, ids, mask), source(images, ids, mask)
        torch.testing.assert_close(a.image_feat, b.image_feat, atol=0, rtol=0)
        torch.testing.assert_close(
            model.itm_logits(model.fuse(a.text_tokens, mask, a.image_tokens)),
            source.itm_logits(source.fuse(b.text_tokens, mask, b.image_tokens)),
            atol=0,
            rtol=0,
        )

    # Into a model the run built (pretrain.encoders.init): albef-tiny's own config, same shapes.
    built = create_model("albef-tiny", vocab_size=VOCAB)
    load_albef_checkpoint(built, albef_pth)
    assert_same_weights(built, source)


def test_every_key_is_mapped_or_skipped_for_a_reason(source):
    layout = albef_layout(source)
    mapping = albef_key_mapping(source)
    for key in layout:
        assert key in mapping or any(key == n or (n.endswith(".") and key.startswith(n)) for n, _ in SKIPPED), key
    assert set(mapping.values()) == set(source.state_dict())  # and every weight of ours has a source


def test_bert_names_are_transformers_names(source):
    """The layout's BERT keys are the names transformers' BERT gives (cross-attention included)."""
    from transformers import BertConfig, BertForMaskedLM

    c = source.config
    bert = BertForMaskedLM(
        BertConfig(
            vocab_size=c.vocab_size,
            hidden_size=c.text_width,
            num_hidden_layers=c.text_layers + c.fusion_layers,
            num_attention_heads=c.text_heads,
            intermediate_size=c.intermediate_size,
            is_decoder=True,
            add_cross_attention=True,
        )
    )
    names = {f"text_encoder.{k}" for k in bert.state_dict()} | {"text_encoder.bert.embeddings.position_ids"}
    ours = {k for k in albef_layout(source, momentum=False, queues=False) if k.startswith("text_encoder.")}
    assert ours - names == set()
    fusion_only = {k for k in names - ours if "crossattention" in k}
    assert all(int(k.split(".")[4]) < c.text_layers for k in fusion_only)  # text layers have no cross-attention


def test_resolution_and_finetuned_layout(source, albef_pth, tmp_path):
    from tests.models.test_models import _albef_resize

    bigger = albef_from_file(albef_pth, image_size=96)
    assert bigger.config.image_size == 96
    torch.testing.assert_close(
        bigger.visual_encoder.pos_embed.detach(),
        _albef_resize(source.visual_encoder.pos_embed.detach(), 12),
        atol=1e-6,
        rtol=0,
    )
    assert_same_weights(bigger, source, skip=("visual_encoder.pos_embed",))
    built = create_model("albef-tiny", vocab_size=VOCAB, image_size=96)
    load_albef_checkpoint(built, albef_pth)
    assert torch.equal(built.visual_encoder.pos_embed, bigger.visual_encoder.pos_embed)

    # A fine-tuned retrieval checkpoint: BERT without "bert.", no MLM head (kept newly initialised), no momentum.
    path = write_albef_checkpoint(source, tmp_path / "mscoco.pth", finetuned=True, momentum=False)
    retrieval = albef_from_checkpoint(find_checkpoint(path, "finetune.checkpoint"), vocab_size=VOCAB)
    assert_same_weights(retrieval, source, skip=("mlm_head.",))


def first_line_error(call) -> str:
    with pytest.raises(FalconError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    return message


def test_a_file_that_does_not_match_fails_with_one_line(source, albef_pth, tmp_path):
    layout = albef_layout(source)
    stray = tmp_path / "stray.pth"
    torch.save(
        {"model": {**layout, "text_encoder.bert.encoder.layer.1.attention.self.extra.weight": torch.zeros(2)}}, stray
    )
    message = first_line_error(lambda: albef_from_file(stray))
    assert (
        str(stray) in message and "unexpected text_encoder.bert.encoder.layer.1.attention.self.extra.weight" in message
    )

    missing = tmp_path / "missing.pth"
    torch.save({"model": {k: v for k, v in layout.items() if k != "itm_head.bias"}}, missing)
    message = first_line_error(lambda: albef_from_file(missing))
    assert str(missing) in message and "missing itm_head.bias" in message

    # More layers than the model: the extra fusion layer's keys are unexpected, and the hint names pretrain.model.
    deeper = create_model("albef-tiny", vocab_size=VOCAB, pooling="cls", fusion_layers=3)
    path = write_albef_checkpoint(deeper, tmp_path / "deeper.pth")
    message = first_line_error(lambda: load_albef_checkpoint(create_model("albef-tiny", vocab_size=VOCAB), path))
    assert "fusion_layers=2" in message and "the file has 2 text and 3 fusion layers" in message
    assert "pretrain.model" in message

    # Another vocabulary (a run with its own WordPiece tokenizer).
    message = first_line_error(
        lambda: load_albef_checkpoint(create_model("albef-tiny", vocab_size=VOCAB + 5), albef_pth)
    )
    assert (
        f"vocabulary has {VOCAB} tokens but the run's tokenizer has {VOCAB + 5}" in message
        and "bert-base-uncased" in message
    )
    message = first_line_error(lambda: albef_from_checkpoint(albef_pth, vocab_size=1000))
    assert f"has {VOCAB} tokens but the run's tokenizer has 1000" in message

    # Not ALBEF's layout at all; text_weights given a file.
    torch.save({"model": {"weight": torch.zeros(2)}}, tmp_path / "other.pth")
    assert "not in the ALBEF/GRIT-VLP/MAFA layout" in first_line_error(lambda: albef_from_file(tmp_path / "other.pth"))
    torch.save(source.state_dict(), tmp_path / "falcon.pth")  # falcon's own names are not ALBEF's layout
    assert "not in the ALBEF/GRIT-VLP/MAFA layout" in first_line_error(lambda: albef_from_file(tmp_path / "falcon.pth"))
    message = first_line_error(lambda: create_model("albef-tiny", text_weights=str(albef_pth)))
    assert "pretrain.encoders.init" in message and "no such directory" not in message
    config = first_line_error(
        lambda: albef_config_from_state({"visual_encoder.pos_embed": torch.zeros(1, 5, 4)}, "x.pth")
    )
    assert "x.pth: not an ALBEF/GRIT-VLP/MAFA checkpoint" in config


def test_pretrain_init_excludes_the_part_sources():
    from falcon_cli.config.schema import PretrainConfig

    assert PretrainConfig(init="ALBEF.pth").encoders.init == "ALBEF.pth"
    with pytest.raises(ValueError, match="leave vision_weights and text_weights unset"):
        PretrainConfig(init="ALBEF.pth", text_weights="bert-base-uncased")
