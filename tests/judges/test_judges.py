"""Judges: a tiny BLIP loaded from disk, the shapes oracle and a falcon checkpoint's ITM head, all offline."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from falcon_cli.data.shapes import ShapesOracle
from falcon_cli.errors import FalconError
from falcon_cli.judges import DEFAULT_BLIP_MODEL, Judge, JudgedPair, is_false_negative, load_judge


@pytest.fixture(scope="module")
def world(tiny_shapes_world):
    return tiny_shapes_world


def judged(record, caption_record=None) -> JudgedPair:
    """The pair (image of ``record``, caption of ``caption_record`` or of ``record`` itself)."""
    caption_record = caption_record or record
    return JudgedPair(
        image=record.image,
        caption=caption_record.captions[0],
        image_id=record.extra["image_id"],
        caption_id=caption_record.extra["caption_id"],
    )


@pytest.fixture(scope="module")
def pairs(world):
    """Four positives and four negatives (each image with the caption of a record of another image)."""
    records = world["records"]
    positives = [judged(records[i]) for i in (0, 3, 7, len(records) - 1)]
    negatives = []
    for i in (1, 4, 9, 15):
        other = next(r for r in records[i + 1 :] if r.extra["image_id"] != records[i].extra["image_id"])
        negatives.append(judged(records[i], other))
    return positives + negatives


# --- base -------------------------------------------------------------------------------------


def test_false_negative_means_probability_above_the_threshold():
    scores = np.array([0.0, 0.5, 0.5000001, 0.9, 1.0])
    assert is_false_negative(scores).tolist() == [False, False, True, True, True]
    assert is_false_negative(scores, threshold=0.95).tolist() == [False, False, False, False, True]
    with pytest.raises(FalconError, match="threshold"):
        is_false_negative(scores, threshold=1.5)


def test_unknown_kind_and_missing_arguments_are_one_line_errors():
    for kind, kwargs, words in (
        ("clip", {}, "unknown judge 'clip'"),
        ("oracle", {}, "no shapes world"),
        ("checkpoint", {}, "no falcon run"),
    ):
        with pytest.raises(FalconError, match=words) as info:
            load_judge(kind, **kwargs)
        assert "\n" not in str(info.value)


# --- oracle -----------------------------------------------------------------------------------


def test_oracle_scores_are_the_ground_truth(world, pairs):
    judge = load_judge("oracle", world=world["dir"])
    assert isinstance(judge, Judge) and judge.name == f"oracle:{world['dir']}"
    scores = judge.score(pairs)
    expected = ShapesOracle.load(world["dir"]).matches([p.image_id for p in pairs], [p.caption_id for p in pairs])
    assert scores.dtype == np.float64 and scores.shape == (len(pairs),)
    np.testing.assert_array_equal(scores, expected.astype(np.float64))
    assert scores[:4].tolist() == [1.0, 1.0, 1.0, 1.0]  # a record's own caption describes its image
    assert set(scores[4:].tolist()) <= {0.0, 1.0}
    assert judge.score([]).shape == (0,)


def test_oracle_on_a_world_with_many_negatives_flags_exactly_the_matching_ones(world):
    records = world["records"]
    rng = np.random.default_rng(0)
    rows, cols = rng.integers(0, len(records), 200), rng.integers(0, len(records), 200)
    pairs = [judged(records[i], records[j]) for i, j in zip(rows, cols)]
    scores = load_judge("oracle", world=world["dir"]).score(pairs)
    truth = ShapesOracle.load(world["dir"]).matches([p.image_id for p in pairs], [p.caption_id for p in pairs])
    np.testing.assert_array_equal(is_false_negative(scores), truth)
    assert 0 < truth.sum() < len(pairs)  # both outcomes occur, so the comparison means something


def test_oracle_needs_ids(world, pairs):
    judge = load_judge("oracle", world=world["dir"])
    no_caption_id = JudgedPair(image=pairs[0].image, caption=pairs[0].caption, image_id=pairs[0].image_id)
    with pytest.raises(FalconError, match="pair 1 .*has no caption_id") as info:
        judge.score([pairs[0], no_caption_id])
    assert "\n" not in str(info.value)
    with pytest.raises(FalconError, match="scenes.parquet: not found"):
        load_judge("oracle", world=world["dir"] / "missing")


# --- BLIP -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_blip(world, pairs, tmp_path_factory):
    """A tiny random BlipForImageTextRetrieval and its BlipProcessor (a WordPiece tokenizer trained on the
    world's captions, 32-pixel images) saved to a directory. The ITM head is scaled up and centred on the
    test pairs, so their scores spread around 0.5 instead of all rounding to the same value."""
    from transformers import BlipConfig, BlipForImageTextRetrieval, BlipImageProcessor, BlipProcessor

    from falcon_cli.data.images import load_image
    from falcon_cli.data.tokenizer import train_wordpiece_tokenizer

    root = tmp_path_factory.mktemp("blip")
    tokenizer = train_wordpiece_tokenizer([r.captions[0] for r in world["records"]], root / "tokenizer", vocab_size=200)
    processor = BlipProcessor(BlipImageProcessor(size={"height": 32, "width": 32}), tokenizer)
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.cls_token_id,
        sep_token_id=tokenizer.sep_token_id,
    )
    vision = dict(
        hidden_size=32, image_size=32, patch_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    )
    torch.manual_seed(0)
    model = BlipForImageTextRetrieval(
        BlipConfig(text_config=text, vision_config=vision, image_text_hidden_size=16, projection_dim=16)
    ).eval()
    inputs = processor(
        images=[load_image(p.image) for p in pairs], text=[p.caption for p in pairs], return_tensors="pt", padding=True
    )
    with torch.no_grad():
        model.itm_head.weight.mul_(200.0)
        logits = model(**inputs, use_itm_head=True).itm_score
        model.itm_head.bias[1] -= (logits[:, 1] - logits[:, 0]).mean()
    path = root / "blip"
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return {"path": path, "model": model, "processor": processor}


def test_blip_scores_are_the_itm_heads_match_probability(tiny_blip, pairs):
    from falcon_cli.data.images import load_image

    judge = load_judge("blip", model=tiny_blip["path"], device="cpu", batch_size=3)  # 3 batches, the last one short
    assert judge.name == f"blip:{tiny_blip['path']}"
    scores = judge.score(pairs)

    processor, model = tiny_blip["processor"], tiny_blip["model"]
    inputs = processor(
        images=[load_image(p.image) for p in pairs], text=[p.caption for p in pairs], return_tensors="pt", padding=True
    )
    with torch.no_grad():
        logits = model(**inputs, use_itm_head=True).itm_score
    expected = torch.softmax(logits, dim=-1)[:, 1].double().numpy()
    assert scores.dtype == np.float64 and scores.shape == (len(pairs),)
    np.testing.assert_allclose(scores, expected, atol=1e-5)
    assert ((scores >= 0) & (scores <= 1)).all()
    assert np.ptp(scores) > 1e-3, "scores must differ between pairs for the comparison to mean anything"
    np.testing.assert_allclose(
        load_judge("blip", model=tiny_blip["path"], device="cpu", batch_size=64).score(pairs), scores, atol=1e-5
    )  # padding within a batch does not change a pair's score


def test_blip_that_cannot_be_loaded_is_a_one_line_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        FalconError, match=r"BLIP judge model .*empty: cannot load .*hubs may be unreachable.*local directory"
    ) as info:
        load_judge("blip", model=tmp_path / "empty", device="cpu")
    assert "\n" not in str(info.value)
    with pytest.raises(FalconError, match="no such directory"):
        load_judge("blip", model=tmp_path / "missing", device="cpu")
    assert DEFAULT_BLIP_MODEL == "Salesforce/blip-itm-base-coco"


def test_fp16_needs_cuda(tiny_blip):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(FalconError, match="needs a CUDA device"):
        load_judge("blip", model=tiny_blip["path"], device="cpu", fp16=True)


# --- falcon checkpoint ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def falcon_run(world, tmp_path_factory):
    """A falcon run directory: the world's tokenizer and one albef-tiny checkpoint with random weights."""
    from falcon_cli.data.tokenizer import train_wordpiece_tokenizer
    from falcon_cli.models import create_model
    from falcon_cli.runtime.checkpoint import save_checkpoint

    run = tmp_path_factory.mktemp("falcon_run") / "run"
    tokenizer = train_wordpiece_tokenizer(
        [r.captions[0] for r in world["records"]], run / "data" / "tokenizer", vocab_size=200
    )
    torch.manual_seed(0)
    model = create_model("albef-tiny", vocab_size=len(tokenizer))
    with torch.no_grad():
        model.itm_head.weight.mul_(5.0)  # so the scores spread instead of all rounding to ~1
    save_checkpoint(run / "checkpoints", 7, {"model": model}, {}, {"epoch": 1, "model": "albef-tiny"})
    return run


def test_checkpoint_scores_are_its_itm_heads_match_probability(falcon_run, pairs):
    from falcon_cli.data.collate import PretrainCollate
    from falcon_cli.data.images import load_image
    from falcon_cli.data.tokenizer import load_tokenizer
    from falcon_cli.data.transforms import build_transform
    from falcon_cli.models import model_from_weights

    judge = load_judge("checkpoint", run=falcon_run, device="cpu", batch_size=3)
    checkpoint = falcon_run / "checkpoints" / "00000007"
    assert judge.name == f"checkpoint:{checkpoint}"
    scores = judge.score(pairs)

    model = model_from_weights(checkpoint / "model.safetensors").eval()
    transform = build_transform("test", model.config.image_size)
    items = [{"image": transform(load_image(p.image)), "caption": p.caption, "pair_id": i} for i, p in enumerate(pairs)]
    batch = PretrainCollate(load_tokenizer(falcon_run / "data" / "tokenizer"), 25)(items)
    with torch.no_grad():
        image_tokens, _ = model.encode_image(batch["images"])
        text_tokens, _ = model.encode_text(batch["input_ids"], batch["attention_mask"])
        logits = model.itm_logits(model.fuse(text_tokens, batch["attention_mask"], image_tokens))
    expected = torch.softmax(logits, dim=-1)[:, 1].double().numpy()
    assert scores.dtype == np.float64 and scores.shape == (len(pairs),)
    np.testing.assert_allclose(scores, expected, atol=1e-5)
    assert ((scores >= 0) & (scores <= 1)).all()
    assert np.ptp(scores) > 1e-3, "scores must differ between pairs for the comparison to mean anything"
    # one checkpoint directory works as well as the run directory
    np.testing.assert_allclose(load_judge("checkpoint", run=checkpoint, device="cpu").score(pairs), scores, atol=1e-5)


def test_checkpoint_that_is_not_there_is_a_one_line_error(tmp_path):
    with pytest.raises(FalconError, match=r"checkpoint judge: .*missing: not found") as info:
        load_judge("checkpoint", run=tmp_path / "missing", device="cpu")
    assert "\n" not in str(info.value) and "embed.encoder" not in str(info.value)
