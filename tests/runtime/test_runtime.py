"""Runtime pieces of the training loop: RNG state, LR schedule, parameter groups, checkpoints, metrics."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from torch import nn

from falcon_cli.errors import FalconError
from falcon_cli.runtime.checkpoint import (
    latest_checkpoint,
    load_checkpoint_weights,
    load_training_state,
    save_checkpoint,
)
from falcon_cli.runtime.metrics import MetricsLog, read_metrics
from falcon_cli.runtime.optim import learning_rate, parameter_groups
from falcon_cli.runtime.seeding import rng_state, seed_everything, set_rng_state


def draws():
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def test_rng_state_roundtrip_through_a_safe_checkpoint(tmp_path):
    seed_everything(5)
    draws()
    torch.save(rng_state(), tmp_path / "s.pt")
    expected = draws()
    draws()
    set_rng_state(torch.load(tmp_path / "s.pt", weights_only=True))
    assert draws() == expected


def test_learning_rate_schedule_matches_reference():
    kw = dict(lr=1e-4, min_lr=1e-5, warmup_lr=1e-5, warmup_steps=2000, cosine_epochs=30)
    assert learning_rate(0, 0, **kw) == pytest.approx(1e-5)
    assert learning_rate(1000, 0, **kw) == pytest.approx(5.5e-5)
    assert learning_rate(2000, 0, **kw) == pytest.approx(1e-4)  # cosine at epoch 0 = peak
    assert learning_rate(10**6, 19, **kw) == pytest.approx(3.67e-5, rel=1e-2)  # GRIT's last epoch
    assert learning_rate(10**6, 30, **kw) == pytest.approx(1e-5)
    lrs = [learning_rate(10**6, e, **kw) for e in range(31)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.linear = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.head = nn.Linear(4, 10, bias=False)
        self.temp = nn.Parameter(torch.tensor(0.07))


def test_parameter_groups_exempt_biases_and_norms():
    model = Tiny()
    decay, no_decay = parameter_groups(model, 0.02)
    ids = lambda group: {id(p) for p in group["params"]}  # noqa: E731
    assert id(model.linear.weight) in ids(decay) and id(model.temp) in ids(decay)
    assert {id(model.linear.bias), id(model.norm.weight), id(model.norm.bias)} <= ids(no_decay)
    assert decay["weight_decay"] == 0.02 and no_decay["weight_decay"] == 0.0


def test_checkpoint_roundtrip_latest_and_keep_last(tmp_path):
    model = Tiny()
    extra = nn.Linear(2, 2)
    for step in (10, 20, 30, 40):
        save_checkpoint(
            tmp_path,
            step,
            {"model": model, "momentum": extra},
            {"step": step, "rng": rng_state()},
            {"epoch": 0},
            keep_last=2,
        )
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["00000030", "00000040"]
    latest = latest_checkpoint(tmp_path)
    assert latest.name == "00000040"
    assert json.loads((latest / "meta.json").read_text()) == {"step": 40, "epoch": 0}
    other, other_extra = Tiny(), nn.Linear(2, 2)
    load_checkpoint_weights(latest, {"model": other, "momentum": other_extra})
    for a, b in zip(
        [*model.state_dict().values(), *extra.state_dict().values()],
        [*other.state_dict().values(), *other_extra.state_dict().values()],
    ):
        assert torch.equal(a, b)
    assert load_training_state(latest)["step"] == 40


def test_checkpoint_errors(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    save_checkpoint(tmp_path, 1, {"model": Tiny()}, {}, {})
    with pytest.raises(FalconError, match="keys do not match the model"):
        load_checkpoint_weights(latest_checkpoint(tmp_path), {"model": nn.Linear(3, 3)})
    with pytest.raises(FalconError, match="momentum.safetensors: not found"):
        load_checkpoint_weights(latest_checkpoint(tmp_path), {"momentum": nn.Linear(3, 3)})
    (tmp_path / "latest").write_text("00000099\n")
    with pytest.raises(FalconError, match="points to 00000099"):
        latest_checkpoint(tmp_path)


def test_training_state_refuses_pickled_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    save_checkpoint(tmp_path, 1, {"model": Tiny()}, {}, {})
    torch.save({"x": Evil()}, tmp_path / "00000001" / "training_state.pt")
    with pytest.raises(FalconError, match="holds more than tensors and plain values; refused") as err:
        load_training_state(tmp_path / "00000001")
    assert "weights_only=False" not in str(err.value)  # never suggest the unsafe way


def test_metrics_log_truncate_and_torn_line(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    for step in range(5):
        log.write(step=step, loss=torch.tensor(1.0 / (step + 1)), bad=float("nan"))
    log.truncate_after(2)
    with open(tmp_path / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 9, "lo')  # a kill mid-write
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert records[1]["loss"] == 0.5 and records[0]["bad"] == "nan"


def test_a_tracked_loop_inside_a_tracked_loop_draws_one_bar(monkeypatch):
    from falcon_cli.runtime import progress

    monkeypatch.setenv("FALCON_PROGRESS", "1")
    drawn = []
    real = progress.make_progress

    def counting():
        drawn.append(1)
        return real()

    monkeypatch.setattr(progress, "make_progress", counting)
    seen = [(i, j) for i in progress.track(range(3), "outer") for j in progress.track(range(2), "inner")]
    assert seen == [(i, j) for i in range(3) for j in range(2)]
    assert len(drawn) == 1, "rich allows one live display: the inner loops run without a bar"
    assert list(progress.track(range(2), "after")) == [0, 1] and len(drawn) == 2


def test_precision_on_the_cpu_is_fp32_unless_bf16_is_asked_of_a_cpu_that_has_it(monkeypatch):
    from falcon_cli.runtime import precision

    cpu = torch.device("cpu")
    assert precision.resolve_precision("auto", cpu) == "fp32"  # (never bf16 unasked: CPU runs keep their numbers)
    assert precision.resolve_precision("fp32", cpu) == "fp32"
    with pytest.raises(FalconError, match="needs a CUDA device"):
        precision.resolve_precision("fp16", cpu)
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)
    assert precision.resolve_precision("bf16", cpu) == "bf16"
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: False)
    with pytest.raises(FalconError, match=r"bf16 on the CPU needs native bf16 .*use precision=fp32") as info:
        precision.resolve_precision("bf16", cpu)
    assert "\n" not in str(info.value)
    monkeypatch.undo()
    assert isinstance(precision.cpu_has_bf16(), bool)
    with precision.autocast("bf16", cpu):  # the context the step runs in: bf16 matrix products on the CPU
        assert (torch.ones(2, 3) @ torch.ones(3, 2)).dtype == torch.bfloat16
