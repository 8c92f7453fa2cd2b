"""Generated shapes worlds: truth of captions, determinism, file formats, oracle tables, VQA, NLVR2, reuse."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pydantic
import pytest

from falcon_cli.data.shapes import ShapesConfig, ShapesOracle, WorldSummary, generate_world, generation, writing
from falcon_cli.data.shapes.parser import parse_caption
from falcon_cli.data.shapes.statements import parse_statement, statement_truth
from falcon_cli.data.shapes.vocabulary import COLOR_WORDS, POSITION_PHRASES, SHAPE_WORDS, SIZE_WORDS
from falcon_cli.data.shapes.world import load_world_summary
from falcon_cli.data.spec import load_spec
from falcon_cli.errors import FalconError
from falcon_cli.field_docs import field_docstrings

SMALL = dict(images=120, seed=3, vqa_questions_per_image=4, nlvr2_statements_per_image=1.5)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("shapes") / "world"
    generate_world(ShapesConfig(**SMALL), out, preview=True)
    return out


@pytest.fixture(scope="module")
def oracle(world) -> ShapesOracle:
    return ShapesOracle.load(world)


@pytest.fixture(scope="module")
def scenes(world) -> dict[int, list[dict]]:
    table = pq.read_table(world / "scenes.parquet").to_pylist()
    return {row["image_id"]: row["objects"] for row in table}


def load(world: Path, name: str):
    return json.loads((world / name).read_text(encoding="utf-8"))


def matching(objects: list[dict], description: dict) -> int:
    return sum(all(o[k] == v for k, v in description.items()) for o in objects)


# --- captions ---------------------------------------------------------------------------


def test_every_caption_is_true_of_its_own_image(oracle):
    assert oracle.caption_ids.size == 120 * 5
    assert oracle.matches(oracle.caption_image_ids, oracle.caption_ids).all()
    # and the text alone (through the parser) says the same
    for caption_id, image_id, text in list(zip(oracle.caption_ids, oracle.caption_image_ids, oracle.caption_texts))[
        :150
    ]:
        assert oracle.describes_text([image_id], text)[0], text


def test_caption_text_parses_to_its_stored_logical_form(world, oracle):
    captions = pq.read_table(world / "captions.parquet").to_pylist()
    for caption in captions:
        assert parse_caption(caption["text"]) == json.loads(caption["logical_form"]), caption["text"]


def test_oracle_specificity_equals_the_captions_table(world, oracle):
    table = pq.read_table(world / "captions.parquet", columns=["caption_id", "specificity"]).to_pandas()
    shuffled = table.sample(frac=1.0, random_state=0)
    assert (oracle.specificity(shuffled["caption_id"].to_numpy()) == shuffled["specificity"].to_numpy()).all()


def test_captions_table_columns_and_kinds(world):
    table = pq.read_table(world / "captions.parquet")
    assert table.column_names == [
        "caption_id",
        "image_id",
        "split",
        "index",
        "kind",
        "text",
        "logical_form",
        "specificity",
        "paraphrased",
        "images_described",
    ]
    rows = table.to_pylist()
    assert [r["caption_id"] for r in rows] == [r["image_id"] * 5 + r["index"] for r in rows]
    kinds = Counter(r["kind"] for r in rows)
    assert set(kinds) == {"attribute", "combination", "position", "relation", "count", "full"}
    assert any(r["paraphrased"] for r in rows) and not all(r["paraphrased"] for r in rows)
    # a full description is more specific than a single attribute
    spec = {k: np.mean([r["specificity"] for r in rows if r["kind"] == k]) for k in kinds}
    assert spec["full"] > spec["combination"] > spec["attribute"] == 1


# --- determinism and atomicity -----------------------------------------------------------


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_config_gives_byte_identical_files(tmp_path, world):
    again = tmp_path / "again"
    generate_world(ShapesConfig(**SMALL), again, preview=True)
    first, second = tree_bytes(world), tree_bytes(again)
    assert len(first) > 120 and first.keys() == second.keys()
    assert [name for name in first if first[name] != second[name]] == []


def test_parallel_rendering_gives_identical_files(tmp_path, monkeypatch):
    config = ShapesConfig(images=40, seed=11)
    generate_world(config, tmp_path / "serial", workers=1)
    monkeypatch.setattr(generation, "PARALLEL_MIN_IMAGES", 0)
    monkeypatch.setattr(generation, "CHUNK", 7)
    generate_world(config, tmp_path / "parallel", workers=2)
    assert tree_bytes(tmp_path / "serial") == tree_bytes(tmp_path / "parallel")


def test_different_seed_gives_a_different_world(tmp_path, world):
    other = tmp_path / "other"
    generate_world(ShapesConfig(**{**SMALL, "seed": 4}), other)
    assert (other / "captions.parquet").read_bytes() != (world / "captions.parquet").read_bytes()
    assert (other / "images" / "000000.png").read_bytes() != (world / "images" / "000000.png").read_bytes()


def test_failed_generation_leaves_nothing_behind(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("killed")

    monkeypatch.setattr(generation, "density_statistics", boom)
    with pytest.raises(RuntimeError, match="killed"):
        generate_world(ShapesConfig(images=30), tmp_path / "world")
    assert list(tmp_path.iterdir()) == []


# --- reuse and overwrite -------------------------------------------------------------------


def test_existing_world_with_same_config_is_reused(world):
    before = {p: p.stat().st_mtime_ns for p in world.rglob("*") if p.is_file()}
    summary = generate_world(ShapesConfig(**SMALL), world)
    assert isinstance(summary, WorldSummary) and summary.reused
    assert {p: p.stat().st_mtime_ns for p in world.rglob("*") if p.is_file()} == before
    assert summary.to_dict()["counts"] == load_world_summary(world).counts
    as_dict = summary.to_dict()
    assert as_dict["splits"]["train"] == {"images": 96, "captions": 480, "vqa_questions": 384, "nlvr2_statements": 144}
    assert as_dict["fn_density"]["test"]["captions"] == 60 and json.dumps(as_dict)


def test_different_config_is_refused_then_overwritten(tmp_path):
    out = tmp_path / "world"
    first = generate_world(ShapesConfig(images=30, seed=1), out)
    assert not first.reused
    with pytest.raises(FalconError, match=r"different config \(seed: 1 -> 2\).*overwrite"):
        generate_world(ShapesConfig(images=30, seed=2), out)
    summary = generate_world(ShapesConfig(images=30, seed=2), out, overwrite=True)
    assert not summary.reused and load_world_summary(out).config["seed"] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["world"]  # no temporary or old copies left
    # overwrite regenerates even when the config is the same
    (out / "images" / "000000.png").write_bytes(b"stale")
    assert not generate_world(ShapesConfig(images=30, seed=2), out, overwrite=True).reused
    assert (out / "images" / "000000.png").read_bytes().startswith(b"\x89PNG")


def test_directory_that_is_not_a_world_is_refused(tmp_path):
    out = tmp_path / "notes"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(FalconError, match="not a shapes world"):
        generate_world(ShapesConfig(images=30), out)
    assert (out / "keep.txt").read_text() == "mine"
    with pytest.raises(FalconError, match="not a shapes world"):
        load_world_summary(out)


# --- formats ---------------------------------------------------------------------------


def test_dataset_spec_points_at_every_file(world):
    spec = load_spec(world)
    assert spec.root_for() == world.resolve()
    assert spec.resolve(spec.shapes_world) == world.resolve()
    paths = [
        *spec.pretrain,
        spec.retrieval.train,
        spec.retrieval.val,
        spec.retrieval.test,
        *spec.vqa.train,
        *spec.vqa.val,
        *spec.vqa.test,
        spec.vqa.answer_list,
        spec.nlvr2.train,
        spec.nlvr2.dev,
        spec.nlvr2.test,
    ]
    for path in paths:
        assert spec.resolve(path).is_file(), path


def test_pretrain_and_retrieval_formats(world, oracle):
    summary = load_world_summary(world)
    n_train = summary.counts["images"]["train"]
    pretrain = load(world, "pretrain.json")
    assert len(pretrain) == 5 * n_train == summary.counts["pretrain_pairs"]
    for entry in pretrain:
        assert set(entry) == {"image", "caption", "image_id", "caption_id"}
        assert (
            isinstance(entry["caption"], str)
            and isinstance(entry["image_id"], int)
            and isinstance(entry["caption_id"], int)
        )
        assert entry["image"] == f"images/{entry['image_id']:06d}.png" and (world / entry["image"]).is_file()
    assert oracle.matches([e["image_id"] for e in pretrain], [e["caption_id"] for e in pretrain]).all()
    assert set(oracle.image_splits[np.isin(oracle.image_ids, [e["image_id"] for e in pretrain])]) == {"train"}

    train = load(world, "retrieval_train.json")
    assert [(e["image"], e["caption"], e["image_id"]) for e in train] == [
        (e["image"], e["caption"], e["image_id"]) for e in pretrain
    ]
    assert all(set(e) == {"image", "caption", "image_id"} for e in train)

    seen_images = set()
    for split in ("val", "test"):
        entries = load(world, f"retrieval_{split}.json")
        assert len(entries) == summary.counts["images"][split]
        for entry in entries:
            assert set(entry) == {"image", "caption", "image_id", "caption_ids"}
            assert len(entry["caption"]) == 5 == len(entry["caption_ids"]) and all(
                isinstance(c, str) for c in entry["caption"]
            )
            assert oracle.image_splits[oracle.image_rows([entry["image_id"]])[0]] == split
            texts = oracle.caption_texts[oracle.caption_rows(entry["caption_ids"])]
            assert list(texts) == entry["caption"]
            seen_images.add(entry["image_id"])
    assert seen_images.isdisjoint(e["image_id"] for e in pretrain)


def test_scenes_table(world, scenes):
    table = pq.read_table(world / "scenes.parquet")
    assert table.column_names == ["image_id", "split", "file", "num_objects", "objects"]
    for row in table.to_pylist():
        objects = row["objects"]
        assert 1 <= row["num_objects"] == len(objects) <= 4
        assert len({o["cell"] for o in objects}) == len(objects)
        for o in objects:
            assert o["cell"] == 3 * o["row"] + o["col"]
            assert o["shape"] in ("circle", "square", "triangle", "diamond")
            assert o["size"] in ("small", "large")


# --- oracle tables and false-negative density -------------------------------------------------


def test_compatibility_table_equals_the_oracle_matrix(world, oracle):
    from falcon_cli.artifacts.tables import COMPATIBILITY, read_table

    table = read_table(world / "compatibility_test.parquet", COMPATIBILITY)  # validates schema + version
    assert list(table.columns) == ["image_id", "caption_id"]
    pairs = set(zip(table["image_id"].tolist(), table["caption_id"].tolist()))
    images, captions = oracle.image_ids_in("test"), oracle.caption_ids_in("test")
    matrix = oracle.matrix(images, captions)
    assert matrix.shape == (images.size, captions.size)
    expected = {(int(images[i]), int(captions[j])) for i, j in zip(*np.nonzero(matrix))}
    assert pairs == expected
    own = {
        (int(i), int(c))
        for i, c in zip(oracle.caption_image_ids, oracle.caption_ids)
        if oracle.caption_splits[oracle.caption_rows([c])[0]] == "test"
    }
    assert len(own) == captions.size and own <= pairs
    assert len(pairs) > len(own)  # the world has false negatives to find
    # matches() agrees with matrix() elementwise
    ii, cc = np.meshgrid(images, captions, indexing="ij")
    assert np.array_equal(oracle.matches(ii.ravel(), cc.ravel()).reshape(matrix.shape), matrix)


def test_false_negative_density_is_consistent_with_the_oracle(world, oracle):
    summary = load_world_summary(world)
    captions = pq.read_table(world / "captions.parquet").to_pylist()
    for split in ("train", "val", "test"):
        images, caption_ids = oracle.image_ids_in(split), oracle.caption_ids_in(split)
        described = oracle.matrix(images, caption_ids).sum(axis=0)
        stored = np.array([c["images_described"] for c in captions if c["split"] == split])
        assert np.array_equal(described, stored)
        stats = summary.false_negative_density[split]
        assert stats["captions"] == caption_ids.size
        assert stats["mean"] == pytest.approx(described.mean(), abs=1e-4)
        assert stats["median"] == pytest.approx(float(np.median(described)))
        assert stats["max"] == described.max()
        kinds = np.array([c["kind"] for c in captions if c["split"] == split])
        for kind, kind_stats in stats["by_kind"].items():
            assert kind_stats["mean"] == pytest.approx(described[kinds == kind].mean(), abs=1e-4)
    test = summary.false_negative_density["test"]["by_kind"]
    assert test["attribute"]["mean"] > test["full"]["mean"] >= 1


def test_random_negative_rates_match_a_brute_force_count(world, oracle):
    """The rates a uniformly drawn negative hits, counted pair by pair from the oracle's matrix:
    over the split's other images, and over its other pairs (which include the other captions of
    the caption's own image, reported apart)."""
    summary = load_world_summary(world)
    for split in ("train", "test"):
        images, caption_ids = oracle.image_ids_in(split), oracle.caption_ids_in(split)
        truth = oracle.matrix(images, caption_ids)  # [images, captions]
        own_image = oracle.caption_image_ids[oracle.caption_rows(caption_ids)]
        pair_image_row = np.searchsorted(images, own_image)  # each pair's image, as a row of truth
        image_rates, pair_rates, same_rates = [], [], []
        for c in range(caption_ids.size):
            others = np.arange(images.size) != pair_image_row[c]
            image_rates.append(truth[others, c].mean())
            other_pairs = np.arange(caption_ids.size) != c
            pair_false = truth[pair_image_row[other_pairs], c]  # the caption describes that pair's image
            pair_rates.append(pair_false.mean())
            same_rates.append((pair_image_row[other_pairs] == pair_image_row[c]).mean())
        stats = summary.false_negative_density[split]
        assert stats["random_negative_fn_rate"] == pytest.approx(np.mean(image_rates), abs=2e-6)
        assert stats["pair_negative_fn_rate"] == pytest.approx(np.mean(pair_rates), abs=2e-6)
        assert stats["same_image_pair_rate"] == pytest.approx(np.mean(same_rates), abs=2e-6)
        assert stats["same_image_pair_rate"] < stats["pair_negative_fn_rate"]


