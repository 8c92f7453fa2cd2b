"""The data stage in-process: tokenizer sources, the missing-image policy, stopping on problems."""

from __future__ import annotations

import json
import shutil

import pytest

from falcon_cli.config.recipes import validate_config
from falcon_cli.data.shapes import ShapesConfig, generate_world
from falcon_cli.data.tokenizer import train_wordpiece_tokenizer
from falcon_cli.errors import FalconError
from falcon_cli.runtime.run_dir import RunDirectory, read_manifest
from stages import run_stages


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    out = tmp_path_factory.mktemp("stage") / "world"
    generate_world(ShapesConfig(images=40, seed=3), out, workers=1)
    return out


def recipe(dataset, **data):
    return validate_config({"name": "t", "data": {"dataset": str(dataset), **data}}, "test")


def start(tmp_path, config):
    return RunDirectory.open(tmp_path / "run", config=config.model_dump(mode="json"), seed=0)


def test_local_tokenizer_directory_is_copied_into_the_run(world, tmp_path):
    source = tmp_path / "my-tokenizer"
    train_wordpiece_tokenizer(["a red circle", "a blue square"], source, vocab_size=60)
    config = recipe(world, tokenizer=str(source))
    results = run_stages(config, start(tmp_path, config))
    saved = tmp_path / "run" / "data" / "tokenizer"
    assert (saved / "tokenizer.json").exists()
    assert results["data"]["tokenizer"] == {
        "source": str(source),
        "vocab_size": len(json.loads((source / "tokenizer.json").read_text())["model"]["vocab"]),
    }
    assert not [p for p in saved.parent.iterdir() if p.name.startswith(".")], "no temporary directories left behind"


def test_skip_policy_records_dropped_pairs(world, tmp_path):
    copy = tmp_path / "world"
    shutil.copytree(world, copy)
    pairs = json.loads((copy / "pretrain.json").read_text())
    (copy / pairs[0]["image"]).unlink()
    dropped = sum(p["image"] == pairs[0]["image"] for p in pairs)
    config = recipe(copy, on_missing="skip", tokenizer_vocab_size=100)
    results = run_stages(config, start(tmp_path, config))
    assert results["data"]["load"]["dropped"] == dropped == 5
    assert results["data"]["pretrain_pairs"] == len(pairs) - dropped
    manifest = read_manifest(tmp_path / "run")
    assert manifest["stages"]["data"]["result"]["load"]["dropped"] == 5


def test_problems_stop_the_stage_before_the_tokenizer(world, tmp_path):
    copy = tmp_path / "world"
    shutil.copytree(world, copy)
    (copy / "nlvr2_dev.json").write_text('[{"images": ["a", "b"], "sentence": "x", "label": "maybe"}]')
    config = recipe(copy, tokenizer_vocab_size=100)
    with pytest.raises(FalconError, match=r"data problem\(s\), first: .*nlvr2_dev.json.*label"):
        run_stages(config, start(tmp_path, config))
    manifest = read_manifest(tmp_path / "run")
    assert manifest["status"] == "failed" and manifest["stages"]["data"]["status"] == "failed"
    assert (tmp_path / "run" / "data" / "check.json").exists()
    assert not (tmp_path / "run" / "data" / "tokenizer").exists()
