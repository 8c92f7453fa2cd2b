"""``pretrain.false_negatives.oracle: mask``: every in-batch pair the shapes oracle says truly matches leaves the ITC
denominators and ITM mining (a diagnostic bound: what the false negatives cost a composer)."""

from __future__ import annotations

import json

import pytest
import torch

from falcon_cli.config.recipes import load_recipe
from falcon_cli.data.datasets import pretrain_dataset
from falcon_cli.data.shapes import ShapesOracle
from falcon_cli.data.shared_images import SharedImages
from falcon_cli.data.spec import load_spec
from falcon_cli.errors import FalconError
from falcon_cli.objectives.false_negative_builder import excluded_negatives


@pytest.fixture(scope="module")
def world(tiny_shapes_world):
    return tiny_shapes_world


def settings(**changes):
    """The false-negative settings of shapes-grit (``pretrain.false_negatives``) with ``changes``."""
    overrides = [f"pretrain.false_negatives.{key}={value}" for key, value in changes.items()]
    return load_recipe("shapes-grit", overrides)[0].pretrain.false_negatives


def test_oracle_mask_is_the_oracle_truth_off_the_diagonal(world):
    """Entry [i, j] is True exactly when pair j's caption truly describes pair i's image (checked pair by pair
    against the oracle), never on the diagonal, and it holds every same-image pair."""
    records = world["records"]
    exclude = excluded_negatives(settings(oracle="mask"), world["spec"], records)
    oracle = ShapesOracle.load(world["dir"])
    # `mask_itc`: the same pairs leave the ITC; ITM's mining (and the audit's replay of it) keeps them
    itc_only = settings(oracle="mask_itc")
    assert excluded_negatives(itc_only, world["spec"], records, itm=True) is None
    assert excluded_negatives(settings(oracle="mask"), world["spec"], records, itm=True) is not None
    batch = torch.tensor([records[k].pair_id for k in range(0, len(records), 3)][:24])
    got = exclude(batch)
    assert excluded_negatives(itc_only, world["spec"], records)(batch).equal(got)
    by_id = {r.pair_id: r for r in records}
    for i, a in enumerate(batch.tolist()):
        for j, b in enumerate(batch.tolist()):
            truth = bool(oracle.matches([by_id[a].extra["image_id"]], [by_id[b].extra["caption_id"]])[0])
            assert bool(got[i, j]) == (truth and i != j), (i, j)
    assert got.any() and not got.diagonal().any()
    assert not got.equal(got.t())  # rows images, columns texts: a caption may describe only one of the two images
    shared = SharedImages(records).mask(batch)
    assert bool((got | ~shared).all())  # a superset of the same-image pairs
    both = excluded_negatives(settings(oracle="mask", same_image="mask"), world["spec"], records)
    assert both(batch).equal(got)


def test_nothing_excluded_by_default_and_same_image_alone(world):
    records = world["records"]
    assert excluded_negatives(settings(), world["spec"], records) is None
    batch = torch.tensor([r.pair_id for r in records[:16]])
    same = excluded_negatives(settings(same_image="mask"), world["spec"], records)
    assert same(batch).equal(SharedImages(records).mask(batch))


def test_refused_without_an_oracle_or_beside_a_method(world, tmp_path):
    spec = world["spec"].model_copy(update={"shapes_world": None})
    with pytest.raises(FalconError, match="not a shapes world.*false_negatives.oracle=keep"):
        excluded_negatives(settings(oracle="mask"), spec, world["records"])
    for recipe in ("shapes-mafa", "shapes-glofnd"):
        with pytest.raises(FalconError, match=r"oracle=mask works with method none \(got"):
            load_recipe(recipe, ["pretrain.false_negatives.oracle=mask"])
    for recipe in ("shapes-diht", "shapes-glofnd"):
        with pytest.raises(FalconError, match=r"oracle=mask_itc works with method none \(got"):
            load_recipe(recipe, ["pretrain.false_negatives.oracle=mask_itc"])
    with pytest.raises(FalconError, match="oracle=mask_itc keeps ITM's mining as it is"):
        load_recipe(
            "shapes-uniform", ["pretrain.false_negatives.oracle=mask_itc", "pretrain.false_negatives.same_image=mask"]
        )
    with pytest.raises(FalconError, match="FALCON's reward would measure ITM with the pairs masked"):
        load_recipe("shapes-falcon", ["pretrain.false_negatives.oracle=mask_itc"])
    with pytest.raises(FalconError, match="expected one of keep, mask or mask_itc"):
        load_recipe("shapes-grit", ["pretrain.false_negatives.oracle=drop"])


def test_masked_run_and_its_audit(tmp_path):
    """A GRIT run with the oracle's false negatives masked logs how many entries it masked on every step, and its
    audit re-mines the ITM negatives with the same mask, so none of them is a false negative."""
    import pandas as pd

    from falcon_cli.judges.oracle import in_batch_truth
    from falcon_cli.runtime.metrics import read_metrics
    from falcon_cli.sampling.batch_log import read_batch_log
    from tests.conftest import run_cli

    run = tmp_path / "run"
    proc = run_cli(
        "pretrain",
        "--recipe",
        "shapes-demo",
        "--run-dir",
        run,
        f"data.dataset={tmp_path / 'world'}",
        "data.shapes.images=40",
        "data.tokenizer_vocab_size=200",
        "pretrain.epochs=2",
        "pretrain.batch_size=16",
        "pretrain.composer.search_space_size=48",
        "pretrain.loader.num_workers=0",
        "pretrain.optim.warmup_steps=2",
        "pretrain.logging.every=1",
        "pretrain.eval.split=null",
        "pretrain.false_negatives.oracle=mask",
        "pretrain.composer.name=grit",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    masked = [r["oracle_masked"] for r in read_metrics(run / "metrics.jsonl") if "loss" in r]
    assert len(masked) == 20 and sum(masked) > 0
    proc = run_cli("audit-false-negatives", run, "--judge", "oracle")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    overall = {r["kind"]: r for r in json.loads((run / "audit" / "summary.json").read_text())["overall"]}
    assert overall["chain"]["oracle_false_negatives"] > 0  # the composer still picks them; the losses skip them
    # An ITM negative is a false negative only where nothing else was left: a caption (such as "a large shape") that
    # truly describes every image of its batch, where mining falls back to any pair but the anchor's own.
    audit = pd.read_parquet(run / "audit" / "audit.parquet")
    log = read_batch_log(run / "batches.parquet")
    spec = load_spec(tmp_path / "world")
    truth = in_batch_truth(spec.resolve(spec.shapes_world), pretrain_dataset(spec, transform=None).records)
    false_itm = audit[(audit["kind"] == "itm") & audit["oracle"]]
    assert len(false_itm) < 0.01 * (audit["kind"] == "itm").sum()
    for row in false_itm.itertuples():
        batch = log[(log["epoch"] == row.epoch) & (log["step"] == row.step)].sort_values("slot")["pair_id"].tolist()
        matches = truth(torch.tensor(batch))
        anchor = batch.index(row.anchor)
        others = matches[:, anchor] if row.direction == "t2i" else matches[anchor, :]
        assert int(others.sum()) == len(batch) - 1, (row.anchor, row.direction)
