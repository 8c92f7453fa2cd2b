"""``falcon --help``, every command's help, the recipes commands and a bad override answer at once: none of them
imports torch or the other heavy libraries, which only a running stage needs (docs/architecture.md).

The cause is tested, not the time (a shared machine's timings are noise): each command runs in a fresh
interpreter, exactly as the ``falcon`` script runs it, and reports which heavy libraries it ended up importing.
``benchmarks/cli_latency.py`` measures the effect.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

HEAVY = (
    "torch",
    "torchvision",
    "transformers",
    "timm",
    "open_clip",
    "faiss",
    "h5py",
    "pandas",
    "pyarrow",
    "matplotlib",
    "PIL",
    "numpy",
)
"""What a command that runs no stage must not import (numpy too: its 0.1 s is a fifth of the budget)."""

RUN = """
import json, sys
out, heavy, sys.argv = sys.argv[1], set(sys.argv[2].split(",")), ["falcon", *sys.argv[3:]]
code = 0
try:
    from falcon_cli.cli.app import main
    main()
except SystemExit as exc:
    code = exc.code
finally:
    with open(out, "w") as f:
        json.dump({"exit": code, "heavy": sorted({m.split(".")[0] for m in sys.modules} & heavy)}, f)
"""
"""``falcon ARGS`` as the console script runs it (``main()``), then which of ``HEAVY`` it imported."""


def help_commands() -> list[list[str]]:
    """Every command and command group of the ``falcon`` tree (``[]`` is ``falcon`` itself)."""
    import typer

    from falcon_cli.cli.app import app

    found: list[list[str]] = []

    def walk(command, path: list[str]) -> None:
        found.append(path)
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return found


def falcon(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """Run ``falcon ARGS`` in a fresh interpreter; its process and its report (exit status, heavy imports)."""
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-c", RUN, str(report), ",".join(HEAVY), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.is_file(), proc.stderr
    return proc, json.loads(report.read_text())


@pytest.mark.parametrize("command", help_commands(), ids=lambda c: " ".join(c) or "falcon")
def test_every_help_imports_nothing_heavy(tmp_path, command):
    proc, report = falcon(tmp_path, *command, "--help")
    assert report["exit"] in (0, None), proc.stdout + proc.stderr
    assert "Usage: falcon" in proc.stdout
    assert report["heavy"] == [], f"falcon {' '.join(command)} --help imported {report['heavy']}"


@pytest.mark.parametrize(
    "args", [["recipes", "list"], ["recipes", "show", "shapes-demo"], ["recipes", "validate"]], ids=" ".join
)
def test_the_recipes_commands_import_nothing_heavy(tmp_path, args):
    proc, report = falcon(tmp_path, *args)
    assert report["exit"] in (0, None), proc.stdout + proc.stderr
    assert report["heavy"] == [], f"falcon {' '.join(args)} imported {report['heavy']}"


def test_a_bad_override_is_one_line_and_imports_nothing_heavy(tmp_path):
    proc, report = falcon(tmp_path, "recipes", "show", "shapes-demo", "pretrain.epochz=3")
    assert report["exit"] == 2
    assert proc.stderr.strip().splitlines() == [
        "error: override 'pretrain.epochz=3': unknown key 'pretrain.epochz'; did you mean 'pretrain.epochs'? "
        "(`falcon recipes show NAME` lists the keys)"
    ]
    assert report["heavy"] == []


def test_the_check_sees_a_heavy_import(tmp_path):
    """The report is not empty by construction: a command that imports a stage's library is caught."""
    report = tmp_path / "report.json"
    code = RUN.replace("from falcon_cli.cli.app import main", "import numpy\n    from falcon_cli.cli.app import main")
    subprocess.run(
        [sys.executable, "-c", code, str(report), ",".join(HEAVY), "--version"],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=120,
    )
    assert json.loads(report.read_text()) == {"exit": 0, "heavy": ["numpy"]}
