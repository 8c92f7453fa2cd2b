"""The suite's CLI runs fork from a pre-imported zygote (tests/cli_zygote.py): each must behave as a fresh
``python -m falcon_cli`` process would (exit status, both streams, working directory, environment)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests import conftest
from tests.conftest import run_cli

pytestmark = pytest.mark.skipif(
    os.environ.get("FALCON_TEST_FRESH_PROCESS") == "1", reason="FALCON_TEST_FRESH_PROCESS=1: no zygote to test"
)


def both(monkeypatch, *args, cwd=None):
    """``falcon ARGS`` through the zygote, then in a fresh interpreter."""
    forked = run_cli(*args, cwd=cwd)
    with monkeypatch.context() as m:
        m.setenv("FALCON_TEST_FRESH_PROCESS", "1")
        fresh = run_cli(*args, cwd=cwd)
    assert forked.args[0] == "falcon" and fresh.args[:3] == [sys.executable, "-m", "falcon_cli"]  # (which ran where)
    return forked, fresh


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],
        ["recipes", "show", "shapes-demo"],
        ["data", "check", "no/such/dataset"],
        ["pretrain", "--recipe", "shapes-demo", "oops=1"],
    ],
    ids=["version", "recipe", "missing-data", "bad-override"],
)
def test_a_forked_command_answers_as_a_fresh_process(monkeypatch, tmp_path, args):
    forked, fresh = both(monkeypatch, *args, cwd=tmp_path)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert (forked.returncode == 0) == (args[0] in ("--version", "recipes"))


def test_a_forked_command_works_in_its_own_directory_and_the_zygote_outlives_a_failure(monkeypatch, tmp_path):
    (tmp_path / "a").mkdir()
    failed = run_cli("data", "check", "nothing-here", cwd=tmp_path / "a")
    assert failed.returncode == 2 and "nothing-here" in failed.stderr and "Traceback" not in failed.stderr
    made = run_cli("data", "shapes", "--out", "w", "--images", "30", "--seed", "1", cwd=tmp_path / "a")
    assert made.returncode == 0, made.stdout + made.stderr
    world = json.loads((tmp_path / "a" / "w" / "world.json").read_text())  # relative to the request's directory
    assert world["config"]["images"] == 30
    assert not (conftest.REPO / "w").exists()


def test_another_environment_runs_in_a_fresh_interpreter(tmp_path):
    run_cli("--version")
    zygote = conftest._zygote
    proc = run_cli("--version", env={"FALCON_SOME_SETTING": "1"})
    assert proc.returncode == 0 and proc.args[:3] == [sys.executable, "-m", "falcon_cli"]  # a fresh interpreter
    assert conftest._zygote is zygote and zygote.proc.poll() is None
