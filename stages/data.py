"""The data stage: make sure the dataset exists and is sound, and fix the tokenizer.

Reads top to bottom:
1. generate the shapes world when the recipe asks for one and it is missing;
2. check every source of the dataset spec (entries, images, captions, ids, labels) and
   stop on any problem before later stages spend hours on broken data;
3. load the pretraining pairs with the missing-image policy, so the manifest records how
   many pairs a run actually has and how many were skipped;
4. train the offline WordPiece tokenizer on the training captions (or load the named one)
   and save it into the run, so every later stage tokenises the same way.
"""

from __future__ import annotations

import logging
from pathlib import Path

from falcon_cli.artifacts.atomic import atomic_dir, write_json
from falcon_cli.config.schema import Recipe
from falcon_cli.data.check import check_dataset
from falcon_cli.data.datasets import pretrain_dataset
from falcon_cli.data.shapes import generate_world
from falcon_cli.data.shards import load_index
from falcon_cli.data.spec import load_spec
from falcon_cli.data.tokenizer import RUN_TOKENIZER_DIR, load_tokenizer, train_wordpiece_tokenizer
from falcon_cli.errors import FalconError
from falcon_cli.runtime.console import make_console
from falcon_cli.runtime.distributed import on_rank_zero
from falcon_cli.runtime.run_dir import RunDirectory

log = logging.getLogger("falcon")
console = make_console(stderr=True)

CHECK_REPORT = Path("data/check.json")


def run(config: Recipe, run: RunDirectory) -> dict:
    """Run the data stage (rank 0 works, other ranks wait); returns the summary recorded in the manifest."""
    return on_rank_zero(lambda: _prepare(config, run))


def _prepare(config: Recipe, run: RunDirectory) -> dict:
    data = config.data
    result: dict = {"dataset": str(data.dataset)}

    # 1. The shapes world is generated on demand; an identical existing world is reused.
    if data.shapes is not None:
        summary = generate_world(data.shapes, data.dataset)
        result["shapes_world"] = {k: v for k, v in summary.to_dict().items() if k != "config"}
        summary.render(console)

    # 2. Check everything once, up front; the report goes into the run either way.
    spec = load_spec(data.dataset)
    if data.on_missing is not None:
        spec.on_missing = data.on_missing
    report = check_dataset(spec, verify_images=data.verify_images)
    report.render(console)
    write_json(run.path / CHECK_REPORT, report.to_dict())
    run.add_artifact(CHECK_REPORT, schema="data_check", schema_version=1)
    if not report.ok:
        raise FalconError(
            f"{spec.base_dir}: {len(report.problems)} data problem(s), first: {report.problems[0]} "
            f"(full report: {run.path / CHECK_REPORT})"
        )

    # 3. The pretraining pairs as a run will see them (missing images failed or skipped).
    pairs = pretrain_dataset(spec, transform=None)
    result["pretrain_pairs"] = len(pairs)
    result["load"] = pairs.load_summary()
    if spec.pretrain_shards:  # what the run read: the shard index and the fingerprint of its rows
        index = load_index(spec)
        result["shard_index"] = {"path": str(index.path), "shards": len(index.shards), "fingerprint": index.fingerprint}
    if pairs.dropped:
        log.warning("skipped %d pretraining pairs whose images are missing (on_missing=skip)", pairs.dropped)

    # 4. One tokenizer for the whole run, saved inside it.
    target = run.path / RUN_TOKENIZER_DIR
    if data.tokenizer == "wordpiece":
        captions = [caption for record in pairs.records for caption in record.captions]
        tokenizer = train_wordpiece_tokenizer(captions, target, vocab_size=data.tokenizer_vocab_size)
    else:
        tokenizer = load_tokenizer(data.tokenizer, "data.tokenizer")
        with atomic_dir(target) as tmp:
            tokenizer.save_pretrained(str(tmp))
    run.add_artifact(RUN_TOKENIZER_DIR, schema="tokenizer", schema_version=1, meta={"source": data.tokenizer})
    result["tokenizer"] = {"source": data.tokenizer, "vocab_size": len(tokenizer)}
    return result
