"""ALBEF pretraining JSON: a list of ``{"image": path, "caption": str | [str, ...]}``.

One entry is one image-text pair. Its ``pair_id`` is its position in the file; with
several files the positions run on globally (file 2 starts after the last entry of file
1). Ids are assigned before missing images are skipped, so a pair keeps its id whatever
is dropped. Extra keys (``image_id``, ``caption_id`` from the shapes world) are kept on
the record.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from falcon_cli.data.images import load_image
from falcon_cli.data.loading import LoadedDataset, LoadReport, OnMissing, load_source
from falcon_cli.data.schema import EntryFormat, Field, nonempty_string, string_or_strings
from falcon_cli.data.text import DEFAULT_MAX_WORDS, pre_caption


def item_seed(seed: int, epoch: int, pair_id: int) -> int:
    """A well-mixed 63-bit seed for one item in one epoch (stable across processes and platforms)."""
    digest = hashlib.blake2b(f"{seed}:{epoch}:{pair_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _pair_key(entry: dict) -> Any:
    caption = entry.get("caption")
    captions = tuple(caption) if isinstance(caption, list) else caption
    return (entry.get("image"), captions)


PRETRAIN_FORMAT = EntryFormat(
    name="pretrain",
    fields=(
        Field("image", nonempty_string),
        Field("caption", string_or_strings, kind="caption"),
    ),
    duplicate_key=_pair_key,
    duplicate_label="(image, caption) pairs",
)
"""Entries of a pretraining file."""


@dataclass(frozen=True)
class PretrainRecord:
    """One image-text pair of the pretraining set."""

    pair_id: int
    """Global running index of the entry over all pretraining files."""
    image: Path
    """Resolved image path."""
    captions: tuple[str, ...]
    """The entry's caption(s), as written (normalised when an item is built)."""
    extra: dict = field(default_factory=dict)
    """Every other key of the entry (``image_id``, ``caption_id``, ...)."""


def load_pretrain_records(
    paths: Sequence[str | Path], image_root: Path, on_missing: OnMissing = "fail"
) -> tuple[list[PretrainRecord], list[LoadReport]]:
    """Load pretraining files into records with global ``pair_id`` s, plus one load report per file."""
    records: list[PretrainRecord] = []
    reports: list[LoadReport] = []
    offset = 0
    for path in paths:
        source = load_source(path, PRETRAIN_FORMAT, image_root, on_missing)
        for index, entry, images in zip(source.indices, source.entries, source.images):
            caption = entry["caption"]
            records.append(
                PretrainRecord(
                    pair_id=offset + index,
                    image=images[0],
                    captions=tuple(caption) if isinstance(caption, list) else (caption,),
                    extra={k: v for k, v in entry.items() if k not in ("image", "caption")},
                )
            )
        offset += source.report.entries
        reports.append(source.report)
    return records, reports


class PretrainDataset(LoadedDataset):
    """Image-text pairs for pretraining; an item is ``{"image", "caption", "pair_id"}``.

    When an entry has several captions, one is picked per access from a generator seeded
    with ``(seed, epoch, pair_id)``: reproducible, and different each epoch (call
    :meth:`set_epoch` before each epoch, as with a ``DistributedSampler``).
    """

    def __init__(
        self,
        records: Sequence[PretrainRecord],
        transform: Callable,
        *,
        seed: int = 0,
        max_words: int = DEFAULT_MAX_WORDS,
        load_reports: Sequence[LoadReport] = (),
    ):
        self.records = list(records)
        self.transform = transform
        self.seed = seed
        self.epoch = 0
        self.max_words = max_words
        self.load_reports = list(load_reports)
        self._position = {r.pair_id: i for i, r in enumerate(self.records)}
        self.load_images = True
        """False: items carry no ``image`` (the images are preloaded on the device:
        ``pretrain.loader.preload_images``)."""

    def __len__(self) -> int:
        return len(self.records)

    @property
    def pair_ids(self) -> list[int]:
        """The ``pair_id`` of every item, in dataset order."""
        return [r.pair_id for r in self.records]

    def index_of(self, pair_id: int) -> int:
        """Dataset position of a ``pair_id`` (``KeyError`` if it was dropped or never existed)."""
        return self._position[pair_id]

    def set_epoch(self, epoch: int) -> None:
        """Change which caption multi-caption entries yield (seeded by ``(seed, epoch, pair_id)``)."""
        self.epoch = epoch

    def caption_for(self, record: PretrainRecord) -> str:
        """The normalised caption this record yields in the current epoch."""
        captions = record.captions
        if len(captions) == 1:
            return pre_caption(captions[0], self.max_words)
        rng = random.Random(f"{self.seed}:{self.epoch}:{record.pair_id}")
        return pre_caption(captions[rng.randrange(len(captions))], self.max_words)

    def __getitem__(self, index: int) -> dict:
        record = self.records[index]
        if not self.load_images:
            return {"caption": self.caption_for(record), "pair_id": record.pair_id}
        image = load_image(record.image)
        # The augmentation draws from torch's RNG seeded by (seed, epoch, pair_id): an item is
        # augmented the same way whichever worker loads it and in whatever order, which is
        # what makes a resumed run identical to an uninterrupted one. Only the CPU generator is seeded
        # (what the transform draws from): ``torch.manual_seed`` also seeds every accelerator backend, and
        # an uninitialised one records a stack trace per call (about 0.1 ms an item: benchmarks/epoch_overheads.py).
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(item_seed(self.seed, self.epoch, record.pair_id))
            image = self.transform(image)
        return {"image": image, "caption": self.caption_for(record), "pair_id": record.pair_id}
