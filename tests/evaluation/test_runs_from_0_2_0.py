"""Run directories written by falcon 0.2.0 (flat ``pretrain`` keys), kept as a fixture (tests/fixtures/runs-0.2.0:
their manifest, config and retrieval results, made by the 0.2.0 release commit on a tiny shapes world): compare
pairs them with runs written today exactly as it pairs runs of one release."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from falcon_cli.config.recipes import load_recipe
from tests.conftest import REPO, TINY_SHAPES_RUN, run_cli

FIXTURE = REPO / "tests" / "fixtures" / "runs-0.2.0"
OVERRIDES = TINY_SHAPES_RUN  # (the fixture's command line, in today's keys)
R1 = {
    ("grit", 0): 40.0,
    ("grit", 1): 44.0,
    ("grit", 2): 47.0,
    ("uniform", 0): 30.0,
    ("uniform", 1): 35.0,
    ("uniform", 2): 41.0,
}
"""Each run's re-ranked R@1 (both directions), so the paired difference is known: grit - uniform = 10, 9, 6."""


def _set_results(run: Path, r1: float) -> None:
    path = run / "results" / "retrieval.json"
    result = json.loads(path.read_text())
    for row in result["rows"]:
        row["i2t_R@1"] = row["t2i_R@1"] = r1 - (10.0 if row["scoring"] == "itc" else 0.0)
    path.write_text(json.dumps(result))


@pytest.fixture
def runs(tmp_path):
    """The 0.2.0 runs (grit seeds 0 and 1, uniform seed 0) and today's stand-ins of the others (grit seed 2, uniform
    seeds 1 and 2: today's resolved config of the same command, in the 0.2.0 runs' manifest), under ``tmp/runs``."""
    root = tmp_path / "runs"
    for old in FIXTURE.iterdir():
        shutil.copytree(old, root / old.name)
        for path in (root / old.name).rglob("*.*"):
            path.write_text(path.read_text().replace("@RUNS@", str(root)))
    template = json.loads((root / "grit-s0" / "manifest.json").read_text())
    for method, seed in (("grit", 2), ("uniform", 1), ("uniform", 2)):
        config, _ = load_recipe(f"shapes-{method}", [*OVERRIDES, f"data.dataset={root / 'world'}", f"seed={seed}"])
        run = root / f"{method}-s{seed}"
        (run / "results").mkdir(parents=True)
        shutil.copy(root / "grit-s0" / "results" / "retrieval.json", run / "results" / "retrieval.json")
        resolved = config.model_dump(mode="json")
        (run / "manifest.json").write_text(json.dumps({**template, "name": run.name, "config": resolved, "seed": seed}))
        (run / "config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))
    for (method, seed), r1 in R1.items():
        _set_results(root / f"{method}-s{seed}", r1)
    return root


def test_the_fixture_is_what_0_2_0_wrote():
    config = yaml.safe_load((FIXTURE / "grit-s0" / "config.yaml").read_text().replace("@RUNS@", "/runs"))["pretrain"]
    assert config["composer"] == "grit" and "scheduler_lr" in config and "search_space_size" in config
    assert json.loads((FIXTURE / "grit-s0" / "manifest.json").read_text())["git"]["sha"].startswith("5920280")


def test_compare_pairs_0_2_0_runs_with_todays(runs):
    proc = run_cli(
        "compare", *sorted(str(p) for p in runs.glob("*-s*")), "--metric", "rerank:R@1", "--out", runs / "cmp"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = pd.read_csv(runs / "cmp" / "comparison.csv").set_index("method")
    assert list(table.index) == ["shapes-grit", "shapes-uniform"] and (table["seeds"] == 3).all(), table
    uniform = table.loc["shapes-uniform"]  # (against the first method: uniform - grit = -10, -9, -6 by seed)
    assert (uniform["baseline"], uniform["paired_seeds"]) == ("shapes-grit", 3)
    assert uniform["difference"] == pytest.approx(-(10 + 9 + 6) / 3, abs=1e-6)
    deprecated = [line for line in proc.stderr.splitlines() if "deprecated" in line]
    assert len(deprecated) == 1 and "was written before 0.3.0" in deprecated[0], proc.stderr


def as_written_by_0_2_0(config: dict) -> dict:
    """A resolved config with its pretrain section in 0.2.0's flat keys (the inverse of the renaming)."""
    from falcon_cli.artifacts.renamed_keys import RENAMED

    pretrain = json.loads(json.dumps(config["pretrain"]))
    flat = {}
    for old, new in RENAMED.items():
        node, parts = pretrain, new.split(".")[1:]
        for part in parts:
            node = node[part]
        flat[old.removeprefix("pretrain.")] = node
    kept = {k: v for k, v in pretrain.items() if k in ("model", "epochs", "max_steps_per_epoch", "batch_size")}
    return {**config, "pretrain": {**kept, **flat}}


@pytest.mark.slow  # (a tiny pretraining, evaluated and resumed: `make test-all`)
def test_a_run_recorded_in_0_2_0_keys_evaluates_resumes_and_compares(tmp_path):
    run = tmp_path / "runs" / "grit-s0"
    args = ["--recipe", "shapes-grit", "--run-dir", run, f"data.dataset={tmp_path / 'world'}", *OVERRIDES]
    assert run_cli("run", *args, "stages=[data,pretrain]").returncode == 0
    for name in ("manifest.json", "config.yaml"):
        path = run / name
        if name == "manifest.json":
            manifest = json.loads(path.read_text())
            path.write_text(json.dumps({**manifest, "config": as_written_by_0_2_0(manifest["config"])}))
        else:
            path.write_text(yaml.safe_dump(as_written_by_0_2_0(yaml.safe_load(path.read_text())), sort_keys=False))
    evaluated = run_cli("evaluate", "retrieval", run, "--k", "16", "--device", "cpu")
    assert evaluated.returncode == 0 and (run / "results" / "retrieval.json").is_file(), evaluated.stderr[-2000:]
    assert "written before 0.3.0" in evaluated.stderr
    resumed = run_cli("pretrain", *args, "evaluate.retrieval.k=16", "evaluate.device=cpu", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    again = yaml.safe_load((run / "config.yaml").read_text())["pretrain"]  # (written back in today's keys)
    assert again["composer"]["name"] == "grit" and "search_space_size" not in again
