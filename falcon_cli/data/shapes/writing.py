"""Write a generated world's content to disk: Parquet tables, the dataset JSON files in
their real formats, ``dataset.yaml`` and ``world.json`` (layout in docs/shapes.md).

Files are written inside the temporary world directory (``world.py`` renames it into place);
they still go through the atomic writers, so no reader ever sees a partial file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from falcon_cli.artifacts.atomic import atomic_path, write_json, write_text
from falcon_cli.artifacts.tables import COMPATIBILITY, write_table
from falcon_cli.data.shapes import formats
from falcon_cli.data.shapes import logical_forms as lfs
from falcon_cli.data.shapes.config import CAPTION_KINDS, SPLITS
from falcon_cli.data.shapes.generation import WorldContent, split_counts
from falcon_cli.data.shapes.questions import QUESTION_TYPES
from falcon_cli.data.shapes.scene import objects_column
from falcon_cli.data.shapes.vocabulary import COLORS, POSITIONS, SHAPES, SIZES

WORLD_SCHEMA_VERSION = 1
"""Version of the world directory layout (bump when files, columns or generation change)."""

WORLD_FILE = "world.json"


def _write_parquet(path: Path, columns: dict[str, pa.Array]) -> None:
    with atomic_path(path) as tmp:
        pq.write_table(pa.table(columns), tmp)


def write_tables(content: WorldContent, root: Path) -> None:
    """``scenes.parquet``, ``captions.parquet`` and ``compatibility_test.parquet``."""
    scenes, captions, judgement = content.scenes, content.captions, content.judgement
    n = len(scenes)
    split_names = np.array(SPLITS)
    _write_parquet(
        root / "scenes.parquet",
        {
            "image_id": pa.array(np.arange(n, dtype=np.int64)),
            "split": pa.array(split_names[content.image_split].tolist(), pa.string()),
            "file": pa.array(content.files, pa.string()),
            "num_objects": pa.array(scenes.occupied.sum(axis=1).astype(np.int8)),
            "objects": objects_column(scenes),
        },
    )
    caption_ids = np.array([c["caption_id"] for c in captions], dtype=np.int64)
    _write_parquet(
        root / "captions.parquet",
        {
            "caption_id": pa.array(caption_ids),
            "image_id": pa.array(np.array([c["image_id"] for c in captions], dtype=np.int64)),
            "split": pa.array(split_names[[c["split"] for c in captions]].tolist(), pa.string()),
            "index": pa.array(np.array([c["index"] for c in captions], dtype=np.int8)),
            "kind": pa.array([c["kind"] for c in captions], pa.string()),
            "text": pa.array([c["text"] for c in captions], pa.string()),
            "logical_form": pa.array([c["key"] for c in captions], pa.string()),
            "specificity": pa.array(np.array([lfs.specificity(c["logical_form"]) for c in captions], dtype=np.int8)),
            "paraphrased": pa.array([c["paraphrased"] for c in captions], pa.bool_()),
            "images_described": pa.array(judgement.images_described),
        },
    )
    # The ground truth of FN-aware metrics: a versioned artifact that readers validate.
    write_table(
        root / "compatibility_test.parquet",
        {
            "image_id": judgement.test_pairs[:, 0].astype(np.int64),
            "caption_id": caption_ids[judgement.test_pairs[:, 1]],
        },
        COMPATIBILITY,
    )


def write_dataset_files(content: WorldContent, root: Path) -> dict:
    """Pretraining, retrieval, VQA and NLVR2 JSON files and ``dataset.yaml``; returns their counts and statistics."""
    config, files, captions, image_split = content.config, content.files, content.captions, content.image_split
    by_split = {split: [c for c in captions if c["split"] == code] for code, split in enumerate(SPLITS)}
    captions_by_image: dict[int, list[dict]] = {}
    for c in captions:
        captions_by_image.setdefault(c["image_id"], []).append(c)
    write_json(root / "pretrain.json", formats.pretrain_entries(by_split["train"], files), indent=None)
    write_json(root / "retrieval_train.json", formats.retrieval_train_entries(by_split["train"], files), indent=None)
    for split in ("val", "test"):
        ids = np.flatnonzero(image_split == SPLITS.index(split)).tolist()
        write_json(
            root / f"retrieval_{split}.json", formats.retrieval_eval_entries(ids, captions_by_image, files), indent=None
        )

    vqa_counts, question_types, yes_no = {}, {t: 0 for t in QUESTION_TYPES}, {"yes": 0, "no": 0}
    for code, split in enumerate(SPLITS):
        entries = []
        for i in np.flatnonzero(image_split == code).tolist():
            for j, q in enumerate(content.questions[i]):
                question_id = i * max(config.vqa_questions_per_image, 1) + j
                entries.append(formats.vqa_entry(question_id, q["question"], q["answers"], files[i]))
                question_types[q["type"]] += 1
                if q["answer"] in yes_no:
                    yes_no[q["answer"]] += 1
        write_json(root / f"vqa_{split}.json", entries, indent=None)
        vqa_counts[split] = len(entries)
    answer_list = (
        ["yes", "no"]
        + [str(k) for k in range(config.max_objects + 1)]
        + list(COLORS[: config.num_colors])
        + list(SHAPES[: config.num_shapes])
        + list(SIZES)
    )
    write_json(root / "answer_list.json", answer_list, indent=None)

    nlvr2_labels = {}
    for split, entries in content.statements.items():
        name = formats.NLVR2_SPLIT_NAMES[split]
        write_json(root / f"nlvr2_{name}.json", entries, indent=None)
        nlvr2_labels[name] = {
            "True": sum(e["label"] == "True" for e in entries),
            "False": sum(e["label"] == "False" for e in entries),
        }

    write_text(root / "dataset.yaml", yaml.safe_dump(formats.dataset_spec(), sort_keys=False))
    counts = {
        "captions": {split: len(by_split[split]) for split in SPLITS} | {"total": len(captions)},
        "pretrain_pairs": len(by_split["train"]),
        "vqa_questions": vqa_counts,
        "nlvr2_statements": {name: labels["True"] + labels["False"] for name, labels in nlvr2_labels.items()},
        "answer_list": len(answer_list),
    }
    statistics = {"vqa": {"question_types": question_types, "answers": yes_no}, "nlvr2_labels": nlvr2_labels}
    return {"counts": counts, "statistics": statistics}


def world_record(content: WorldContent, dataset: dict) -> dict:
    """The ``world.json`` content: schema version, config, vocabulary, counts and statistics. No timestamps."""
    config, captions = content.config, content.captions
    objects_per_image = np.bincount(content.scenes.occupied.sum(axis=1), minlength=config.max_objects + 1)
    counts = {
        "images": {**split_counts(content.image_split), "total": config.images},
        **dataset["counts"],
        "distinct_logical_forms": content.distinct_forms,
        "compatibility_test_pairs": int(content.judgement.test_pairs.shape[0]),
    }
    return {
        "schema_version": WORLD_SCHEMA_VERSION,
        "generator": "falcon_cli.data.shapes",
        "config": config.model_dump(mode="json"),
        "vocabulary": {
            "shapes": list(SHAPES[: config.num_shapes]),
            "colors": list(COLORS[: config.num_colors]),
            "sizes": list(SIZES),
            "positions": list(POSITIONS),
        },
        "counts": counts,
        "statistics": {
            "false_negative_density": content.density,
            "duplicate_captions": content.duplicate_captions,
            "caption_kinds": {kind: int((content.caption_kind == k).sum()) for k, kind in enumerate(CAPTION_KINDS)},
            "paraphrased_fraction": round(float(np.mean([c["paraphrased"] for c in captions])), 4),
            "mean_specificity": round(float(np.mean([lfs.specificity(c["logical_form"]) for c in captions])), 4),
            "objects_per_image": {
                str(k): int(objects_per_image[k]) for k in range(config.min_objects, config.max_objects + 1)
            },
            **dataset["statistics"],
        },
    }


def write_world(content: WorldContent, root: Path) -> dict:
    """Write every file except the images (already written) into ``root``; return the world.json content."""
    write_tables(content, root)
    dataset = write_dataset_files(content, root)
    record = world_record(content, dataset)
    write_json(root / WORLD_FILE, record)
    return record
