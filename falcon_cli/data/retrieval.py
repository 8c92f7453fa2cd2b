"""Karpathy retrieval splits (COCO 5K, Flickr30k 1K, the shapes world), as ALBEF reads them.

* train: one entry per caption, ``{"image", "caption": str, "image_id"}``; ``image_id`` is
  mapped to a contiguous index (order of first appearance), same index = positive.
* val/test: one entry per image, ``{"image", "caption": [captions]}`` (extra keys such as
  ``image_id`` and ``caption_ids`` are kept); builds ``text``, ``img2txt`` and ``txt2img``.
* COCO ids of a val/test split (for ECCV Caption / CxC): the entries' own ``image_id`` and
  ``caption_ids``, or matched in COCO's ``captions_val2014.json`` (:func:`split_ids`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Hashable

from falcon_cli.data.images import load_image
from falcon_cli.data.json_io import json_type_name, read_json
from falcon_cli.data.loading import LoadedDataset, LoadedSource, LoadReport
from falcon_cli.data.schema import EntryFormat, Field, identifier, nonempty_string, string_or_strings
from falcon_cli.data.text import DEFAULT_MAX_WORDS, pre_caption
from falcon_cli.errors import FalconError

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
            captions = _entry_captions(entry)
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


# --- Image and caption ids of a val/test split ------------------------------------------------------
# False-negative ground truth is keyed by ids: the shapes oracle by the world's ids, ECCV Caption /
# CxC by COCO image ids and caption (annotation) ids. They come from the entries themselves
# (``image_id`` and ``caption_ids``, as the shapes world writes them) or, for ALBEF's
# coco_karpathy_test.json, which names each image by path and lists its captions as text only,
# from COCO's own captions file, matched on image file name and caption text.


_COCO_CAPTIONS = "COCO's annotations/captions_val2014.json (from annotations_trainval2014.zip)"


def caption_match_key(text: str) -> str:
    """How captions are compared with COCO's: whitespace runs as one space, no leading or trailing
    whitespace, lower case, trailing periods dropped (``"A dog  runs. "`` -> ``"a dog runs"``)."""
    return " ".join(text.split()).lower().rstrip(". ").strip()


def _entry_captions(entry: dict) -> list[str]:
    """An eval entry's captions, in the order :class:`RetrievalEvalDataset` puts them in ``text``."""
    return entry["caption"] if isinstance(entry["caption"], list) else [entry["caption"]]


@dataclass(frozen=True)
class SplitIds:
    """Image and caption ids of a retrieval val/test split, in the dataset's order; ``None`` where unmatched."""

    image_ids: list[int | None]
    """Per entry (image) of the split."""
    caption_ids: list[int | None]
    """Per text, in ``RetrievalEvalDataset.text`` order (each entry's captions in turn)."""
    source: str
    """``entries`` (the split's own ``image_id``/``caption_ids``) or the captions file's path."""
    first_unmatched: str | None = None
    """The first image or caption without an id, for messages."""

    @property
    def images_matched(self) -> int:
        """Entries with an image id."""
        return sum(i is not None for i in self.image_ids)

    @property
    def captions_matched(self) -> int:
        """Texts with a caption id."""
        return sum(c is not None for c in self.caption_ids)

    @property
    def complete(self) -> bool:
        """Every image and every caption has its id."""
        return self.images_matched == len(self.image_ids) and self.captions_matched == len(self.caption_ids)

    def counts(self) -> dict:
        """``{"source", "images_matched", "images", "captions_matched", "captions"}`` for result metadata."""
        return {
            "source": self.source,
            "images_matched": self.images_matched,
            "images": len(self.image_ids),
            "captions_matched": self.captions_matched,
            "captions": len(self.caption_ids),
        }

    def summary(self) -> str:
        """``"4,998 of 5,000 images and 24,990 of 25,010 captions"``."""
        return (
            f"{self.images_matched:,} of {len(self.image_ids):,} images and {self.captions_matched:,} of "
            f"{len(self.caption_ids):,} captions"
        )


