"""Shared test helpers: run the real CLI in its own process (forked from a pre-imported zygote), tiny shapes worlds."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    """One intra-op thread in each xdist worker, as :func:`run_cli` gives its subprocesses: two workers with two
    spinning OpenMP threads each on two cores made a 2-second in-process training test take 85 seconds."""
    if hasattr(config, "workerinput"):
        import torch

        torch.set_num_threads(1)


LONGEST_FIRST = (
    "test_cluster_faults.py",
    "test_pretrain.py",
    "test_graph_step.py",
    "test_tutorial_coco.py",
    "test_blip2_pretrain.py",
    "test_pretrain_speed.py",
    "test_finetune_evaluate.py",
    "test_multinode.py",
    "test_shards.py",
    "test_dual_pretrain.py",
    "test_hub.py",
    "test_build_search_spaces.py",
    "test_distributed.py",
    "test_relative_paths.py",
    "test_embed.py",
    "test_eval_eccv.py",
    "test_evaluation_scoring.py",
    "test_same_image.py",
    "test_scheduler_overlap.py",
    "test_sigmoid_loss.py",
    "test_cli.py",
    "test_unimodal.py",
    "test_artifacts.py",
    "test_cli_zygote.py",
)
"""The longest test files (measured with ``--durations=0``), in the order `make test` should start them."""


def pytest_collection_modifyitems(config, items):
    """The longest files first: `make test` deals whole files to two workers in collection order, and the longest
    file dealt last kept one worker busy a minute after the other had finished."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # (stable: the rest keep their order)


def pytest_sessionstart(session):
    """Delete earlier finished sessions' temporary directories now: pytest would only do it at exit, after this
    session has written its own gigabytes beside them (a full /tmp once failed CI). A directory whose session still
    holds its ``.lock`` (a suite running beside this one) is left alone."""
    config = session.config
    if hasattr(config, "workerinput") or config.option.basetemp:
        return  # xdist workers live inside the controller's directory; a given --basetemp is pytest's to clear
    current = config._tmp_path_factory.getbasetemp()
    number = int(current.name.removeprefix("pytest-"))
    for old in current.parent.glob("pytest-*"):
        suffix = old.name.removeprefix("pytest-")
        if suffix.isdigit() and int(suffix) < number and not (old / ".lock").exists():
            shutil.rmtree(old, ignore_errors=True)


FAILED_MODULES: set[str] = set()
"""The test modules with a failed setup, call or teardown: their temporary directories are kept for a look."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        FAILED_MODULES.add(item.module.__name__)
    return report


@pytest.fixture(scope="module", autouse=True)
def module_temporary_directories(request, tmp_path_factory):
    """Delete the directories a module's tests made once its last test is done (unless one failed, as pytest keeps
    a failed test's): pytest itself deletes a passed test's ``tmp_path`` at once, but a module-scoped fixture's
    ``tmp_path_factory.mktemp`` directories (worlds, runs with their checkpoints) only at exit, and together they
    filled a CI runner's disk near the suite's end. Every ``mktemp`` in tests/ is module-scoped or narrower, and
    this fixture, autouse at module scope, is set up before the module's others and so torn down after them."""
    base = tmp_path_factory.getbasetemp()
    before = set(base.iterdir())
    yield
    if request.module.__name__ in FAILED_MODULES:
        return
    for path in set(base.iterdir()) - before:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)


