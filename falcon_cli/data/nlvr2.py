"""NLVR2 statements: ``{"images": [left, right], "sentence", "label": "True" | "False"}``.

An optional ``identifier`` (as in the official files) is kept and used to find duplicates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from falcon_cli.data.images import load_image
from falcon_cli.data.loading import LoadedDataset, LoadedSource, LoadReport
from falcon_cli.data.schema import EntryFormat, Field, identifier, nonempty_string, one_of, string_pair
from falcon_cli.data.text import DEFAULT_MAX_WORDS, pre_caption

LABELS = {"True": 1, "False": 0}
"""NLVR2 label strings and the class index each becomes."""

NLVR2_FORMAT = EntryFormat(
    name="nlvr2",
    fields=(
        Field("images", string_pair),
        Field("sentence", nonempty_string, kind="caption"),
        Field("label", one_of(*LABELS), kind="label"),
        Field("identifier", identifier, required=False),
    ),
    image_keys=("images",),
    duplicate_key=lambda e: e.get("identifier"),
    duplicate_label="identifier values",
)
"""Entries of an NLVR2 file."""


class NLVR2Dataset(LoadedDataset):
    """NLVR2 statements; an item is ``{"image0", "image1", "sentence", "label", "index"}``.

    ``label`` is 1 for ``"True"`` and 0 for ``"False"``; ``index`` is the entry's position
    in the file. ``records`` keeps the entries (extra keys included).
    """

    def __init__(self, source: LoadedSource, transform: Callable, *, max_words: int = DEFAULT_MAX_WORDS):
        self.transform = transform
        self.max_words = max_words
        self.load_reports: list[LoadReport] = [source.report]
        self.records: list[dict] = list(source.entries)
        self.indices: list[int] = list(source.indices)
        self.images: list[tuple[Path, Path]] = [(images[0], images[1]) for images in source.images]

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> dict:
        entry = self.records[index]
        left, right = self.images[index]
        return {
            "image0": self.transform(load_image(left)),
            "image1": self.transform(load_image(right)),
            "sentence": pre_caption(entry["sentence"], self.max_words),
            "label": LABELS[entry["label"]],
            "index": self.indices[index],
        }
