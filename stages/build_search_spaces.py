"""The build-search-spaces stage: group the pairs into search spaces of |M| for batch composition.

Reads top to bottom:
1. settings and inputs: the ``embeddings.h5`` (the run's own, from the embed stage, unless
   ``search_spaces.embeddings`` names one), |M|, the seed and, on the shapes world, the
   oracle with each pair's image and caption ids; every check happens here, before any
   clustering;
2. one partition per epoch (``random``: GRIT-VLP's shuffled spaces; ``kmeans``: balanced
   spherical k-means on the joint embedding), written to ``search_spaces.parquet``;
3. what the spaces are like: sizes and mean within-space cosine similarity of the written
   method, beside the other method when ``compare`` is on;
4. on the shapes world, the oracle's false-negative density inside the spaces: for each
   pair, how many captions of the other pairs of its space truly describe its image;
5. the summary: ``results/search_spaces_summary.json``, a printed table, the manifest.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from rich.markup import escape
from rich.table import Table

from falcon_cli.artifacts.atomic import write_json
from falcon_cli.artifacts.embeddings import FINGERPRINT_ATTR, EmbeddingsFile, check_fingerprint, open_embeddings
from falcon_cli.artifacts.tables import SEARCH_SPACES, write_table
from falcon_cli.config.schema import Recipe
from falcon_cli.data.datasets import pretrain_dataset
from falcon_cli.data.pairs import split_fingerprint
from falcon_cli.data.shapes.oracle import ShapesOracle
from falcon_cli.data.spec import load_spec
from falcon_cli.errors import FalconError
from falcon_cli.runtime.console import make_console
from falcon_cli.runtime.distributed import on_rank_zero
from falcon_cli.runtime.run_dir import RunDirectory
from falcon_cli.sampling.partition import (
    Partition,
    false_negatives_in_spaces,
    kmeans_partition_of,
    partition_summary_of,
    random_partition,
)

console = make_console(stderr=True)

DEFAULT_EMBEDDINGS = Path("embeddings/embeddings.h5")
OUTPUT = Path("search_spaces.parquet")
SUMMARY = Path("results/search_spaces_summary.json")


def run(config: Recipe, run: RunDirectory) -> dict:
    """Build and write the search spaces (rank 0 works, other ranks wait); returns the manifest summary."""
    return on_rank_zero(lambda: _build(config, run))


def _build(config: Recipe, run: RunDirectory) -> dict:
    s = config.search_spaces
    path = Path(s.embeddings) if s.embeddings is not None else run.path / DEFAULT_EMBEDDINGS
    if not path.exists():
        how = (
            "set search_spaces.embeddings=PATH to an existing file"
            if s.embeddings is not None
            else "run the embed stage first, or set search_spaces.embeddings=PATH to an existing embeddings.h5"
        )
        raise FalconError(f"{path}: embeddings file not found; {how}")
    # Read by row, never whole: a 14M-pair fp16 file is 14 GB (docs/scaling.md).
    with open_embeddings(path) as embeddings:
        return _build_from(config, run, path, embeddings)


def _build_from(config: Recipe, run: RunDirectory, path: Path, embeddings: EmbeddingsFile) -> dict:
    s = config.search_spaces
    started = time.perf_counter()

    # 1. Inputs and settings, all checked before any clustering (the norms: as each row is read).
    # |M| defaults to the batch composers' own search_space_size, so the spaces fit the run.
    size_key, size = (
        ("search_spaces.size", s.size)
        if s.size is not None
        else ("pretrain.composer.search_space_size", config.pretrain.composer.search_space_size)
    )
    if size < 1:
        raise FalconError(f"{size_key}={size}: a search space needs at least 1 pair")
    _check_same_dataset(config, path, embeddings.attrs)
    pair_ids = embeddings.pair_id
    if size > len(pair_ids):
        raise FalconError(
            f"{size_key}={size} is larger than the {len(pair_ids)} pairs in {path}; "
            f"choose {size_key} <= {len(pair_ids)}"
        )
    seed = s.seed if s.seed is not None else config.seed
    judge = _oracle_for(config, path, pair_ids)  # on the shapes world: the oracle and each pair's ids

    def build(method: str, partition_seed: int) -> Partition:
        if method == "random":
            return random_partition(pair_ids, size, partition_seed)
        return kmeans_partition_of(embeddings, size, partition_seed, iterations=s.kmeans_iterations)

    # 2. One partition per epoch, each with its own seed (seed + epoch: a row's seed rebuilds it).
    partitions = [build(s.method, seed + epoch) for epoch in range(s.epochs)]
    columns = [p.columns(pair_ids, epoch=e, method=s.method, seed=seed + e) for e, p in enumerate(partitions)]
    write_table(
        run.path / OUTPUT,
        {name: np.concatenate([c[name] for c in columns]) for name in SEARCH_SPACES.names},
        SEARCH_SPACES,
    )
    run.add_artifact(
        OUTPUT,
        schema=SEARCH_SPACES.name,
        schema_version=SEARCH_SPACES.version,
        meta={"method": s.method, "size": size, "epochs": s.epochs, "seed": seed},
    )

    # 3. Epoch 0 of the written method, and of the other one for comparison.
    compared = {s.method: partitions[0]}
    if s.compare:
        other = "random" if s.method == "kmeans" else "kmeans"
        compared[other] = build(other, seed)
    stats = partition_summary_of(compared, embeddings)

    # 4. False negatives inside the spaces, where an oracle knows them.
    if isinstance(judge, str):
        false_negatives = {"skipped": judge}
    else:
        oracle, image_ids, caption_ids = judge
        false_negatives = {
            "judge": "shapes oracle",
            "definition": "per pair: captions of the other pairs in its space that truly describe its image",
        }
        for method, partition in compared.items():
            counts = false_negatives_in_spaces(partition, image_ids, caption_ids, oracle)
            stats[method].update({k: v for k, v in counts.items() if k != "pairs"})

    # 5. Summary: a file in results/, a table, the manifest.
    summary = {
        "embeddings": str(path),
        "embeddings_source": {k: embeddings.attrs.get(k) for k in ("model", "checkpoint", "dataset", "split", "epoch")},
        "pairs": int(len(pair_ids)),
        "dim": embeddings.dim,
        "method": s.method,
        "size": int(size),
        "seed": int(seed),
        "epochs": s.epochs,
        "spaces": partitions[0].num_spaces,
        "epoch_0": stats,
        "false_negatives": false_negatives,
        "seconds": round(time.perf_counter() - started, 2),
    }
    write_json(run.path / SUMMARY, summary)
    run.add_artifact(SUMMARY, schema="search_spaces_summary", schema_version=1)
    _render(summary)
    return summary


def _check_same_dataset(config: Recipe, path: Path, attrs: dict) -> None:
    """Refuse embeddings of another dataset (by the pair-list fingerprint they record); warn when they record none."""
    expected, split = "", str(attrs.get("split"))
    if attrs.get(FINGERPRINT_ATTR):
        try:
            expected = split_fingerprint(load_spec(config.data.dataset), split, config.data.on_missing)
        except FalconError as exc:
            raise FalconError(
                f"{path}: cannot check these embeddings ({split} split) against {config.data.dataset} "
                f"({exc}); re-run `falcon embed` for this dataset"
            ) from None
    warning = check_fingerprint(path, attrs, expected, config.data.dataset)
    if warning is not None:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}", markup=True, highlight=False)


def _oracle_for(
    config: Recipe, embeddings_path: Path, pair_ids: np.ndarray
) -> tuple[ShapesOracle, np.ndarray, np.ndarray] | str:
    """On a shapes world: (oracle, image id, caption id of each pair); elsewhere the reason there is no oracle."""
    spec = load_spec(config.data.dataset)
    if spec.shapes_world is None:
        return (
            f"{config.data.dataset} is not a shapes world (no shapes_world in its dataset.yaml): "
            "no oracle to judge false negatives"
        )
    oracle = ShapesOracle.load(spec.resolve(spec.shapes_world))
    # The embeddings name pairs by pair_id; the oracle judges (image_id, caption_id).
    records = {r.pair_id: r for r in pretrain_dataset(spec, transform=None, on_missing=config.data.on_missing).records}
    unknown = [int(i) for i in pair_ids if int(i) not in records]
    if unknown:
        raise FalconError(
            f"{embeddings_path}: pair_id {unknown[0]} is not a pretraining pair of {config.data.dataset} "
            f"({len(unknown)} such); the embeddings were made from another dataset"
        )
    try:
        image_ids = np.array([records[int(i)].extra["image_id"] for i in pair_ids], dtype=np.int64)
        caption_ids = np.array([records[int(i)].extra["caption_id"] for i in pair_ids], dtype=np.int64)
    except KeyError as exc:
        raise FalconError(
            f"{config.data.dataset}: pretraining entries lack {exc}; regenerate the shapes world"
        ) from None
    return oracle, image_ids, caption_ids


def _render(summary: dict) -> None:
    table = Table(
        title=f"search spaces: {summary['pairs']} pairs, |M| = {summary['size']}, {summary['method']} written "
        f"({summary['epochs']} epoch(s)), epoch 0"
    )
    with_fn = any("mean_false_negatives" in row for row in summary["epoch_0"].values())
    columns = ["method", "spaces", "size min/mean/max", "cos joint", "cos i2t"] + (
        ["FN per pair", "pairs with FN"] if with_fn else []
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "method" else "right")
    for method, row in summary["epoch_0"].items():
        cells = [
            method + (" (written)" if method == summary["method"] else ""),
            str(row["spaces"]),
            f"{row['size_min']} / {row['size_mean']:g} / {row['size_max']}",
            _number(row["mean_cosine_joint"]),
            _number(row["mean_cosine_i2t"]),
        ]
        if with_fn:
            cells += [_number(row.get("mean_false_negatives")), _number(row.get("fraction_with_false_negatives"))]
        table.add_row(*cells)
    console.print(table)
    if "skipped" in summary["false_negatives"]:
        console.print(f"false negatives: skipped ({summary['false_negatives']['skipped']})")


def _number(value) -> str:
    return "-" if value is None else f"{value:.4f}"
