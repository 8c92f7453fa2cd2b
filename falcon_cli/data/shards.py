"""Webdataset tar shards for pretraining, read by pair id through an index built once.

img2dataset and open_clip keep web-scale pairs as tar shards: each sample is a group of
members sharing a key (``000123.jpg`` + ``000123.txt`` and/or ``000123.json``). A stream
reader is enough for uniform sampling, but GRIT and FALCON compose batches from arbitrary
pairs, so every pair must be readable by id. ``falcon data index`` scans the shards once and
writes ``shards-index.parquet``: for each sample its ``pair_id`` (its running position over
the shards, in spec order), shard, key, the image member's byte offset and size inside the
tar, its caption(s) and the rest of its JSON. Reading a pair is then one ``pread`` of the
image bytes (:class:`~falcon_cli.data.images.ShardImage`), with no tar parsing.

The index records each shard's size and a fingerprint of its rows; a shard that changed
size, a spec that names other shards, or an index of another format version is refused
with one line that says to rebuild it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from falcon_cli.artifacts.atomic import atomic_dir, atomic_path
from falcon_cli.data.images import ShardImage
from falcon_cli.data.loading import LoadReport
from falcon_cli.data.pretrain import PretrainRecord
from falcon_cli.data.spec import SPEC_FILENAME, load_spec
from falcon_cli.errors import FalconError
from falcon_cli.runtime.progress import track

INDEX_VERSION = 1
"""Format version of ``shards-index.parquet`` (an index of another version is rebuilt)."""
DEFAULT_INDEX = "shards-index.parquet"
"""Where ``falcon data index`` writes the index, beside ``dataset.yaml`` unless the spec's ``shard_index`` says."""
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "bmp", "ppm", "tif", "tiff")
"""Member extensions read as the sample's image (the first present, in this order)."""
META_KEY = b"falcon.shards"
SHOWN_KEYS = 3

INDEX_SCHEMA = pa.schema(
    [
        ("pair_id", pa.int64()),
        ("shard", pa.int32()),
        ("key", pa.string()),
        ("image", pa.string()),
        ("offset", pa.int64()),
        ("size", pa.int64()),
        ("captions", pa.list_(pa.string())),
        ("extra", pa.string()),
    ]
)


def expand_braces(pattern: str) -> list[str]:
    """Expand a shard pattern as img2dataset and open_clip write them: ``{00000..00009}`` (a zero-padded
    numeric range) and ``{a,b}`` (alternatives), several per pattern. ``shards/{0..2}.tar`` ->
    ``shards/0.tar``, ``shards/1.tar``, ``shards/2.tar``."""
    match = re.search(r"\{([^{}]*)\}", pattern)
    if match is None:
        return [pattern]
    body, head, tail = match.group(1), pattern[: match.start()], pattern[match.end() :]
    numeric = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if numeric:
        first, last = numeric.groups()
        if int(last) < int(first):
            raise FalconError(f"shard pattern {pattern!r}: range {{{body}}} runs backwards")
        width = len(first) if first.startswith("0") else 0
        choices = [str(n).zfill(width) for n in range(int(first), int(last) + 1)]
    elif "," in body:
        choices = body.split(",")
    else:
        raise FalconError(f"shard pattern {pattern!r}: {{{body}}} is neither a range {{0000..0009}} nor a list {{a,b}}")
    return [out for choice in choices for out in expand_braces(head + choice + tail)]


def shard_paths(spec) -> list[Path]:
    """The spec's ``pretrain_shards`` expanded and resolved against its directory, in order."""
    return [spec.resolve(Path(p)) for pattern in spec.pretrain_shards for p in expand_braces(str(pattern))]


def index_path(spec) -> Path:
    """Where the spec's shard index lives (``shard_index``, else ``shards-index.parquet`` beside the spec)."""
    return spec.resolve(spec.shard_index) if spec.shard_index is not None else spec.base_dir / DEFAULT_INDEX


def split_key(name: str) -> tuple[str, str]:
    """``dir/000123.jpg`` -> (``dir/000123``, ``jpg``): webdataset's key is the member name up to the first dot of
    its file name, the extension what follows (lower case)."""
    directory, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    return (f"{directory}/{stem}" if directory else stem), (ext.lower() if dot else "")


