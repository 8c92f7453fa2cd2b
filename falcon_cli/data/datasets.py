"""Build torch datasets from a dataset spec: the entry point stages use.

Each builder finds its files through the spec, validates them, applies the missing-image
policy (``on_missing`` argument, else the spec's ``on_missing``) and returns a dataset
whose ``load_reports`` / ``load_summary()`` say what was dropped. Build the transform with
:func:`falcon_cli.data.transforms.build_transform`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from falcon_cli.data.loading import LoadedSource, OnMissing, load_source
from falcon_cli.data.nlvr2 import NLVR2Dataset
from falcon_cli.data.pretrain import PretrainDataset, load_pretrain_records
from falcon_cli.data.retrieval import RetrievalEvalDataset, RetrievalTrainDataset
from falcon_cli.data.shards import shard_records
from falcon_cli.data.shared_images import image_keys
from falcon_cli.data.sources import spec_file, split_sources
from falcon_cli.data.spec import DatasetSpec
from falcon_cli.data.text import DEFAULT_MAX_WORDS
from falcon_cli.data.vqa import VQADataset, load_answer_list
from falcon_cli.errors import FalconError


def _policy(spec: DatasetSpec, on_missing: OnMissing | None) -> OnMissing:
    return on_missing if on_missing is not None else spec.on_missing


def pretrain_records(spec: DatasetSpec, on_missing: OnMissing | None = None):
    """``(records, load reports)`` of the spec's pretraining pairs: from its JSON files, or through the shard
    index when it names ``pretrain_shards``. Every stage reads pretraining pairs through here."""
    if spec.pretrain_shards:
        return shard_records(spec, _policy(spec, on_missing))
    sources = split_sources(spec, "pretrain", "train")
    return load_pretrain_records([s.path for s in sources], sources[0].root, _policy(spec, on_missing))  # type: ignore[arg-type]


def pretrain_dataset(
    spec: DatasetSpec,
    transform: Callable,
    *,
    on_missing: OnMissing | None = None,
    seed: int = 0,
    max_words: int = DEFAULT_MAX_WORDS,
) -> PretrainDataset:
    """The spec's pretraining pairs (all ``pretrain`` files or shards, global ``pair_id`` s)."""
    records, reports = pretrain_records(spec, on_missing)
    return PretrainDataset(records, transform, seed=seed, max_words=max_words, load_reports=reports)


def retrieval_dataset(
    spec: DatasetSpec,
    split: str,
    transform: Callable,
    *,
    on_missing: OnMissing | None = None,
    max_words: int = DEFAULT_MAX_WORDS,
) -> RetrievalTrainDataset | RetrievalEvalDataset:
    """A Karpathy retrieval split: ``train`` gives a :class:`RetrievalTrainDataset`,
    ``val``/``test`` a :class:`RetrievalEvalDataset` (with ``text``, ``img2txt``, ``txt2img``)."""
    (ref,) = split_sources(spec, "retrieval", split)
    source = load_source(ref.path, ref.fmt, ref.root, _policy(spec, on_missing))  # type: ignore[arg-type]
    cls = RetrievalTrainDataset if split == "train" else RetrievalEvalDataset
    return cls(source, transform, max_words=max_words)


def pretrain_retrieval_dataset(
    spec: DatasetSpec,
    transform: Callable,
    *,
    max_images: int | None = None,
    seed: int = 0,
    on_missing: OnMissing | None = None,
    max_words: int = DEFAULT_MAX_WORDS,
) -> RetrievalEvalDataset:
    """The pretraining pairs as a retrieval split: one item per image, with every caption the pretraining files
    pair it with, so that a model can be scored on what it trained on (beside the test split: the memorisation
    gap). ``max_images``: at most that many images, drawn at random with ``seed`` (kept in file order); None =
    all. Entries keep ``image_id`` and get ``caption_ids`` where every pair carries ``image_id`` and
    ``caption_id`` (a shapes world's do), so the oracle's metrics apply."""
    import random

    records, reports = pretrain_records(spec, on_missing)
    by_image: dict = {}
    for key, record in zip(image_keys(records), records):  # image_id where every pair has one (shards copy images)
        by_image.setdefault(key, []).append(record)
    images = list(by_image)
    if max_images is not None and len(images) > max_images:
        keep = set(random.Random(seed).sample(range(len(images)), max_images))
        images = [image for n, image in enumerate(images) if n in keep]
    with_ids = all("image_id" in r.extra and "caption_id" in r.extra and len(r.captions) == 1 for r in records)
    entries = []
    for image in images:
        pairs = by_image[image]
        entry = {"image": str(pairs[0].image), "caption": [c for r in pairs for c in r.captions]}
        if with_ids:
            entry.update(image_id=pairs[0].extra["image_id"], caption_ids=[r.extra["caption_id"] for r in pairs])
        entries.append(entry)
    source = LoadedSource(
        path=Path(reports[0].source),
        indices=list(range(len(entries))),
        entries=entries,
        images=[[by_image[image][0].image] for image in images],
        report=reports[0],
    )
    dataset = RetrievalEvalDataset(source, transform, max_words=max_words)
    dataset.load_reports = list(reports)
    return dataset


def vqa_dataset(
    spec: DatasetSpec,
    split: str,
    transform: Callable,
    *,
    on_missing: OnMissing | None = None,
    max_words: int = DEFAULT_MAX_WORDS,
    eos: str = "",
) -> VQADataset:
    """A VQA split (all its files concatenated); answers are required except for ``test``."""
    refs = split_sources(spec, "vqa", split)
    policy = _policy(spec, on_missing)
    sources = [load_source(ref.path, ref.fmt, ref.root, policy) for ref in refs]  # type: ignore[arg-type]
    return VQADataset(sources, transform, max_words=max_words, eos=eos)


def vqa_answer_list(spec: DatasetSpec) -> list[str]:
    """The spec's candidate answers (``vqa.answer_list``)."""
    if spec.vqa is None or spec.vqa.answer_list is None:
        raise FalconError(
            f"{spec_file(spec)}: no VQA answer list configured; add key 'vqa.answer_list' to the dataset spec"
        )
    return load_answer_list(spec.resolve(spec.vqa.answer_list))


def nlvr2_dataset(
    spec: DatasetSpec,
    split: str,
    transform: Callable,
    *,
    on_missing: OnMissing | None = None,
    max_words: int = DEFAULT_MAX_WORDS,
) -> NLVR2Dataset:
    """An NLVR2 split (``train``, ``dev`` or ``test``)."""
    (ref,) = split_sources(spec, "nlvr2", split)
    source = load_source(ref.path, ref.fmt, ref.root, _policy(spec, on_missing))  # type: ignore[arg-type]
    return NLVR2Dataset(source, transform, max_words=max_words)
