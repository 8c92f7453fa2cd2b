"""Every stage with a relative ``--run-dir`` and relative input paths, run from other working directories.

A user types ``falcon run --recipe shapes-demo --run-dir runs/demo`` and ``falcon evaluate
retrieval runs/demo``, or chains stages in a script that ``cd``s around. The rest of the suite
mostly passes absolute temporary paths; a relative ``--run-dir`` once made ``make demo`` crash
(the run directory joined onto itself: ``runs/x/runs/x/embeddings/epoch_000.h5``). Here every
path on the command line is relative, and the readers run from a different directory.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli

TINY = [
    "data.dataset=data/w",
    "data.shapes.images=40",
    "data.shapes.size=32",
    "pretrain.encoders.image_size=32",
    "data.tokenizer_vocab_size=200",
    "data.verify_images=false",
    "pretrain.epochs=2",
    "pretrain.batch_size=16",
    "pretrain.composer.search_space_size=32",
    "pretrain.loader.augment=test",
    "pretrain.loader.num_workers=0",
    "pretrain.optim.warmup_steps=2",
    "pretrain.checkpoints.every=2",
    "finetune.num_workers=0",
    "finetune.vqa.epochs=1",
    "finetune.vqa.batch_size=16",
    "finetune.vqa.max_steps_per_epoch=2",
    "evaluate.num_workers=0",
    "evaluate.retrieval.k=4",
    "evaluate.batch_size=16",
]


def ok(proc):
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def check_run(run: Path) -> dict:
    """The manifest is complete, names only files inside the run that exist, and the run never nested itself."""
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "completed"
    assert manifest["cwd"] and Path(manifest["cwd"]).is_absolute()
    for rel in manifest["artifacts"]:
        assert not Path(rel).is_absolute() and (run / rel).exists(), rel
    assert not (run / "runs").exists()
    return manifest


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A working directory holding ``data/w`` and ``runs/demo`` (data → pretrain → finetune → evaluate), all
    made with relative paths; and a sibling directory to run the readers from."""
    root = tmp_path_factory.mktemp("relative")
    (root / "work").mkdir()
    (root / "elsewhere").mkdir()
    ok(
        run_cli(
            "run",
            "--recipe",
            "shapes-demo",
            "--run-dir",
            "runs/demo",
            *TINY,
            "finetune.tasks=[vqa]",
            "evaluate.tasks=[retrieval, vqa]",
            cwd=root / "work",
        )
    )
    return root


def test_falcon_run_with_a_relative_run_dir(work):
    run = work / "work" / "runs" / "demo"
    manifest = check_run(run)
    assert [manifest["stages"][s]["status"] for s in ("data", "pretrain", "finetune", "evaluate")] == ["completed"] * 4
    for name in (
        "embeddings/epoch_000.h5",
        "embeddings/epoch_001.h5",
        "batches.parquet",
        "results/retrieval.json",
        "results/vqa.json",
        "data/tokenizer",
    ):
        assert name in manifest["artifacts"], name
    # The resolved config names the files it used, whatever directory reads it later.
    assert manifest["config"]["data"]["dataset"] == str(work / "work" / "data" / "w")
    assert "data.dataset=data/w" in manifest["command"]  # what the user typed stays on record


def test_readers_from_another_working_directory(work):
    """The run's recorded dataset and checkpoints are found from elsewhere; a checkpoint named by a relative path
    too."""
    elsewhere, run = work / "elsewhere", "../work/runs/demo"
    latest = (work / "work" / "runs" / "demo" / "checkpoints" / "latest").read_text().strip()
    ok(
        run_cli(
            "evaluate",
            "retrieval",
            run,
            "--itc-only",
            "--model",
            "pretrained",
            "--model",
            f"{run}/checkpoints/{latest}",
            cwd=elsewhere,
        )
    )
    ok(run_cli("audit-false-negatives", run, "--judge", "oracle", "--steps", "2", cwd=elsewhere))
    ok(run_cli("finetune", "--run-dir", run, "--task", "vqa", "finetune.vqa.epochs=1", "--overwrite", cwd=elsewhere))
    manifest = check_run(work / "work" / "runs" / "demo")
    assert {"audit", "results/retrieval.md", "results/vqa.md"} <= set(manifest["artifacts"])
    rows = json.loads((work / "work" / "runs" / "demo" / "results" / "retrieval.json").read_text())["rows"]
    assert [r["checkpoint"] for r in rows] == [str(work / "work" / "runs" / "demo" / "checkpoints" / latest)] * 2