@dataclass
class _Sample:
    """The members of one key inside a shard, as found by the scan."""

    image: tuple[str, int, int] | None = None
    """(member name, data offset, size) of the image."""
    image_rank: int = len(IMAGE_EXTENSIONS)
    text_captions: list[str] | None = None
    """From ``.txt``."""
    json_captions: list[str] | None = None
    """From ``.json``'s ``caption`` (a string or a list): when present it wins over ``.txt``."""
    extra: dict = field(default_factory=dict)

    @property
    def captions(self) -> list[str] | None:
        """The sample's caption(s), or None when it has none."""
        return self.json_captions or self.text_captions


def _captions_of(value) -> list[str] | None:
    if isinstance(value, str) and value.strip():
        return [value]
    if isinstance(value, list) and value and all(isinstance(c, str) and c.strip() for c in value):
        return list(value)
    return None


def _scan_shard(path: Path) -> dict[str, _Sample]:
    """Every key of one shard with its image member's position and its caption(s), in tar order."""
    if not path.is_file():
        raise FalconError(f"{path}: shard not found; fix pretrain_shards in dataset.yaml")
    file_size = path.stat().st_size
    samples: dict[str, _Sample] = {}
    try:
        with tarfile.open(path, mode="r:") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                key, ext = split_key(member.name)
                if member.offset_data + member.size > file_size:
                    raise FalconError(
                        f"{path}: truncated at key {key} (member {member.name} needs bytes up to "
                        f"{member.offset_data + member.size:,}, the file has {file_size:,}); "
                        f"re-download the shard or remove it from pretrain_shards"
                    )
                sample = samples.setdefault(key, _Sample())
                if ext in IMAGE_EXTENSIONS and IMAGE_EXTENSIONS.index(ext) < sample.image_rank:
                    sample.image, sample.image_rank = (
                        (member.name, member.offset_data, member.size),
                        IMAGE_EXTENSIONS.index(ext),
                    )
                elif ext in ("txt", "json"):
                    text = tar.extractfile(member).read().decode("utf-8", errors="replace")  # type: ignore[union-attr]
                    if ext == "txt":
                        sample.text_captions = _captions_of(text.strip())
                    else:
                        try:
                            meta = json.loads(text)
                        except json.JSONDecodeError as exc:
                            raise FalconError(
                                f"{path}: key {key}: {member.name} is not valid JSON ({exc.msg}); "
                                f"fix or remove the sample"
                            ) from None
                        if isinstance(meta, dict):
                            caption = meta.pop("caption", meta.pop("captions", None))
                            sample.json_captions, sample.extra = _captions_of(caption), meta
    except tarfile.TarError as exc:
        raise FalconError(
            f"{path}: not a readable tar shard ({exc}); it is truncated or damaged: "
            f"re-download it or remove it from pretrain_shards"
        ) from None
    return samples


def _fingerprint(table: pa.Table, shards: Sequence[dict]) -> str:
    digest = hashlib.sha256(json.dumps(list(shards), sort_keys=True).encode())
    for column in ("pair_id", "shard", "key", "image", "offset", "size", "captions"):
        digest.update(json.dumps(table.column(column).to_pylist()).encode())
    return digest.hexdigest()


@dataclass
class ShardIndex:
    """A loaded ``shards-index.parquet``: the table and what it was built from."""

    path: Path
    """The index file."""
    table: pa.Table
    """One row per complete sample (columns of :data:`INDEX_SCHEMA`)."""
    shards: list[dict]
    """Per shard, in spec order: ``path`` (relative to the spec's directory) and ``size`` in bytes."""
    keys: int
    """Keys found in the shards, complete or not (pair ids run over all of them)."""
    incomplete: list[str]
    """``shard:key`` of the first keys without an image or caption (those counted by ``incomplete_count``)."""
    incomplete_count: int
    """Keys without an image or a caption (not in the table)."""
    fingerprint: str
    """sha256 of the shard list and the table's rows: what a run records as the data it read."""


