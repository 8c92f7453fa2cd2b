"""The pretraining story's shape (issue 69): built, then trained; the loop is short and names no composer, whose work
around a step sits behind the step hooks (which do nothing for the composers that need nothing)."""

from __future__ import annotations

import inspect

from falcon_cli.sampling.step_hooks import FalconHooks, StepHooks, step_hooks
from stages import pretrain


def test_run_is_train_of_build_and_the_loop_is_short_and_names_no_composer():
    assert "train(build(config, run" in inspect.getsource(pretrain.run)
    loop = inspect.getsource(pretrain.train).split('"""')[2]  # (the code, below its docstring)
    assert len(loop.splitlines()) <= 120, len(loop.splitlines())
    assert "falcon" not in loop.lower() and "scheduler" not in loop


def test_the_empty_hooks_change_nothing_and_falcons_wait_for_its_epochs():
    hooks = StepHooks()
    loader = object()
    assert hooks.loader(loader) is loader and not hooks.syncs and hooks.lag == 0
    assert hooks.after_step(None, None, {}, (), None, None, None) == {} and hooks.end_epoch(0) == (False, None)
    assert isinstance(step_hooks(None, None, None, overlap=False), StepHooks)

    class Epochs:
        def on_demand(self, epoch):
            return epoch > 0

    calls = []

    class Step:
        def compose_within(self, loader):
            calls.append("compose")
            return "composed"

        def before(self, *args):
            calls.append("before")

    falcon = step_hooks(Step(), Epochs(), None, lag=2, overlap=True)
    assert falcon.lag == 1  # (overlap: one step of the lag is the scheduler's own)
    assert isinstance(falcon, FalconHooks)
    falcon.begin_epoch(0)  # (epoch 0 is uniform: no scheduler at work)
    assert (
        falcon.loader(loader) is loader
        and not falcon.syncs
        and falcon.after_step(None, None, {}, (), None, None, 0) == {}
    )
    falcon.begin_epoch(1)
    falcon.before_step(None, (), None)
    assert falcon.loader(loader) == "composed" and calls == ["before", "compose"]
    assert not falcon.syncs  # (overlap: the update reads the verdict, not the loop)
    assert step_hooks(Step(), Epochs(), None, overlap=False).syncs is False  # (not before its epoch begins)