class CliZygote:
    """A process that has imported falcon once (``tests/cli_zygote.py``) and forks one child per command line:
    each child runs the real ``falcon`` entry point in its own process, working directory, environment and
    standard streams, without the ~6 seconds of imports a fresh interpreter spends first. A zygote serves only
    the environment it started with (a variable read at import time is then the same): :func:`run_cli` starts a
    new one when the test process's environment has changed, and runs a command given its own ``env``, or any
    command under ``FALCON_TEST_FRESH_PROCESS=1``, in a fresh interpreter."""

    def __init__(self, env: dict):
        self.env = dict(env)
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "cli_zygote.py")],
            cwd=REPO,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )

    def serves(self, env: dict) -> bool:
        """Whether a command with ``env`` can run here: the zygote is alive and started with that environment
        (pytest's PYTEST_CURRENT_TEST, which changes with every test and which falcon never reads, aside)."""
        strip = lambda e: {k: v for k, v in e.items() if k != "PYTEST_CURRENT_TEST"}  # noqa: E731
        return self.proc.poll() is None and strip(self.env) == strip(env)

    def run(self, argv: list[str], cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
        import signal
        import tempfile

        with tempfile.TemporaryDirectory(prefix="falcon-cli-") as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            request = {"argv": argv, "cwd": str(cwd), "env": env, "stdout": str(out), "stderr": str(err)}
            self.proc.stdin.write(json.dumps(request) + "\n")
            pid = json.loads(self._reply(timeout=120))["pid"]
            try:
                status = json.loads(self._reply(timeout))["status"]
            except subprocess.TimeoutExpired:
                os.kill(pid, signal.SIGKILL)
                self._reply(timeout=60)
                raise
            return subprocess.CompletedProcess(
                ["falcon", *argv],
                os.waitstatus_to_exitcode(status),
                out.read_text(errors="replace"),
                err.read_text(errors="replace"),
            )

    def _reply(self, timeout: float) -> str:
        import select

        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise subprocess.TimeoutExpired("falcon", timeout)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(
                "the CLI zygote (tests/cli_zygote.py) exited; run with FALCON_TEST_FRESH_PROCESS=1 to see why"
            )
        return line

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


_zygote: CliZygote | None = None


def run_cli(
    *args: str, cwd: Path | None = None, env: dict | None = None, check: bool = False
) -> subprocess.CompletedProcess:
    """Run ``falcon ARGS`` as a user would (its own process), capturing output."""
    global _zygote
    # One intra-op thread: the suite already keeps both cores busy, and oversubscribed OpenMP
    # threads make tiny CPU steps several times slower.
    full_env = {**os.environ, "FALCON_PROGRESS": "0", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **(env or {})}
    full_env.pop("FALCON_DEBUG", None)
    argv = [str(a) for a in args]
    if os.environ.get("FALCON_TEST_FRESH_PROCESS") != "1" and not env:
        if _zygote is None or not _zygote.serves(full_env):
            if _zygote is not None:
                _zygote.close()
            _zygote = CliZygote(full_env)
            atexit.register(_zygote.close)
        proc = _zygote.run(argv, Path(cwd or REPO), full_env, timeout=600)
    else:
        proc = subprocess.run(
            [sys.executable, "-m", "falcon_cli", *argv],
            cwd=cwd or REPO,
            capture_output=True,
            text=True,
            env=full_env,
            timeout=600,
        )
    if check and proc.returncode != 0:
        raise AssertionError(f"falcon {' '.join(argv)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def kill_past_step(args, run_dir: Path, step: int, timeout: float = 300) -> None:
    """Start ``falcon ARGS`` and SIGKILL it (no cleanup, as a real kill) once ``run_dir``'s metrics log reaches
    ``step``; the process must have been killed mid-training."""
    import signal

    code, _ = signal_past_step(args, Path(run_dir) / "metrics.jsonl", step, signal.SIGKILL, timeout=timeout)
    assert code == -signal.SIGKILL, "the run must be killed mid-training"


def signal_past_step(args, metrics: Path, step: int, signum: int, timeout: float = 300) -> tuple[int, str]:
    """Start ``falcon ARGS``, send it ``signum`` once the metrics log ``metrics`` reaches ``step``, and return its exit
    status and standard error once it has ended."""
    import time

    from falcon_cli.runtime.metrics import read_metrics

    env = {**os.environ, "FALCON_PROGRESS": "0", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "falcon_cli", *map(str, args)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and any(r.get("step", 0) >= step for r in read_metrics(metrics)):
            proc.send_signal(signum)
            break
        time.sleep(0.05)
    _, stderr = proc.communicate(timeout=timeout)
    return proc.returncode, stderr


def preempt_and_resume(args: list, run_dir: Path, step: int) -> None:
    """Run ``falcon ARGS`` (a pretraining into ``run_dir``), preempt it with SIGUSR1 once it has logged ``step``
    (exit status 75), then run it again with ``--resume`` to the end."""
    import signal

    code, stderr = signal_past_step(args, Path(run_dir) / "metrics.jsonl", step, signal.SIGUSR1)
    assert code == 75, stderr[-3000:]
    resumed = run_cli(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr


def assert_same_training(reference: Path, run_dir: Path, keys: tuple[str, ...]) -> None:
    """``run_dir`` logged the same steps as ``reference`` with the same ``keys`` (losses, reward, temperature) and
    composed the same batches (pair ids and their anchors; q to 1e-5): an exact resume."""
    from falcon_cli.runtime.metrics import read_metrics
    from falcon_cli.sampling.batch_log import read_batch_log

    expected, got = read_metrics(Path(reference) / "metrics.jsonl"), read_metrics(Path(run_dir) / "metrics.jsonl")
    assert [r["step"] for r in got] == [r["step"] for r in expected]
    for a, b in zip(expected, got):
        for key in keys:
            if a.get(key) is not None:
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a["step"], key, a[key], b[key])
    ref_log, new_log = (
        read_batch_log(Path(reference) / "batches.parquet"),
        read_batch_log(Path(run_dir) / "batches.parquet"),
    )
    columns = ["epoch", "step", "slot", "pair_id", "anchor_pair_id"]
    assert ref_log[columns].equals(new_log[columns])
    assert (ref_log["q"].fillna(-1) - new_log["q"].fillna(-1)).abs().max() < 1e-5


TINY_SHAPES_RUN = [
    "data.shapes.images=40",
    "data.tokenizer_vocab_size=200",
    "data.verify_images=false",
    "pretrain.epochs=2",
    "pretrain.batch_size=16",
    "pretrain.composer.search_space_size=48",
    "pretrain.optim.warmup_steps=4",
    "pretrain.logging.every=1",
    "pretrain.runtime.device=cpu",
    "pretrain.loader.num_workers=0",
]
"""A shapes recipe's smallest whole run: 40 images, 2 epochs of batch 16 on the CPU (the 0.2.0 fixture's runs and the
plugin's test runs)."""


TINY_FRAMEWORK_RUN = [
    "data.shapes.images=40",
    "data.tokenizer_vocab_size=200",
    "pretrain.epochs=3",
    "pretrain.batch_size=16",
    "pretrain.composer.search_space_size=48",
    "pretrain.logging.every=1",
    "pretrain.optim.warmup_steps=4",
    "pretrain.checkpoints.every=8",
    "pretrain.scheduler.quantile_levels=20",
    "pretrain.runtime.device=cpu",
    "audit.max_pairs=2000",
]
"""The tiny run the BLIP-2 and dual-encoder pipeline tests train: 40 images, 3 epochs of batch 16, a checkpoint
every 8 steps (so a kill at step 19 resumes inside the first FALCON epoch)."""


def recipe_args(recipe: str, tiny: list[str]):
    """``args(run_dir, world, *extra, command="pretrain", recipe=recipe)``: the command line of a test module's tiny
    runs of ``recipe`` on the shapes world ``world``."""

    def args(run_dir, world, *extra, command: str = "pretrain", recipe: str = recipe) -> list:
        return [command, "--recipe", recipe, "--run-dir", run_dir, f"data.dataset={world}", *tiny, *extra]

    return args


def complete_run(args, world: Path, directory: Path) -> Path:
    """``falcon run`` of ``args`` (data, pretrain, audit, evaluate) into ``directory/run``; it must succeed."""
    run_dir = Path(directory) / "run"
    proc = run_cli(*args(run_dir, world, command="run"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run_dir


def run_torchrun(args, processes: int = 2) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc_per_node PROCESSES -m falcon_cli ARGS`` (gloo on the CPU), captured."""
    env = {**os.environ, "FALCON_PROGRESS": "0", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(processes),
        "-m",
        "falcon_cli",
        *map(str, args),
    ]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture
def cli():
    """The :func:`run_cli` helper as a fixture."""
    return run_cli


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def captured(monkeypatch):
    """Every matplotlib Figure handed to falcon's PNG saver, in order (the real saver still runs)."""
    from falcon_cli.reporting import figures

    figs = []
    real = figures._save_png

    def spy(fig, path):
        figs.append(fig)
        return real(fig, path)

    monkeypatch.setattr(figures, "_save_png", spy)
    return figs


def assert_png(path: Path) -> None:
    """``path`` is a real PNG, written atomically (no temporary file left beside it)."""
    data = path.read_bytes()
    assert len(data) > 1000 and data.startswith(PNG_MAGIC)
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def random_captions(rng, n_images: int, max_captions: int) -> tuple[list[list[int]], list[int]]:
    """``(img2txt, txt2img)`` of a retrieval split with 1..``max_captions`` consecutive captions per image."""
    img2txt, txt2img = [], []
    for i in range(n_images):
        caps = list(range(len(txt2img), len(txt2img) + rng.randint(1, max_captions)))
        img2txt.append(caps)
        txt2img.extend([i] * len(caps))
    return img2txt, txt2img


@pytest.fixture(scope="module")
def tiny_shapes_world(tmp_path_factory):
    """A tiny shapes world (the demo recipe's, 40 images) with its dataset spec and pretraining records (one caption
    each, with image and caption ids): ``{"dir", "spec", "records"}``."""
    from falcon_cli.config.recipes import load_recipe
    from falcon_cli.data.datasets import pretrain_dataset
    from falcon_cli.data.shapes import generate_world
    from falcon_cli.data.spec import load_spec

    world = tmp_path_factory.mktemp("tiny-shapes") / "world"
    overrides = [
        f"data.dataset={world}",
        "data.shapes.images=40",
        "data.tokenizer_vocab_size=200",
        "data.verify_images=false",
    ]
    config, _ = load_recipe("shapes-demo", overrides)
    generate_world(config.data.shapes, world, workers=1)
    spec = load_spec(world)
    return {"dir": world, "spec": spec, "records": pretrain_dataset(spec, transform=None).records}