def test_repeated_captions_of_one_image_are_counted(tmp_path):
    """Only relations and full descriptions, five captions an image: a scene has one full description
    (and a one-object scene no relation), so captions must repeat, and world.json says how many."""
    mix = dict(attribute=0, combination=0, position=0, count=0)
    out = generate_world(
        ShapesConfig(images=40, seed=1, min_objects=1, max_objects=2, caption_mix=mix), tmp_path / "w"
    ).out_dir
    captions = pq.read_table(out / "captions.parquet").to_pylist()
    by_image: dict[int, list[dict]] = {}
    for c in captions:
        by_image.setdefault(c["image_id"], []).append(c)
    same_form = sum(len(cs) - len({c["logical_form"] for c in cs}) for cs in by_image.values())
    same_text = sum(len(cs) - len({c["text"] for c in cs}) for cs in by_image.values())
    images = sum(len(cs) > len({c["logical_form"] for c in cs}) for cs in by_image.values())
    stored = load(out, "world.json")["statistics"]["duplicate_captions"]
    assert stored == {"same_text": same_text, "same_logical_form": same_form, "images": images}
    assert same_form > 0 and same_text > 0
    assert load_world_summary(out).duplicate_captions == stored


def test_oracle_rejects_unknown_ids_and_bad_text(oracle):
    with pytest.raises(FalconError, match="unknown image_id 99999"):
        oracle.matches([99999], [0])
    with pytest.raises(FalconError, match="unknown caption_id"):
        oracle.matrix([0], [10**9])
    with pytest.raises(FalconError, match="outside the shapes grammar"):
        oracle.describes_text([0], "a dog on a sofa")


