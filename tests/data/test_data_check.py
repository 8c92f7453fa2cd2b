"""``check_dataset``: counts every kind of data problem per file and never raises on them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from PIL import Image
from rich.console import Console

import falcon_cli.data.images as images_module
from falcon_cli.data.check import check_dataset
from falcon_cli.data.spec import load_spec


def png(path: Path, color=(0, 0, 255)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), color).save(path)


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj), encoding="utf-8")


def make_spec(tmp_path: Path, **sections):
    (tmp_path / "dataset.yaml").write_text(
        yaml.safe_dump({"name": "tiny", "image_root": "images", **sections}), encoding="utf-8"
    )
    return load_spec(tmp_path)


@pytest.fixture()
def messy(tmp_path):
    """A spec whose files hold one or more of every problem check_dataset counts."""
    img = tmp_path / "images"
    for name in ("a.png", "b.png", "c.png"):
        png(img / name)
    (img / "garbage.png").write_bytes(b"this is not a png at all" * 10)
    write_json(
        tmp_path / "pretrain.json",
        [
            {"image": "a.png", "caption": "a blue square"},
            {"image": "a.png", "caption": "a blue square"},  # duplicate pair
            {"image": "b.png", "caption": ""},  # empty caption
            {"image": "missing1.png", "caption": "x"},  # missing image
            {"image": "garbage.png", "caption": 42},  # unreadable image + non-string caption
            {"image": "c.png"},  # missing key
            {"image": "missing2.png", "caption": ["ok", "fine"]},  # missing image
        ],
    )
    write_json(
        tmp_path / "ret_test.json",
        [
            {"image": "a.png", "caption": ["one", "two"], "image_id": 1},
            {"image": "b.png", "caption": ["three"], "image_id": 1},  # duplicate image_id
            {"image": "a.png", "caption": ["four"], "image_id": 2},
        ],
    )
    write_json(
        tmp_path / "vqa_train.json",
        [
            {"question_id": 1, "question": "what colour", "answer": ["blue"] * 3, "image": "a.png", "dataset": "vqa"},
            {"question_id": 1, "question": "again", "answer": "blue", "image": "a.png", "dataset": "vqa"},  # dup id
            {"question_id": 2, "question": "shape", "answer": 7, "image": "b.png", "dataset": "vqa"},  # bad answer
            {"question_id": 3, "question": "vg q", "answer": "x", "image": "v.png", "dataset": "vg"},
        ],
    )
    png(tmp_path / "vg" / "v.png")
    write_json(tmp_path / "answers.json", ["blue", "blue", ""])
    write_json(
        tmp_path / "nlvr_dev.json",
        [
            {"images": ["a.png", "b.png"], "sentence": "s", "label": "True", "identifier": "x-0"},
            {"images": ["a.png", "missing3.png"], "sentence": "s", "label": "maybe", "identifier": "x-0"},
            {"images": ["a.png", "b.png"], "sentence": " ", "label": "False", "identifier": "x-1"},
        ],
    )
    (tmp_path / "broken.json").write_text('[\n{"image": "a.png",\n "caption": "x",,}\n]', encoding="utf-8")
    return make_spec(
        tmp_path,
        pretrain=["pretrain.json", "broken.json", "absent.json"],
        retrieval={"test": "ret_test.json"},
        vqa={"train": "vqa_train.json", "answer_list": "answers.json", "vg_image_root": "vg"},
        nlvr2={"dev": "nlvr_dev.json"},
    )


def by_label(report):
    return {s.label: s for s in report.sources}


def test_check_counts_every_problem(messy):
    report = check_dataset(messy)
    sources = by_label(report)
    assert list(sources) == [
        "pretrain/train[0]",
        "pretrain/train[1]",
        "pretrain/train[2]",
        "retrieval/test",
        "vqa/train",
        "vqa/answer_list",
        "nlvr2/dev",
    ]
    pre = sources["pretrain/train[0]"]
    assert (pre.entries, pre.images, pre.images_found, pre.images_missing, pre.images_unreadable) == (7, 6, 3, 2, 1)
    assert pre.entries_missing_images == 2
    assert (pre.empty_captions, pre.malformed, pre.duplicates, pre.bad_labels) == (2, 1, 1, 0)
    assert pre.first_missing == ["missing1.png", "missing2.png"] and pre.first_unreadable == ["garbage.png"]

    ret = sources["retrieval/test"]
    assert (ret.entries, ret.images, ret.images_found, ret.duplicates) == (3, 2, 2, 1)

    vqa = sources["vqa/train"]
    assert (vqa.entries, vqa.duplicates, vqa.bad_labels, vqa.images, vqa.images_found, vqa.images_missing) == (
        4,
        1,
        1,
        3,
        3,
        0,
    )  # the vg entry is found under vg_image_root

    answers = sources["vqa/answer_list"]
    assert (answers.entries, answers.malformed, answers.duplicates) == (3, 1, 1)

    nlvr = sources["nlvr2/dev"]
    assert (nlvr.entries, nlvr.bad_labels, nlvr.empty_captions, nlvr.duplicates) == (3, 1, 1, 1)
    assert (nlvr.images, nlvr.images_found, nlvr.images_missing) == (3, 2, 1)

    broken, absent = sources["pretrain/train[1]"], sources["pretrain/train[2]"]
    assert "broken.json" in broken.error and "line 3 column" in broken.error and broken.entries == 0
    assert "absent.json" in absent.error and "not found" in absent.error
    assert not report.ok


def test_check_problems_are_one_line_and_name_files(messy):
    report = check_dataset(messy)
    problems = report.problems
    assert all("\n" not in line for line in problems + report.warnings)

    def find(*parts):
        hits = [p for p in problems if all(part in p for part in parts)]
        assert hits, f"no problem mentions {parts}: {problems}"

    find("pretrain.json", "2 of 6 images are missing", "missing1.png, missing2.png")
    find("pretrain.json", "1 of 6 images cannot be decoded", "garbage.png")
    find("pretrain.json", "2 entries with an empty or non-string caption", "entry 2", "key 'caption'")
    find("pretrain.json", "1 entry malformed", "entry 5", "missing required key 'caption'")
    find("vqa_train.json", "1 entry with a bad label", "entry 2", "key 'answer'")
    find("nlvr_dev.json", "1 entry with a bad label", "entry 1", "'maybe'")
    find("nlvr_dev.json", "1 of 3 images are missing", "missing3.png")
    find("answers.json", "1 entry not a non-empty string", "entry 2")
    find("broken.json", "line 3 column")
    find("absent.json", "not found")
    warnings = report.warnings
    assert any("pretrain.json" in w and "1 duplicate (image, caption) pairs" in w for w in warnings)
    assert any("vqa_train.json" in w and "question_id" in w and "entry 1 repeats entry 0" in w for w in warnings)
    assert any("ret_test.json" in w and "image_id" in w for w in warnings)
    assert any("nlvr_dev.json" in w and "identifier" in w for w in warnings)


def test_check_report_serialises_and_renders(messy):
    report = check_dataset(messy)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["ok"] is False and data["name"] == "tiny" and len(data["sources"]) == 7
    assert data["sources"][0]["images_unreadable"] == 1 and data["problems"] == report.problems
    console = Console(record=True, width=250)
    report.render(console)
    text = console.export_text()
    for part in ("pretrain/train[0]", "nlvr2/dev", "missing", "unreadable", "problem:", "warning:", "garbage.png"):
        assert part in text


def test_check_without_verification_counts_garbage_as_found(messy):
    pre = by_label(check_dataset(messy, verify_images=False))["pretrain/train[0]"]
    assert pre.images_unreadable is None
    assert (pre.images_found, pre.images_missing) == (4, 2)


def test_check_probes_each_distinct_image_once(messy, monkeypatch):
    calls: list[Path] = []
    real = images_module.probe_image

    def counting(path, verify=True):
        calls.append(path)
        return real(path, verify)

    monkeypatch.setattr(images_module, "probe_image", counting)
    check_dataset(messy)
    assert len(calls) == len(set(calls))
    # distinct over all files: a b c garbage missing1 missing2 (pretrain), vg/v (vqa), missing3 (nlvr2)
    assert len(calls) == 8
    assert Path(messy.base_dir / "images" / "a.png") in calls


def test_clean_dataset_is_ok(tmp_path):
    png(tmp_path / "images" / "a.png")
    png(tmp_path / "images" / "b.png")
    write_json(tmp_path / "p.json", [{"image": "a.png", "caption": "x"}, {"image": "b.png", "caption": ["y", "z"]}])
    report = check_dataset(make_spec(tmp_path, pretrain=["p.json"]))
    assert report.ok and report.problems == [] and report.warnings == []
    (src,) = report.sources
    assert (src.entries, src.images, src.images_found, src.images_missing, src.images_unreadable) == (2, 2, 2, 0, 0)


def test_spec_without_files_is_a_problem(tmp_path):
    report = check_dataset(make_spec(tmp_path))
    assert not report.ok and "names no annotation files" in report.problems[0]


def test_missing_images_are_warnings_under_on_missing_skip(messy):
    messy.on_missing = "skip"
    report = check_dataset(messy)
    pre = by_label(report)["pretrain/train[0]"]
    assert (pre.images_missing, pre.entries_missing_images) == (2, 2)
    assert not any("are missing" in p for p in report.problems)
    assert any(
        "pretrain.json" in w and "2 of 6 images are missing" in w and "drops the 2 entries" in w
        for w in report.warnings
    )
    assert any("cannot be decoded" in p for p in report.problems)  # unreadable images still fail


def test_clean_but_missing_dataset_is_ok_under_skip(tmp_path):
    png(tmp_path / "images" / "a.png")
    write_json(tmp_path / "p.json", [{"image": "a.png", "caption": "x"}, {"image": "gone.png", "caption": "y"}])
    spec = make_spec(tmp_path, pretrain=["p.json"])
    assert not check_dataset(spec).ok
    spec.on_missing = "skip"
    report = check_dataset(spec)
    assert report.ok and len(report.warnings) == 1 and "drops the 1 entry" in report.warnings[0]


def scrambled_png(path: Path) -> None:
    """A PNG whose IDAT bytes are scrambled but whose chunk CRCs are recomputed (so PIL ``verify()`` passes)."""
    import io
    import struct
    import zlib

    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 30, 30)).save(buffer, format="PNG")
    data, out, pos = buffer.getvalue(), bytearray(buffer.getvalue()[:8]), 8
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], bytearray(data[pos + 8 : pos + 8 + length])
        if kind == b"IDAT":
            body[2:] = bytes(b ^ 0x5A for b in body[2:])  # keep the zlib header, scramble the stream
        out += struct.pack(">I", length) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
        pos += 12 + length
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(out))


def test_check_decodes_images_fully(cli, tmp_path):
    world = tmp_path / "w"
    cli("data", "shapes", "--out", world, "--images", 40, check=True)
    first = json.loads((world / "pretrain.json").read_text())[0]["image"]
    scrambled_png(world / first)
    with Image.open(world / first) as img:
        img.verify()  # the checksums are valid: only decoding finds the damage
    proc = cli("data", "check", world)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    error = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr and len(error) == 1 and error[0].startswith("error:")
    assert "cannot be decoded" in error[0] and first.split("/")[-1] in error[0] and "re-download or remove" in error[0]
