"""Near-miss families: what separates two siblings, and how often retrieval confuses them (``results/near_misses``)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from falcon_cli.data.shapes.near_misses import NEAR_MISS_KINDS, difference_kinds, family_pairs
from falcon_cli.data.shapes.scene import EMPTY, SceneArrays, near_miss, sample_scene
from falcon_cli.evaluation.near_misses import near_miss_confusion
from tests.conftest import random_captions, run_cli


def _scene(objects: dict[int, tuple[int, int, int]]):
    """Three length-9 code rows from {cell: (shape, color, size)}."""
    rows = np.full((3, 9), EMPTY, dtype=np.int8)
    for cell, codes in objects.items():
        rows[:, cell] = codes
    return rows


def _arrays(scenes) -> SceneArrays:
    return SceneArrays(*(np.stack([s[k] for s in scenes]) for k in range(3)))


def test_each_kind_of_difference_is_named():
    base = {0: (0, 0, 0), 4: (1, 2, 1), 8: (2, 3, 0)}
    variants = {
        "color": {**base, 4: (1, 5, 1)},
        "shape": {**base, 0: (3, 0, 0)},
        "size": {**base, 8: (2, 3, 1)},
        "move": {0: (0, 0, 0), 4: (1, 2, 1), 6: (2, 3, 0)},
        "swap": {0: (1, 2, 1), 4: (0, 0, 0), 8: (2, 3, 0)},
        "several": {**base, 0: (3, 0, 0), 4: (1, 5, 1)},  # two objects changed
    }
    scenes = [_scene(base)] + [_scene(v) for v in variants.values()]
    scenes.append(_scene({**base, 4: (1, 5, 0)}))  # one object, two attributes
    scenes.append(_scene({0: (0, 0, 0), 4: (1, 2, 1)}))  # an object removed
    arrays = _arrays(scenes)
    others = np.arange(1, len(scenes))
    kinds = difference_kinds(arrays, np.zeros(len(others), dtype=int), others).tolist()
    assert kinds == [*variants, "several", "several"]
    assert difference_kinds(arrays, others, np.zeros(len(others), dtype=int)).tolist() == kinds  # symmetric


def test_a_scene_and_its_near_miss_differ_in_one_named_thing():
    drawn, misses = [], []
    for seed in range(300):
        rng = random.Random(seed)
        scene = sample_scene(rng, min_objects=2, max_objects=4, num_shapes=6, num_colors=8)
        drawn.append(np.stack(scene))
        misses.append(np.stack(near_miss(scene, rng, num_shapes=6, num_colors=8)))
    kinds = difference_kinds(_arrays(drawn + misses), np.arange(300), np.arange(300, 600))
    assert "several" not in set(kinds)
    assert set(kinds) == set(NEAR_MISS_KINDS) - {"several"}


def test_family_pairs_are_every_ordered_pair_within_a_family():
    rng = random.Random(0)
    scenes = _arrays(
        [np.stack(sample_scene(rng, min_objects=2, max_objects=4, num_shapes=6, num_colors=8)) for _ in range(12)]
    )
    image_ids = np.array([9, 8, 0, 1, 3, 11, 5])  # families of 4: {0, 1, 3}, {5}, {8, 9, 11}
    scene_rows = image_ids  # scene row = image id here
    first, second, kinds = family_pairs(scenes, scene_rows, image_ids, 4)
    got = sorted(zip(image_ids[first].tolist(), image_ids[second].tolist()))
    want = sorted((a, b) for a in image_ids for b in image_ids if a != b and a // 4 == b // 4)
    assert got == want
    assert kinds.tolist() == difference_kinds(scenes, image_ids[first], image_ids[second]).tolist()
    assert [len(x) for x in family_pairs(scenes, scene_rows, image_ids, 1)] == [0, 0, 0]


def _reference(i2t, t2i, img2txt, positives, pairs):
    """The same counts, one comparison at a time."""
    counts = {}
    for a, b, kind in zip(*pairs):
        for direction in ("i2t", "t2i"):
            n, won = counts.get((direction, kind), (0, 0))
            if direction == "t2i":
                for t in img2txt[a]:
                    if not positives[b, t]:
                        n, won = n + 1, won + int(t2i[t, b] > t2i[t, a])
            else:
                best = max(i2t[a, t] for t in img2txt[a])
                for u in img2txt[b]:
                    if not positives[a, u]:
                        n, won = n + 1, won + int(i2t[a, u] > best)
            counts[(direction, kind)] = (n, won)
    return counts


def test_confusion_matches_a_comparison_by_comparison_reference():
    rng = random.Random(3)
    torch.manual_seed(3)
    n_images = 24
    img2txt, txt2img = random_captions(rng, n_images, 4)
    i2t = torch.randn(n_images, len(txt2img))
    t2i = i2t.t() + 0.3 * torch.randn(len(txt2img), n_images)  # re-ranking changes some scores
    positives = torch.rand(n_images, len(txt2img)) < 0.15
    for i, caps in enumerate(img2txt):
        positives[i, caps] = True
    scenes = _arrays(
        [np.stack(sample_scene(rng, min_objects=2, max_objects=4, num_shapes=6, num_colors=8)) for _ in range(n_images)]
    )
    pairs = family_pairs(scenes, np.arange(n_images), np.arange(n_images), 4)
    rows = near_miss_confusion(i2t, t2i, img2txt, positives, pairs)
    reference = _reference(i2t, t2i, img2txt, positives, pairs)
    for row in rows:
        if row["kind"] == "all":
            n = sum(v[0] for (d, _), v in reference.items() if d == row["direction"])
            won = sum(v[1] for (d, _), v in reference.items() if d == row["direction"])
        else:
            n, won = reference.get((row["direction"], row["kind"]), (0, 0))
        assert row["comparisons"] == n
        assert row["confusion"] == (pytest.approx(100 * won / n) if n else None)
    assert sum(r["comparisons"] for r in rows if r["kind"] == "all") > 0
    # A model that scores every true pair above every other pair confuses nothing.
    perfect = positives.float()
    assert all(
        r["confusion"] in (0.0, None) for r in near_miss_confusion(perfect, perfect.t(), img2txt, positives, pairs)
    )


@pytest.fixture(scope="module")
def coco_like_run(tmp_path_factory):
    """A one-epoch run on a tiny ``coco-like`` world (near-miss families, one caption per training image)."""
    root = tmp_path_factory.mktemp("coco-like")
    run, world = root / "run", root / "world"
    proc = run_cli(
        "pretrain",
        "--recipe",
        "shapes-demo",
        "--run-dir",
        run,
        f"data.dataset={world}",
        "data.shapes.preset=coco-like",
        "data.shapes.images=80",
        "data.tokenizer_vocab_size=200",
        "pretrain.epochs=1",
        "pretrain.batch_size=16",
        "pretrain.composer.search_space_size=32",
        "pretrain.loader.num_workers=0",
        "pretrain.optim.warmup_steps=2",
        "pretrain.eval.split=null",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run, world


def test_evaluate_writes_near_misses_on_a_world_with_near_misses(coco_like_run):
    run, _ = coco_like_run
    proc = run_cli("evaluate", "retrieval", run, "--rerank", "--k", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Near misses on `test`" in proc.stderr
    result = json.loads((run / "results" / "near_misses.json").read_text())
    assert [(r["scoring"], r["direction"]) for r in result["rows"]] == [
        ("itc", "i2t"),
        ("itc", "t2i"),
        ("itc+itm@3", "i2t"),
        ("itc+itm@3", "t2i"),
    ]
    counts = result["meta"]["comparisons"]
    assert counts["t2i"]["all"] == sum(counts["t2i"][k] for k in NEAR_MISS_KINDS) > 0
    for row in result["rows"]:
        for kind in (*NEAR_MISS_KINDS, "all"):
            assert row[kind] is None if counts[row["direction"]][kind] == 0 else 0 <= row[kind] <= 100
    # The audit says how often the run's batches held a near miss of a row's scene.
    proc = run_cli("audit-false-negatives", run, "--judge", "oracle", "--negatives", "itm")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shares = json.loads((run / "audit" / "summary.json").read_text())["near_misses_in_batch"]
    assert [s["epoch"] for s in shares] == [0] and 0 <= shares[0]["share"] <= 1 and shares[0]["rows"] > 0


def test_pretrain_split_scores_the_pairs_the_run_trained_on_beside_the_test_split(coco_like_run):
    run, world = coco_like_run
    here = run.parent  # relative paths, as a user types them
    proc = run_cli("evaluate", "retrieval", "run", "--itc-only", cwd=here)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    test_result = (run / "results" / "retrieval.json").read_bytes()
    proc = run_cli("evaluate", "retrieval", "run", "--split", "pretrain", "--itc-only", cwd=here)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "results/retrieval_pretrain.md" in proc.stdout + proc.stderr
    assert (run / "results" / "retrieval.json").read_bytes() == test_result  # the test split's results stay
    assert (run / "results" / "near_misses_pretrain.json").exists()
    result = json.loads((run / "results" / "retrieval_pretrain.json").read_text())
    pairs = json.loads((world / "pretrain.json").read_text())
    meta, (row,) = result["meta"], result["rows"]
    assert meta["split"] == "pretrain" and meta["false_negatives"] == "oracle"
    assert 0 < meta["perfect_t2i_R@1"] <= 100 and 0 < meta["perfect_i2t_R@1"] <= 100  # what reading the captions allows
    assert (meta["images"], meta["texts"]) == (len({p["image"] for p in pairs}), len(pairs))
    for direction in ("i2t", "t2i"):  # every pair is a true match, so the oracle's R@1 is at least the standard one
        assert 0 <= row[f"{direction}_R@1"] <= row[f"oracle_{direction}_R@1"] <= 100
    # A cap draws that many images, the same ones every time, and keeps each image's pairs together.
    proc = run_cli(
        "evaluate",
        "retrieval",
        "run",
        "--split",
        "pretrain",
        "--itc-only",
        "--set",
        "evaluate.retrieval.pretrain_images=7",
        cwd=here,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((run / "results" / "retrieval_pretrain.json").read_text())["meta"]["images"] == 7
    # Without --split the next evaluation scores the test split again, not the pairs asked for last time.
    proc = run_cli("evaluate", "retrieval", "run", "--itc-only", cwd=here)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "results/retrieval.md" in proc.stdout + proc.stderr
    assert json.loads((run / "results" / "retrieval.json").read_text())["meta"]["split"] == "test"


def test_pretrain_retrieval_dataset_groups_pairs_by_image(coco_like_run):
    from falcon_cli.data.datasets import pretrain_retrieval_dataset
    from falcon_cli.data.retrieval import ids_from_entries
    from falcon_cli.data.spec import load_spec

    _, world = coco_like_run
    spec = load_spec(world)
    pairs = json.loads((world / "pretrain.json").read_text())
    full = pretrain_retrieval_dataset(spec, lambda image: image)
    assert len(full) == len({p["image"] for p in pairs}) and len(full.text) == len(pairs)
    for item, record in enumerate(full.records):  # each image holds exactly its pairs' captions and ids
        mine = [p for p in pairs if p["image"] == Path(record["image"]).relative_to(world).as_posix()]
        assert record["caption_ids"] == [p["caption_id"] for p in mine]
        assert {p["image_id"] for p in mine} == {record["image_id"]}
        assert [full.txt2img[t] for t in full.img2txt[item]] == [item] * len(mine)
    assert ids_from_entries(full.records) is not None
    some = pretrain_retrieval_dataset(spec, lambda image: image, max_images=5)
    again = pretrain_retrieval_dataset(spec, lambda image: image, max_images=5)
    assert len(some) == 5 and [r["image"] for r in some.records] == [r["image"] for r in again.records]
    order = [r["image"] for r in full.records]
    assert sorted(order.index(r["image"]) for r in some.records) == [order.index(r["image"]) for r in some.records]


def test_near_miss_share_counts_rows_whose_family_meets_again_in_their_batch():
    import pandas as pd

    from falcon_cli.audit.near_misses import near_miss_share

    family = np.array([0, 0, 1, 1, 2, 3, 3, 4])  # pair -> family
    log = pd.DataFrame(
        {
            "epoch": [0, 0, 0, 0, 0, 0, 1, 1, 1, 1],
            "step": [0, 0, 0, 1, 1, 1, 0, 0, 0, 0],
            "pair_id": [0, 1, 4, 2, 5, 7, 2, 3, 6, 5],
        }
    )
    share = near_miss_share(log, family)
    # epoch 0: step 0 holds pairs 0 and 1 (one family) and 4; step 1 holds families 1, 3, 4 once each -> 2 of 6.
    # epoch 1: one step with pairs 2, 3 (family 1) and 6, 5 (family 3) -> 4 of 4.
    assert share.to_dict(orient="records") == [
        {"epoch": 0, "share": pytest.approx(2 / 6), "rows": 6},
        {"epoch": 1, "share": 1.0, "rows": 4},
    ]
    assert near_miss_share(log.iloc[:0], family).empty