def test_describes_text_judges_arbitrary_captions(oracle, scenes):
    ids = oracle.image_ids
    for text in ["a red shape", "two shapes", "a circle left of a square", "there are no triangles"]:
        got = oracle.describes_text(ids, text)
        lf = parse_caption(text)
        assert np.array_equal(got, oracle.describes(ids, lf))
    expected = np.array([any(o["color"] == "red" for o in scenes[int(i)]) for i in ids])
    assert np.array_equal(oracle.describes_text(ids, "a crimson thing"), expected)
    assert 0 < expected.sum() < ids.size


# --- VQA --------------------------------------------------------------------------------


def _phrase_to_description(phrase: str, plural: bool = False) -> dict:
    """Independent reading of the fixed question templates' noun phrases (canonical words only)."""
    words = phrase.split()
    description = {}
    if words and words[0] in SIZE_WORDS:
        description["size"] = words.pop(0)
    if words and words[0] in COLOR_WORDS:
        description["color"] = words.pop(0)
    noun = words.pop(0)
    shapes = {forms[0][1 if plural else 0]: shape for shape, forms in SHAPE_WORDS.items()}
    if noun in shapes:
        description["shape"] = shapes[noun]
    else:
        assert noun in ("shape", "shapes", "object", "objects")
    assert not words, phrase
    return description


