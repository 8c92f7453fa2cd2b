"""The unimodal stage: the shapes world's DeiT and BERT, cached per world, model and seed, and loaded by pretraining;
and the learning curve (`pretrain.eval_every`) of a run that starts from them."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from tests.conftest import run_cli

TINY = ["data.shapes.images=40", "data.shapes.size=24", "pretrain.image_size=24", "data.tokenizer_vocab_size=200",
        "data.verify_images=false", "unimodal.image_epochs=2", "unimodal.text_epochs=1", "unimodal.batch_size=8",
        "pretrain.vision_weights=unimodal", "pretrain.text_weights=unimodal", "pretrain.epochs=2",
        "pretrain.max_steps_per_epoch=2", "pretrain.batch_size=8", "pretrain.num_workers=0", "pretrain.augment=test",
        "pretrain.warmup_steps=1", "pretrain.eval_every=1", "pretrain.device=cpu", "unimodal.device=cpu"]


def ok(proc):
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """data → unimodal → pretrain on a world shared through data.dataset."""
    root = tmp_path_factory.mktemp("unimodal")
    ok(run_cli("run", "--recipe", "shapes-demo", "--run-dir", root / "a", f"data.dataset={root / 'world'}",
               "stages=[data, unimodal, pretrain]", *TINY))
    return root


def entries(world):
    return sorted(p for p in (world / "unimodal").iterdir() if not p.name.startswith("."))


def test_the_stage_trains_both_encoders_and_pretraining_starts_from_them(first):
    (entry,) = entries(first / "world")
    report = json.loads((entry / "report.json").read_text())
    assert report["image"]["steps"] == 2 * (32 // 8) and report["text"]["steps"] == 1 * (160 // 8)  # 32 train images
    for key in ("val_shape_accuracy", "val_color_accuracy", "val_size_accuracy", "val_empty_cells"):
        assert 0 <= report["image"][key] <= 100
    assert report["text"]["val_masked_tokens"] > 0
    vision = load_file(str(entry / "vision.safetensors"))
    assert "pos_embed" in vision and not any(k.startswith("head") for k in vision)  # the bare ViT, timm's names
    assert json.loads((entry / "text" / "config.json").read_text())["num_hidden_layers"] == 4  # text 2 + fusion 2
    log = (first / "a" / "log.txt").read_text()
    assert f"vision weights from {entry / 'vision.safetensors'}: loaded" in log
    assert f"text weights from {entry / 'text'}: loaded" in log
    manifest = json.loads((first / "a" / "manifest.json").read_text())
    assert manifest["stages"]["unimodal"]["result"]["reused"] is False
    assert manifest["config"]["pretrain"]["vision_weights"] == "unimodal"  # the keyword stays on record
    row = json.loads((first / "a" / "results" / "unimodal.json").read_text())["rows"][0]
    assert row["weights"] == str(entry) and row["reused"] is False


def test_the_learning_curve_has_a_point_per_epoch_and_ends_at_the_final_result(first):
    """`pretrain.eval_every: 1`: zero-shot retrieval after every epoch, in metrics.jsonl (kind zero_shot)."""
    from falcon_cli.runtime.metrics import read_metrics

    curve = [r for r in read_metrics(first / "a" / "metrics.jsonl") if r.get("kind") == "zero_shot"]
    assert [r["epoch"] for r in curve] == [0, 1]
    final = next(r for r in json.loads((first / "a" / "results" / "retrieval_zeroshot.json").read_text())["rows"]
                 if r["model"] == "trained")
    for key in ("i2t_R@1", "t2i_R@5", "mean_R", "i2t_R@1_lo"):
        assert curve[-1][key] == pytest.approx(final[key])


def test_another_run_of_the_same_world_and_seed_reuses_them_and_another_seed_does_not(first):
    (entry,) = entries(first / "world")
    before = (entry / "vision.safetensors").stat().st_mtime_ns
    ok(run_cli("unimodal", "--recipe", "shapes-demo", "--run-dir", first / "b", f"data.dataset={first / 'world'}", *TINY))
    assert json.loads((first / "b" / "results" / "unimodal.json").read_text())["rows"][0]["reused"] is True
    assert (entry / "vision.safetensors").stat().st_mtime_ns == before
    ok(run_cli("unimodal", "--recipe", "shapes-demo", "--run-dir", first / "c", f"data.dataset={first / 'world'}", *TINY,
               "seed=1"))
    assert len(entries(first / "world")) == 2


def test_pretraining_from_unimodal_weights_that_do_not_exist_is_one_line(first):
    proc = run_cli("pretrain", "--recipe", "shapes-demo", "--run-dir", first / "d", f"data.dataset={first / 'world'}",
                   *TINY, "unimodal.text_epochs=3")
    assert proc.returncode != 0
    assert "holds no unimodal weights for this world, model and seed" in proc.stderr and "falcon unimodal" in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]  # (after the data stage's own report)
    assert last.startswith("error: pretrain: vision_weights/text_weights=unimodal") and "Traceback" not in proc.stderr


def test_unimodal_weights_are_for_albef_models_only():
    proc = run_cli("recipes", "show", "shapes-siglip", "pretrain.vision_weights=unimodal")
    assert proc.returncode != 0 and "unimodal stage trains ALBEF's encoders" in proc.stderr
