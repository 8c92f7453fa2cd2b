"""Each false-negative method's testbed settings come from its paper's by a written rule (falcon_cli/method_rules.py):
the tables in docs/methods.md, the rules, the sweep's arms and the recipes they start from agree."""

from __future__ import annotations

from pathlib import Path

import pytest

from falcon_cli import method_rules as rules
from falcon_cli.config.recipes import load_recipe
from falcon_cli.errors import FalconError

ROOT = Path(__file__).resolve().parents[2]


def test_the_rules_themselves():
    # schedule: the same fraction of training; rate: as far in fewer or more updates
    assert rules.schedule(15, 37, rules.DENSE) == 15 and rules.schedule(20, 37, rules.DENSE) == 19
    assert rules.rate(0.05, 22, 21) == pytest.approx(0.05 * 22 / 21, rel=1e-3)
    assert rules.rate(1e-4, 100, 100) == 1e-4
    # at the paper's own schedule a rule gives the paper's value back
    cc3m = rules.Testbed("cc3m", epochs=37, batch=1024, pairs=2_900_000, false_negative_rate=0.001)
    assert rules.candidates("glofnd", cc3m) == (15, 20)
    assert rules.method_settings("glofnd", 15, cc3m)["pretrain.false_negatives.glofnd.lr"] == 0.05
    coco = rules.Testbed("coco", epochs=20, batch=384, pairs=566_747, false_negative_rate=0.001)
    assert rules.method_settings("falcon", None, coco)["pretrain.scheduler.lr"] == 1e-4


def test_dense_settings_follow_the_rules():
    glofnd = rules.method_settings("glofnd", 15)
    assert glofnd == {
        "pretrain.false_negatives.glofnd.start_epoch": 15,
        "pretrain.false_negatives.glofnd.lr": rules.rate(0.05, 22, 21),
        "pretrain.false_negatives.glofnd.alpha": 0.179,
        "pretrain.false_negatives.glofnd.adam_step": "epoch",
    }
    assert rules.method_settings("glofnd", 19)["pretrain.false_negatives.glofnd.lr"] == 0.05  # 17 updates in both
    assert rules.DENSE.false_negative_rate == pytest.approx(0.178827)  # the tuning world's, as measured
    with pytest.raises(ValueError, match="not one of the tuning candidates"):
        rules.method_settings("diht", 1.0)
    for method in ("glofnd", "mafa", "srcl", "diht"):  # a budget of at most two values, for every method
        assert 1 <= len(rules.candidates(method)) <= 2 and rules.RULES[method].tuned is not None
    assert rules.select({0.25: 60.1, 0.5: 61.0}) == 0.5 and rules.select({5.0: 60.0, 10.0: 60.0}) == 5.0


def test_the_page_shows_the_rules():
    """docs/methods.md's block is what the module renders (`python -m falcon_cli.method_rules docs/methods.md`)."""
    text = (ROOT / "docs" / "methods.md").read_text()
    block = text.split(rules.RULES_BEGIN, 1)[1].split(rules.RULES_END, 1)[0].strip("\n").split("\n")
    assert block == "\n".join(rules.rules_markdown()).strip("\n").split("\n"), (
        "docs/methods.md's rules block is stale: python -m falcon_cli.method_rules docs/methods.md"
    )
    for method in ("glofnd", "mafa", "srcl", "diht", "falcon"):
        assert f"**{method}**" in "\n".join(block)


@pytest.mark.parametrize("arm", ["glofnd-rule", "mafa-rule", "srcl-rule", "diht-rule"])
def test_sweep_arms_and_recipes_take_the_rules_values(arm, tmp_path):
    """Each rule arm is its method's shipped recipe with the rules' overrides: the resolved config holds every value
    the rules give, on uniform batches without GRIT's consistency term (the control's), and differs from the
    control arm in the method's own keys alone."""
    from benchmarks.fair_dense import CONTROL, RULE_ARMS, arm_spec

    method = RULE_ARMS[arm]
    for value in rules.candidates(method):
        recipe, overrides, auxiliary = arm_spec(arm, method, value, tmp_path, 3)
        config = load_recipe(recipe, [*overrides, "pretrain.epochs=36"])[0]
        p = config.pretrain
        for key, expected in rules.method_settings(method, value).items():
            got = p.setting(key.removeprefix("pretrain."))
            assert got == expected, (key, got, expected)
        assert (
            p.composer.name == "uniform"
            and p.false_negatives.method == method
            and p.losses.itc_consistency_weight == 0.0
        )
        if method == "mafa":  # the same seed's uniform run as Con-D, never the oracle
            assert p.false_negatives.mafa.judge == "checkpoint" and p.false_negatives.mafa.judge_model.endswith(
                "uniform-cpu-s3"
            )
        assert auxiliary == ("uniform-cpu" if method == "srcl" else None)
    recipe, overrides, _ = arm_spec(CONTROL, None, None, tmp_path, 3)
    control = load_recipe(recipe, [*overrides, "pretrain.epochs=36"])[0].pretrain
    recipe, overrides, _ = arm_spec(arm, method, rules.candidates(method)[0], tmp_path, 3)
    method_config = load_recipe(recipe, [*overrides, "pretrain.epochs=36"])[0].pretrain
    differing = {k for k, v in method_config.model_dump().items() if control.model_dump()[k] != v}
    assert differing <= {"false_negatives", method}, differing


def test_a_start_epoch_past_the_last_is_refused(tmp_path):
    from tests.conftest import run_cli

    proc = run_cli(
        "pretrain",
        "--recipe",
        "shapes-glofnd",
        "--run-dir",
        tmp_path / "run",
        "pretrain.false_negatives.glofnd.start_epoch=3",
    )
    assert proc.returncode == 2 and not (tmp_path / "run").exists(), proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "glofnd.start_epoch=3 is past the last epoch (epochs=3" in line
    with pytest.raises(FalconError, match=r"glofnd.start_epoch=36 is past the last epoch \(epochs=36"):
        load_recipe("shapes-glofnd", ["pretrain.epochs=36", "pretrain.false_negatives.glofnd.start_epoch=36"])
    assert (
        load_recipe("shapes-glofnd", ["pretrain.epochs=36", "pretrain.false_negatives.glofnd.start_epoch=35"])[
            0
        ].pretrain.false_negatives.glofnd.start_epoch
        == 35
    )


@pytest.mark.parametrize("method", list(rules.COCO_RECIPES))
def test_coco_recipes_take_the_rules_values(method):
    """Each COCO recipe trains its method at the rules' values on COCO's schedule (a candidate of its tuned setting)."""
    recipe, value = rules.COCO_RECIPES[method]
    assert rules.RULES[method].tuned is None or value in rules.candidates(method, rules.COCO)
    p = load_recipe(recipe)[0].pretrain
    assert p.epochs == rules.COCO.epochs and p.batch_size * 4 == rules.COCO.batch
    for key, expected in rules.method_settings(method, value, rules.COCO).items():
        got = p.setting(key.removeprefix("pretrain."))
        assert got == expected, (recipe, key, got, expected)
