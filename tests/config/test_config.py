"""Recipes and overrides: lookup, key checking with suggestions, typed parsing, one-line errors."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from falcon_cli.artifacts.renamed_keys import renamed_key
from falcon_cli.config.recipes import (
    STUDY_DIR,
    apply_overrides,
    find_recipe,
    list_recipes,
    load_recipe,
    parse_override,
    read_recipe,
    recipe_group,
    recipe_header,
    valid_keys,
)
from falcon_cli.config.schema import Recipe
from falcon_cli.errors import FalconError
from falcon_cli.field_docs import field_docstrings


def flat(mapping: dict, prefix: str = "") -> dict:
    """A nested mapping's leaves by dotted key."""
    out = {}
    for key, value in mapping.items():
        out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def changed(base: dict, other: dict) -> dict:
    """The dotted leaves of ``other`` (a pretrain section's dump) that differ from ``base``'s."""
    base, other = flat(base), flat(other)
    return {k: v for k, v in other.items() if base.get(k) != v}


def renamed(base: dict, changes: dict) -> dict:
    """``changes`` written with the 0.2.0 keys (their sections whole), as the dotted leaves they change of ``base``."""
    moved = {}
    for key, value in flat(changes).items():
        moved[(renamed_key(f"pretrain.{key}", value) or f"pretrain.{key}").removeprefix("pretrain.")] = value
    base = flat(base)
    return {k: v for k, v in moved.items() if base.get(k) != v}


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_every_shipped_recipe_validates_and_documents_its_command():
    recipes = list_recipes()
    assert "shapes-demo" in recipes
    for name, path in recipes.items():
        config, _ = load_recipe(name)
        assert isinstance(config, Recipe) and config.name == name
        header = recipe_header(path)
        assert f"--recipe {name}" in header, f"{path} must start with a comment showing the exact command"


