"""COCO ids for ECCV Caption / CxC: mapping ALBEF's Karpathy test entries (paths and caption texts)
to COCO image and caption ids through captions_val2014.json, and what the evaluate stage says and
records when the false-negative-aware metrics cannot be computed."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from falcon_cli.config.schema import RetrievalEvalConfig
from falcon_cli.data.retrieval import caption_match_key, ids_from_coco_captions, ids_from_entries, split_ids
from falcon_cli.errors import FalconError


def coco_image(image_id: int) -> dict:
    return {"id": image_id, "file_name": f"COCO_val2014_{image_id:012d}.jpg", "height": 480, "width": 640}


def karpathy_entry(image_id: int, captions: list[str]) -> dict:
    """An entry as ALBEF's coco_karpathy_test.json has it: a path and caption texts, no ids."""
    return {"image": f"val2014/COCO_val2014_{image_id:012d}.jpg", "caption": captions}


@pytest.fixture
def tiny(tmp_path):
    """Three Karpathy test images; COCO's file knows two of them, one caption of those is not COCO's."""
    annotations = [
        {"id": 11, "image_id": 1, "caption": "A man riding a horse.\n"},
        {"id": 12, "image_id": 1, "caption": "a  man on a horse"},
        {"id": 13, "image_id": 1, "caption": "A man on a horse"},  # the same text as 12: used in file order
        {"id": 21, "image_id": 2, "caption": "Two dogs play in the snow."},
        {"id": 22, "image_id": 2, "caption": "Dogs in snow"},
        {"id": 99, "image_id": 9, "caption": "An image the split does not use."},
    ]
    coco = {"info": {}, "images": [coco_image(1), coco_image(2), coco_image(9)], "annotations": annotations}
    captions_file = tmp_path / "captions_val2014.json"
    captions_file.write_text(json.dumps(coco))
    records = [
        karpathy_entry(1, ["A man riding a horse. ", "A man on a horse", "a man  on a HORSE."]),
        karpathy_entry(2, ["Two dogs play in the snow", "Cats in snow"]),  # the second is no COCO caption of image 2
        karpathy_entry(3, ["Not in COCO's file."]),
    ]
    (tmp_path / "coco_karpathy_test.json").write_text(json.dumps(records))
    return records, captions_file


def test_caption_match_key():
    assert caption_match_key("A man  riding\ta horse. \n") == "a man riding a horse"
    assert caption_match_key("Dogs...") == "dogs"
    assert caption_match_key("U.S. flag") == "u.s. flag"  # only trailing periods go


def test_mapping_counts_and_ids(tiny):
    records, captions_file = tiny
    ids = ids_from_coco_captions(records, captions_file)
    assert ids.image_ids == [1, 2, None]
    # Whitespace, case and the trailing period are ignored; equal texts take the ids in file order.
    assert ids.caption_ids == [11, 12, 13, 21, None, None]
    assert (ids.images_matched, ids.captions_matched, ids.complete) == (2, 4, False)
    assert ids.counts() == {
        "source": str(captions_file),
        "images_matched": 2,
        "images": 3,
        "captions_matched": 4,
        "captions": 6,
    }
    assert ids.summary() == "2 of 3 images and 4 of 6 captions"
    assert ids.first_unmatched == "caption 'Cats in snow' of val2014/COCO_val2014_000000000002.jpg"
    complete = ids_from_coco_captions(records[:1], captions_file)
    assert complete.complete and complete.caption_ids == [11, 12, 13]
    assert (
        ids_from_coco_captions(records[2:], captions_file).first_unmatched
        == "image val2014/COCO_val2014_000000000003.jpg (not in the file)"
    )


def test_ids_from_entries_and_precedence(tiny):
    records, captions_file = tiny
    assert ids_from_entries(records) is None and split_ids(records, None) is None
    with_ids = [{**records[0], "image_id": 5, "caption_ids": [50, 51, 52]}]
    ids = ids_from_entries(with_ids)
    assert (ids.image_ids, ids.caption_ids, ids.source, ids.complete) == ([5], [50, 51, 52], "entries", True)
    assert split_ids(with_ids, captions_file).caption_ids == [11, 12, 13]  # the file, when set, wins
    with pytest.raises(FalconError, match="entry 0 .*caption_ids must list one id per caption"):
        ids_from_entries([{**records[0], "image_id": 5, "caption_ids": [50]}])


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "evaluate.retrieval.coco_captions: .*file not found.*captions_val2014.json"),
        ("{not json", "line 1 column 2: invalid JSON"),
        ("[]", "needs an object with `images` and `annotations` lists, got list"),
        ('{"images": []}', "needs an object with `images` and `annotations` lists, got keys \\['images'\\]"),
        ('{"images": [{"id": 1}], "annotations": []}', "images\\[0\\] needs an integer `id` and a string `file_name`"),
        ('{"images": [], "annotations": [{"id": 1, "image_id": 2}]}', "annotations\\[0\\] needs .* a string `caption`"),
    ],
)
def test_bad_captions_file_is_one_line(tmp_path, content, message):
    path = tmp_path / "captions.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(FalconError, match=message) as info:
        ids_from_coco_captions([karpathy_entry(1, ["x"])], path)
    assert "\n" not in str(info.value)


# --- the evaluate stage ----------------------------------------------------------------------------


class FakeSplit:
    """What the stage reads of a RetrievalEvalDataset: entries, texts and the image <-> text maps."""

    def __init__(self, records: list[dict]):
        self.records = records
        self.text, self.img2txt, self.txt2img = [], {}, {}
        for i, rec in enumerate(records):
            self.img2txt[i] = []
            for caption in rec["caption"]:
                self.img2txt[i].append(len(self.text))
                self.txt2img[len(self.text)] = i
                self.text.append(caption)

    def __len__(self) -> int:
        return len(self.records)