def test_stage_commands_with_default_and_relative_run_dirs(work):
    """`falcon pretrain` without --run-dir (runs/<recipe>), resumed; embed from a relative `falcon:` run; search
    spaces from relative embeddings; a warm-started SRCL run reading both through relative paths."""
    cwd = work / "work"
    short = [*TINY, "pretrain.eval.split=null", "pretrain.epochs=1", "pretrain.max_steps_per_epoch=2"]
    ok(run_cli("pretrain", "--recipe", "shapes-demo", *short, cwd=cwd))
    default = cwd / "runs" / "shapes-demo"
    check_run(default)
    assert "resumed from" in ok(run_cli("pretrain", "--recipe", "shapes-demo", "--resume", *short, cwd=cwd)).stderr
    check_run(default)

    ok(
        run_cli(
            "embed",
            "--recipe",
            "shapes-demo",
            "--run-dir",
            "runs/emb",
            *TINY,
            "embed.encoder=falcon:runs/demo",
            "embed.split=pretrain",
            "embed.device=cpu",
            "embed.num_workers=0",
            cwd=cwd,
        )
    )
    check_run(cwd / "runs" / "emb")
    embeddings = "runs/emb/embeddings/embeddings.h5"
    ok(
        run_cli(
            "build-search-spaces",
            "--recipe",
            "shapes-demo",
            "--run-dir",
            "runs/spaces",
            *TINY,
            f"search_spaces.embeddings={embeddings}",
            cwd=cwd,
        )
    )
    check_run(cwd / "runs" / "spaces")

    # Run from a subdirectory: every input path climbs out of it.
    sub = cwd / "scripts"
    sub.mkdir()
    ok(
        run_cli(
            "pretrain",
            "--recipe",
            "shapes-demo",
            "--run-dir",
            "../runs/warm",
            *[a.replace("data/w", "../data/w") for a in short],
            "pretrain.composer.name=grit",
            "pretrain.composer.search_spaces=../runs/spaces/search_spaces.parquet",
            f"search_spaces.embeddings=../{embeddings}",
            "pretrain.false_negatives.method=srcl",
            f"pretrain.false_negatives.srcl.aux_embeddings=../{embeddings}",
            cwd=sub,
        )
    )
    manifest = check_run(cwd / "runs" / "warm")
    assert manifest["config"]["pretrain"]["false_negatives"]["srcl"]["aux_embeddings"] == str(
        cwd / "runs" / "emb" / "embeddings" / "embeddings.h5"
    )


def test_data_commands_with_relative_paths(work):
    """`falcon data shapes --out` and `falcon data check` with paths relative to a subdirectory."""
    sub = work / "elsewhere" / "data-cmds"
    sub.mkdir()
    ok(run_cli("data", "shapes", "--out", "../worlds/v", "--images", "30", "--seed", "3", cwd=sub))
    assert (work / "elsewhere" / "worlds" / "v" / "world.json").is_file()
    ok(run_cli("data", "check", "../worlds/v", cwd=sub))


def test_a_generated_world_without_a_dataset_goes_into_the_run(tmp_path):
    """The shapes recipes name no data.dataset: the world goes into <run>/world, not into the working
    directory (which is often the code checkout); readers find it from anywhere through the manifest."""
    cwd = tmp_path / "checkout"
    cwd.mkdir()
    ok(
        run_cli(
            "run",
            "--recipe",
            "shapes-demo",
            "--run-dir",
            "runs/own",
            "stages=[data]",
            "data.shapes.images=24",
            "data.tokenizer_vocab_size=200",
            cwd=cwd,
        )
    )
    run = cwd / "runs" / "own"
    manifest = check_run(run)
    assert manifest["config"]["data"]["dataset"] == str(run / "world")
    assert (run / "world" / "world.json").is_file()
    assert sorted(p.name for p in cwd.iterdir()) == ["runs"]
    from falcon_cli.config.recipes import load_recipe, resolved_yaml
    from falcon_cli.errors import FalconError

    assert "dataset: null" in resolved_yaml(load_recipe("shapes-demo")[0])  # what `falcon recipes show` prints
    with pytest.raises(FalconError, match="data.dataset is required"):
        load_recipe("shapes-demo", ["data.shapes=null"])
