"""Karpathy retrieval splits (COCO 5K, Flickr30k 1K, the shapes world), as ALBEF reads them.

* train: one entry per caption, ``{"image", "caption": str, "image_id"}``; ``image_id`` is
  mapped to a contiguous index (order of first appearance), same index = positive.
* val/test: one entry per image, ``{"image", "caption": [captions]}`` (extra keys such as
  ``image_id`` and ``caption_ids`` are kept); builds ``text``, ``img2txt`` and ``txt2img``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Hashable

from falcon_cli.data.images import load_image
from falcon_cli.data.loading import LoadedDataset, LoadReport, LoadedSource
from falcon_cli.data.schema import EntryFormat, Field, identifier, nonempty_string, string_or_strings
from falcon_cli.data.text import DEFAULT_MAX_WORDS, pre_caption

RETRIEVAL_TRAIN_FORMAT = EntryFormat(
    name="retrieval-train",
    fields=(
        Field("image", nonempty_string),
        Field("caption", nonempty_string, kind="caption"),
        Field("image_id", identifier),
    ),
    duplicate_key=lambda e: (e.get("image"), e.get("caption")),
    duplicate_label="(image, caption) pairs",
)
"""Entries of a retrieval train file (one per caption)."""


def _eval_image_key(entry: dict) -> Hashable:
    return entry["image_id"] if "image_id" in entry else entry.get("image")


RETRIEVAL_EVAL_FORMAT = EntryFormat(
    name="retrieval-eval",
    fields=(
        Field("image", nonempty_string),
        Field("caption", string_or_strings, kind="caption"),
        Field("image_id", identifier, required=False),
    ),
    duplicate_key=_eval_image_key,
    duplicate_label="image_id values (image paths where there is no image_id)",
)
"""Entries of a retrieval val/test file (one per image)."""


@dataclass(frozen=True)
class RetrievalTrainRecord:
    """One caption of the retrieval train split."""

    index: int
    """Position of the entry in the file."""
    image: Path
    caption: str
    image_id: Any
    """The file's ``image_id`` (any JSON id)."""
    image_idx: int
    """Contiguous index of ``image_id`` (0..n_images-1): same index, same image."""
    extra: dict = field(default_factory=dict)


class RetrievalTrainDataset(LoadedDataset):
    """Retrieval fine-tuning pairs; an item is ``{"image", "caption", "image_idx", "index"}``."""

    def __init__(self, source: LoadedSource, transform: Callable, *, max_words: int = DEFAULT_MAX_WORDS):
        self.transform = transform
        self.max_words = max_words
        self.load_reports: list[LoadReport] = [source.report]
        self.img_ids: dict[Any, int] = {}
        """``image_id`` → contiguous index, in order of first appearance (after skipped entries)."""
        self.records: list[RetrievalTrainRecord] = []
        for index, entry, images in zip(source.indices, source.entries, source.images):
            image_idx = self.img_ids.setdefault(entry["image_id"], len(self.img_ids))
            self.records.append(
                RetrievalTrainRecord(
                    index=index,
                    image=images[0],
                    caption=entry["caption"],
                    image_id=entry["image_id"],
                    image_idx=image_idx,
                    extra={k: v for k, v in entry.items() if k not in ("image", "caption", "image_id")},
                )
            )

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> dict:
        record = self.records[index]
        return {
            "image": self.transform(load_image(record.image)),
            "caption": pre_caption(record.caption, self.max_words),
            "image_idx": record.image_idx,
            "index": record.index,
        }


class RetrievalEvalDataset(LoadedDataset):
    """A retrieval val/test split, one item per image: ``{"image", "index"}``.

    Attributes, as in ALBEF's ``re_eval_dataset``:

    * ``text``: every caption, normalised, in file order;
    * ``image``: resolved image path of each item;
    * ``img2txt``: item index → indices into ``text`` of its captions;
    * ``txt2img``: text index → item index of its image;
    * ``records``: the entries themselves (extra keys such as ``image_id``/``caption_ids`` kept).
    """

    def __init__(self, source: LoadedSource, transform: Callable, *, max_words: int = DEFAULT_MAX_WORDS):
        self.transform = transform
        self.load_reports: list[LoadReport] = [source.report]
        self.records: list[dict] = list(source.entries)
        self.indices: list[int] = list(source.indices)
        """Position in the file of each item."""
        self.image: list[Path] = [images[0] for images in source.images]
        self.text: list[str] = []
        self.img2txt: dict[int, list[int]] = {}
        self.txt2img: dict[int, int] = {}
        for img_id, entry in enumerate(self.records):
            captions = entry["caption"] if isinstance(entry["caption"], list) else [entry["caption"]]
            self.img2txt[img_id] = []
            for caption in captions:
                txt_id = len(self.text)
                self.text.append(pre_caption(caption, max_words))
                self.img2txt[img_id].append(txt_id)
                self.txt2img[txt_id] = img_id

    def __len__(self) -> int:
        return len(self.image)

    def __getitem__(self, index: int) -> dict:
        return {"image": self.transform(load_image(self.image[index])), "index": index}