def test_coco_albef_is_falcon_with_the_papers_hyperparameters_and_siblings_differ_only_as_named():
    p = load_recipe("coco-albef")[0].pretrain
    assert (p.composer.name, p.batch_size, p.composer.search_space_size, p.scheduler.quantile_levels, p.epochs) == (
        "falcon",
        96,
        5664,
        100,
        20,
    )
    assert (p.scheduler.hidden, p.scheduler.blocks, p.scheduler.lr, p.scheduler.weight_decay) == (256, 2, 1e-4, 0.01)
    assert (p.scheduler.reward.name, p.scheduler.level, p.losses.mlm_probability, p.optim.lr) == (
        "mlm",
        "instance",
        0.5,
        1e-4,
    )
    base = p.model_dump()
    expected = {
        "coco-albef-uniform": {"composer": "uniform"},
        "coco-albef-grit": {"composer": "grit", "search_space_size": 1920},
        "coco-albef-q0": {"composer": "quantile", "quantile": 0.0},
        "coco-albef-q05": {"composer": "quantile", "quantile": 0.5},
        "coco-albef-hardening": {"composer": "progressive"},
        "coco-albef-softening": {"composer": "progressive", "progressive_start": 1.0, "progressive_end": 0.0},
        "coco-albef-batch-level": {"scheduler_level": "batch"},
        "coco-albef-reward-itc-itm": {"reward": "itc+itm"},
        "coco-albef-reward-itc-itm-mlm": {"reward": "itc+itm+mlm"},
        "coco-albef-space480": {"search_space_size": 480},
        "coco-albef-space28320": {"search_space_size": 28320},
        "coco-albef-plus": PLUS_SCHEDULER,
    }
    defaults = p.model_dump()
    for section, values in {"mafa": {"judge": "checkpoint", "high": 0.98}}.items():
        expected_section = {**defaults["false_negatives"][section], **values}
        expected.setdefault(f"coco-albef-{section}", {})[section] = expected_section
    expected["coco-albef-mafa"].update(
        composer="grit", search_space_size=1920, itc_consistency_weight=0.0, false_negatives="mafa"
    )
    # the baselines train their papers' ITC: no GRIT consistency term (methods.md §2-§5, docs/methods.md)
    expected["coco-albef-srcl"] = {"composer": "uniform", "false_negatives": "srcl", "itc_consistency_weight": 0.0}
    expected["coco-albef-diht"] = {"composer": "uniform", "false_negatives": "diht", "itc_consistency_weight": 0.0}
    expected["coco-albef-glofnd"] = {
        "composer": "uniform",
        "false_negatives": "glofnd",
        "itc_consistency_weight": 0.0,
        "glofnd": {**defaults["false_negatives"]["glofnd"], "start_epoch": 8, "lr": 0.09167, "alpha": 0.001},
    }
    for name, changes in expected.items():
        sibling = load_recipe(name)[0].pretrain.model_dump()
        assert changed(base, sibling) == renamed(base, changes), name
    shapes, plus = (load_recipe(name)[0].pretrain.model_dump() for name in ("shapes-falcon", "shapes-falcon-plus"))
    assert changed(shapes, plus) == renamed(shapes, PLUS_SCHEDULER)
    for plus_name, margin_name in [
        ("shapes-falcon-plus", "shapes-falcon-margin"),
        ("coco-albef-plus", "coco-albef-margin"),
    ]:
        plus, margin = (load_recipe(name)[0].pretrain.model_dump() for name in (plus_name, margin_name))
        assert changed(plus, margin) == renamed(plus, {"reward": "positive_margin", "reward_margin": 0.5})
    # the ITM-charged margin: one key over the margin recipes; for BLIP-2, the improved scheduler and both keys
    for margin_name, itm_name in [
        ("shapes-falcon-margin", "shapes-falcon-itm"),
        ("coco-albef-margin", "coco-albef-itm"),
    ]:
        margin, itm = (load_recipe(name)[0].pretrain.model_dump() for name in (margin_name, itm_name))
        assert changed(margin, itm) == renamed(margin, {"reward": "positive_margin+itm"})
    itm, excess = (
        load_recipe(name)[0].pretrain.model_dump() for name in ("shapes-falcon-itm", "shapes-falcon-itm-excess")
    )
    assert changed(itm, excess) == renamed(itm, {"reward_itm_charge": "excess", "reward_itm_weight": 6.0})
    expected = load_recipe("shapes-falcon-itm-expected")[0].pretrain.model_dump()
    assert changed(itm, expected) == renamed(itm, {"reward_itm_charge": "expected"})
    oracle = load_recipe("shapes-falcon-oracle")[0].pretrain.model_dump()  # the same reward, the oracle as judge
    assert changed(expected, oracle) == renamed(expected, {"reward": "positive_margin+oracle"})
    margin, levels = (
        load_recipe(name)[0].pretrain.model_dump() for name in ("shapes-falcon-margin", "shapes-falcon-levels")
    )
    assert changed(margin, levels) == renamed(
        margin,
        {
            "scheduler_credit": "levels",
            "reward_baseline": "none",
        },
    )
    top = load_recipe("shapes-falcon-margin-top")[0].pretrain.model_dump()  # the margin with q on the log-rank scale
    assert changed(margin, top) == renamed(margin, {"quantile_scale": "log_rank"})
    # issue 70's candidates, each on the log-rank scale: A over paper-exact FALCON, B over the expected-worth judges,
    # C over the improved scheduler
    log_rank = {"quantile_scale": "log_rank"}
    for base_name, name, changes in [
        ("shapes-falcon", "shapes-falcon-start-top", {**log_rank, "scheduler.init_q": 0.9, "scheduler_lr": 1.144e-3}),
        ("shapes-falcon-oracle", "shapes-falcon-rank-oracle", {**log_rank, "reward_hardness": "rank"}),
        ("shapes-falcon-itm-expected", "shapes-falcon-rank-itm", {**log_rank, "reward_hardness": "rank"}),
        ("shapes-falcon-plus", "shapes-falcon-itm-progress", {**log_rank, "reward": "itm_progress"}),
    ]:
        base_p, candidate = (load_recipe(n)[0].pretrain.model_dump() for n in (base_name, name))
        assert changed(base_p, candidate) == renamed(base_p, changes), name
    for base_name, itm_name in [("shapes-blip2-falcon", "shapes-blip2-falcon-itm"), ("coco-blip2", "coco-blip2-itm")]:
        base_p, itm = (load_recipe(name)[0].pretrain.model_dump() for name in (base_name, itm_name))
        assert changed(base_p, itm) == renamed(
            base_p,
            {
                **PLUS_SCHEDULER,
                "reward": "positive_margin+itm",
                "reward_margin": 0.5,
            },
        ), itm_name