def context(**retrieval) -> SimpleNamespace:
    return SimpleNamespace(
        e=SimpleNamespace(retrieval=RetrievalEvalConfig(**retrieval)),
        spec=SimpleNamespace(shapes_world=None, name="coco"),
    )


def coco_5k(tmp_path, drop_caption: bool = False):
    """A fake Karpathy 5K test split (5 captions per image, no ids) and its captions_val2014.json."""
    records = [karpathy_entry(i, [f"Caption {j} of image {i}." for j in range(5)]) for i in range(1, 5001)]
    annotations = [
        {"id": 10 * i + j, "image_id": i, "caption": f"caption {j} of image {i}"}
        for i in range(1, 5001)
        for j in range(5)
        if not (drop_caption and (i, j) == (4321, 2))
    ]
    path = tmp_path / "captions_val2014.json"
    path.write_text(json.dumps({"images": [coco_image(i) for i in range(1, 5001)], "annotations": annotations}))
    return FakeSplit(records), path


def test_auto_without_ids_says_why_it_skips(tmp_path, capsys):
    from stages.evaluate import false_negative_truth

    split, _ = coco_5k(tmp_path)
    kind, metrics, meta = false_negative_truth(context(), split)
    assert kind == "none" and metrics is None
    assert meta["false_negatives_skipped"].startswith(
        "ECCV Caption, CxC and COCO 1K/5K metrics skipped: the test split's entries have no image_id and caption_ids"
    )
    assert "evaluate.retrieval.coco_captions is not set" in meta["false_negatives_skipped"]
    assert "metrics skipped" in capsys.readouterr().err
    with pytest.raises(FalconError, match="false_negatives=eccv: the test split's entries have no image_id"):
        false_negative_truth(context(false_negatives="eccv"), split)
    assert false_negative_truth(context(false_negatives="none"), split) == ("none", None, {})  # asked for: no note


def test_auto_with_a_partial_match_skips_and_records_the_counts(tmp_path, capsys):
    from stages.evaluate import false_negative_truth

    split, captions_file = coco_5k(tmp_path, drop_caption=True)
    kind, metrics, meta = false_negative_truth(context(coco_captions=captions_file), split)
    assert kind == "none" and metrics is None
    assert meta["coco_ids"] == {
        "source": str(captions_file),
        "images_matched": 5000,
        "images": 5000,
        "captions_matched": 24999,
        "captions": 25000,
    }
    assert (
        "only 5,000 of 5,000 images and 24,999 of 25,000 captions of the test split matched"
        in meta["false_negatives_skipped"]
    )
    assert "'Caption 2 of image 4321.'" in meta["false_negatives_skipped"]
    err = capsys.readouterr().err
    assert "24,999 of 25,000 captions of the test split matched" in err and "metrics skipped" in err
    with pytest.raises(FalconError, match="false_negatives=eccv: only 5,000 of 5,000 images"):
        false_negative_truth(context(false_negatives="eccv", coco_captions=captions_file), split)


def test_a_split_that_is_not_coco_5k_says_so(tmp_path):
    from stages.evaluate import false_negative_truth

    split = FakeSplit([karpathy_entry(i, ["a caption"]) for i in range(1000)])
    kind, _, meta = false_negative_truth(context(), split)
    assert kind == "none" and "the test split has 1,000 images" in meta["false_negatives_skipped"]


def test_auto_with_a_full_match_computes_eccv_on_the_mapped_ids(tmp_path, monkeypatch):
    pytest.importorskip("eccv_caption")
    import warnings

    import eccv_caption
    import torch

    from falcon_cli.evaluation import eccv
    from stages.evaluate import false_negative_truth

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        truth = eccv_caption.Metrics().coco_gts["i2t"]  # the package's COCO 5K: image id -> its 5 caption ids
    records = [karpathy_entry(int(i), [f"Caption {c} of image {i}. " for c in caps]) for i, caps in truth.items()]
    annotations = [
        {"id": int(c), "image_id": int(i), "caption": f"caption {c}  of image {i}"}
        for i, caps in truth.items()
        for c in reversed(caps)
    ]  # file order differs from the split's
    path = tmp_path / "captions_val2014.json"
    path.write_text(json.dumps({"images": [coco_image(int(i)) for i in truth], "annotations": annotations}))
    split = FakeSplit(records)

    seen = {}
    monkeypatch.setattr(
        eccv,
        "eccv_metrics",
        lambda i2t, image_ids, caption_ids, **kw: (
            seen.update(image_ids=image_ids, caption_ids=caption_ids) or {"eccv_i2t_R@1": 1.0}
        ),
    )
    monkeypatch.setattr(eccv, "coco_1k_recalls", lambda *args, **kw: {"coco1k_i2t_R@1": 2.0})
    kind, metrics, meta = false_negative_truth(context(coco_captions=path), split)
    assert kind == "eccv" and "false_negatives_skipped" not in meta
    assert meta["coco_ids"]["images_matched"] == 5000 and meta["coco_ids"]["captions_matched"] == 25000
    assert metrics(torch.zeros(1, 1), torch.zeros(1, 1)) == {"eccv_i2t_R@1": 1.0, "coco1k_i2t_R@1": 2.0}
    assert seen["image_ids"] == [int(i) for i in truth]
    assert seen["caption_ids"] == [int(c) for caps in truth.values() for c in caps]
