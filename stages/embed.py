"""The embed stage: embed every image-caption pair of a dataset split into ``embeddings/embeddings.h5``.

Reads top to bottom:
1. settings and inputs: the dataset split (the missing-image policy applied as it loads),
   the encoder (``embed.encoder``: an open_clip model or a falcon checkpoint), the device;
   every check happens here, before any image is encoded;
2. the partial directory ``embeddings/embeddings.h5.partial/``: a ``progress.json`` that says
   what is being embedded, and one ``chunk_<k>.npz`` per completed chunk of ``chunk_size``
   pairs, each written atomically. ``--resume`` keeps the chunks of a run with the same
   settings and encodes only the missing ones; without it the directory starts afresh;
3. encoding: a DataLoader (``num_workers`` processes load, transform and tokenise) in
   batches that never straddle a chunk, autocast on CUDA, a progress bar; images that fail
   to decode stop the stage under ``on_missing: fail`` and are dropped and counted under
   ``skip``;
4. assembly: the chunks are streamed, in order, into ``embeddings.h5`` by ``EmbeddingsWriter``
   (a temporary file renamed into place when complete), then the partial directory goes;
5. the summary: pairs, dimension, dtype, images that failed, time and pairs/s; the manifest.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from rich.markup import escape
from torch.utils.data import DataLoader, Dataset

from falcon_cli.artifacts.atomic import atomic_path, write_json
from falcon_cli.artifacts.embeddings import EMBEDDINGS_SCHEMA_VERSION, EmbeddingsWriter
from falcon_cli.config.schema import Recipe
from falcon_cli.data.images import load_image
from falcon_cli.data.pairs import Pair, pairs_fingerprint, split_pairs  # noqa: F401 (Pair, split_pairs: re-exported)
from falcon_cli.data.spec import load_spec
from falcon_cli.errors import FalconError
from falcon_cli.models.encoders import load_encoder
from falcon_cli.runtime.console import make_console
from falcon_cli.runtime.distributed import is_main_process, on_rank_zero
from falcon_cli.runtime.precision import autocast, pick_device, resolve_precision
from falcon_cli.runtime.progress import track
from falcon_cli.runtime.run_dir import RunDirectory

console = make_console(stderr=True)

OUTPUT = Path("embeddings/embeddings.h5")
PARTIAL = Path("embeddings/embeddings.h5.partial")
PROGRESS = "progress.json"


def run(config: Recipe, run: RunDirectory, *, resume: bool = False) -> dict:
    """Embed the configured split into ``embeddings/embeddings.h5`` (rank 0 works, other ranks wait); returns the
    summary."""
    return on_rank_zero(lambda: _embed(config, run, resume))


def _embed(config: Recipe, run: RunDirectory, resume: bool) -> dict:
    e = config.embed
    started = time.perf_counter()

    # 1. Inputs and settings, all checked before any encoding.
    device = pick_device(e.device)
    spec = load_spec(config.data.dataset)
    pairs, load_reports, policy = split_pairs(spec, e.split, config.data.on_missing, config.seed)
    if not pairs:
        raise FalconError(f"{config.data.dataset}: split '{e.split}' has no pairs to embed; choose another embed.split")
    encoder = load_encoder(e.encoder, e.pretrained, device)
    precision = resolve_precision("auto", device)
    chunks = math.ceil(len(pairs) / e.chunk_size)
    missing_at_load = sum(r.dropped for r in load_reports)

    # 2. The partial directory: completed chunks survive a kill; --resume keeps those of the same job.
    partial = run.path / PARTIAL
    identity = {
        "encoder": e.encoder,
        "pretrained": e.pretrained if e.encoder.startswith("open_clip:") else None,
        "checkpoint": encoder.checkpoint,
        "dataset": spec.name,
        "split": e.split,
        "pairs": len(pairs),
        "pair_ids_sha256": hashlib.sha256(np.array([p.pair_id for p in pairs], dtype=np.int64).tobytes()).hexdigest(),
        "chunk_size": e.chunk_size,
    }
    done = _completed_chunks(partial, identity, chunks) if resume else set()
    if not done:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        write_json(partial / PROGRESS, identity)
    elif is_main_process():
        console.print(f"resuming: {len(done)} of {chunks} chunk(s) already embedded in {escape(str(partial))}")

    # 3. Encode the missing chunks; batches never straddle a chunk, so each chunk is written as soon as it is complete.
    todo = [k for k in range(chunks) if k not in done]
    batches = [
        list(range(start, min(start + e.batch_size, stop)))
        for k in todo
        for stop in [min((k + 1) * e.chunk_size, len(pairs))]
        for start in range(k * e.chunk_size, stop, e.batch_size)
    ]
    loader = DataLoader(
        PairImages(pairs, encoder.image_transform),
        batch_sampler=batches,
        num_workers=e.num_workers,
        collate_fn=PairCollate(encoder.tokenizer),
        persistent_workers=False,
    )
    encoded_pairs = 0
    encoding_started = time.perf_counter()
    current, rows = None, []
    for batch in track(loader, f"embed {e.split}", total=len(batches)):
        chunk = batch["positions"][0] // e.chunk_size
        if current is not None and chunk != current:
            _write_chunk(partial, current, rows)
            rows = []
        current = chunk
        failed = [
            (pid, reason) for pid, reason in zip(batch["pair_ids"].tolist(), batch["errors"]) if reason is not None
        ]
        if failed and policy == "fail":
            raise FalconError(
                f"{failed[0][1]}; {len(failed)} image(s) of this batch failed to load; set data.on_missing=skip "
                "to embed without them (they are counted in the summary)"
            )
        with autocast(precision, device):
            image, text = encoder.encode(batch["images"], batch["text"])
        rows.append(
            (image.float().cpu().numpy(), text.float().cpu().numpy(), batch["pair_ids"].numpy(), batch["ok"].numpy())
        )
        encoded_pairs += len(batch["pair_ids"])
    if current is not None:
        _write_chunk(partial, current, rows)
    encoding_seconds = time.perf_counter() - encoding_started

    # 4. Assemble the chunks into embeddings.h5 (atomic: the file appears only when every row is in).
    files = [partial / _chunk_name(k) for k in range(chunks)]
    counts, unreadable = [], 0
    for path in files:
        with np.load(path) as data:
            counts.append((len(data["pair_id"]), data["image"].shape[1]))
            unreadable += len(data["failed_pair_id"])
    total, dim = sum(c for c, _ in counts), counts[0][1]
    if total == 0:
        raise FalconError(f"{config.data.dataset}: every image of split '{e.split}' failed to load; nothing to embed")
    dtype = "float16" if e.fp16 else "float32"
    attrs = {
        "model": encoder.model_name,
        "checkpoint": encoder.checkpoint,
        "dataset": spec.name,
        "split": e.split,
        "epoch": -1 if encoder.epoch is None else int(encoder.epoch),
        "dataset_fingerprint": pairs_fingerprint(pairs, spec.base_dir),
    }
    with EmbeddingsWriter(run.path / OUTPUT, n=total, dim=dim, attrs=attrs, dtype=dtype) as writer:
        start = 0
        for path in files:
            with np.load(path) as data:
                writer.write(start, data["image"], data["text"], data["pair_id"])
                start += len(data["pair_id"])
    shutil.rmtree(partial, ignore_errors=True)
    run.add_artifact(
        OUTPUT,
        schema="embeddings",
        schema_version=EMBEDDINGS_SCHEMA_VERSION,
        meta={"model": encoder.model_name, "split": e.split, "dtype": dtype},
    )

    # 5. Summary.
    summary = {
        "embeddings": str(OUTPUT),
        "model": encoder.model_name,
        "checkpoint": encoder.checkpoint,
        "dataset": spec.name,
        "split": e.split,
        "pairs": int(total),
        "dim": int(dim),
        "dtype": dtype,
        "device": str(device),
        "images_failed": int(missing_at_load + unreadable),
        "images_missing": int(missing_at_load),
        "images_unreadable": int(unreadable),
        "chunks": chunks,
        "chunks_resumed": len(done),
        "seconds": round(time.perf_counter() - started, 2),
        "pairs_per_s": round(encoded_pairs / encoding_seconds, 1) if encoded_pairs and encoding_seconds > 0 else None,
    }
    console.print(
        f"embed: {total} pairs x {dim} ({dtype}) from {escape(encoder.model_name)} on {device}; "
        f"{summary['images_failed']} image(s) failed; {summary['pairs_per_s']} pairs/s"
    )
    return summary


class PairImages(Dataset):
    """Items ``{"position", "image", "caption", "pair_id", "error"}``; an image that fails to load gives a
    zero tensor and the one-line reason in ``error`` (the main process applies the policy)."""

    def __init__(self, pairs: list[Pair], transform):
        self.pairs = pairs
        self.transform = transform

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, position: int) -> dict:
        pair = self.pairs[position]
        try:
            image, error = self.transform(load_image(pair.image)), None
        except FalconError as exc:
            image, error = None, str(exc)
        return {"position": position, "image": image, "caption": pair.caption, "pair_id": pair.pair_id, "error": error}


class PairCollate:
    """Stack images (a failed image takes the shape of the batch's good ones), tokenise captions."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, items: list[dict]) -> dict:
        good = next((item["image"] for item in items if item["image"] is not None), None)
        blank = torch.zeros_like(good) if good is not None else torch.zeros(3, 1, 1)
        return {
            "positions": [item["position"] for item in items],
            "images": torch.stack([item["image"] if item["image"] is not None else blank for item in items]),
            "text": self.tokenizer([item["caption"] for item in items]),
            "pair_ids": torch.tensor([item["pair_id"] for item in items], dtype=torch.long),
            "ok": torch.tensor([item["error"] is None for item in items]),
            "errors": [item["error"] for item in items],
        }


def _chunk_name(index: int) -> str:
    return f"chunk_{index:06d}.npz"


def _completed_chunks(partial: Path, identity: dict, chunks: int) -> set[int]:
    """Chunks already written by an interrupted run of the same job (empty when there is none)."""
    progress = partial / PROGRESS
    if not progress.is_file():
        return set()
    recorded = json.loads(progress.read_text())
    differ = [k for k in identity if recorded.get(k) != identity[k]]
    if differ:
        raise FalconError(
            f"{progress}: the interrupted embedding differs in {', '.join(differ)} "
            f"({differ[0]}: {recorded.get(differ[0])!r} then, {identity[differ[0]]!r} now); "
            "run without --resume to start afresh"
        )
    return {k for k in range(chunks) if (partial / _chunk_name(k)).is_file()}


def _write_chunk(partial: Path, index: int, rows: list[tuple[np.ndarray, ...]]) -> None:
    """Write one completed chunk atomically: the rows whose image loaded, and the ids of those whose image did not."""
    image, text, pair_id, ok = (np.concatenate(column) for column in zip(*rows))
    with atomic_path(partial / _chunk_name(index)) as tmp, open(tmp, "wb") as handle:
        np.savez(
            handle,
            image=image[ok],
            text=text[ok],
            pair_id=pair_id[ok].astype(np.int64),
            failed_pair_id=pair_id[~ok].astype(np.int64),
        )
