"""Pluggable loggers (``pretrain.logging.loggers`` / ``finetune.loggers``): each sink read back from what it wrote, the
one-line error when a package is missing, config validation, and one tiny CLI run with TensorBoard."""

from __future__ import annotations

import builtins
import time

import pytest
from PIL import Image

from falcon_cli.config.recipes import load_recipe
from falcon_cli.errors import FalconError
from falcon_cli.runtime.loggers import RunLoggers, require, scalar_tags
from falcon_cli.runtime.metrics import MetricsLog, read_metrics


def _events(directory):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory), size_guidance={"scalars": 0, "histograms": 0, "images": 0})
    events.Reload()
    return events


def _png(path):
    Image.new("RGB", (8, 6), (200, 10, 10)).save(path)
    return path


def test_scalar_tags_are_the_numbers_of_a_record_grouped_by_kind():
    assert scalar_tags(
        {"step": 3, "epoch": 0, "loss": 1.5, "lr": 1e-4, "sampler": "grit", "reward": None, "flag": True, "bad": "nan"}
    ) == {"train/loss": 1.5, "train/lr": 1e-4}
    assert scalar_tags({"step": 3, "kind": "zero_shot", "mean": 40.0}) == {"zero_shot/mean": 40.0}


def test_tensorboard_gets_scalars_histograms_images_and_a_resume_purges_later_steps(tmp_path):
    pytest.importorskip("tensorboard")
    loggers = RunLoggers(["jsonl", "tensorboard"], tmp_path / "loggers", what="pretrain.logging.loggers", name="run")
    metrics = MetricsLog(tmp_path / "metrics.jsonl", loggers)
    metrics.truncate_after(0)
    for step in range(1, 7):
        metrics.write(step=step, epoch=0, loss=float(step), sampler="uniform")
    metrics.write(step=6, epoch=0, kind="epoch_summary", q_mean=0.5)
    metrics.histogram("epoch_summary/q", [0.1, 0.2, float("nan"), 0.9], 6)
    metrics.image("figures/q_over_training", _png(tmp_path / "q.png"), 6)
    metrics.close()
    events = _events(tmp_path / "loggers" / "tensorboard")
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(s, float(s)) for s in range(1, 7)]
    assert events.Scalars("epoch_summary/q_mean")[0].value == 0.5
    assert events.Histograms("epoch_summary/q")[0].histogram_value.num == 3  # (the NaN left out)
    assert events.Images("figures/q_over_training")[0].width == 8

    # Resumed from a checkpoint at step 3: metrics.jsonl and TensorBoard both forget steps 4-6.
    loggers = RunLoggers(["tensorboard"], tmp_path / "loggers", what="pretrain.logging.loggers", name="run")
    metrics = MetricsLog(tmp_path / "metrics.jsonl", loggers)
    metrics.truncate_after(3)
    for step in (4, 5):
        metrics.write(step=step, epoch=0, loss=10.0 * step)
    metrics.close()
    assert [r["loss"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1.0, 2.0, 3.0, 40.0, 50.0]
    events = _events(tmp_path / "loggers" / "tensorboard")
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
        (4, 40.0),
        (5, 50.0),
    ]


def test_wandb_writes_an_offline_run_in_the_run_directory_and_a_resume_continues_its_id(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    for key in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_API_KEY", "WANDB_DIR"):
        monkeypatch.delenv(key, raising=False)
    folder = tmp_path / "loggers" / "wandb"
    loggers = RunLoggers(
        ["wandb"], tmp_path / "loggers", what="pretrain.logging.loggers", name="run", config={"seed": 1}
    )
    loggers.open(0)
    loggers.scalars({"step": 2, "epoch": 0, "loss": 1.25})
    loggers.histogram("epoch_summary/q", [0.2, 0.4], 2)
    loggers.close()
    run_id = (folder / "run_id").read_text().strip()
    [history] = folder.glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb")
    # wandb's own service process writes the file: on a loaded machine `finish()` returned while it held only the
    # 7-byte header (a newcomer's `make test`), so the record is waited for, not assumed written at once
    deadline = time.monotonic() + 60
    while b"train/loss" not in history.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert b"train/loss" in history.read_bytes()
    resumed = RunLoggers(["wandb"], tmp_path / "loggers", what="pretrain.logging.loggers", name="run")
    resumed.open(2)
    resumed.scalars({"step": 3, "loss": 1.0})
    resumed.close()
    assert (folder / "run_id").read_text().strip() == run_id
    assert len(list(folder.glob(f"wandb/offline-run-*-{run_id}"))) >= 1


def test_mlflow_writes_a_file_store_in_the_run_directory(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    loggers = RunLoggers(["mlflow"], tmp_path / "loggers", what="pretrain.logging.loggers", name="run")
    loggers.open(0)
    loggers.scalars({"step": 1, "loss": 2.0})
    loggers.image("figures/q_over_training", _png(tmp_path / "q_over_training.png"), 1)
    loggers.close()
    resumed = RunLoggers(["mlflow"], tmp_path / "loggers", what="pretrain.logging.loggers", name="run")
    resumed.open(1)
    resumed.scalars({"step": 2, "loss": 1.0})
    resumed.close()
    store = tmp_path / "loggers" / "mlflow"
    client = MlflowClient(tracking_uri=(store / "mlruns").as_uri())
    run_id = (store / "run_id").read_text().strip()
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "train/loss")] == [(1, 2.0), (2, 1.0)]
    assert list((store / "mlruns").glob(f"*/{run_id}/artifacts/figures/q_over_training.png"))