def vqa_reference_answer(question: str, objects: list[dict]) -> str:
    if m := re.fullmatch(r"what color is the shape (.+)\?", question):
        cell = next(name for name, phrases in POSITION_PHRASES.items() if phrases[0] == m.group(1))
        (obj,) = [o for o in objects if o["position"] == cell]
        return obj["color"]
    if m := re.fullmatch(r"what (color|shape|size) is the (.+)\?", question):
        found = [o for o in objects if all(o[k] == v for k, v in _phrase_to_description(m.group(2)).items())]
        assert len(found) == 1, f"ambiguous question {question!r}"
        return found[0][m.group(1)]
    if m := re.fullmatch(r"how many (.+) are there\?", question):
        return str(matching(objects, _phrase_to_description(m.group(1), plural=True)))
    if m := re.fullmatch(r"is there an? (.+)\?", question):
        return "yes" if matching(objects, _phrase_to_description(m.group(1))) else "no"
    raise AssertionError(f"unexpected question {question!r}")


def test_vqa_answers_are_correct_for_the_scene(world, scenes):
    answer_list = load(world, "answer_list.json")
    assert {"yes", "no", "0", "1", "red", "circle", "small"} <= set(answer_list)
    ids, total, yes_no = set(), 0, Counter()
    for split in ("train", "val", "test"):
        entries = load(world, f"vqa_{split}.json")
        split_yes_no = Counter()
        for entry in entries:
            assert set(entry) == {"question_id", "question", "answer", "image", "dataset"} and entry["dataset"] == "vqa"
            assert isinstance(entry["question_id"], int) and entry["question_id"] not in ids
            ids.add(entry["question_id"])
            assert len(entry["answer"]) == 10
            canonical, votes = Counter(entry["answer"]).most_common(1)[0]
            assert votes >= 6 and canonical in answer_list
            image_id = int(Path(entry["image"]).stem)
            assert canonical == vqa_reference_answer(entry["question"], scenes[image_id]), entry
            if canonical in ("yes", "no"):
                split_yes_no[canonical] += 1
        assert abs(split_yes_no["yes"] - split_yes_no["no"]) <= 1
        yes_no += split_yes_no
        total += len(entries)
    assert total > 120 * 3 and yes_no["yes"] > 10
    # human-like variation: some answers are synonyms of the canonical one
    all_answers = [
        a for split in ("train", "val", "test") for e in load(world, f"vqa_{split}.json") for a in e["answer"]
    ]
    assert set(all_answers) - set(answer_list)


