"""The shapes oracle, caption grammar and logical forms, on hand-written scenes with known answers."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from falcon_cli.data.shapes import logical_forms as lfs
from falcon_cli.data.shapes.captions import render_caption, sample_captions
from falcon_cli.data.shapes.oracle import evaluate
from falcon_cli.data.shapes.parser import parse_caption
from falcon_cli.data.shapes.scene import SceneArrays, scene_objects
from falcon_cli.data.shapes.vocabulary import COLORS, POSITIONS, RELATIONS, SHAPES, SIZES
from falcon_cli.errors import FalconError


def obj(size, color, shape, position):
    return {"size": size, "color": color, "shape": shape, "position": position}


# A: three different objects on the diagonal.
SCENE_A = [
    obj("large", "red", "circle", "top left"),
    obj("small", "blue", "square", "center"),
    obj("large", "green", "triangle", "bottom right"),
]
# B: two identical small red circles, top right and bottom left.
SCENE_B = [obj("small", "red", "circle", "top right"), obj("small", "red", "circle", "bottom left")]
# C: a single large yellow diamond in the center.
SCENE_C = [obj("large", "yellow", "diamond", "center")]
# D: same column: a red circle at the top, a blue square at the bottom.
SCENE_D = [obj("large", "red", "circle", "top"), obj("large", "blue", "square", "bottom")]
SCENES = {"A": SCENE_A, "B": SCENE_B, "C": SCENE_C, "D": SCENE_D}
ARRAYS = SceneArrays.from_objects(list(SCENES.values()))


def truth(text: str) -> set[str]:
    """The names of the hand-written scenes the caption is true of (via parser + vectorised oracle)."""
    result = evaluate(parse_caption(text), ARRAYS)
    return {name for name, value in zip(SCENES, result) if value}


@pytest.mark.parametrize(
    "text, expected",
    [
        # single attributes
        ("a red shape", {"A", "B", "D"}),
        ("there is a circle", {"A", "B", "D"}),
        ("a small thing", {"A", "B"}),
        ("a diamond", {"C"}),
        ("a purple shape", set()),
        # attribute combinations
        ("a small red circle", {"B"}),
        ("a large red circle", {"A", "D"}),
        ("a large blue square", {"D"}),
        ("a small green triangle", set()),
        # synonyms
        ("a crimson ball", {"A", "B", "D"}),
        ("a big scarlet disc in the upper left", {"A"}),
        ("a tiny box", {"A"}),
        ("a golden rhombus in the middle", {"C"}),
        # positions name exactly one cell
        ("a blue square in the center", {"A"}),
        ("a blue square in the top left", set()),
        ("a shape in the top left", {"A"}),
        ("a shape at the top", {"D"}),
        ("a red circle on the left", set()),
        ("a circle in the bottom left corner", {"B"}),
        ("a shape in the bottom right", {"A"}),
    ],
)
def test_existence_attributes_synonyms_positions(text, expected):
    assert truth(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        # A: red circle (r0,c0), blue square (r1,c1), green triangle (r2,c2)
        ("a red circle left of a blue square", {"A"}),
        ("a blue square left of a red circle", set()),
        ("a blue square to the right of a red circle", {"A"}),
        ("a red circle right of a green triangle", set()),
        ("a red circle above a blue square", {"A", "D"}),
        ("a green triangle below a blue square", {"A"}),
        ("a blue square under a red circle", {"A", "D"}),
        # same column: not left of, but above
        ("a red circle left of a blue shape", {"A"}),
        # the two objects must be distinct: A has one red circle, B has two
        ("a red circle left of a red circle", {"B"}),
        ("a red circle above a red circle", {"B"}),
        ("a red circle below a red shape", {"B"}),
        ("a diamond left of a diamond", set()),
        ("a shape right of a shape", {"A", "B"}),
        ("a shape above a shape", {"A", "B", "D"}),
    ],
)
def test_relations_are_strict_and_need_two_objects(text, expected):
    assert truth(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("three shapes", {"A"}),
        ("two shapes", {"B", "D"}),
        ("one shape", {"C"}),
        ("two red circles", {"B"}),
        ("one red circle", {"A", "D"}),  # exact: B has two
        ("exactly 1 red circle", {"A", "D"}),
        ("two red objects", {"B"}),
        ("there are no triangles", {"B", "C", "D"}),
        ("four shapes", set()),
        ("one small shape", {"A"}),
    ],
)
def test_counts_are_exact(text, expected):
    assert truth(text) == expected


FULL_A = (
    "three shapes: a large red circle in the top left, a small blue square in the center and a large green triangle "
    "in the bottom right"
)


@pytest.mark.parametrize(
    "text, expected",
    [
        (FULL_A, {"A"}),
        (FULL_A.replace("three", "3").replace("circle", "ball").replace("red", "crimson"), {"A"}),
        # asserts the exact object count: a true subset of the objects is not enough
        ("two shapes: a large red circle in the top left and a small blue square in the center", set()),
        (
            "three shapes: a large red circle in the top left, a small blue square in the center and a small green "
            "triangle in the bottom right",
            set(),
        ),
        ("one shape: a large yellow diamond in the center", {"C"}),
        # without positions, descriptions must still go to distinct objects
        ("two shapes: a red circle and a red circle", {"B"}),
        ("two shapes: a red circle and a circle", {"B"}),
        ("two shapes: a red circle and a blue square", {"D"}),
        ("two shapes: a red circle and a blue circle", set()),
        ("three shapes: a red shape, a blue shape and a green shape", {"A"}),
        ("three shapes: a red shape, a red shape and a green shape", set()),
    ],
)
def test_full_descriptions(text, expected):
    assert truth(text) == expected


def test_synonym_caption_parses_to_the_canonical_form():
    assert (
        parse_caption("a crimson ball")
        == parse_caption("a red circle")
        == lfs.exists(lfs.describe(color="red", shape="circle"))
    )
    assert parse_caption("There's a big box in the upper-left corner.") == lfs.exists(
        lfs.describe(size="large", shape="square", position="top left")
    )
    assert parse_caption("exactly 2 green objects") == lfs.count(2, lfs.describe(color="green"))


@pytest.mark.parametrize(
    "text",
    [
        "a purple elephant",
        "red circle",
        "a red circle near a blue square",
        "a red circle left of",
        "three shapes: a red circle",
        "two red shapes: a red circle and a red square",
        "the cat sat on the mat",
        "",
        "a red circle and",
    ],
)
def test_parser_rejects_text_outside_the_grammar(text):
    with pytest.raises(FalconError) as info:
        parse_caption(text)
    message = str(info.value)
    assert "\n" not in message
    assert repr(text) in message or "empty" in message


def test_parser_error_names_the_word():
    with pytest.raises(FalconError, match=r"found 'elephant' \(word 3\)"):
        parse_caption("a purple elephant")


def test_malformed_logical_forms_are_rejected():
    with pytest.raises(FalconError, match="colour"):
        evaluate({"type": "exists", "object": {"colour": "red"}}, ARRAYS)
    with pytest.raises(FalconError, match="mauve"):
        evaluate({"type": "exists", "object": {"color": "mauve"}}, ARRAYS)
    with pytest.raises(FalconError, match="relation"):
        evaluate({"type": "relation", "relation": "near", "subject": {}, "object": {}}, ARRAYS)
    with pytest.raises(FalconError, match="count"):
        evaluate({"type": "count", "count": -1, "object": {}}, ARRAYS)
    # a JSON string is accepted too
    assert evaluate('{"type": "exists", "object": {"shape": "diamond"}}', ARRAYS).tolist() == [
        False,
        False,
        True,
        False,
    ]


# --- vectorised oracle == plain per-scene Python ---------------------------------------


def reference_truth(lf: dict, objects: list[dict]) -> bool:
    """The documented semantics, written as directly as possible (one scene at a time)."""

    def matches(o, description):
        return all(o[key] == value for key, value in description.items())

    def cell(o):
        return divmod(POSITIONS.index(o["position"]), 3)  # (row, col)

    kind = lf["type"]
    if kind == "exists":
        return any(matches(o, lf["object"]) for o in objects)
    if kind == "count":
        return sum(matches(o, lf["object"]) for o in objects) == lf["count"]
    if kind == "relation":
        for a in objects:
            for b in objects:
                if a is b or not (matches(a, lf["subject"]) and matches(b, lf["object"])):
                    continue
                (ra, ca), (rb, cb) = cell(a), cell(b)
                if {"left_of": ca < cb, "right_of": ca > cb, "above": ra < rb, "below": ra > rb}[lf["relation"]]:
                    return True
        return False
    descriptions = lf["objects"]
    if len(objects) != len(descriptions):
        return False
    return any(
        all(matches(objects[p[i]], d) for i, d in enumerate(descriptions))
        for p in itertools.permutations(range(len(objects)))
    )


def random_scene(rng: random.Random) -> list[dict]:
    # A small vocabulary makes repeated attributes (and so tricky cases) common.
    cells = rng.sample(range(9), rng.randint(1, 5))
    return [obj(rng.choice(SIZES), rng.choice(COLORS[:2]), rng.choice(SHAPES[:2]), POSITIONS[c]) for c in cells]


def random_description(rng: random.Random, scene: list[dict] | None) -> dict:
    if scene and rng.random() < 0.6:
        source = rng.choice(scene)
    else:
        source = obj(rng.choice(SIZES), rng.choice(COLORS[:2]), rng.choice(SHAPES[:2]), rng.choice(POSITIONS))
    keys = [k for k in ("size", "color", "shape", "position") if rng.random() < 0.4]
    return lfs.describe(**{k: source[k] for k in keys})


def random_form(rng: random.Random, scene: list[dict]) -> dict:
    kind = rng.choice(["exists", "count", "relation", "scene"])
    if kind == "exists":
        return lfs.exists(random_description(rng, scene))
    if kind == "count":
        return lfs.count(rng.randint(0, 4), random_description(rng, scene))
    if kind == "relation":
        return lfs.relation(rng.choice(RELATIONS), random_description(rng, scene), random_description(rng, scene))
    k = rng.randint(1, 5)
    return lfs.scene([random_description(rng, scene) for _ in range(k)])


def test_vectorised_evaluate_equals_per_scene_reference():
    rng = random.Random(1234)
    scenes = [random_scene(rng) for _ in range(250)]
    arrays = SceneArrays.from_objects(scenes)
    forms = [random_form(rng, rng.choice(scenes)) for _ in range(400)]
    positives = 0
    for lf in forms:
        expected = np.array([reference_truth(lf, s) for s in scenes])
        got = evaluate(lf, arrays)
        assert got.dtype == bool and got.shape == (len(scenes),)
        assert np.array_equal(got, expected), lf
        positives += int(expected.sum())
    # the comparison is only meaningful if both answers occur often
    assert 0.1 < positives / (len(scenes) * len(forms)) < 0.9


def test_scene_arrays_round_trip_through_objects():
    for objects, row in zip(SCENES.values(), range(len(SCENES))):
        back = scene_objects(ARRAYS.shape[row], ARRAYS.color[row], ARRAYS.size[row])
        assert sorted((o["position"], o["shape"], o["color"], o["size"]) for o in back) == sorted(
            (o["position"], o["shape"], o["color"], o["size"]) for o in objects
        )


# --- renderer <-> parser ---------------------------------------------------------------


def test_parse_inverts_render_for_canonical_and_paraphrased_text():
    rng = random.Random(7)
    checked = 0
    for _ in range(300):
        scene = random_scene(rng)
        for lf in [random_form(rng, scene) for _ in range(3)]:
            if lf["type"] == "scene" and len(lf["objects"]) == 0:
                continue
            canonical = render_caption(lf)
            assert parse_caption(canonical) == lf, canonical
            for prob in (0.5, 1.0):
                text = render_caption(lf, random.Random(checked), prob)
                assert parse_caption(text) == lf, text
            checked += 1
    assert checked > 500


def test_paraphrases_actually_vary_the_wording():
    lf = lfs.exists(lfs.describe(size="small", color="red", shape="circle", position="top left"))
    texts = {render_caption(lf, random.Random(seed), 1.0) for seed in range(30)}
    assert render_caption(lf) == "a small red circle in the top left"
    assert render_caption(lf) not in texts  # probability 1: every slot is a synonym
    assert len(texts) > 5


def test_sampled_captions_are_true_and_parse_back():
    rng = random.Random(99)
    for _ in range(200):
        scene = random_scene(rng)
        arrays = SceneArrays.from_objects([scene])
        for caption in sample_captions(
            scene_objects(arrays.shape[0], arrays.color[0], arrays.size[0]),
            rng,
            count=5,
            kind_weights=[1] * 6,
            paraphrase_prob=0.5,
        ):
            assert evaluate(caption["logical_form"], arrays)[0], caption["text"]
            assert parse_caption(caption["text"]) == caption["logical_form"]
            assert lfs.kind_of(caption["logical_form"]) == caption["kind"]