def _without_wandb(monkeypatch):
    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb" or name.startswith("wandb."):
            raise ModuleNotFoundError("No module named 'wandb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(__import__("sys").modules, "wandb", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_wandb)


def test_a_missing_package_stops_a_pipeline_before_its_first_stage(monkeypatch, tmp_path):
    """`falcon run` names the missing extra before the data stage spends its minutes, and writes nothing of it."""
    from falcon_cli.config.recipes import load_recipe
    from falcon_cli.runtime.run_dir import RunDirectory
    from stages import run_stages

    config, _ = load_recipe("shapes-demo", [f"data.dataset={tmp_path / 'world'}", "finetune.loggers=[jsonl,wandb]"])
    run = RunDirectory.open(tmp_path / "run", config=config.model_dump(mode="json"), seed=0)
    _without_wandb(monkeypatch)
    try:
        with pytest.raises(FalconError, match=r"^finetune.loggers names 'wandb' but the package is not installed"):
            run_stages(config, run)
    finally:
        run.close()
    assert not (tmp_path / "world").exists() and not (tmp_path / "run" / "data").exists()


def test_a_missing_package_is_one_line_naming_the_extra(monkeypatch):
    _without_wandb(monkeypatch)
    with pytest.raises(FalconError) as error:
        RunLoggers(["jsonl", "wandb"], "unused", what="pretrain.logging.loggers", name="run")
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("pretrain.logging.loggers names 'wandb' but the package is not installed")
    assert message.endswith("pip install 'falcon-vlp[wandb]'")
    require(["jsonl"], "finetune.loggers")  # jsonl needs nothing


def test_off_rank_zero_or_with_jsonl_alone_nothing_is_opened(tmp_path):
    for loggers in (
        RunLoggers(["jsonl"], tmp_path / "loggers", what="pretrain.logging.loggers", name="run"),
        RunLoggers(["tensorboard"], tmp_path / "loggers", what="pretrain.logging.loggers", name="run", main=False),
    ):
        assert not loggers
        MetricsLog(tmp_path / "metrics.jsonl", loggers).write(step=1, loss=1.0)
        loggers.histogram("q", [0.5], 1)
    assert not (tmp_path / "loggers").exists()


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "pretrain.logging.loggers=[jsonl,tensorbord]",
            r"key 'pretrain.logging.loggers\[1\]': expected one of jsonl, tensorboard, wandb or mlflow",
        ),
        ("finetune.loggers=[wandb,wandb]", r"key 'finetune.loggers': loggers must be distinct"),
    ],
)
def test_config_rejects_unknown_and_repeated_loggers(override, message):
    assert (
        load_recipe("shapes-demo", ["pretrain.logging.loggers=[jsonl,tensorboard,wandb,mlflow]"])[
            0
        ].pretrain.logging.loggers[-1]
        == "mlflow"
    )
    assert load_recipe("shapes-demo")[0].finetune.loggers == ["jsonl"]
    with pytest.raises(FalconError, match=message):
        load_recipe("shapes-demo", [override])


def test_a_tiny_pretraining_run_logs_to_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    from tests.conftest import run_cli
    from tests.stages.test_pretrain import pretrain_args

    run_dir = tmp_path / "run"
    proc = run_cli(
        *pretrain_args(
            run_dir,
            tmp_path / "world",
            "pretrain.runtime.device=cpu",
            "pretrain.composer.name=quantile",
            "pretrain.eval.split=null",
            "pretrain.max_steps_per_epoch=1",
            "pretrain.logging.loggers=[jsonl,tensorboard]",
        )
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = _events(run_dir / "loggers" / "tensorboard")
    steps = [r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if "kind" not in r]
    assert [e.step for e in events.Scalars("train/loss")] == steps
    assert "epoch_summary/q" in events.Tags()["histograms"]  # epoch 1: composed at a quantile
    assert "figures/q_over_training" in events.Tags()["images"]
