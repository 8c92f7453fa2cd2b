"""World regimes: presets, near-miss scene families, caption detail, and the rates they give."""

from __future__ import annotations

import json
import random
import typing
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from falcon_cli.cli.app import app
from falcon_cli.data.shapes import ShapesConfig, generate_world
from falcon_cli.data.shapes.captions import sample_captions
from falcon_cli.data.shapes.config import assign_splits
from falcon_cli.data.shapes.presets import PRESETS
from falcon_cli.data.shapes.scene import EMPTY, near_miss, sample_scene, scene_objects
from falcon_cli.errors import FalconError


def test_the_config_names_every_preset_and_nothing_else():
    names = typing.get_args(typing.get_args(ShapesConfig.model_fields["preset"].annotation)[0])
    assert set(names) == set(PRESETS)


def test_a_preset_fills_knobs_that_are_not_given_and_given_knobs_win():
    config = ShapesConfig(preset="coco-like", images=400)
    for key, value in PRESETS["coco-like"].settings.items():
        got = getattr(config, key)
        assert (got.model_dump() if key == "caption_mix" else got) == value
    own = ShapesConfig(preset="coco-like", images=400, near_misses=0, caption_mix={"count": 2.0})
    assert own.near_misses == 0 and own.min_attributes == 3
    assert (
        own.caption_mix.count == 2.0
        and own.caption_mix.relation == PRESETS["coco-like"].settings["caption_mix"]["relation"]
    )
    # The dense preset is the default world, knob for knob.
    assert ShapesConfig(preset="dense").model_dump(exclude={"preset"}) == ShapesConfig().model_dump(exclude={"preset"})
    # A resolved config validates to itself (what the reuse check relies on).
    assert ShapesConfig.model_validate(config.model_dump(mode="json")) == config
    with pytest.raises(ValueError, match="preset"):
        ShapesConfig(preset="sparse")


def _differences(a, b) -> list[tuple[int, str]]:
    """(cell, what) for every attribute that differs between two scenes."""
    return [(cell, name) for name, x, y in zip(("shape", "color", "size"), a, b) for cell in np.flatnonzero(x != y)]


def test_a_near_miss_differs_from_its_scene_in_exactly_one_thing():
    for seed in range(200):
        _check_near_miss(random.Random(seed))


def _check_near_miss(rng: random.Random) -> None:
    scene = sample_scene(rng, min_objects=1, max_objects=5, num_shapes=4, num_colors=6)
    variant = near_miss(scene, rng, num_shapes=4, num_colors=6)
    assert not all(np.array_equal(x, y) for x, y in zip(scene, variant))
    occupied, moved = scene[0] != EMPTY, variant[0] != EMPTY
    before, after = scene_objects(*scene), scene_objects(*variant)
    objects = lambda objs: sorted((o["shape"], o["color"], o["size"]) for o in objs)  # noqa: E731
    if np.array_equal(occupied, moved) and objects(before) != objects(after):
        # one attribute of one object changed, and nothing else
        changes = _differences(scene, variant)
        assert len(changes) == 1
        cell, _ = changes[0]
        for arr in variant:
            assert 0 <= arr[cell]
    elif np.array_equal(occupied, moved):
        # two different objects swapped cells
        changed = sorted({cell for cell, _ in _differences(scene, variant)})
        assert len(changed) == 2
        a, b = changed
        assert all(x[a] == y[b] and x[b] == y[a] for x, y in zip(scene, variant))
    else:
        # one object moved to an empty cell
        assert objects(before) == objects(after) and occupied.sum() == moved.sum()
        assert (occupied & ~moved).sum() == 1 and (moved & ~occupied).sum() == 1
    assert variant[1][moved].max() < 6 and variant[0][moved].max() < 4


def test_families_share_a_split_and_their_near_misses_differ_from_each_other():
    config = ShapesConfig(images=202, near_misses=3, min_objects=2, max_objects=4)
    codes = assign_splits(config)
    families = np.arange(config.images) // 4
    for family in np.unique(families):
        assert np.unique(codes[families == family]).size == 1
    assert np.bincount(codes, minlength=3).min() >= 2
    # Without near misses every image is its own family: the seeded permutation cut by the fractions.
    plain = ShapesConfig(images=50)
    assert np.bincount(assign_splits(plain)).tolist() == [40, 5, 5]


