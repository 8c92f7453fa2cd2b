"""UpdateStep, the one optimizer update every training loop uses: against a plain AdamW step, with clipping, and on
a non-finite loss (the update skipped on the device, the stop read only where the loop syncs)."""

from __future__ import annotations

import math

import pytest
import torch

from falcon_cli.runtime.optim import build_optimizer
from falcon_cli.runtime.precision import grad_scaler
from falcon_cli.runtime.update import UpdateStep


class Stopped(Exception):
    pass


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def _loss(model, scale: float = 1.0) -> torch.Tensor:
    x = torch.linspace(-1, 1, 12).reshape(3, 4)
    return scale * model(x).pow(2).mean()


def _stop(bad):
    raise Stopped(bad)


def _update_step(model: torch.nn.Module, clip: float | None) -> UpdateStep:
    """An fp32 update of ``model`` (AdamW at 1e-2, no weight decay) whose stop raises :class:`Stopped`."""
    scaler = grad_scaler("fp32", torch.device("cpu"))
    return UpdateStep(
        model, build_optimizer(model, 1e-2, 0.0), scaler, "fp32", grad_clip=clip, stop=_stop, parts=("mse",)
    )


@pytest.mark.parametrize("clip", [None, 0.01])
def test_an_update_is_a_plain_adamw_step_with_the_norm_clipped_or_measured(clip):
    mine, plain = _model(), _model()
    update = _update_step(mine, clip)
    reference = build_optimizer(plain, 1e-2, 0.0)
    for step in range(3):
        loss = _loss(mine)
        norm = update(loss, {"mse": loss}, 0, step, sync=True)
        reference.zero_grad(set_to_none=True)
        _loss(plain).backward()
        expected = torch.nn.utils.get_total_norm([q.grad for q in plain.parameters()])
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(plain.parameters(), clip)
        reference.step()
        assert norm is not None and float(norm) == pytest.approx(float(expected), rel=1e-6)
        if clip is not None:
            assert float(norm) > clip  # (clipped: the returned norm is the one before clipping)
    for a, b in zip(mine.parameters(), plain.parameters()):
        assert torch.equal(a, b)


def test_a_non_finite_loss_skips_every_update_and_stops_only_where_the_loop_syncs():
    model = _model()
    update = _update_step(model, None)
    loss = _loss(model)
    update(loss, {"mse": loss}, 0, 0, sync=False)
    before = [q.detach().clone() for q in model.parameters()]
    bad = _loss(model, scale=math.inf)
    update(bad, {"mse": bad}, 1, 1, sync=False)  # (no sync: no stop yet, but no update either)
    good = _loss(model)
    update(good, {"mse": good}, 1, 2, sync=False)  # (a finite step after it updates nothing)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))
    with pytest.raises(Stopped) as stopped:
        update.check()
    first = stopped.value.args[0]
    assert (first["epoch"], first["step"]) == (1, 1) and not math.isfinite(first["loss"])
    assert not math.isfinite(first["mse"])
