"""VQA v2 / Visual Genome QA files and the candidate answer list, as ALBEF reads them.

* train/val: ``{"question_id", "question", "answer": [answers] | str, "image", "dataset"}``;
* test: the same without ``answer``;
* ``answer_list.json``: a JSON list of candidate answers.

Answer weights follow ALBEF: for ``dataset: vqa`` each distinct answer weighs
``count / len(answers)``; for ``dataset: vg`` each answer weighs 0.5. Images of ``vg``
entries are resolved against ``vqa.vg_image_root`` (the VQA image root when unset).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from falcon_cli.data.images import load_image
from falcon_cli.data.json_io import read_json_list
from falcon_cli.data.loading import LoadedDataset, LoadedSource, LoadReport
from falcon_cli.data.schema import EntryFormat, Field, answer_value, identifier, nonempty_string
from falcon_cli.data.text import DEFAULT_MAX_WORDS, pre_caption
from falcon_cli.errors import FalconError

VG_ANSWER_WEIGHT = 0.5
"""ALBEF's weight for a Visual Genome answer."""


def _vqa_format(answers_required: bool) -> EntryFormat:
    return EntryFormat(
        name="vqa",
        fields=(
            Field("question_id", identifier),
            Field("question", nonempty_string, kind="caption"),
            Field("image", nonempty_string),
            Field("answer", answer_value, required=answers_required, kind="label"),
            Field("dataset", nonempty_string, required=False),
        ),
        duplicate_key=lambda e: e.get("question_id"),
        duplicate_label="question_id values",
    )


VQA_TRAIN_FORMAT = _vqa_format(answers_required=True)
"""Entries of a VQA train or val file (answers required)."""
VQA_TEST_FORMAT = _vqa_format(answers_required=False)
"""Entries of a VQA test file (answers optional)."""


def vqa_format(split: str) -> EntryFormat:
    """The entry format of a VQA split: answers are required except for ``test``."""
    return VQA_TEST_FORMAT if split == "test" else VQA_TRAIN_FORMAT


def answer_weights(answer: str | Sequence[str], dataset: str = "vqa") -> tuple[list[str], list[float]]:
    """Distinct answers and their ALBEF weights.

    ``vqa``: weight = occurrences / number of answers (``["yes"]*7 + ["no"]*3`` gives
    ``(["yes", "no"], [0.7, 0.3])``); ``vg``: every distinct answer weighs 0.5.
    """
    answers = [answer] if isinstance(answer, str) else list(answer)
    counts = Counter(answers)
    distinct = list(counts)
    if dataset == "vg":
        return distinct, [VG_ANSWER_WEIGHT] * len(distinct)
    return distinct, [counts[a] / len(answers) for a in distinct]


def load_answer_list(path: str | Path) -> list[str]:
    """Read ``answer_list.json`` (a JSON list of non-empty strings)."""
    answers = read_json_list(path, what="candidate answers (strings)")
    for i, answer in enumerate(answers):
        if not (isinstance(answer, str) and answer.strip()):
            raise FalconError(
                f"{Path(path)}: entry {i}: must be a non-empty string, got {answer!r}; fix the answer list"
            )
    return answers


@dataclass(frozen=True)
class VQARecord:
    """One question."""

    question_id: Any
    question: str
    """As written (normalised when an item is built)."""
    image: Path
    dataset: str
    """``vqa`` or ``vg`` (``vqa`` when the entry does not say)."""
    answers: tuple[str, ...] | None
    """Every answer as written (all annotators'), ``None`` for test questions."""
    extra: dict = field(default_factory=dict)


class VQADataset(LoadedDataset):
    """VQA questions; an item is ``{"image", "question", "question_id"}`` plus, when the
    question has answers, ``"answers"`` (distinct) and ``"weights"`` (ALBEF weights).

    ``eos`` is appended to every answer (ALBEF appends ``"[SEP]"`` for its decoder).
    Batch items with :func:`vqa_collate`.
    """

    def __init__(
        self,
        sources: Sequence[LoadedSource],
        transform: Callable,
        *,
        max_words: int = DEFAULT_MAX_WORDS,
        eos: str = "",
    ):
        self.transform = transform
        self.max_words = max_words
        self.eos = eos
        self.load_reports: list[LoadReport] = [s.report for s in sources]
        self.records: list[VQARecord] = []
        for source in sources:
            for entry, images in zip(source.entries, source.images):
                answer = entry.get("answer")
                self.records.append(
                    VQARecord(
                        question_id=entry["question_id"],
                        question=entry["question"],
                        image=images[0],
                        dataset=entry.get("dataset", "vqa"),
                        answers=None if answer is None else ((answer,) if isinstance(answer, str) else tuple(answer)),
                        extra={
                            k: v
                            for k, v in entry.items()
                            if k not in ("question_id", "question", "image", "dataset", "answer")
                        },
                    )
                )

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> dict:
        record = self.records[index]
        item = {
            "image": self.transform(load_image(record.image)),
            "question": pre_caption(record.question, self.max_words),
            "question_id": record.question_id,
        }
        if record.answers is not None:
            answers, weights = answer_weights(record.answers, record.dataset)
            item["answers"] = [a + self.eos for a in answers]
            item["weights"] = weights
        return item


def vqa_collate(batch: Sequence[dict]) -> dict:
    """Batch VQA items (ALBEF's ``vqa_collate_fn``).

    Returns ``image`` [B, 3, H, W], ``question`` and ``question_id`` lists, and when the
    items have answers: ``answers`` (all items' answers, flattened), ``weights`` (a float
    tensor aligned with ``answers``) and ``n`` (answers per question).
    """
    out: dict[str, Any] = {
        "image": torch.stack([item["image"] for item in batch]),
        "question": [item["question"] for item in batch],
        "question_id": [item["question_id"] for item in batch],
    }
    if all("answers" in item for item in batch):
        out["answers"] = [a for item in batch for a in item["answers"]]
        out["weights"] = torch.tensor([w for item in batch for w in item["weights"]], dtype=torch.float)
        out["n"] = [len(item["answers"]) for item in batch]
    return out
