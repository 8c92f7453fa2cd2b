"""`falcon run` refuses, before anything trains, a recipe whose later stages need a split its dataset spec lacks.

A retrieval-only COCO spec under a recipe that also fine-tunes VQA and NLVR2 used to pretrain for hours and then
stop at "no vqa train file configured". The check runs after the data stage (which may generate the dataset) and
before the first stage that trains.
"""

from __future__ import annotations

import shutil

import pytest
import yaml

from falcon_cli.config.recipes import load_recipe
from falcon_cli.data.spec import load_spec
from falcon_cli.errors import FalconError
from stages import check_needed_splits, needed_splits
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def retrieval_only(tiny_shapes_world, tmp_path_factory):
    """A copy of the tiny world whose spec names no VQA and no NLVR2 files (as a retrieval-only COCO spec)."""
    world = tmp_path_factory.mktemp("retrieval-only") / "world"
    shutil.copytree(tiny_shapes_world["dir"], world)
    spec = yaml.safe_load((world / "dataset.yaml").read_text())
    for section in ("vqa", "nlvr2"):
        spec.pop(section, None)
    (world / "dataset.yaml").write_text(yaml.safe_dump(spec))
    return world


def test_needed_splits_follow_the_tasks_of_each_stage():
    config, _ = load_recipe("shapes-demo", ["finetune.tasks=[retrieval, nlvr2]", "evaluate.tasks=[vqa]"])
    needs = {(section, split) for section, split, _ in needed_splits(config, ["pretrain", "finetune", "evaluate"])}
    assert needs == {
        ("retrieval", "test"),
        ("retrieval", "train"),
        ("retrieval", "val"),
        ("nlvr2", "train"),
        ("nlvr2", "dev"),
        ("vqa", "test"),
    }
    assert needed_splits(config, ["pretrain"]) == [("retrieval", "test", "pretrain.eval.split")]


def test_a_missing_split_is_one_line_naming_the_file_the_key_and_who_needs_it(retrieval_only):
    config, _ = load_recipe("shapes-demo", [f"data.dataset={retrieval_only}"])
    with pytest.raises(
        FalconError,
        match=r"dataset.yaml: no vqa train file configured; add key 'vqa.train' to the "
        r"dataset spec \(finetune.tasks names vqa; checked before any stage trains\)",
    ):
        check_needed_splits(config, ["pretrain", "finetune", "evaluate"])
    check_needed_splits(config, ["pretrain"])  # (pretraining alone needs only what the spec has)
    assert load_spec(retrieval_only).vqa is None


def test_falcon_run_stops_before_pretraining(retrieval_only, tmp_path):
    run = tmp_path / "run"
    proc = run_cli(
        "run",
        "--recipe",
        "shapes-demo",
        "--run-dir",
        run,
        f"data.dataset={retrieval_only}",
        "data.shapes.images=40",
        "data.tokenizer_vocab_size=200",
        "data.verify_images=false",
    )
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no vqa train file configured" in errors[0] and "finetune.tasks names vqa" in errors[0]
    assert not (run / "checkpoints").exists() and not (run / "metrics.jsonl").exists()
    # the same run without the tasks the spec cannot serve goes past the check (pretraining alone here)
    proc = run_cli(
        "run",
        "--recipe",
        "shapes-demo",
        "--run-dir",
        run,
        f"data.dataset={retrieval_only}",
        "data.shapes.images=40",
        "data.tokenizer_vocab_size=200",
        "data.verify_images=false",
        "stages=[data, pretrain]",
        "pretrain.epochs=1",
        "pretrain.max_steps_per_epoch=2",
        "pretrain.encoders.image_size=32",
        "--overwrite",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