PLUS_SCHEDULER = {
    "scheduler_features": ["positive", "spread"],
    "scheduler_credit": "chosen",
    "reward_baseline": "batch_mean",
    "scheduler_advantage_norm": True,
    "scheduler_entropy": 0.01,
    "scheduler_max_concentration": 50.0,
}
"""What the improved scheduler's recipes change of the paper's (and nothing else)."""


PAPER_CONSISTENCY_WEIGHT = {"none": 0.2, "mafa": 0.0, "srcl": 0.0, "diht": 0.0, "glofnd": 0.0}
"""GRIT-VLP's code hard-codes 0.2 (FALCON follows GRIT); MAFA's code removes the term; SRCL, DiHT and
GloFND have none (docs/methods.md, "Which losses each method trains")."""


def test_each_method_trains_its_papers_itc_consistency_weight():
    from falcon_cli.config.recipes import resolved_yaml

    shipped = {
        "coco-albef": "none",
        "coco-albef-grit": "none",
        "coco-albef-uniform": "none",
        "coco-albef-q05": "none",
        "shapes-demo": "none",
        "shapes-falcon": "none",
        "shapes-grit": "none",
    }
    shipped.update(
        {f"{world}-{m}": m for world in ("coco-albef", "shapes") for m in ("mafa", "srcl", "diht", "glofnd")}
    )
    for name, method in shipped.items():
        config = load_recipe(name)[0]
        assert config.pretrain.false_negatives.method == method, name
        assert config.pretrain.losses.itc_consistency_weight == PAPER_CONSISTENCY_WEIGHT[method], name
        # what `falcon recipes show` prints and the run records is the number trained, not a placeholder
        assert f"itc_consistency_weight: {PAPER_CONSISTENCY_WEIGHT[method]}" in resolved_yaml(config), name
    # a method picked on the command line brings its own weight, whatever recipe it is put on
    for base in ("coco-albef", "coco-albef-grit", "shapes-demo", "shapes-falcon"):
        for method, weight in PAPER_CONSISTENCY_WEIGHT.items():
            p = load_recipe(base, [f"pretrain.false_negatives.method={method}"])[0].pretrain
            assert p.losses.itc_consistency_weight == weight, (base, method)
    p = load_recipe("coco-albef", ["pretrain.composer.name=falcon", "pretrain.false_negatives.method=mafa"])[0].pretrain
    assert (p.composer.name, p.losses.itc_consistency_weight) == ("falcon", 0.0)
    # ... and back: a baseline recipe switched to plain ITC trains GRIT's term again
    assert (
        load_recipe("coco-albef-glofnd", ["pretrain.false_negatives.method=none"])[
            0
        ].pretrain.losses.itc_consistency_weight
        == 0.2
    )
    from falcon_cli.method_weights import ITC_CONSISTENCY_WEIGHT

    assert ITC_CONSISTENCY_WEIGHT == PAPER_CONSISTENCY_WEIGHT


def test_an_explicit_itc_consistency_weight_wins_over_the_methods_own(tmp_path, monkeypatch):
    for recipe, override, weight in (
        ("coco-albef-glofnd", "0.2", 0.2),
        ("coco-albef-mafa", "0.3", 0.3),
        ("coco-albef", "0", 0.0),
        ("shapes-demo", "0.5", 0.5),
        ("coco-albef-diht", "null", 0.0),
        ("coco-albef", "null", 0.2),
    ):
        p = load_recipe(recipe, [f"pretrain.losses.itc_consistency_weight={override}"])[0].pretrain
        assert p.losses.itc_consistency_weight == weight, (recipe, override)
    p = load_recipe(
        "coco-albef", ["pretrain.losses.itc_consistency_weight=0.2", "pretrain.false_negatives.method=srcl"]
    )[0].pretrain
    assert p.losses.itc_consistency_weight == 0.2
    monkeypatch.setenv("FALCON_RECIPE_PATH", str(tmp_path))
    write(tmp_path / "lab-srcl-grit.yaml", "base: coco-albef-srcl\npretrain: {itc_consistency_weight: 0.1}\n")
    assert load_recipe("lab-srcl-grit")[0].pretrain.losses.itc_consistency_weight == 0.1
    # the resolved config validates again to the same weight (a run's config.yaml, a resume)
    resolved = load_recipe("coco-albef-glofnd")[0]
    assert Recipe.model_validate(resolved.model_dump()).pretrain.losses.itc_consistency_weight == 0.0
    with pytest.raises(
        FalconError,
        match=r"override 'pretrain.losses.itc_consistency_weight=-1': key 'pretrain.losses.itc_consistency_weight'",
    ):
        load_recipe("coco-albef", ["pretrain.losses.itc_consistency_weight=-1"])


