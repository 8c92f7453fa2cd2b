"""The suite's own disk use: a module's temporary directories go when its last test passes, stay when one fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

MODULE = """
import pytest

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    directory = tmp_path_factory.mktemp("{name}-world")
    (directory / "checkpoint").write_bytes(b"0" * 1024)
    return directory

def test_one(world):
    assert (world / "checkpoint").exists()

def test_two(world, tmp_path):
    assert {outcome}
"""


def test_a_module_s_directories_go_when_it_passes_and_stay_when_it_fails(tmp_path):
    tests, base = tmp_path / "tests", tmp_path / "base"
    tests.mkdir()
    (tests / "test_passes.py").write_text(MODULE.format(name="passes", outcome="True"))
    (tests / "test_fails.py").write_text(MODULE.format(name="fails", outcome="False"))
    (tests / "test_third.py").write_text(
        "def test_after(tmp_path_factory):\n"
        "    names = {p.name for p in tmp_path_factory.getbasetemp().iterdir()}\n"
        "    assert 'passes-world0' not in names and 'fails-world0' in names, names\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider"]
        + ["--basetemp", str(base), "--rootdir", str(tests), "-o", "tmp_path_retention_policy=failed"]
        + [str(tests / name) for name in ("test_passes.py", "test_fails.py", "test_third.py")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert "1 failed, 4 passed" in done.stdout, done.stdout + done.stderr
    assert not (base / "passes-world0").exists()  # the passed module's, deleted when it ended
    assert (base / "fails-world0" / "checkpoint").exists()  # the failed module's, kept
