"""docs/extending.md, run as written: a false-negative method added from outside the package (one file loaded
through ``FALCON_PLUGINS``, one recipe) trains, is compared and is audited like a built-in one; the plugin's bad
input (an unknown name, a name taken, a file that fails to import) is one line and nothing is written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import REPO, TINY_SHAPES_RUN, run_cli

PAGE = REPO / "docs" / "extending.md"
TINY = TINY_SHAPES_RUN


def page_block(language: str, first_line: str) -> str:
    """The page's fenced ``language`` block whose first line is ``first_line``."""
    for block in re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S):
        if block.splitlines()[0].strip() == first_line:
            return block
    raise AssertionError(f"docs/extending.md has no {language} block starting with {first_line!r}")


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    """The page's plugin file and recipe, written into a directory of their own: ``(plugin file, recipe)``."""
    folder = tmp_path_factory.mktemp("contributor")
    (folder / "topk_drop.py").write_text(page_block("python", "# topk_drop.py"), encoding="utf-8")
    (folder / "topk-drop.yaml").write_text(
        page_block(
            "yaml", "# topk-drop.yaml: top-k drop on the shapes world, beside shapes-grit (its base: one difference)."
        ),
        encoding="utf-8",
    )
    return folder / "topk_drop.py", folder / "topk-drop.yaml"


def falcon(*args, plugins: str, cwd: Path):
    return run_cli(*args, cwd=cwd, env={"FALCON_PLUGINS": plugins})


def test_the_plugins_recipe_resolves_with_its_section(plugin, tmp_path):
    path, recipe = plugin
    shown = falcon("recipes", "show", recipe, "pretrain.false_negatives.topk_drop.k=2", plugins=str(path), cwd=tmp_path)
    assert shown.returncode == 0 and "deprecated" not in shown.stderr, shown.stderr
    resolved = yaml.safe_load(shown.stdout.split(f"# {recipe}\n", 1)[1])  # (after the header and the file's path)
    assert resolved["pretrain"]["false_negatives"]["method"] == "topk_drop"
    assert resolved["pretrain"]["false_negatives"]["topk_drop"] == {"k": 2}
    assert resolved["pretrain"]["losses"]["itc_consistency_weight"] == 0.0  # (the registered default)
    assert resolved["pretrain"]["composer"]["name"] == "grit"  # (its base's: one difference)
    bad = falcon("recipes", "show", recipe, "pretrain.false_negatives.topk_drop.k=0", plugins=str(path), cwd=tmp_path)
    assert bad.returncode == 2 and "pretrain.false_negatives.topk_drop.k" in bad.stderr, bad.stderr


@pytest.mark.slow  # (four tiny trainings, about three minutes: `make test-all`)
def test_a_method_from_outside_the_package_trains_compares_and_audits(plugin, tmp_path):
    path, recipe = plugin
    world = tmp_path / "world"

    for seed in (0, 1):  # two paired seeds each: the method and its base, one difference
        for name, source in (("grit", "shapes-grit"), ("topk", str(recipe))):
            proc = falcon(
                "run", "--recipe", source, "--run-dir", tmp_path / f"{name}-s{seed}", f"seed={seed}",
                f"data.dataset={world}", "stages=[data,pretrain,evaluate]", *TINY, plugins=str(path), cwd=tmp_path,
            )  # fmt: skip
            assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "topk-s0"
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["pretrain"]["false_negatives"]["method"] == "topk_drop"
    scored = [
        r
        for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
        if r.get("kind") == "false_negatives"
    ]
    assert scored and scored[-1]["flagged"] > 0 and scored[-1]["precision"] is not None  # (its flags vs the oracle)

    compared = falcon(
        "compare", *(tmp_path / f"{n}-s{s}" for n in ("grit", "topk") for s in (0, 1)), "--baseline", "shapes-grit",
        "--out", tmp_path / "cmp", plugins=str(path), cwd=tmp_path,
    )  # fmt: skip
    assert compared.returncode == 0, compared.stderr[-3000:]
    table = pd.read_csv(tmp_path / "cmp" / "comparison.csv").set_index("method")
    assert set(table.index) == {"shapes-grit", "topk-drop"} and (table["seeds"] == 2).all(), table
    assert table.loc["topk-drop", "paired_seeds"] == 2 and pd.notna(table.loc["topk-drop", "difference"])

    audited = falcon(
        "audit-false-negatives", run, "--judge", "oracle", "--max-pairs", "500", plugins=str(path), cwd=tmp_path
    )
    assert audited.returncode == 0, audited.stderr[-3000:]
    assert (run / "audit").is_dir() or any(run.glob("audit*")), sorted(p.name for p in run.iterdir())