def test_every_config_field_has_a_docstring():
    from falcon_cli.config.paths import section_type

    def walk(model):
        for name, field in model.model_fields.items():
            assert field_docstrings(model).get(name), f"{model.__name__}.{name} has no docstring"
            sub = section_type(field.annotation)
            if sub is not None:
                walk(sub)

    walk(Recipe)


def test_find_recipe_by_name_path_and_unknown(tmp_path):
    assert find_recipe("shapes-demo").name == "shapes-demo.yaml"
    custom = write(tmp_path / "mine.yaml", "data: {dataset: x}\n")
    assert find_recipe(str(custom)) == custom
    with pytest.raises(
        FalconError, match=r"unknown recipe 'shapes-dmo': did you mean 'shapes-demo'\? `falcon recipes list`"
    ):
        find_recipe("shapes-dmo")
    with pytest.raises(FalconError, match="not found"):
        find_recipe(str(tmp_path / "missing.yaml"))


def test_recipe_base_merges_sections_and_refuses_cycles(tmp_path, monkeypatch):
    monkeypatch.setenv("FALCON_RECIPE_PATH", str(tmp_path))
    write(tmp_path / "lab-base.yaml", "seed: 3\ndata: {dataset: x}\npretrain: {batch_size: 8, epochs: 4}\n")
    write(tmp_path / "lab-child.yaml", "# falcon pretrain --recipe lab-child\nbase: lab-base\npretrain: {epochs: 2}\n")
    config, path = load_recipe("lab-child", ["pretrain.optim.lr=0.01"])
    assert config.name == "lab-child" and config.seed == 3 and config.data.dataset == Path.cwd() / "x"
    assert (config.pretrain.batch_size, config.pretrain.epochs, config.pretrain.optim.lr) == (8, 2, 0.01)
    write(tmp_path / "lab-a.yaml", "base: lab-b\n")
    write(tmp_path / "lab-b.yaml", "base: lab-a\n")
    with pytest.raises(FalconError, match="cycle"):
        load_recipe("lab-a")
    write(tmp_path / "lab-bad.yaml", "base: [lab-base]\n")
    with pytest.raises(FalconError, match="key 'base': expected a recipe name"):
        load_recipe("lab-bad")
    with pytest.raises(FalconError, match="unknown recipe 'lab-missing'"):
        write(tmp_path / "lab-orphan.yaml", "base: lab-missing\n")
        load_recipe("lab-orphan")


def test_recipe_path_env(tmp_path, monkeypatch):
    write(tmp_path / "lab-recipe.yaml", "data: {dataset: x}\n")
    monkeypatch.setenv("FALCON_RECIPE_PATH", str(tmp_path))
    assert "lab-recipe" in list_recipes()
    config, _ = load_recipe("lab-recipe")
    assert config.name == "lab-recipe"


def test_overrides_are_parsed_to_the_field_type():
    config, _ = load_recipe(
        "shapes-demo",
        ["data.shapes.images=500", "seed=7", "data.verify_images=false", "data.tokenizer=bert-base-uncased"],
    )
    assert config.data.shapes.images == 500 and isinstance(config.data.shapes.images, int)
    assert config.seed == 7
    assert config.data.verify_images is False
    assert config.data.tokenizer == "bert-base-uncased"


def test_parse_override_values():
    assert parse_override("a.b=3") == ("a.b", 3)
    assert parse_override("a=[1, 2]") == ("a", [1, 2])
    assert parse_override("a=null") == ("a", None)
    assert parse_override("a=x=y") == ("a", "x=y")
    with pytest.raises(FalconError, match="not of the form key=value"):
        parse_override("images500")


