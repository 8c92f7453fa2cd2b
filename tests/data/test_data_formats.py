"""Loaders of the ALBEF data formats: pretraining, Karpathy retrieval, VQA, NLVR2, transforms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image

from falcon_cli.data.datasets import (
    nlvr2_dataset,
    pretrain_dataset,
    retrieval_dataset,
    vqa_answer_list,
    vqa_dataset,
)
from falcon_cli.data.loading import load_source
from falcon_cli.data.pretrain import PRETRAIN_FORMAT
from falcon_cli.data.spec import load_spec
from falcon_cli.data.text import pre_caption
from falcon_cli.data.transforms import CLIP_MEAN, CLIP_STD, AlbefRandAugment, build_transform
from falcon_cli.data.vqa import answer_weights, vqa_collate
from falcon_cli.errors import FalconError

RES = 16
TEST_TF = build_transform("test", RES)


# ---------------------------------------------------------------- fixture builders


def png(path: Path, color=(255, 0, 0)) -> str:
    """Write an 8x8 PNG and return its name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), color).save(path)
    return path.name


def write_json(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj, indent=1), encoding="utf-8")
    return path


def make_spec(tmp_path: Path, **sections):
    spec = {"name": "tiny", "image_root": "images", **sections}
    (tmp_path / "dataset.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    return load_spec(tmp_path)


def images(tmp_path: Path, *names: str, root: str = "images") -> None:
    for name in names:
        png(tmp_path / root / name)


def error_of(fn, *args, **kwargs) -> str:
    with pytest.raises(FalconError) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message, "errors must be one line"
    return message


# ---------------------------------------------------------------- text


def test_pre_caption_normalises_like_albef():
    assert pre_caption("  A Red-Circle,  left of a BLUE/green square!! ") == "a red circle left of a blue green square"
    assert pre_caption('The <person> (smiling) said: "hi"; ok?') == "the person smiling said hi ok"
    assert pre_caption(" ".join(f"w{i}" for i in range(40))) == " ".join(f"w{i}" for i in range(30))
    assert pre_caption("one two three", max_words=2) == "one two"


# ---------------------------------------------------------------- pretraining


def test_pretrain_loads_pairs_with_global_pair_ids_and_extra_keys(tmp_path):
    images(tmp_path, "a.png", "b.png", "c.png")
    write_json(
        tmp_path / "p1.json",
        [
            {"image": "a.png", "caption": "A Red circle.", "image_id": 7, "caption_id": 70},
            {"image": "b.png", "caption": "a blue square"},
        ],
    )
    write_json(tmp_path / "p2.json", [{"image": str(tmp_path / "images" / "c.png"), "caption": "Three shapes!"}])
    ds = pretrain_dataset(make_spec(tmp_path, pretrain=["p1.json", "p2.json"]), TEST_TF)
    assert len(ds) == 3 and ds.pair_ids == [0, 1, 2]
    item = ds[0]
    assert item["caption"] == "a red circle" and item["pair_id"] == 0
    assert item["image"].shape == (3, RES, RES) and item["image"].dtype == torch.float32
    assert ds[2]["caption"] == "three shapes"  # absolute path used as is
    assert ds.records[0].extra == {"image_id": 7, "caption_id": 70}
    assert ds.dropped == 0 and [r.entries for r in ds.load_reports] == [2, 1]


def test_pretrain_caption_list_pick_is_seeded_and_varies_by_epoch(tmp_path):
    images(tmp_path, "a.png")
    options = [f"caption number {i}" for i in range(6)]
    write_json(tmp_path / "p.json", [{"image": "a.png", "caption": options}])
    spec = make_spec(tmp_path, pretrain=["p.json"])
    first = pretrain_dataset(spec, TEST_TF, seed=3)
    again = pretrain_dataset(spec, TEST_TF, seed=3)
    picks = []
    for epoch in range(12):
        first.set_epoch(epoch)
        again.set_epoch(epoch)
        pick = first.caption_for(first.records[0])
        assert pick == again.caption_for(again.records[0]) == first[0]["caption"]
        assert pick in options
        picks.append(pick)
    assert len(set(picks)) > 1, "different epochs should pick different captions"


def test_pretrain_missing_images_fail_by_default_with_count_and_paths(tmp_path):
    images(tmp_path, "a.png", "c.png")
    write_json(
        tmp_path / "pre.json",
        [
            {"image": "a.png", "caption": "x"},
            {"image": "gone1.png", "caption": "y"},
            {"image": "c.png", "caption": "z"},
            {"image": "gone2.png", "caption": "w"},
        ],
    )
    message = error_of(pretrain_dataset, make_spec(tmp_path, pretrain=["pre.json"]), TEST_TF)
    assert "pre.json" in message
    assert "2 of 4 images are missing" in message
    assert str(tmp_path / "images") in message
    assert "gone1.png, gone2.png" in message
    assert "on_missing=skip" in message


def test_pretrain_missing_images_skip_keeps_pair_ids_stable(tmp_path):
    images(tmp_path, "a.png", "c.png", "d.png")
    write_json(tmp_path / "p1.json", [{"image": "a.png", "caption": "x"}, {"image": "gone.png", "caption": "y"}])
    write_json(
        tmp_path / "p2.json",
        [{"image": "gone.png", "caption": "z"}, {"image": "c.png", "caption": "w"}, {"image": "d.png", "caption": "v"}],
    )
    spec = make_spec(tmp_path, pretrain=["p1.json", "p2.json"])
    ds = pretrain_dataset(spec, TEST_TF, on_missing="skip")
    assert ds.pair_ids == [0, 3, 4]
    assert [ds[i]["pair_id"] for i in range(len(ds))] == [0, 3, 4]
    assert ds.index_of(3) == 1
    assert ds.dropped == 2
    summary = ds.load_summary()
    assert summary["dropped"] == 2
    assert [(s["entries"], s["kept"], s["dropped"], s["missing_images"]) for s in summary["sources"]] == [
        (2, 1, 1, 1),
        (3, 2, 1, 1),
    ]
    assert summary["sources"][0]["first_missing"] == ["gone.png"]
    json.dumps(summary)  # manifest-ready
    # the spec's policy applies when no argument is given; the argument overrides it
    spec_skip = make_spec(tmp_path, pretrain=["p1.json", "p2.json"], on_missing="skip")
    assert pretrain_dataset(spec_skip, TEST_TF).pair_ids == [0, 3, 4]
    with pytest.raises(FalconError, match="missing"):
        pretrain_dataset(spec_skip, TEST_TF, on_missing="fail")


# ---------------------------------------------------------------- retrieval


def test_retrieval_train_maps_image_ids_to_contiguous_index(tmp_path):
    images(tmp_path, "a.png", "b.png", root="coco")
    write_json(
        tmp_path / "train.json",
        [
            {"image": "b.png", "caption": "B one", "image_id": "coco_42"},
            {"image": "a.png", "caption": "A one", "image_id": 9},
            {"image": "b.png", "caption": "B two", "image_id": "coco_42"},
        ],
    )
    spec = make_spec(tmp_path, retrieval={"train": "train.json", "image_root": "coco"})
    ds = retrieval_dataset(spec, "train", TEST_TF)
    assert ds.img_ids == {"coco_42": 0, 9: 1}
    assert [ds[i]["image_idx"] for i in range(3)] == [0, 1, 0]
    assert ds[2]["caption"] == "b two" and ds[2]["index"] == 2
    assert ds[0]["image"].shape == (3, RES, RES)


def test_retrieval_eval_builds_text_img2txt_txt2img(tmp_path):
    images(tmp_path, "a.png", "b.png", "c.png")
    write_json(
        tmp_path / "test.json",
        [
            {"image": "a.png", "caption": ["A one.", "A two"], "image_id": 1, "caption_ids": [10, 11]},
            {"image": "b.png", "caption": ["B one", "B two", "B three"]},
            {"image": "c.png", "caption": "C only"},
        ],
    )
    ds = retrieval_dataset(make_spec(tmp_path, retrieval={"test": "test.json"}), "test", TEST_TF)
    assert ds.text == ["a one", "a two", "b one", "b two", "b three", "c only"]
    assert ds.img2txt == {0: [0, 1], 1: [2, 3, 4], 2: [5]}
    assert ds.txt2img == {0: 0, 1: 0, 2: 1, 3: 1, 4: 1, 5: 2}
    assert ds.records[0]["image_id"] == 1 and ds.records[0]["caption_ids"] == [10, 11]
    assert len(ds) == 3 and ds[1]["index"] == 1 and ds[1]["image"].shape == (3, RES, RES)


def test_retrieval_eval_skip_rebuilds_indices(tmp_path):
    images(tmp_path, "a.png", "c.png")
    write_json(
        tmp_path / "val.json",
        [
            {"image": "a.png", "caption": ["a1", "a2"]},
            {"image": "gone.png", "caption": ["b1"]},
            {"image": "c.png", "caption": ["c1", "c2"]},
        ],
    )
    ds = retrieval_dataset(make_spec(tmp_path, retrieval={"val": "val.json"}), "val", TEST_TF, on_missing="skip")
    assert ds.text == ["a1", "a2", "c1", "c2"]
    assert ds.img2txt == {0: [0, 1], 1: [2, 3]}
    assert ds.txt2img == {0: 0, 1: 0, 2: 1, 3: 1}
    assert ds.indices == [0, 2] and ds.dropped == 1


# ---------------------------------------------------------------- VQA


def test_vqa_answer_weights_match_albef():
    answers = ["yes"] * 7 + ["no"] * 2 + ["maybe"]
    assert answer_weights(answers, "vqa") == (["yes", "no", "maybe"], [0.7, 0.2, 0.1])
    assert answer_weights("two", "vqa") == (["two"], [1.0])
    assert answer_weights("two", "vg") == (["two"], [0.5])
    assert answer_weights(["red", "red", "blue"], "vg") == (["red", "blue"], [0.5, 0.5])


def test_vqa_train_test_and_answer_list(tmp_path):
    images(tmp_path, "coco1.png", root="coco")
    images(tmp_path, "vg1.png", root="vg")
    write_json(
        tmp_path / "vqa_train.json",
        [
            {
                "question_id": 1,
                "question": "What Color is it?",
                "answer": ["red"] * 3 + ["pink"],
                "image": "coco1.png",
                "dataset": "vqa",
            },
        ],
    )
    write_json(
        tmp_path / "vg_qa.json",
        [
            {
                "question_id": "vg_5",
                "question": "How many shapes?",
                "answer": "three",
                "image": "vg1.png",
                "dataset": "vg",
            },
        ],
    )
    write_json(
        tmp_path / "vqa_test.json",
        [{"question_id": 9, "question": "is it red", "image": "coco1.png", "dataset": "vqa", "note": "kept"}],
    )
    write_json(tmp_path / "answers.json", ["red", "pink", "three"])
    spec = make_spec(
        tmp_path,
        vqa={
            "train": ["vqa_train.json", "vg_qa.json"],
            "test": "vqa_test.json",
            "answer_list": "answers.json",
            "image_root": "coco",
            "vg_image_root": "vg",
        },
    )
    train = vqa_dataset(spec, "train", TEST_TF, eos="[SEP]")
    assert len(train) == 2
    first, second = train[0], train[1]
    assert first["question"] == "what color is it" and first["question_id"] == 1
    assert first["answers"] == ["red[SEP]", "pink[SEP]"] and first["weights"] == [0.75, 0.25]
    assert second["answers"] == ["three[SEP]"] and second["weights"] == [0.5]
    assert train.records[1].image == tmp_path / "vg" / "vg1.png"  # dataset: vg uses vg_image_root
    batch = vqa_collate([first, second])
    assert batch["image"].shape == (2, 3, RES, RES)
    assert batch["answers"] == ["red[SEP]", "pink[SEP]", "three[SEP]"] and batch["n"] == [2, 1]
    assert torch.allclose(batch["weights"], torch.tensor([0.75, 0.25, 0.5]))

    test = vqa_dataset(spec, "test", TEST_TF)
    item = test[0]
    assert "answers" not in item and item["question_id"] == 9 and test.records[0].extra == {"note": "kept"}
    assert "answers" not in vqa_collate([item])
    assert vqa_answer_list(spec) == ["red", "pink", "three"]


# ---------------------------------------------------------------- NLVR2


def test_nlvr2_loads_pairs_and_labels(tmp_path):
    images(tmp_path, "l.png", "r.png", root="nlvr")
    write_json(
        tmp_path / "dev.json",
        [
            {
                "images": ["l.png", "r.png"],
                "sentence": "The left image has a Dog.",
                "label": "True",
                "identifier": "d-0",
            },
            {"images": ["r.png", "l.png"], "sentence": "no dogs", "label": "False"},
        ],
    )
    ds = nlvr2_dataset(make_spec(tmp_path, nlvr2={"dev": "dev.json", "image_root": "nlvr"}), "dev", TEST_TF)
    a, b = ds[0], ds[1]
    assert (a["label"], b["label"]) == (1, 0)
    assert a["sentence"] == "the left image has a dog"
    assert a["image0"].shape == a["image1"].shape == (3, RES, RES)
    assert ds.images[1] == (tmp_path / "nlvr" / "r.png", tmp_path / "nlvr" / "l.png")
    batch = torch.utils.data.default_collate([a, b])
    assert batch["label"].tolist() == [1, 0]


# ---------------------------------------------------------------- errors


def test_malformed_json_names_file_line_and_column(tmp_path):
    (tmp_path / "broken.json").write_text(
        '[\n  {"image": "a.png", "caption": "x"},\n  {"image": "b.png" "caption": "y"}\n]\n', encoding="utf-8"
    )
    message = error_of(pretrain_dataset, make_spec(tmp_path, pretrain=["broken.json"]), TEST_TF)
    assert "broken.json" in message and "line 3 column 21" in message and "invalid JSON" in message


def test_wrong_top_level_type_and_missing_file(tmp_path):
    write_json(tmp_path / "obj.json", {"image": "a.png", "caption": "x"})
    message = error_of(pretrain_dataset, make_spec(tmp_path, pretrain=["obj.json"]), TEST_TF)
    assert "obj.json" in message and "top level must be a JSON list" in message and "got object" in message
    message = error_of(pretrain_dataset, make_spec(tmp_path, pretrain=["nope.json"]), TEST_TF)
    assert "nope.json" in message and "not found" in message


@pytest.mark.parametrize(
    "entries, expected",
    [
        ([{"image": "a.png", "caption": "x"}, {"image": "a.png"}], ["entry 1", "missing required key 'caption'"]),
        ([{"image": 5, "caption": "x"}], ["entry 0", "key 'image'", "non-empty string", "got number"]),
        (
            [
                {"image": "a.png", "caption": "x"},
                {"image": "a.png", "caption": "x"},
                {"image": "a.png", "caption": "  "},
            ],
            ["entry 2", "key 'caption'", "got an empty string"],
        ),
        ([{"image": "a.png", "caption": ["fine", 3]}], ["entry 0", "key 'caption'", "item 1", "got number"]),
        ([{"image": "a.png", "caption": []}], ["entry 0", "key 'caption'", "empty list"]),
        (["a.png"], ["entry 0", "must be a JSON object", "got string"]),
    ],
)
def test_bad_pretrain_entries_name_file_entry_and_key(tmp_path, entries, expected):
    images(tmp_path, "a.png")
    write_json(tmp_path / "bad.json", entries)
    message = error_of(pretrain_dataset, make_spec(tmp_path, pretrain=["bad.json"]), TEST_TF)
    assert "bad.json" in message
    for part in expected:
        assert part in message


def test_bad_entries_of_other_formats(tmp_path):
    images(tmp_path, "a.png")
    write_json(
        tmp_path / "nlvr.json",
        [
            {"images": ["a.png", "a.png"], "sentence": "ok", "label": "True"},
            {"images": ["a.png", "a.png"], "sentence": "ok", "label": "yes"},
        ],
    )
    write_json(tmp_path / "nlvr_one.json", [{"images": ["a.png"], "sentence": "ok", "label": "False"}])
    write_json(tmp_path / "vqa.json", [{"question_id": 1, "question": "q", "answer": 3, "image": "a.png"}])
    write_json(tmp_path / "vqa_noans.json", [{"question_id": 1, "question": "q", "image": "a.png"}])
    write_json(tmp_path / "rtrain.json", [{"image": "a.png", "caption": ["x", "y"], "image_id": 1}])
    write_json(tmp_path / "answers.json", ["yes", 4])
    spec = make_spec(
        tmp_path,
        nlvr2={"train": "nlvr.json", "dev": "nlvr_one.json"},
        vqa={"train": "vqa.json", "val": "vqa_noans.json", "test": "vqa_noans.json", "answer_list": "answers.json"},
        retrieval={"train": "rtrain.json"},
    )
    message = error_of(nlvr2_dataset, spec, "train", TEST_TF)
    assert "nlvr.json" in message and "entry 1" in message and "key 'label'" in message
    assert "'True', 'False'" in message and "'yes'" in message
    message = error_of(nlvr2_dataset, spec, "dev", TEST_TF)
    assert "nlvr_one.json" in message and "key 'images'" in message and "a list of 1" in message
    message = error_of(vqa_dataset, spec, "train", TEST_TF)
    assert "vqa.json" in message and "entry 0" in message and "key 'answer'" in message and "got number" in message
    message = error_of(vqa_dataset, spec, "val", TEST_TF)
    assert "vqa_noans.json" in message and "missing required key 'answer'" in message
    assert len(vqa_dataset(spec, "test", TEST_TF)) == 1  # test questions need no answers
    message = error_of(retrieval_dataset, spec, "train", TEST_TF)
    assert "rtrain.json" in message and "key 'caption'" in message and "got list" in message
    message = error_of(vqa_answer_list, spec)
    assert "answers.json" in message and "entry 1" in message


def test_error_counts_further_problems_and_unconfigured_splits(tmp_path):
    write_json(tmp_path / "bad.json", [{"image": "a.png"}, {"image": "b.png"}, {"caption": "x"}])
    message = error_of(load_source, tmp_path / "bad.json", PRETRAIN_FORMAT, tmp_path)
    assert "entry 0" in message and "2 more problems" in message
    spec = make_spec(tmp_path, retrieval={"train": "bad.json"})
    message = error_of(retrieval_dataset, spec, "test", TEST_TF)
    assert "dataset.yaml" in message and "retrieval.test" in message
    message = error_of(nlvr2_dataset, spec, "val", TEST_TF)
    assert "dev" in message


# ---------------------------------------------------------------- transforms


def test_transforms_output_shapes_and_normalisation():
    img = Image.new("RGB", (8, 8), (128, 64, 255))
    for kind in ("pretrain", "finetune", "test"):
        out = build_transform(kind, 32)(img)
        assert out.shape == (3, 32, 32) and out.dtype == torch.float32
    out = build_transform("test", 32)(img)
    expected = [(v / 255 - m) / s for v, m, s in zip((128, 64, 255), CLIP_MEAN, CLIP_STD)]
    assert torch.allclose(out[:, 5, 5], torch.tensor(expected), atol=1e-4)


def test_transform_composition_follows_albef():
    from torchvision import transforms as T

    pretrain = build_transform("pretrain", 64).transforms
    crop = pretrain[0]
    assert isinstance(crop, T.RandomResizedCrop) and crop.scale == (0.2, 1.0)
    assert crop.interpolation == T.InterpolationMode.BICUBIC
    assert any(isinstance(t, T.RandomHorizontalFlip) for t in pretrain)
    augment = next(t for t in pretrain if isinstance(t, AlbefRandAugment))
    assert (augment.num_ops, augment.magnitude) == (2, 7)
    assert build_transform("finetune", 64).transforms[0].scale == (0.5, 1.0)
    no_flip = build_transform("pretrain", 64, hflip=False).transforms
    assert not any(isinstance(t, T.RandomHorizontalFlip) for t in no_flip)
    test = build_transform("test", 64).transforms
    assert isinstance(test[0], T.Resize) and test[0].size == (64, 64)
    with pytest.raises(FalconError, match="unknown transform kind"):
        build_transform("train", 64)


def test_albef_randaugment_ops_keep_colours():
    img = Image.new("RGB", (32, 32), (200, 30, 30))
    augment = AlbefRandAugment(2, 7)
    for op in AlbefRandAugment.OPS:
        out = augment.apply(img, op)
        assert out.size == img.size and out.mode == "RGB"
        r, g, b = out.getpixel((16, 16))
        assert r > g + 100 and r > b + 100, f"{op} changed the colour: {(r, g, b)}"
    torch.manual_seed(0)
    for _ in range(20):
        assert augment(img).size == (32, 32)


def test_pretrain_augmentation_is_per_item_deterministic(tmp_path):
    """Same (seed, epoch, pair_id) -> same augmented tensor, whatever was drawn before; next epoch differs."""
    import torch
    from PIL import Image

    from falcon_cli.data.pretrain import PretrainDataset, PretrainRecord
    from falcon_cli.data.transforms import build_transform

    path = tmp_path / "img.png"
    Image.fromarray((torch.rand(32, 32, 3) * 255).to(torch.uint8).numpy()).save(path)
    records = [PretrainRecord(pair_id=i, image=path, captions=("a red circle",)) for i in range(3)]
    data = PretrainDataset(records, build_transform("pretrain", 24), seed=1)
    first = data[1]["image"]
    torch.rand(100)  # unrelated draws from the global RNG must not matter
    data[0], data[2]
    assert torch.equal(data[1]["image"], first)
    assert not torch.equal(data[0]["image"], first), "different pairs get different augmentations"
    data.set_epoch(1)
    assert not torch.equal(data[1]["image"], first), "a new epoch gets a new augmentation"