def test_min_attributes_makes_relations_and_positions_name_that_many_attributes():
    rng = random.Random(0)
    for _ in range(60):
        objects = scene_objects(*sample_scene(rng, min_objects=2, max_objects=4, num_shapes=6, num_colors=8))
        for caption in sample_captions(
            objects, rng, count=5, kind_weights=[0, 0, 1, 3, 0, 1], paraphrase_prob=0.2, min_attributes=3
        ):
            lf = caption["logical_form"]
            if caption["kind"] == "relation":
                assert len(lf["subject"]) == 3 and len(lf["object"]) == 3
            elif caption["kind"] == "position":
                assert len(lf["object"]) == 4  # size, colour, shape and the cell


def test_captions_of_one_image_do_not_repeat_while_another_kind_has_a_new_one():
    """Relations and full descriptions only, five captions: the second full description would repeat
    the first, so a relation stands in for it."""
    rng = random.Random(1)
    for _ in range(50):
        objects = scene_objects(*sample_scene(rng, min_objects=3, max_objects=4, num_shapes=4, num_colors=6))
        captions = sample_captions(objects, rng, count=5, kind_weights=[0, 0, 0, 1, 0, 1], paraphrase_prob=0.0)
        assert len({c["key"] for c in captions}) == 5
        assert sum(c["kind"] == "full" for c in captions) == 1


def test_scene_captions_describe_the_whole_scene_in_distinct_orders():
    """``scene_captions=4``: four whole-scene descriptions per image (two for a two-object scene: it has two
    orders), each listing exactly the scene's objects in another order, the rest relations; all forms distinct."""
    from math import factorial

    from falcon_cli.data.shapes.oracle import evaluate
    from falcon_cli.data.shapes.scene import SceneArrays

    rng = random.Random(3)
    seen_counts = set()
    for _ in range(80):
        cells = sample_scene(rng, min_objects=2, max_objects=4, num_shapes=6, num_colors=8)
        objects = scene_objects(*cells)
        captions = sample_captions(
            objects,
            rng,
            count=5,
            kind_weights=[0, 0, 0, 1, 0, 0],
            paraphrase_prob=0.2,
            min_attributes=3,
            scene_captions=4,
        )
        full = [c for c in captions if c["kind"] == "full"]
        assert len(full) == min(4, factorial(len(objects)))
        seen_counts.add(len(full))
        assert all(c["kind"] == "relation" for c in captions if c["kind"] != "full")
        assert len({c["key"] for c in full}) == len(full)  # another order each
        wanted = sorted(
            json.dumps(
                {"size": o["size"], "color": o["color"], "shape": o["shape"], "position": o["position"]}, sort_keys=True
            )
            for o in objects
        )
        for caption in full:
            assert sorted(json.dumps(d, sort_keys=True) for d in caption["logical_form"]["objects"]) == wanted
        # The oracle reads every order as the same scene: each caption is true of its image.
        scene = SceneArrays(*(np.asarray(a)[None] for a in cells))
        assert all(bool(evaluate(c["logical_form"], scene)[0]) for c in captions)
    assert seen_counts == {2, 4}


def test_without_scene_captions_the_draws_are_unchanged():
    """``scene_captions=0`` draws nothing for them: the same captions as a call without the knob."""
    for seed in range(20):
        objects = scene_objects(
            *sample_scene(random.Random(seed), min_objects=1, max_objects=4, num_shapes=4, num_colors=6)
        )
        plain = sample_captions(objects, random.Random(seed), count=5, kind_weights=[1] * 6, paraphrase_prob=0.2)
        zero = sample_captions(
            objects, random.Random(seed), count=5, kind_weights=[1] * 6, paraphrase_prob=0.2, scene_captions=0
        )
        assert plain == zero