def test_unknown_override_key_names_nearest_valid_key():
    with pytest.raises(FalconError, match=r"unknown key 'data.shape.images'; did you mean 'data.shapes.images'\?"):
        load_recipe("shapes-demo", ["data.shape.images=5"])
    with pytest.raises(FalconError, match=r"unknown key 'sed'; did you mean 'seed'\?"):
        apply_overrides({}, ["sed=1"])


UNBOUNDED_ON_PURPOSE: dict[str, str] = {}
"""Numeric fields without a range in the schema, and why (none today)."""


def test_every_numeric_config_field_has_its_range():
    """A number the schema accepts must be one the code can run with: every int or float field (or an
    optional one, or a list of them) states its bounds, so bad values stop before anything is written."""
    import typing

    import annotated_types

    from falcon_cli.config.paths import section_type

    bounds = (annotated_types.Ge, annotated_types.Gt, annotated_types.Le, annotated_types.Lt, annotated_types.Interval)

    def numeric(annotation) -> bool:
        if annotation in (int, float):
            return True
        return any(numeric(arg) for arg in typing.get_args(annotation))

    def bounded(annotation, metadata) -> bool:
        if any(isinstance(m, bounds) for m in metadata):
            return True
        for arg in typing.get_args(annotation):  # list[Annotated[float, Field(ge=..)]]: the items' bounds
            extra = [m for info in getattr(arg, "__metadata__", ()) for m in getattr(info, "metadata", [info])]
            if any(isinstance(m, bounds) for m in extra):
                return True
        return False

    missing = []

    def walk(model):
        for name, field in model.model_fields.items():
            sub = section_type(field.annotation)
            if sub is not None:
                walk(sub)
            elif (
                numeric(field.annotation)
                and not bounded(field.annotation, field.metadata)
                and f"{model.__name__}.{name}" not in UNBOUNDED_ON_PURPOSE
            ):
                missing.append(f"{model.__name__}.{name}")

    walk(Recipe)
    assert not missing, f"numeric fields without a range: {missing}"


@pytest.mark.parametrize(
    "override, message",
    [
        ("pretrain.batch_size=0", "pretrain.batch_size': input should be greater than or equal to 2"),
        ("pretrain.batch_size=-4", "pretrain.batch_size': input should be greater than or equal to 2"),
        ("pretrain.epochs=0", "pretrain.epochs': input should be greater than or equal to 1"),
        ("pretrain.epochs=-1", "pretrain.epochs': input should be greater than or equal to 1"),
        ("pretrain.optim.lr=-1", "pretrain.optim.lr': input should be greater than 0"),
        ("pretrain.logging.every=0", "pretrain.logging.every': input should be greater than or equal to 1"),
        ("pretrain.checkpoints.every=-1", "pretrain.checkpoints.every': input should be greater than or equal to 0"),
        (
            "pretrain.checkpoints.keep_last=-1",
            "pretrain.checkpoints.keep_last': input should be greater than or equal to 1",
        ),
        ("audit.filter_thresholds=[0.5,1.5]", "audit.filter_thresholds[1]': input should be less than or equal to 1"),
        (
            "pretrain.composer.quantile_scale=log",
            "pretrain.composer.quantile_scale': expected one of linear, log_rank or quadratic_rank, got 'log'",
        ),
    ],
)
def test_values_the_code_cannot_run_with_are_refused_by_the_schema(override, message):
    with pytest.raises(FalconError) as err:
        load_recipe("shapes-demo", [override])
    assert message in str(err.value) and f"override '{override}'" in str(err.value)


def test_rules_across_fields_name_the_overrides_that_broke_them():
    with pytest.raises(FalconError) as err:
        load_recipe("shapes-demo", ["pretrain.composer.search_space_size=8"])
    assert "with 'pretrain.composer.search_space_size=8'" in str(
        err.value
    ) and "search_space_size (8) is smaller than batch_size (32)" in str(err.value)
    assert load_recipe("shapes-demo", ["pretrain.composer.search_space_size=8", "pretrain.composer.name=uniform"])[0]
    with pytest.raises(FalconError, match=r"min_lr .* must not exceed lr"):
        load_recipe("shapes-demo", ["pretrain.optim.lr=1e-6"])
    with pytest.raises(
        FalconError, match="quantile_scale=log_rank changes how a drawn q picks: composer grit draws none"
    ):
        load_recipe("shapes-demo", ["pretrain.composer.quantile_scale=log_rank"])  # (the demo's composer is GRIT)
    assert load_recipe("shapes-demo", ["pretrain.composer.quantile_scale=log_rank", "pretrain.composer.name=quantile"])[
        0
    ]


