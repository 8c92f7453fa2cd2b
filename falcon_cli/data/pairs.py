"""The image-caption pairs of a dataset split, and a fingerprint of that pair list.

:func:`split_pairs` is what the embed stage embeds; :func:`pairs_fingerprint` is the hash
recorded in every ``embeddings.h5`` (attribute ``dataset_fingerprint``) so that readers can
tell embeddings of this dataset from embeddings of another dataset of the same size.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from falcon_cli.data.datasets import pretrain_dataset, retrieval_dataset
from falcon_cli.data.text import pre_caption


@dataclass(frozen=True)
class Pair:
    """One image-caption pair to embed."""

    pair_id: int
    """The id written to ``pair_id`` (unique within the split)."""
    image: Path
    """Resolved image path."""
    caption: str
    """The normalised caption (as falcon's training sees it)."""
    captions: tuple[str, ...] = ()
    """Every caption the pair may yield, as written (multi-caption pretraining entries); empty: just ``caption``."""


def split_pairs(spec, split: str, on_missing: str | None, seed: int) -> tuple[list[Pair], list, str]:
    """(pairs, load reports, the missing-image policy in force) of a dataset split.

    ``pretrain``: the pretraining pairs with their global ``pair_id`` (the epoch-0 caption of
    multi-caption entries); ``train``: one pair per entry, id = its position in the file;
    ``val``/``test``: one pair per caption, id = the caption's index in the split's text list.
    """
    policy = on_missing if on_missing is not None else spec.on_missing
    if split == "pretrain":
        dataset = pretrain_dataset(spec, transform=None, on_missing=policy, seed=seed)
        pairs = [Pair(r.pair_id, r.image, dataset.caption_for(r), tuple(r.captions)) for r in dataset.records]
    elif split == "train":
        dataset = retrieval_dataset(spec, split, transform=None, on_missing=policy)
        pairs = [Pair(r.index, r.image, pre_caption(r.caption)) for r in dataset.records]
    else:
        dataset = retrieval_dataset(spec, split, transform=None, on_missing=policy)
        pairs = caption_pairs(dataset)
    return pairs, list(dataset.load_reports), policy


def caption_pairs(dataset) -> list[Pair]:
    """One pair per caption of a retrieval split (``text``, ``image``, ``txt2img``), id = the caption's index."""
    return [Pair(t, dataset.image[dataset.txt2img[t]], caption) for t, caption in enumerate(dataset.text)]


def pairs_fingerprint(pairs: Iterable[Pair], root: str | Path) -> str:
    """A stable sha256 (hex) of a pair list: each pair's id, image path relative to ``root``
    (the dataset directory) and caption(s), in pair order.

    It does not depend on the seed (multi-caption entries contribute every caption) nor on
    where the dataset lives, and changes when any id, image path or caption does.
    """
    digest = hashlib.sha256()
    root = os.path.abspath(root)
    for pair in pairs:
        image = Path(os.path.relpath(os.path.abspath(pair.image), root)).as_posix()
        captions = pair.captions or (pair.caption,)
        digest.update("\x1e".join([str(int(pair.pair_id)), image, *captions]).encode("utf-8") + b"\x1d")
    return digest.hexdigest()


def records_fingerprint(records: Iterable, root: str | Path) -> str:
    """:func:`pairs_fingerprint` of pretraining records (``pair_id``, ``image``, ``captions``): the same
    value as :func:`split_fingerprint` of the ``pretrain`` split, for callers holding the dataset."""
    return pairs_fingerprint((Pair(r.pair_id, r.image, r.captions[0], tuple(r.captions)) for r in records), root)


def split_fingerprint(spec, split: str, on_missing: str | None, seed: int = 0) -> str:
    """:func:`pairs_fingerprint` of a dataset split's pairs (see :func:`split_pairs`)."""
    pairs, _, _ = split_pairs(spec, split, on_missing, seed)
    return pairs_fingerprint(pairs, spec.base_dir)


__all__ = ["Pair", "split_pairs", "caption_pairs", "pairs_fingerprint", "records_fingerprint", "split_fingerprint"]