def ids_from_entries(records: list[dict]) -> SplitIds | None:
    """The ids the entries carry (``image_id`` and one ``caption_ids`` item per caption); None if any entry lacks
    them."""
    if not all("image_id" in rec and "caption_ids" in rec for rec in records):
        return None
    image_ids, caption_ids = [], []
    for n, rec in enumerate(records):
        captions = _entry_captions(rec)
        if not isinstance(rec["caption_ids"], list) or len(rec["caption_ids"]) != len(captions):
            raise FalconError(
                f"entry {n} (image {rec.get('image')}): caption_ids must list one id per caption "
                f"({len(captions)}), got {rec['caption_ids']!r}; fix the split file"
            )
        image_ids.append(int(rec["image_id"]))
        caption_ids.extend(int(c) for c in rec["caption_ids"])
    return SplitIds(image_ids, caption_ids, "entries")


def _coco_captions_tables(path: Path) -> tuple[dict[str, int], dict[int, dict[str, list[int]]]]:
    """From COCO's ``captions_*.json``: file name -> image id, and image id -> match key -> caption ids
    (file order)."""
    hint = f"expected {_COCO_CAPTIONS}"
    data = read_json(path)
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("images"), list)
        or not isinstance(data.get("annotations"), list)
    ):
        got = f"keys {sorted(data)}"[:80] if isinstance(data, dict) else json_type_name(data)
        raise FalconError(f"{path}: needs an object with `images` and `annotations` lists, got {got}; {hint}")
    by_name: dict[str, int] = {}
    for n, image in enumerate(data["images"]):
        if (
            not isinstance(image, dict)
            or not isinstance(image.get("id"), int)
            or not isinstance(image.get("file_name"), str)
        ):
            raise FalconError(
                f"{path}: images[{n}] needs an integer `id` and a string `file_name`, got {image!r:.80}; {hint}"
            )
        name = Path(image["file_name"]).name
        if by_name.setdefault(name, image["id"]) != image["id"]:
            raise FalconError(
                f"{path}: images[{n}]: file name {name} is listed under two ids "
                f"({by_name[name]} and {image['id']}); {hint}"
            )
    captions: dict[int, dict[str, list[int]]] = {}
    for n, ann in enumerate(data["annotations"]):
        if (
            not isinstance(ann, dict)
            or not isinstance(ann.get("id"), int)
            or not isinstance(ann.get("image_id"), int)
            or not isinstance(ann.get("caption"), str)
        ):
            raise FalconError(
                f"{path}: annotations[{n}] needs integer `id` and `image_id` and a string `caption`, "
                f"got {ann!r:.80}; {hint}"
            )
        captions.setdefault(ann["image_id"], {}).setdefault(caption_match_key(ann["caption"]), []).append(ann["id"])
    return by_name, captions


def ids_from_coco_captions(records: list[dict], captions_file: str | Path) -> SplitIds:
    """Map a Karpathy split's entries to COCO ids through COCO's captions file.

    An entry's image is the COCO image whose ``file_name`` has the same base name
    (``val2014/COCO_val2014_000000391895.jpg`` -> ``COCO_val2014_000000391895.jpg``); each
    caption is the annotation of that image with the same :func:`caption_match_key`, each
    annotation used once (in file order when an image has two equal captions). What does not
    match stays ``None``: check :attr:`SplitIds.complete`.
    """
    path = Path(captions_file).expanduser()
    if not path.is_file():
        problem = "is a directory" if path.is_dir() else "file not found"
        raise FalconError(f"evaluate.retrieval.coco_captions: {path}: {problem}; point it at {_COCO_CAPTIONS}")
    by_name, captions = _coco_captions_tables(path)
    image_ids: list[int | None] = []
    caption_ids: list[int | None] = []
    first_unmatched = None
    for rec in records:
        image_id = by_name.get(Path(str(rec["image"])).name)
        image_ids.append(image_id)
        unused = {key: list(ids) for key, ids in captions.get(image_id, {}).items()}
        for caption in _entry_captions(rec):
            ids = unused.get(caption_match_key(caption))
            caption_ids.append(ids.pop(0) if ids else None)
            if caption_ids[-1] is None and first_unmatched is None:
                first_unmatched = (
                    f"image {rec['image']} (not in the file)"
                    if image_id is None
                    else f"caption {caption!r} of {rec['image']}"
                )
    return SplitIds(image_ids, caption_ids, str(path), first_unmatched)


def split_ids(records: list[dict], captions_file: str | Path | None) -> SplitIds | None:
    """The ids of an eval split: COCO's, matched in ``captions_file`` when given, else the entries'; None = neither."""
    if captions_file is not None:
        return ids_from_coco_captions(records, captions_file)
    return ids_from_entries(records)