# --- NLVR2 -------------------------------------------------------------------------------


def test_nlvr2_is_balanced_and_labels_are_correct(world, scenes, oracle):
    identifiers = set()
    for split, world_split in (("train", "train"), ("dev", "val"), ("test", "test")):
        entries = load(world, f"nlvr2_{split}.json")
        labels = Counter(e["label"] for e in entries)
        assert labels["True"] == labels["False"] > 0
        templates = Counter()
        for entry in entries:
            assert set(entry) == {"images", "sentence", "label", "identifier"}
            assert entry["identifier"] not in identifiers
            identifiers.add(entry["identifier"])
            left, right = (int(Path(p).stem) for p in entry["images"])
            assert left != right
            assert {str(s) for s in oracle.image_splits[oracle.image_rows([left, right])]} == {world_split}
            statement = parse_statement(entry["sentence"])
            templates[statement["template"]] += 1
            truth = statement_truth(
                statement, matching(scenes[left], statement["object"]), matching(scenes[right], statement["object"])
            )
            assert entry["label"] == ("True" if truth else "False"), entry
        if split == "train":
            assert len(templates) >= 6


# --- config ---------------------------------------------------------------------------------


def test_config_validation_messages():
    with pytest.raises(pydantic.ValidationError, match=r"min_objects \(5\) must be <= max_objects \(3\)"):
        ShapesConfig(min_objects=5, max_objects=3)
    with pytest.raises(pydantic.ValidationError, match="must sum to 1"):
        ShapesConfig(splits={"train": 0.5, "val": 0.1, "test": 0.1})
    with pytest.raises(pydantic.ValidationError, match="fewer than 2 images"):
        ShapesConfig(images=10)
    with pytest.raises(pydantic.ValidationError, match="at least one caption kind"):
        ShapesConfig(caption_mix={k: 0 for k in ("attribute", "combination", "position", "relation", "count", "full")})
    with pytest.raises(pydantic.ValidationError, match="extra"):
        ShapesConfig(colours=3)
    for name in ShapesConfig.model_fields:
        assert field_docstrings(ShapesConfig).get(name), f"ShapesConfig.{name} has no docstring"


