"""The shapes world in the real dataset formats the ALBEF reference code reads.

Each function returns plain JSON-ready lists; ``world.py`` writes them. Image paths are
relative to the world directory (``dataset.yaml`` sets ``image_root: .``).
"""

from __future__ import annotations

NLVR2_SPLIT_NAMES = {"train": "train", "val": "dev", "test": "test"}
"""NLVR2 calls the validation split ``dev``."""


def pretrain_entries(captions: list[dict], files: list[str]) -> list[dict]:
    """One entry per (image, caption) pair: ``{"image", "caption", "image_id", "caption_id"}``."""
    return [
        {"image": files[c["image_id"]], "caption": c["text"], "image_id": c["image_id"], "caption_id": c["caption_id"]}
        for c in captions
    ]


def retrieval_train_entries(captions: list[dict], files: list[str]) -> list[dict]:
    """Karpathy train format: one entry per caption, ``{"image", "caption", "image_id"}``."""
    return [{"image": files[c["image_id"]], "caption": c["text"], "image_id": c["image_id"]} for c in captions]


def retrieval_eval_entries(
    image_ids: list[int], captions_by_image: dict[int, list[dict]], files: list[str]
) -> list[dict]:
    """Karpathy val/test format: one entry per image with all its captions (and their ids)."""
    return [
        {
            "image": files[i],
            "caption": [c["text"] for c in captions_by_image[i]],
            "image_id": i,
            "caption_ids": [c["caption_id"] for c in captions_by_image[i]],
        }
        for i in image_ids
    ]


def vqa_entry(question_id: int, question: str, answers: list[str], image: str) -> dict:
    """VQA v2 style entry as ALBEF's ``vqa_dataset`` reads it."""
    return {"question_id": question_id, "question": question, "answer": answers, "image": image, "dataset": "vqa"}


def nlvr2_entry(split: str, index: int, left: str, right: str, sentence: str, label: bool) -> dict:
    """NLVR2 entry: ``{"images": [left, right], "sentence", "label": "True"|"False", "identifier"}``."""
    return {
        "images": [left, right],
        "sentence": sentence,
        "label": "True" if label else "False",
        "identifier": f"{NLVR2_SPLIT_NAMES[split]}-{index}-0-0",
    }


def dataset_spec(name: str = "shapes") -> dict:
    """The ``dataset.yaml`` content (validated by ``falcon_cli.data.spec.DatasetSpec``)."""
    return {
        "name": name,
        "image_root": ".",
        "pretrain": ["pretrain.json"],
        "retrieval": {"train": "retrieval_train.json", "val": "retrieval_val.json", "test": "retrieval_test.json"},
        "vqa": {
            "train": ["vqa_train.json"],
            "val": ["vqa_val.json"],
            "test": ["vqa_test.json"],
            "answer_list": "answer_list.json",
        },
        "nlvr2": {"train": "nlvr2_train.json", "dev": "nlvr2_dev.json", "test": "nlvr2_test.json"},
        "shapes_world": ".",
    }