def build_index(spec, *, on_missing: str | None = None) -> ShardIndex:
    """Scan the spec's shards and write their index atomically (``falcon data index``).

    A key without an image or a caption fails the build (one line naming the shard and key)
    under ``on_missing: fail``; under ``skip`` it is left out and counted. Its pair id is
    spent either way, so ids do not move when such keys are dropped or fixed later.
    """
    policy = on_missing if on_missing is not None else spec.on_missing
    paths = shard_paths(spec)
    if not paths:
        raise FalconError(f"{spec.base_dir / 'dataset.yaml'}: no pretrain_shards configured; add key 'pretrain_shards'")
    columns: dict[str, list] = {name: [] for name in INDEX_SCHEMA.names}
    shards, incomplete, pair_id = [], [], 0
    incomplete_count = 0
    for number, path in enumerate(track(paths, "indexing shards", total=len(paths))):
        for key, sample in _scan_shard(path).items():
            if sample.image is None or sample.captions is None:
                what = (
                    "no image (" + "/".join(IMAGE_EXTENSIONS[:3]) + "...)"
                    if sample.image is None
                    else "no caption (.txt, or .json with 'caption')"
                )
                if policy != "skip":
                    raise FalconError(
                        f"{path}: key {key} has {what}; fix or remove the sample, "
                        f"or set on_missing: skip in dataset.yaml to leave such keys out"
                    )
                incomplete_count += 1
                if len(incomplete) < SHOWN_KEYS:
                    incomplete.append(f"{path.name}:{key}")
            else:
                member, offset, size = sample.image
                for name, value in (
                    ("pair_id", pair_id),
                    ("shard", number),
                    ("key", key),
                    ("image", member),
                    ("offset", offset),
                    ("size", size),
                    ("captions", sample.captions),
                    ("extra", json.dumps(sample.extra, ensure_ascii=False, sort_keys=True)),
                ):
                    columns[name].append(value)
            pair_id += 1
        shards.append({"path": Path(os.path.relpath(path, spec.base_dir)).as_posix(), "size": path.stat().st_size})
    table = pa.table(columns, schema=INDEX_SCHEMA)
    index = ShardIndex(
        index_path(spec), table, shards, pair_id, incomplete, incomplete_count, _fingerprint(table, shards)
    )
    meta = {
        "version": INDEX_VERSION,
        "shards": shards,
        "keys": pair_id,
        "incomplete": incomplete,
        "incomplete_count": incomplete_count,
        "fingerprint": index.fingerprint,
    }
    with atomic_path(index.path) as tmp:
        pq.write_table(table.replace_schema_metadata({META_KEY: json.dumps(meta).encode()}), tmp, compression="zstd")
    return index


def load_index(spec) -> ShardIndex:
    """The spec's shard index, checked against the shards it names (one-line :class:`FalconError` otherwise)."""
    path = index_path(spec)
    rebuild = f"rebuild it with `falcon data index {spec.base_dir}`"
    if not path.exists():
        raise FalconError(f"{path}: no shard index; build it once with `falcon data index {spec.base_dir}`")
    try:
        table = pq.read_table(path)
        meta = json.loads((table.schema.metadata or {})[META_KEY])
    except (pa.ArrowInvalid, OSError, KeyError, ValueError) as exc:
        raise FalconError(f"{path}: not a falcon shard index ({type(exc).__name__}); {rebuild}") from None
    if meta.get("version") != INDEX_VERSION:
        raise FalconError(
            f"{path}: index format version {meta.get('version')}, this falcon reads {INDEX_VERSION}; {rebuild}"
        )
    named = [Path(os.path.relpath(p, spec.base_dir)).as_posix() for p in shard_paths(spec)]
    indexed = [s["path"] for s in meta["shards"]]
    if named != indexed:
        first = next(
            (f"{a} vs {b}" for a, b in zip(named, indexed) if a != b),
            f"{len(named)} shards named, {len(indexed)} indexed",
        )
        raise FalconError(f"{path}: no longer matches pretrain_shards in dataset.yaml ({first}); {rebuild}")
    for shard in meta["shards"]:
        file = spec.base_dir / shard["path"]
        size = file.stat().st_size if file.exists() else None
        if size != shard["size"]:
            now = "is missing" if size is None else f"has {size:,} bytes, the index says {shard['size']:,}"
            raise FalconError(f"{file}: shard {now}: the index no longer matches its shards; {rebuild}")
    table = table.select(INDEX_SCHEMA.names).cast(INDEX_SCHEMA)
    return ShardIndex(
        path, table, meta["shards"], meta["keys"], meta["incomplete"], meta["incomplete_count"], meta["fingerprint"]
    )