def test_the_plugins_bad_input_is_one_line_and_writes_nothing(plugin, tmp_path):
    path, recipe = plugin
    run_dir = tmp_path / "never"

    unknown = falcon("run", "--recipe", recipe, "--run-dir", run_dir, "pretrain.false_negatives.method=topk_dorp",
                     plugins=str(path), cwd=tmp_path)  # fmt: skip
    assert unknown.returncode == 2 and "did you mean 'topk_drop'" in unknown.stderr, unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1 and not run_dir.exists()

    taken = tmp_path / "taken.py"
    taken.write_text(path.read_text().replace('"topk_drop", config', '"mafa", config'))
    clash = falcon("recipes", "show", "shapes-grit", plugins=str(taken), cwd=tmp_path)
    assert clash.returncode == 2 and str(taken) in clash.stderr and "'mafa'" in clash.stderr, clash.stderr
    path.with_name("copy.py").write_text(path.read_text())
    twice = falcon("recipes", "show", "shapes-grit", plugins=f"{path}:{path.with_name('copy.py')}", cwd=tmp_path)
    assert twice.returncode == 2 and "copy.py" in twice.stderr and "topk_drop.py registered already" in twice.stderr

    broken = tmp_path / "broken.py"
    broken.write_text("import a_package_nobody_has\n")
    failed = falcon("run", "--recipe", "shapes-grit", "--run-dir", run_dir, plugins=str(broken), cwd=tmp_path)
    assert failed.returncode == 2 and str(broken) in failed.stderr and "a_package_nobody_has" in failed.stderr
    assert len(failed.stderr.strip().splitlines()) == 1 and not run_dir.exists()


FLAT_REWARD = """# flat_reward.py: every pick is worth half a point, however hard (a reward that cannot teach).
import torch

from falcon_cli.registry import pick_reward


@pick_reward("flat_half", frameworks=("albef",), description="every pick worth 0.5")
def flat_half(c):
    worth = torch.full((len(c.inputs[1]),), 0.5, device=c.out.image_feat.device)
    worth[:1] = 0  # (slot 0 has no pick)
    return worth, None
"""


@pytest.fixture()
def reward_plugin(tmp_path):
    path = tmp_path / "flat_reward.py"
    path.write_text(FLAT_REWARD, encoding="utf-8")
    return path


def test_a_reward_from_outside_the_package_is_checked_like_a_built_in_one(reward_plugin, tmp_path):
    """A plugin's pick score is found by name; the schema checks its credit and framework against its entry."""
    name = "pretrain.scheduler.reward.name"
    shown = falcon("recipes", "show", "shapes-falcon", f"{name}=flat_half", "pretrain.scheduler.update.credit=chosen",
                   plugins=str(reward_plugin), cwd=tmp_path)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "name: flat_half" in shown.stdout, shown.stdout
    for override, said in (
        (f"{name}=flat_halg", "did you mean 'flat_half'"),
        (
            "pretrain.scheduler.update.credit=batch",
            "cannot credit reward.name=flat_half, which can be credited by chosen",
        ),
        ("pretrain.model=dual-tiny-clip", "whose rewards are"),
    ):
        overrides = [f"{name}=flat_half", "pretrain.scheduler.update.credit=chosen", override]
        bad = falcon("recipes", "show", "shapes-falcon", *overrides, plugins=str(reward_plugin), cwd=tmp_path)
        assert bad.returncode == 2 and said in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


@pytest.mark.slow  # (one tiny FALCON training, about a minute: `make test-all`)
def test_a_reward_from_outside_the_package_pays_the_scheduler(reward_plugin, tmp_path):
    run = tmp_path / "flat"
    proc = falcon(
        "run", "--recipe", "shapes-falcon", "--run-dir", run, f"data.dataset={tmp_path / 'world'}",
        "stages=[data,pretrain]", *TINY, "pretrain.scheduler.reward.name=flat_half",
        "pretrain.scheduler.update.credit=chosen", plugins=str(reward_plugin), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(map(json.loads, (run / "metrics.jsonl").read_text().splitlines()))
    paid = [r["reward"] for r in rows if r.get("reward") is not None]
    assert paid and all(r == pytest.approx(0.5) for r in paid), paid
