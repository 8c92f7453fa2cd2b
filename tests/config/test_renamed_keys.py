"""Keys renamed in 0.3.0: every old key is read under its new name, with one deprecation line, from the command
line, a recipe file, a stored run and the Python API; ``falcon recipes upgrade`` rewrites a recipe keeping its
comments; a key neither old nor new gets the nearest new key."""

from __future__ import annotations

import pytest
import yaml

from falcon_cli.artifacts import renamed_keys
from falcon_cli.artifacts.renamed_keys import RENAMED, renamed_key, upgrade_mapping, upgrade_stored
from falcon_cli.config.recipes import load_recipe, valid_keys
from falcon_cli.config.schema import PretrainConfig
from falcon_cli.config.upgrade import upgrade_text
from falcon_cli.errors import FalconError
from tests.conftest import run_cli


@pytest.fixture(autouse=True)
def fresh_lines(monkeypatch):
    """Each test sees its own deprecation lines (they are printed once per process)."""
    monkeypatch.setattr(renamed_keys, "_TOLD", set())


def test_every_new_key_exists_and_no_old_key_does():
    keys = set(valid_keys())
    assert all(new in keys for new in RENAMED.values())
    assert not any(old in keys for old in RENAMED if old not in ("pretrain.composer", "pretrain.false_negatives"))
    assert len(RENAMED) == 81


@pytest.mark.parametrize(
    ("key", "value", "new"),
    [
        ("pretrain.scheduler_lr", 1e-3, "pretrain.scheduler.lr"),
        ("pretrain.reward", "mlm", "pretrain.scheduler.reward.name"),
        ("pretrain.reward_baseline", "ema", "pretrain.scheduler.update.baseline"),
        ("pretrain.composer", "falcon", "pretrain.composer.name"),
        ("pretrain.composer", {"name": "falcon"}, None),  # (already the new section)
        ("pretrain.composer.name", "falcon", None),
        ("pretrain.false_negatives", "mafa", "pretrain.false_negatives.method"),
        ("pretrain.mafa.high", 0.9, "pretrain.false_negatives.mafa.high"),
        ("pretrain.false_negatives.mafa.high", 0.9, None),
        ("pretrain.epochs", 3, None),
        ("finetune.retrieval.lr", 1e-5, None),
    ],
)
def test_renamed_key(key, value, new):
    assert renamed_key(key, value) == new


def test_old_overrides_resolve_as_the_new_ones_with_one_line_each(capsys):
    old, _ = load_recipe(
        "shapes-demo", ["pretrain.scheduler_lr=0.01", "pretrain.composer=quantile", "pretrain.quantile=0.5"]
    )
    lines = capsys.readouterr().err.strip().splitlines()
    new, _ = load_recipe(
        "shapes-demo",
        ["pretrain.scheduler.lr=0.01", "pretrain.composer.name=quantile", "pretrain.composer.quantile=0.5"],
    )
    assert old.model_dump() == new.model_dump()
    assert len(lines) == 3 and all(line.startswith("falcon: deprecated: override '") for line in lines)
    assert "'pretrain.scheduler_lr' is 'pretrain.scheduler.lr'" in lines[0]
    assert capsys.readouterr().err == ""  # (the new keys: no line)


def test_a_users_old_recipe_reads_as_the_new_one_and_upgrades_keeping_its_comments(tmp_path, capsys):
    old = tmp_path / "mine.yaml"
    old.write_text(
        "# my FALCON variant\n"
        "base: shapes-demo\n"
        "pretrain:\n"
        "  composer: falcon            # the learned scheduler\n"
        "  # the scheduler learns faster here\n"
        "  scheduler_lr: 1.0e-3\n"
        "  reward: alignment\n"
        "  scheduler_credit: chosen\n"
        "  epochs: 2\n"
        "  mafa:\n"
        "    high: 0.9\n"
        "  log_every: 5\n"
    )
    config, _ = load_recipe(old)
    assert len(capsys.readouterr().err.strip().splitlines()) == 6  # (one line per old key)
    p = config.pretrain
    assert (p.composer.name, p.scheduler.lr, p.scheduler.reward.name, p.scheduler.update.credit) == (
        "falcon",
        1e-3,
        "alignment",
        "chosen",
    )
    assert (p.false_negatives.mafa.high, p.logging.every, p.epochs) == (0.9, 5, 2)

    check = run_cli("recipes", "upgrade", "--check", old)
    assert check.returncode == 1 and "would move 6 key(s)" in check.stdout and "scheduler_lr" in old.read_text()
    done = run_cli("recipes", "upgrade", old)
    assert done.returncode == 0, done.stderr
    text = old.read_text()
    assert "# the learned scheduler" in text and "  # the scheduler learns faster here\n    lr: 1.0e-3" in text
    assert "scheduler_lr" not in text and text.startswith("# my FALCON variant\nbase: shapes-demo\n")
    upgraded, _ = load_recipe(old)
    assert upgraded.model_dump() == config.model_dump() and "deprecated" not in capsys.readouterr().err
    again = run_cli("recipes", "upgrade", old)
    assert again.returncode == 0 and "already uses the 0.3.0 keys" in again.stdout


def test_the_shipped_recipes_use_the_new_keys():
    from falcon_cli.config.recipes import list_recipes

    for name, path in list_recipes().items():
        assert upgrade_text(path.read_text(), str(path))[1] == [], name


def test_a_key_under_both_names_or_neither_is_one_line(tmp_path):
    both = tmp_path / "both.yaml"
    both.write_text("base: shapes-demo\npretrain:\n  scheduler_lr: 0.1\n  scheduler:\n    lr: 0.2\n")
    with pytest.raises(FalconError, match="both 'pretrain.scheduler_lr' and its new name 'pretrain.scheduler.lr'"):
        load_recipe(both)
    proc = run_cli("recipes", "show", "shapes-demo", "pretrain.scheduler.lrr=1")
    assert proc.returncode == 2 and "did you mean 'pretrain.scheduler.lr'?" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_stored_config_and_the_python_api_read_old_keys(capsys):
    stored = {"pretrain": {"scheduler_lr": 0.5, "composer": "falcon", "glofnd": {"alpha": 0.02}, "epochs": 4}}
    upgraded = upgrade_stored(stored, "runs/x/manifest.json")
    assert upgraded["pretrain"] == {
        "epochs": 4,
        "scheduler": {"lr": 0.5},
        "composer": {"name": "falcon"},
        "false_negatives": {"glofnd": {"alpha": 0.02}},
    }
    upgrade_stored(stored, "runs/y/manifest.json")
    assert len(capsys.readouterr().err.strip().splitlines()) == 1  # (one line for every stored run)
    assert upgrade_mapping({"data": {}}, "x") == {"data": {}}
    p = PretrainConfig(reward_images="reuse", oracle_negatives="mask")
    assert (p.scheduler.reward.images, p.false_negatives.oracle) == ("reuse", "mask")
    assert yaml.safe_dump(upgraded)  # (plain data: it is written back into the run)