def test_vocabulary_and_caption_knobs_take_effect(tmp_path):
    out = tmp_path / "w"
    generate_world(
        ShapesConfig(
            images=40,
            num_colors=8,
            num_shapes=6,
            min_objects=3,
            max_objects=3,
            captions_per_image=2,
            caption_mix={"attribute": 0, "combination": 0, "position": 0, "relation": 0, "count": 1, "full": 0},
        ),
        out,
    )
    scenes = pq.read_table(out / "scenes.parquet").to_pylist()
    assert {row["num_objects"] for row in scenes} == {3}
    captions = pq.read_table(out / "captions.parquet").to_pylist()
    assert len(captions) == 80 and {c["kind"] for c in captions} == {"count"}
    colors = {o["color"] for row in scenes for o in row["objects"]}
    shapes = {o["shape"] for row in scenes for o in row["objects"]}
    assert colors <= {"red", "green", "blue", "yellow", "purple", "orange", "pink", "cyan"} and len(colors) > 6
    assert shapes <= {"circle", "square", "triangle", "diamond", "star", "hexagon"} and len(shapes) > 4
    assert ShapesOracle.load(out).matches([c["image_id"] for c in captions], [c["caption_id"] for c in captions]).all()


def test_world_json_has_no_timestamps_and_full_config(world):
    data = load(world, "world.json")
    assert data["schema_version"] == writing.WORLD_SCHEMA_VERSION
    assert data["config"] == ShapesConfig(**SMALL).model_dump(mode="json")
    text = (world / "world.json").read_text()
    assert not re.search(r"\d{4}-\d{2}-\d{2}", text)
    assert (world / "preview.png").stat().st_size > 10_000


def test_the_split_size_bound_never_exceeds_the_drawn_sizes():
    """ShapesConfig checks every split for two images with a bound that needs no seeded draw, and draws only when
    the bound says a split may be short: the bound must never be above the drawn size, or a short split would pass."""
    from falcon_cli.data.shapes.config import SPLITS, assign_splits, smallest_split_sizes

    rng = np.random.default_rng(0)
    for _ in range(300):
        images, near_misses = int(rng.integers(4, 200)), int(rng.integers(0, 4))
        val, test = (float(x) for x in rng.uniform(0.02, 0.3, size=2))
        config = ShapesConfig.model_construct(
            images=images,
            near_misses=near_misses,
            seed=int(rng.integers(0, 99)),
            splits=ShapesConfig.model_fields["splits"].annotation(train=1 - val - test, val=val, test=test),
        )
        codes = assign_splits(config)
        for k, name in enumerate(SPLITS):
            assert smallest_split_sizes(config)[name] <= int((codes == k).sum()), (images, near_misses, val, test)
