"""A dual encoder (SigLIP-style, dual-tiny) through the real CLI on a tiny shapes world: FALCON with the caption
reward, the audit and retrieval evaluation of the run, an exact resume mid FALCON epoch, the false-negative
methods on the sigmoid and InfoNCE losses, two gloo processes (the sigmoid loss's ring exchange), `falcon embed`
of the run, and one-line refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from falcon_cli.runtime.metrics import read_metrics
from tests.conftest import (
    TINY_FRAMEWORK_RUN,
    assert_same_training,
    complete_run,
    kill_past_step,
    recipe_args,
    run_cli,
    run_torchrun,
)

TINY = TINY_FRAMEWORK_RUN
args = recipe_args("shapes-siglip-falcon", TINY)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return tmp_path_factory.mktemp("dual") / "world"


@pytest.fixture(scope="module")
def falcon_run(world, tmp_path_factory):
    """`falcon run --recipe shapes-siglip-falcon`: data, pretrain, audit, evaluate."""
    return complete_run(args, world, tmp_path_factory.mktemp("dual-run"))


def test_falcon_with_the_caption_reward_trains_audits_and_evaluates(falcon_run):
    manifest = json.loads((falcon_run / "manifest.json").read_text())
    assert manifest["status"] == "completed"
    assert set(manifest["stages"]) >= {"data", "pretrain", "audit_false_negatives", "evaluate"}
    steps = [r for r in read_metrics(falcon_run / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, 31))
    assert all({"itc", "caption"} <= set(r) and "mlm" not in r and "itm" not in r for r in steps)
    assert np.isfinite([r["loss"] for r in steps]).all()
    assert [r["sampler"] for r in steps] == ["uniform"] * 10 + ["falcon"] * 20
    assert all(r["reward"] is not None for r in steps[10:]), (
        "every FALCON step is rewarded by the caption loss decrease"
    )
    assert len({round(r["reward"], 6) for r in steps[10:]}) > 1
    summaries = [r for r in read_metrics(falcon_run / "metrics.jsonl") if r.get("kind") == "epoch_summary"]
    assert [r["epoch"] for r in summaries] == [1, 2]

    from falcon_cli.artifacts.embeddings import read_embeddings
    from falcon_cli.sampling.batch_log import read_batch_log

    log = read_batch_log(falcon_run / "batches.parquet")
    falcon = log[log["sampler"] == "falcon"]
    assert falcon["q"].notna().mean() > 0.9 and falcon["q"].dropna().between(0, 1).all()  # (a batch's seed has no q)
    cache = read_embeddings(falcon_run / "embeddings" / "epoch_002.h5")
    assert cache.image.shape == (160, 64), "one 64-d vector per pair"
    assert np.allclose(np.linalg.norm(cache.image.astype(np.float32), axis=1), 1, atol=1e-2)

    assert (falcon_run / "audit" / "audit.parquet").is_file() and (falcon_run / "audit" / "audit.md").is_file()
    results = json.loads((falcon_run / "results" / "retrieval.json").read_text())
    scorings = [row["scoring"] for row in results["rows"]]
    assert scorings == ["itc"] and results["meta"]["k"] is None, (
        "a dual encoder ranks by its embedding similarity alone"
    )
    assert results["meta"]["false_negatives"] == "oracle"
    assert all("oracle_i2t_R@1" in row for row in results["rows"])


def test_evaluation_from_another_directory_and_a_rerank_rule_it_cannot_follow(falcon_run, tmp_path):
    """`falcon evaluate retrieval` on the run from another working directory (relative path); asking a dual encoder
    to re-rank by an ITM head it does not have is one line."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(falcon_run, copy)
    proc = run_cli("evaluate", "retrieval", "copy", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads((copy / "results" / "retrieval.json").read_text())["rows"]
    reference = json.loads((falcon_run / "results" / "retrieval.json").read_text())["rows"]
    assert [row["scoring"] for row in rows] == ["itc"]
    assert rows[0]["i2t_R@1"] == reference[0]["i2t_R@1"] and rows[0]["oracle_t2i_R@1"] == reference[0]["oracle_t2i_R@1"]
    proc = run_cli("evaluate", "retrieval", "copy", "--rerank-score", "itm", cwd=tmp_path)
    assert proc.returncode != 0 and "without an ITM head" in proc.stderr and "Traceback" not in proc.stderr


def test_falcon_kill_and_resume_is_exact(world, falcon_run, tmp_path):
    run_dir = tmp_path / "run"
    kill_past_step(args(run_dir, world), run_dir, 19)  # past the step-16 checkpoint, inside the first FALCON epoch
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "00000016"
    resumed = run_cli(*args(run_dir, world), "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert_same_training(falcon_run, run_dir, ("loss", "itc", "caption", "reward", "temperature"))


@pytest.mark.parametrize(
    "method,model",
    [
        ("glofnd", "dual-tiny"),
        ("diht", "dual-tiny"),
        ("mafa", "dual-tiny"),
        ("srcl", "dual-tiny"),
        ("mafa", "dual-tiny-clip"),
        ("none", "dual-tiny-clip"),
    ],
)
def test_false_negative_methods_train_a_dual_encoder(world, falcon_run, tmp_path, method, model):
    """Every method on the sigmoid loss on GRIT batches (SRCL with the FALCON run's embeddings as its auxiliary
    model), and on CLIP's InfoNCE (dual-tiny-clip: MAFA; plain on fixed-quantile batches). Four steps an epoch:
    the methods act from the first step of epoch 1."""
    extra = {
        "glofnd": [
            "pretrain.false_negatives.glofnd.start_epoch=1",
            "pretrain.false_negatives.glofnd.alpha=0.2",
            "pretrain.composer.name=grit",
        ],
        "diht": ["pretrain.composer.name=grit"],
        "mafa": ["pretrain.false_negatives.mafa.judge=oracle", "pretrain.composer.name=grit"],
        "srcl": [
            f"pretrain.false_negatives.srcl.aux_embeddings={falcon_run / 'embeddings' / 'epoch_002.h5'}",
            "pretrain.composer.name=grit",
        ],
        "none": ["pretrain.composer.name=quantile", "pretrain.composer.quantile=0.5"],
    }[method]
    if model == "dual-tiny-clip":  # no decoder
        extra += ["pretrain.model=dual-tiny-clip", "pretrain.losses.caption_weight=0"]
    proc = run_cli(
        *args(
            tmp_path / "run",
            world,
            f"pretrain.false_negatives.method={method}",
            "pretrain.epochs=2",
            "pretrain.max_steps_per_epoch=4",
            "pretrain.eval.split=null",
            *extra,
            recipe="shapes-siglip",
        )
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    steps = [r for r in records if "loss" in r]
    assert len(steps) == 8 and np.isfinite([r["loss"] for r in steps]).all()
    if model == "dual-tiny-clip":
        assert all(r["caption"] == 0 for r in steps)
    if method in ("glofnd", "mafa"):  # what the method flagged, measured against the oracle
        assert any(r.get("kind") == "false_negatives" for r in records)


def test_the_audit_refuses_a_checkpoint_judge_without_an_itm_head(falcon_run, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(falcon_run, copy)
    proc = run_cli("audit-false-negatives", copy, "--judge", "checkpoint", "--max-pairs", "500")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "ITM" in proc.stderr, proc.stderr[-1000:]


@pytest.mark.slow  # (two processes under torchrun: `make test-all`)
def test_two_gloo_processes_train_a_dual_encoder_with_the_sigmoid_exchange(tmp_path):
    proc = run_torchrun(
        args(
            tmp_path / "run",
            tmp_path / "world",
            "pretrain.batch_size=8",
            "pretrain.epochs=2",
            "pretrain.eval.split=null",
        )
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "global batch 16" in proc.stderr
    records = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in records] == list(range(1, 21))
    assert [r["sampler"] for r in records] == ["uniform"] * 10 + ["falcon"] * 10
    assert np.isfinite([r["itc"] for r in records]).all() and np.isfinite([r["caption"] for r in records]).all()


def test_albef_only_stages_and_settings_refuse_a_dual_encoder_in_one_line(falcon_run, world, tmp_path):
    proc = run_cli("finetune", "--run-dir", falcon_run, "--task", "vqa")
    assert proc.returncode != 0 and "dual checkpoint" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_cli(*args(tmp_path / "run", world, "pretrain.scheduler.reward.name=mlm"))
    assert proc.returncode != 0 and "whose rewards are caption, itc" in proc.stderr
    assert not (tmp_path / "run").exists(), "refused before anything is written"
    # the recipe checks behind those lines, in-process (the same validation every command runs first)
    from falcon_cli.config.recipes import load_recipe
    from falcon_cli.errors import FalconError

    for override, message in (
        ("pretrain.losses.itc=momentum", "itc=momentum: not available for dual-encoder"),
        (
            "pretrain.encoders.text_weights=bert-base-uncased",
            "loads the whole open_clip model from encoders.vision_weights",
        ),
        ("pretrain.model=dual-tiny-clip", "no captioning decoder"),
    ):
        with pytest.raises(FalconError, match=message):
            load_recipe("shapes-siglip-falcon", [f"data.dataset={world}", override])


def test_falcon_embed_reads_a_dual_encoder_run(falcon_run, world, tmp_path):
    proc = run_cli(
        "embed",
        "--recipe",
        "shapes-siglip",
        "--run-dir",
        tmp_path / "emb",
        f"data.dataset={world}",
        *TINY[:2],
        f"embed.encoder=falcon:{falcon_run}",
        "embed.fp16=false",
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    from falcon_cli.artifacts.embeddings import read_embeddings

    embedded = read_embeddings(tmp_path / "emb" / "embeddings" / "embeddings.h5")
    cache = read_embeddings(falcon_run / "embeddings" / "epoch_002.h5")
    assert embedded.image.shape == cache.image.shape == (160, 64)
    assert np.allclose(np.linalg.norm(embedded.image, axis=1), 1, atol=1e-4)
    assert np.allclose(np.linalg.norm(embedded.text, axis=1), 1, atol=1e-4)