def test_bad_values_stop_the_cli_before_the_run_directory_exists(tmp_path):
    from tests.conftest import run_cli

    run = tmp_path / "run"
    proc = run_cli("pretrain", "--recipe", "shapes-demo", "--run-dir", run, "pretrain.epochs=0")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr + proc.stdout
    assert "pretrain.epochs" in proc.stderr and not run.exists()
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: shapes-demo\npretrain:\n  batch_size: -3\n")
    proc = run_cli("recipes", "validate", bad)
    assert proc.returncode != 0 and "pretrain.batch_size" in proc.stdout + proc.stderr


def test_wrong_type_names_expected_type_and_value():
    with pytest.raises(FalconError) as err:
        load_recipe("shapes-demo", ["data.shapes.images=many"])
    message = str(err.value)
    assert "override 'data.shapes.images=many'" in message and "expected an integer, got 'many'" in message
    with pytest.raises(FalconError, match=r"key 'data.on_missing': expected one of fail or skip, got 'maybe'"):
        load_recipe("shapes-demo", ["data.on_missing=maybe"])


def test_recipe_file_errors_name_the_file(tmp_path):
    bad_key = write(tmp_path / "k.yaml", "data:\n  datset: x\n")
    with pytest.raises(FalconError, match=r"k.yaml: unknown key 'data.datset'; did you mean 'data.dataset'\?"):
        load_recipe(bad_key)
    bad_yaml = write(tmp_path / "y.yaml", "data: [unclosed\n")
    with pytest.raises(FalconError, match=r"y.yaml: line \d+, column \d+: invalid YAML"):
        load_recipe(bad_yaml)
    missing = write(tmp_path / "m.yaml", "seed: 1\n")
    with pytest.raises(FalconError, match=r"m.yaml: key 'data': field required"):
        load_recipe(missing)
    order = write(tmp_path / "o.yaml", "stages: [data, data]\ndata: {dataset: x}\n")
    with pytest.raises(FalconError, match="pipeline order"):
        load_recipe(order)


def test_valid_keys_cover_nested_sections():
    keys = valid_keys()
    assert {"seed", "data.dataset", "data.shapes.images", "data.shapes.seed"} <= set(keys)