def shard_records(spec, on_missing: str | None = None, index: ShardIndex | None = None):
    """The pretraining records of a spec's shards (``(records, [load report])``, as
    :func:`falcon_cli.data.pretrain.load_pretrain_records` gives for JSON files); ``index``: the spec's index
    when the caller has loaded it already."""
    policy = on_missing if on_missing is not None else spec.on_missing
    index = index if index is not None else load_index(spec)
    if index.incomplete_count and policy != "skip":
        raise FalconError(
            f"{index.path}: {index.incomplete_count:,} keys have no image or caption (first: "
            f"{', '.join(index.incomplete)}); fix the shards and re-index, or set on_missing: skip"
        )
    files = [spec.base_dir / s["path"] for s in index.shards]
    t = index.table
    records = [
        PretrainRecord(
            pair_id=pair_id,
            image=ShardImage(files[shard], member, offset, size),
            captions=tuple(captions),
            extra=json.loads(extra) if extra != "{}" else {},
        )
        for pair_id, shard, member, offset, size, captions, extra in zip(
            *(t.column(c).to_pylist() for c in ("pair_id", "shard", "image", "offset", "size", "captions", "extra"))
        )
    ]
    report = LoadReport(
        source=str(index.path),
        entries=index.keys,
        kept=len(records),
        images=len(records),
        missing_images=index.incomplete_count,
        on_missing=policy,
        first_missing=list(index.incomplete),
    )
    return records, [report]


def write_shards(records: Iterable, out: Path, *, samples_per_shard: int = 1000, prefix: str = "") -> list[Path]:
    """Write pretraining records as webdataset shards ``{prefix}{00000..}.tar`` under ``out`` (atomically, one
    shard at a time): per record ``{pair_id:09d}.<image ext>`` (the image file's bytes, unchanged),
    ``.txt`` (its first caption) and ``.json`` (every caption and the extra keys). Returns the shard paths."""
    out.mkdir(parents=True, exist_ok=True)
    records = list(records)
    paths = []
    for start in range(0, len(records), samples_per_shard):
        path = out / f"{prefix}{start // samples_per_shard:05d}.tar"
        with atomic_path(path) as tmp, tarfile.open(tmp, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for record in records[start : start + samples_per_shard]:
                key = f"{record.pair_id:09d}"
                ext = Path(os.fspath(record.image)).suffix.lower().lstrip(".") or "jpg"
                meta = {
                    **record.extra,
                    "caption": list(record.captions) if len(record.captions) > 1 else record.captions[0],
                }
                for name, data in (
                    (f"{key}.{ext}", record.image.read_bytes()),
                    (f"{key}.txt", record.captions[0].encode()),
                    (f"{key}.json", json.dumps(meta, ensure_ascii=False, sort_keys=True).encode()),
                ):
                    info = tarfile.TarInfo(name)
                    info.size, info.mtime, info.mode = len(data), 0, 0o644
                    tar.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


def _absolute(spec, value):
    """A spec section's path values resolved against the spec's directory (lists and nested sections too)."""
    if isinstance(value, dict):
        return {k: _absolute(spec, v) for k, v in value.items()}
    if isinstance(value, list):
        return [_absolute(spec, v) for v in value]
    return str(spec.resolve(Path(value))) if isinstance(value, str) else value


def convert_to_shards(spec, records: Sequence, out: Path, *, samples_per_shard: int = 1000) -> ShardIndex:
    """Write a spec's pretraining pairs (``records``, from :func:`falcon_cli.data.datasets.pretrain_records`) as shards
    under ``out/shards`` with a ``dataset.yaml`` naming them and their index (``falcon data shards``); the other
    sections of the spec point back at the original files. Built in a temporary directory and renamed into place whole.
    Pair ids are kept when no pair was skipped (keys are ``{pair_id:09d}``; the index numbers keys by position)."""
    raw = spec.model_dump(mode="json", exclude={"base_dir", "pretrain", "shard_index"}, exclude_none=True)
    for key in ("image_root", "shapes_world", "retrieval", "vqa", "nlvr2"):
        if key in raw:
            raw[key] = _absolute(spec, raw[key])
    with atomic_dir(out) as tmp:
        paths = write_shards(
            track(records, "writing shards", total=len(records)), tmp / "shards", samples_per_shard=samples_per_shard
        )
        last = len(paths) - 1
        raw["pretrain_shards"] = [f"shards/{{{0:05d}..{last:05d}}}.tar" if last else "shards/00000.tar"]
        (tmp / SPEC_FILENAME).write_text(
            f"# pretraining pairs of {spec.base_dir} as webdataset shards (falcon data shards)\n"
            + yaml.safe_dump(raw, sort_keys=False),
            encoding="utf-8",
        )
        built = build_index(load_spec(tmp))
    built.path = out / built.path.name
    return built