@pytest.fixture(scope="module")
def preset_worlds(tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("presets")
    return {
        name: json.loads(
            (
                generate_world(ShapesConfig(preset=name, images=1200, size=24, seed=2), root / name).out_dir
                / "world.json"
            ).read_text()
        )
        for name in PRESETS
    }


def test_presets_give_their_regimes(preset_worlds):
    """The rates docs/shapes.md promises, on a small world (the family part is larger when the split is small)."""
    rate = {
        name: world["statistics"]["false_negative_density"]["train"]["pair_negative_fn_rate"]
        for name, world in preset_worlds.items()
    }
    assert rate["coco-like"] < 0.006
    assert 0.02 < rate["medium"] < 0.06
    assert rate["dense"] > 0.12
    near_miss = {
        name: world["statistics"]["false_negative_density"]["train"].get("near_miss_fn_rate")
        for name, world in preset_worlds.items()
    }
    assert near_miss["coco-like"] < 0.10 < 0.2 < near_miss["medium"]  # a near miss is rarely true in coco-like
    by_kind = preset_worlds["coco-like"]["statistics"]["false_negative_density"]["train"]["by_kind"]
    assert set(by_kind) == {"relation", "full"} and by_kind["full"]["near_miss_fn_rate"] == 0
    for name in ("medium", "dense"):
        assert preset_worlds[name]["statistics"]["duplicate_captions"]["same_logical_form"] == 0
    # coco-like repeats a caption only where a two-object scene has fewer than five distinct forms (two orders and
    # its relations): a small share, each on its own image.
    repeats = preset_worlds["coco-like"]["statistics"]["duplicate_captions"]
    assert repeats["same_logical_form"] <= repeats["images"] < 0.25 * 1200
    assert preset_worlds["coco-like"]["config"]["preset"] == "coco-like"


def test_coco_like_and_medium_share_their_scenes(tmp_path):
    worlds = {
        name: generate_world(ShapesConfig(preset=name, images=60, size=24), tmp_path / name).out_dir
        for name in ("coco-like", "medium")
    }
    scenes = [pq.read_table(w / "scenes.parquet").to_pylist() for w in worlds.values()]
    assert scenes[0] == scenes[1]
    assert (worlds["coco-like"] / "images" / "000007.png").read_bytes() == (
        worlds["medium"] / "images" / "000007.png"
    ).read_bytes()


def test_training_images_keep_the_first_of_their_captions_and_the_rest_of_the_world_is_unchanged(tmp_path):
    """``train_captions_per_image`` (1 in coco-like and medium): a training image keeps the first of the captions it
    would have had, val and test images keep all five, caption ids stay the rows of captions.parquet, and nothing
    else moves; no training pair shares its image with another."""
    worlds = {
        name: generate_world(
            ShapesConfig(preset="coco-like", images=160, size=24, train_captions_per_image=kept), tmp_path / name
        ).out_dir
        for name, kept in (("all", None), ("one", 1))
    }
    assert ShapesConfig(preset="coco-like").train_captions_per_image == 1
    full, web = (pq.read_table(worlds[name] / "captions.parquet").to_pandas() for name in ("all", "one"))
    train = "train"
    per_image = web.groupby(["split", "image_id"]).size()
    assert (per_image.loc[train] == 1).all() and (per_image.drop(index=train, level=0) == 5).all()
    assert web["caption_id"].tolist() == list(range(len(web)))
    kept = full[(full["split"] != train) | (full["index"] == 0)]
    assert web["text"].tolist() == kept["text"].tolist() and web["image_id"].tolist() == kept["image_id"].tolist()
    assert (worlds["all"] / "images" / "000042.png").read_bytes() == (
        worlds["one"] / "images" / "000042.png"
    ).read_bytes()
    pairs = json.loads((worlds["one"] / "pretrain.json").read_text())
    assert len(pairs) == len({p["image"] for p in pairs}) == (per_image.loc[train]).size
    stats = json.loads((worlds["one"] / "world.json").read_text())["statistics"]["false_negative_density"]
    assert stats["train"]["same_image_pair_rate"] == 0 < stats["test"]["same_image_pair_rate"]
    with pytest.raises(ValueError, match="train_captions_per_image .6. must be <= captions_per_image .5."):
        ShapesConfig(train_captions_per_image=6)


def test_an_older_world_that_repeats_captions_is_not_reused_silently(tmp_path):
    """A world written before repeats were avoided (simulated: a repeat, and no duplicate count in world.json)."""
    config = ShapesConfig(images=40, seed=1)
    out = generate_world(config, tmp_path / "w").out_dir
    record = json.loads((out / "world.json").read_text())
    del record["statistics"]["duplicate_captions"]
    (out / "world.json").write_text(json.dumps(record))
    assert generate_world(config, out).reused  # no repeats: it is what this version makes
    table = pq.read_table(out / "captions.parquet")
    forms = table.column("logical_form").to_pylist()
    forms[1] = forms[0]  # the first image's second caption repeats its first
    pq.write_table(
        table.set_column(table.column_names.index("logical_form"), "logical_form", [forms]), out / "captions.parquet"
    )
    with pytest.raises(FalconError, match="older falcon that repeated captions"):
        generate_world(config, out)


def test_cli_preset_is_recorded_and_a_bad_name_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    result = runner.invoke(
        app, ["data", "shapes", "--out", "w", "--images", "40", "--size", "24", "--preset", "medium"]
    )
    assert result.exit_code == 0, result.output
    assert "random negative is FN" in result.output
    record = json.loads(Path("w/world.json").read_text())
    assert record["config"]["preset"] == "medium" and record["config"]["near_misses"] == 3
    with pytest.raises(FalconError, match=r"key 'preset': expected one of coco-like, medium or dense, got 'sparse'"):
        runner.invoke(
            app, ["data", "shapes", "--out", "w2", "--images", "40", "--preset", "sparse"], catch_exceptions=False
        )
    assert not Path("w2").exists()


def test_near_miss_false_negative_rate_matches_a_brute_force_count(tmp_path):
    """How often a near miss of a caption's image is still truly described, counted with the oracle."""
    from falcon_cli.data.shapes import ShapesOracle
    from falcon_cli.data.shapes.world import load_world_summary

    out = generate_world(ShapesConfig(preset="medium", images=122, size=24, seed=5), tmp_path / "w").out_dir
    oracle = ShapesOracle.load(out)
    family_size = 4
    for split in ("train", "test"):
        captions = oracle.caption_ids_in(split)
        images = oracle.caption_image_ids[oracle.caption_rows(captions)]
        rates = []
        for caption, image in zip(captions, images):
            family = [
                i
                for i in range(image - image % family_size, image - image % family_size + family_size)
                if i != image and i < 122
            ]
            if family:
                rates.append(oracle.matches(family, [caption] * len(family)).mean())
        stats = load_world_summary(out).false_negative_density[split]
        assert stats["near_miss_fn_rate"] == pytest.approx(np.mean(rates), abs=2e-6)
        assert 0 < stats["near_miss_fn_rate"] < 1
        assert stats["by_kind"]["full"]["near_miss_fn_rate"] == 0  # a near miss never fits the whole description


def test_extra_scenes_are_drawn_from_the_worlds_distribution_and_rendered_as_the_world_renders():
    """The unimodal image encoder's ImageNet: fresh scenes with the world's objects per scene and vocabulary,
    the same for the same seed, another draw for another seed, pixels as render_scene gives them."""
    from falcon_cli.data.shapes.config import ShapesConfig
    from falcon_cli.data.shapes.generation import extra_scenes
    from falcon_cli.data.shapes.render import render_scene
    from falcon_cli.data.shapes.seeding import STREAM_EXTRA_PIXELS, stream_generator

    config = ShapesConfig(preset="coco-like", images=40, size=24)
    scenes, pixels = extra_scenes(config, 30, seed=3)
    assert pixels.shape == (30, 24, 24, 3) and pixels.dtype == np.uint8
    objects = scenes.occupied.sum(axis=1)
    assert objects.min() >= config.min_objects and objects.max() <= config.max_objects
    assert scenes.shape.max() < config.num_shapes and scenes.color.max() < config.num_colors
    again, pixels_again = extra_scenes(config, 30, seed=3)
    assert np.array_equal(again.shape, scenes.shape) and np.array_equal(pixels_again, pixels)
    other, _ = extra_scenes(config, 30, seed=4)
    assert not np.array_equal(other.shape, scenes.shape)
    image = render_scene(
        scenes.shape[7],
        scenes.color[7],
        scenes.size[7],
        stream_generator(config.seed, STREAM_EXTRA_PIXELS, 3, 7),
        image_size=24,
        background_noise=config.background_noise,
    )
    assert np.array_equal(np.asarray(image), pixels[7])