def test_input_paths_become_absolute_against_the_working_directory(tmp_path, monkeypatch):
    """Paths, path-or-name values (only when they exist), prefixed paths and keywords, as a recipe resolves them."""
    from falcon_cli.config.paths import absolute_input_paths

    monkeypatch.chdir(tmp_path)
    (tmp_path / "bert-local").mkdir()
    (tmp_path / "runs" / "demo").mkdir(parents=True)
    config, _ = load_recipe(
        "shapes-demo",
        [
            "data.dataset=data/w",
            "pretrain.encoders.text_weights=bert-local",
            "pretrain.encoders.vision_weights=timm:deit_tiny_patch16_224",
            "pretrain.false_negatives.srcl.aux_embeddings=../elsewhere/aux.h5",
            "embed.encoder=falcon:runs/demo",
            "audit.judge_model=Salesforce/blip-itm-base-coco",
            "evaluate.retrieval.models=[pretrained, runs/demo/checkpoints/1]",
            "pretrain.composer.search_spaces=run",
            "finetune.checkpoint=/abs/run",
        ],
    )
    assert config.data.dataset == tmp_path / "data" / "w"
    assert config.pretrain.encoders.text_weights == str(tmp_path / "bert-local")  # exists: a local directory
    assert config.pretrain.encoders.vision_weights == "timm:deit_tiny_patch16_224"  # a name, not a file here
    assert (
        config.pretrain.false_negatives.srcl.aux_embeddings == tmp_path.parent / "elsewhere" / "aux.h5"
    )  # '..' folded
    assert config.embed.encoder == f"falcon:{tmp_path / 'runs' / 'demo'}"
    assert config.audit.judge_model == "Salesforce/blip-itm-base-coco"  # a hub id
    assert config.evaluate.retrieval.models == ["pretrained", str(tmp_path / "runs/demo/checkpoints/1")]
    assert config.pretrain.composer.search_spaces == "run" and config.finetune.checkpoint == "/abs/run"
    assert config.data.tokenizer == "wordpiece"
    # Resolving again (a stored config read from another directory) changes nothing that is absolute.
    again = absolute_input_paths(config.model_copy(deep=True), tmp_path / "other")
    assert again.model_dump() == config.model_dump()
    # What `falcon compare` reads as a run's inputs: every input-path key, each value naming a file found as one.
    from falcon_cli.config.paths import input_path_keys

    markers = dict(input_path_keys(Recipe))
    assert {
        "pretrain.false_negatives.mafa.judge_model",
        "pretrain.false_negatives.srcl.aux_embeddings",
        "embed.encoder",
        "data.dataset",
    } <= set(markers)
    assert "pretrain.epochs" not in markers
    dumped = config.model_dump()
    found = {
        key: markers[key].artifact(value)
        for key in markers
        if (value := functools.reduce(lambda d, k: d.get(k) if isinstance(d, dict) else None, key.split("."), dumped))
    }
    assert found["embed.encoder"] == tmp_path / "runs" / "demo" and found["finetune.checkpoint"] == Path("/abs/run")
    assert found["pretrain.false_negatives.srcl.aux_embeddings"] == tmp_path.parent / "elsewhere" / "aux.h5"
    assert (
        found["audit.judge_model"] is None and found["pretrain.encoders.vision_weights"] is None
    )  # a hub id, a timm name
    assert found["pretrain.composer.search_spaces"] is None and found["data.tokenizer"] is None  # keywords


def test_study_recipes_live_apart_but_resolve_by_name_and_list_in_their_group():
    recipes = list_recipes()
    assert recipes["shapes-falcon-margin"].parent.name == STUDY_DIR
    assert recipes["coco-albef-grit"].parent.name == "recipes"
    assert (
        load_recipe("shapes-falcon-margin")[0].pretrain.scheduler.reward.name == "positive_margin"
    )  # (its base, shapes-falcon-plus, too)
    assert recipe_group("shapes-falcon-margin", recipes["shapes-falcon-margin"]).startswith("Studies")
    assert recipe_group("coco-albef-grit", recipes["coco-albef-grit"]).startswith("COCO, ALBEF")
    assert recipe_group("coco-siglip", recipes["coco-siglip"]).startswith("COCO, dual")
    assert recipe_group("shapes-blip2", recipes["shapes-blip2"]).startswith("Shapes world on CPU, BLIP-2")
    assert recipe_group("shapes-mafa", recipes["shapes-mafa"]).startswith("Shapes world on CPU, albef-tiny")
    # the recipes a user starts from: the demo, every COCO ALBEF baseline, every shapes baseline, not a study
    starters = [n for n, p in recipes.items() if p.parent.name != STUDY_DIR]
    for method in ("uniform", "grit", "q0", "q05", "hardening", "softening", "mafa", "srcl", "diht", "glofnd"):
        assert f"coco-albef-{method}" in starters and f"shapes-{method}" in starters
    assert not any("reward" in n or "space" in n for n in starters)


def test_every_description_fits_one_line_of_the_list():
    for name, path in list_recipes().items():
        description = read_recipe(path).get("description", "")
        assert 0 < len(description) <= 72 and "\n" not in description, name


def test_a_recipe_path_that_moved_names_where_it_is_now(tmp_path):
    with pytest.raises(
        FalconError,
        match=r"recipes/shapes-falcon-margin.yaml not found: it moved to .*recipes/"
        r"studies/shapes-falcon-margin.yaml \(`--recipe shapes-falcon-margin`",
    ):
        find_recipe("recipes/shapes-falcon-margin.yaml")
    with pytest.raises(FalconError, match=r"recipe file .*nowhere.yaml not found$"):
        find_recipe(tmp_path / "nowhere.yaml")
