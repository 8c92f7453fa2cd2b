"""`pretrain.scheduler.overlap`: FALCON's update of step k made after step k + 1 is launched.

Taking one step of ``scheduler_lag`` from the scheduler instead of the loader changes nothing the run computes: a
lag-1 run with it (no loader look-ahead, no worker process) composes the same batches, makes the same updates and
ends with the same weights as a lag-1 run without it (the loader one batch ahead). It resumes exactly after a
preemption that falls between a step and its deferred update, and needs a lag."""

from __future__ import annotations

import pytest
import torch

from falcon_cli.runtime.metrics import read_metrics

# FALCON on the tiny world with the per-caption reward paths of test_pretrain's FALCON runs (credit per pick, a
# running advantage scale), checkpoints every 4 steps: 2 epochs of 10 steps, epoch 1 FALCON
LAG1 = [
    "pretrain.composer.name=falcon",
    "pretrain.epochs=2",
    "pretrain.composer.search_space_size=80",
    "pretrain.checkpoints.every=4",
    "pretrain.scheduler.quantile_levels=20",
    "pretrain.scheduler.lr=1e-2",
    "pretrain.scheduler.features=[positive,spread]",
    "pretrain.scheduler.update.credit=chosen",
    "pretrain.scheduler.update.baseline=batch_mean",
    "pretrain.scheduler.update.advantage_norm=true",
    "pretrain.runtime.device=cpu",
    "pretrain.scheduler.lag=1",
]
OVERLAP = [*LAG1, "pretrain.scheduler.overlap=true", "pretrain.loader.num_workers=0"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The lag-1 run through the loader, and with the scheduler's deferred update."""
    from tests.conftest import run_cli
    from tests.stages.test_pretrain import pretrain_args

    root = tmp_path_factory.mktemp("overlap")
    world = root / "world"
    out = {}
    for name, overrides in (("loader", LAG1), ("overlap", OVERLAP)):
        done = run_cli(*pretrain_args(root / name, world, *overrides))
        assert done.returncode == 0, done.stderr[-3000:]
        out[name] = root / name
    return world, out


def rewards(run_dir) -> list[float]:
    """The scheduler's rewards in the order its updates were made (overlap: each logged a step late)."""
    return [r["reward"] for r in read_metrics(run_dir / "metrics.jsonl") if r.get("reward") is not None]


def test_the_deferred_update_makes_the_lag_1_run(runs):
    from safetensors.torch import load_file

    from falcon_cli.sampling.batch_log import read_batch_log

    _, out = runs
    loader, overlap = out["loader"], out["overlap"]
    ref_log, new_log = read_batch_log(loader / "batches.parquet"), read_batch_log(overlap / "batches.parquet")
    columns = ["epoch", "step", "slot", "pair_id", "anchor_pair_id"]
    assert ref_log[columns].equals(new_log[columns])
    assert (ref_log["q"].fillna(-1) - new_log["q"].fillna(-1)).abs().max() < 1e-6
    expected, got = rewards(loader), rewards(overlap)
    # (the epoch's last update, made after its last step, is in the epoch summary below, not on a step's line)
    assert len(expected) == len(got) + 1 > 5 and got == pytest.approx(expected[:-1], rel=1e-6, abs=1e-9)
    steps = {r["step"]: r for r in read_metrics(loader / "metrics.jsonl") if r.get("kind") is None}
    later = {r["step"]: r for r in read_metrics(overlap / "metrics.jsonl") if r.get("kind") is None}
    assert steps.keys() == later.keys()
    for step, record in steps.items():
        for key in ("loss", "itc", "itm", "mlm"):
            assert later[step][key] == pytest.approx(record[key], rel=1e-6), (step, key)
    # each FALCON step's record carries the update made during it: the previous step's (none in the epoch's first)
    falcon_steps = sorted(s for s, r in steps.items() if r.get("reward") is not None)
    assert later[falcon_steps[0]].get("reward") is None
    assert [later[s]["reward"] for s in falcon_steps[1:]] == pytest.approx(
        [steps[s]["reward"] for s in falcon_steps[:-1]]
    )
    summaries = [
        [r for r in read_metrics(d / "metrics.jsonl") if r.get("kind") == "epoch_summary"] for d in (loader, overlap)
    ]
    assert summaries[0] and [s["reward_mean"] for s in summaries[1]] == pytest.approx(
        [s["reward_mean"] for s in summaries[0]]
    )
    final = f"{int((loader / 'checkpoints' / 'latest').read_text()):08d}"
    ref, new = (load_file(d / "checkpoints" / final / "model.safetensors") for d in (loader, overlap))
    assert all(torch.equal(ref[k], new[k]) for k in ref)


@pytest.mark.slow  # (a preempted run and its resume: about 35 s on 2 cores)
def test_a_preempted_overlapped_run_resumes_with_its_pending_update(runs, tmp_path):
    """Preempted inside the FALCON epoch, the checkpoint holds the reward whose update the next step makes; resumed,
    the run is the uninterrupted one."""
    from tests.conftest import assert_same_training, preempt_and_resume
    from tests.stages.test_pretrain import pretrain_args

    world, out = runs
    run_dir = tmp_path / "run"
    preempt_and_resume(pretrain_args(run_dir, world, *OVERLAP), run_dir, 13)
    assert_same_training(out["overlap"], run_dir, ("loss", "mlm", "reward", "advantage"))
    assert rewards(run_dir) == pytest.approx(rewards(out["overlap"]), rel=1e-6, abs=1e-9)


def test_overlap_needs_a_lag(tmp_path):
    from tests.conftest import run_cli

    done = run_cli(
        "pretrain", "--recipe", "shapes-demo", "--run-dir", str(tmp_path / "run"), "pretrain.scheduler.overlap=true"
    )
    assert done.returncode == 2 and "overlap=true" in done.stderr and "scheduler.lag=1" in done.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the side stream and its events")
def test_on_cuda_the_side_stream_composes_the_same_batches(tmp_path):
    """On a GPU the host's FALCON work runs on a stream of its own, waiting on events for each step's reward: the
    overlapped run still composes the lag-1 run's batches (q to 1e-4: CUDA's kernels are not bitwise repeatable)."""
    from falcon_cli.sampling.batch_log import read_batch_log
    from tests.conftest import run_cli
    from tests.stages.test_pretrain import pretrain_args

    world = tmp_path / "world"
    logs = []
    for name, overrides in (("loader", LAG1), ("overlap", OVERLAP)):
        overrides = [o for o in overrides if o != "pretrain.runtime.device=cpu"] + ["pretrain.runtime.device=cuda"]
        done = run_cli(*pretrain_args(tmp_path / name, world, *overrides))
        assert done.returncode == 0, done.stderr[-3000:]
        logs.append(read_batch_log(tmp_path / name / "batches.parquet"))
    columns = ["epoch", "step", "slot", "pair_id", "anchor_pair_id"]
    assert logs[0][columns].equals(logs[1][columns])
    assert (logs[0]["q"].fillna(-1) - logs[1]["q"].fillna(-1)).abs().max() < 1e-4


def test_overlapped_updates_come_one_step_late_and_none_after_a_non_finite_step():
    """FalconStep with overlap: each step's update is the previous step's, the last one waits for flush(), and the
    non-finite guard's verdict travels with the reward: a reward from a step after a non-finite one updates no
    scheduler (the loop then stops the run with the non-finite line)."""
    from types import SimpleNamespace

    from falcon_cli.config.schema import PretrainConfig
    from falcon_cli.sampling.falcon_step import FalconStep
    from falcon_cli.sampling.scheduler import NegativeScheduler

    b, g = 6, torch.Generator().manual_seed(2)
    p = PretrainConfig(
        composer="falcon", scheduler_credit="chosen", reward="positive_margin", scheduler_lag=1, scheduler_overlap=True
    )
    scheduler = NegativeScheduler(quantiles=4, hidden=8, blocks=1, reward="positive_margin", credit="chosen")
    step = FalconStep(scheduler, p.scheduler, "fp32", torch.device("cpu"))

    def one_step(halted: float) -> dict:
        image, text = (torch.nn.functional.normalize(torch.randn(b, 8, generator=g), dim=-1) for _ in range(2))
        record = {"s_hat": torch.rand(b - 1, 4, generator=g), "q": torch.rand(b - 1, generator=g)}
        inputs = (None, torch.zeros(b, 3, dtype=torch.long), torch.ones(b, 3, dtype=torch.long))
        return step.after(
            SimpleNamespace(),
            SimpleNamespace(image_feat=image, text_feat=text),
            {},
            inputs,
            None,
            SimpleNamespace(chosen_is_fn=torch.zeros(b)),
            record,
            halted=torch.tensor(halted),
        )

    weights = lambda: [t.detach().clone() for t in scheduler.policy.parameters()]  # noqa: E731
    assert one_step(0.0) == {} and len(step.rewards) == 0, "the first step's update waits for the next launch"
    assert "reward" in one_step(0.0) and len(step.rewards) == 1
    before = weights()
    assert "reward" in one_step(1.0) and len(step.rewards) == 2, "(the finite step before it still updates)"
    after_finite = weights()
    assert any(not torch.equal(a, b) for a, b in zip(before, after_finite))
    # (the guard's verdict stays 1 from the first non-finite step on)
    assert one_step(1.0) == {"halted": True} and len(step.rewards) == 2
    assert step.flush() == {"halted": True} and len(step.rewards) == 2
    assert all(torch.equal(a, b) for a, b in zip(after_finite, weights())), "no update from a non-finite step"
    assert step.flush() == {}, "nothing left waiting"
