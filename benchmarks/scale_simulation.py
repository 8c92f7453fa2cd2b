"""Memory, disk and time of FALCON's data pieces at 4M and 14M pairs, simulated with random embeddings.

    PYTHONPATH=. .venv/bin/python benchmarks/scale_simulation.py                       # 4M and 14M, fp16 and fp32
    PYTHONPATH=. .venv/bin/python benchmarks/scale_simulation.py --pairs 100000 1000000 --out /tmp/scale.csv
    PYTHONPATH=. .venv/bin/python benchmarks/scale_simulation.py --pairs 4000000 --pieces compose --worlds 1 8

Random unit 256-d embeddings stand in for a model's (the sizes are what matter; the file's rows are the synthetic
topic data of ``kmeans_partition.py``, so that k-means has clusters to find). Each piece runs in its own subprocess,
so the peak RSS reported (``ru_maxrss``) is that piece's alone:

* ``cache_write``: ``embeddings.h5`` written through the project's writer
  (:class:`~falcon_cli.artifacts.embeddings.EmbeddingsWriter`, chunks of 65,536 rows): seconds, bytes on disk.
* ``cache_read``: the same file read back and validated (:func:`~falcon_cli.artifacts.embeddings.read_embeddings`,
  the whole arrays in memory).
* ``cache_memory``: the training loop's in-memory :class:`~falcon_cli.sampling.cache.EmbeddingCache` of every
  pair, filled batch-wise through ``update`` (8,192 rows a call): a single process's cache (every rank's before
  issue 61).
* ``spaces_random``: ``random_partition`` and ``search_spaces.parquet`` written (``SEARCH_SPACES``): bytes on disk.
* ``spaces_kmeans``: ``kmeans_partition`` (faiss; the synthetic topic data of ``kmeans_partition.py``), only up to
  ``--kmeans-max-pairs`` (its cost grows about as N², k = N / |M| centroids): larger N are extrapolated. The
  embeddings in memory, as the stage held them before issue 61.
* ``spaces_kmeans_sampled``: what ``falcon build-search-spaces`` now does with ``method: kmeans`` (``compare:
  false``): :func:`~falcon_cli.sampling.partition.kmeans_partition_of` on the ``cache_write`` file opened with
  :func:`~falcon_cli.artifacts.embeddings.open_embeddings` (a training sample and the candidate lists in memory, the
  rows read in chunks), ``search_spaces.parquet`` written, and the summary's pass
  (:func:`~falcon_cli.sampling.partition.partition_summary_of`). Not capped by ``--kmeans-max-pairs``.
* ``warm_start_rank``: one rank's warm start at world ``W`` (rank 0):
  :func:`~falcon_cli.sampling.warm_start.load_warm_start` of the ``spaces_random`` parquet and the ``cache_write``
  file, its cache on the CPU (on a GPU node that cache, ``data_gib``, is device memory; the rest is host).
* ``cache_shard``: what each rank holds of the training loop's cache at world ``W``
  (:class:`~falcon_cli.sampling.sharded_cache.ShardedCache` on the CPU, rank 0: an epoch begun, both its caches,
  filled by ``update`` with every pair's features in 8,192-row calls as the all-gathered steps do). ``data_gib``
  is its device bytes (``nbytes``; on a GPU node they are on the GPU), checked against ``cache_bytes_per_rank``.
* ``compose``: one epoch's FALCON composition of one rank's share (``world`` = 1: the whole epoch), as
  ``falcon_compose.py`` does: :class:`~falcon_cli.sampling.quantile.QuantileSpaces` (|M| ``--space``, B ``--batch``,
  m = 100) and ``compose_all`` with a freshly initialised :class:`~falcon_cli.sampling.policy.SchedulerPolicy`
  (instance level). The rank's share is :func:`~falcon_cli.sampling.composers.shard_pair_ids` (rank 0 of
  ``world``); its cache holds only the share's pairs (the rank's training cache is the ``cache_shard`` row).

A piece whose predicted peak exceeds ``--max-gb`` or what the machine has available less ``--keep-free-gb``, or
whose file would not fit the disk, is not run: its row says ``skipped`` and why. Rows ``extrapolated`` come
from fits to the measured sizes of the same piece: seconds and disk bytes ``a N^b``, peak RSS ``c + k N`` (``b``,
``c`` and ``k`` are printed and written to the markdown). Extrapolation needs the small sizes in the same call
(e.g. ``--pairs 100000 1000000 4000000 14000000``). Outputs: ``--out`` (CSV) and the same table as markdown beside it
(``.md``).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.memory import max_rss_mib, rss_mib  # noqa: E402

DIM = 256
GIB = 2**30
COLUMNS = (
    "piece",
    "pairs",
    "dtype",
    "world",
    "rank_pairs",
    "spaces",
    "batches",
    "status",
    "seconds",
    "peak_rss_gib",
    "base_rss_gib",
    "data_gib",
    "disk_bytes",
    "load_avg",
    "note",
)
ATTRS = dict(model="random", checkpoint="", dataset="scale-simulation", split="train", epoch=0)
PIECES = (
    "cache_write",
    "cache_read",
    "cache_memory",
    "cache_shard",
    "spaces_random",
    "spaces_kmeans",
    "spaces_kmeans_sampled",
    "warm_start_rank",
    "compose",
)
PER_RANK = ("cache_shard", "warm_start_rank", "compose")
"""Pieces run once per ``--worlds`` size (one rank's part); the others once per N."""


def _bytes(dtype: str) -> int:
    return 2 if dtype == "fp16" else 4


def predicted_gib(piece: str, pairs: int, dtype: str, rank_pairs: int) -> float:
    """Expected peak RSS (GiB) of a piece: its data plus the libraries (torch ~0.5 GiB), from the data structures."""
    features = pairs * DIM * 2 * _bytes(dtype)
    if piece == "cache_write":
        return 0.4
    if piece == "cache_read":
        return (features + pairs * 8) / GIB + 0.5
    if piece == "cache_memory":
        return (features + pairs * 26) / GIB + 0.8
    if piece == "spaces_random":
        return pairs * 8 * 12 / GIB + 0.4
    if piece == "spaces_kmeans":
        return (pairs * DIM * (2 * 2 + 4 * 2) + pairs * 100) / GIB + 0.8
    if piece == "spaces_kmeans_sampled":  # the sample (fp32), candidates and ids, the partition's columns, chunks
        k = math.ceil(pairs / 5664)
        return (256 * k * DIM * 4 * 2 + pairs * (8 * 12 + 8 * 12)) / GIB + 1.5
    if piece == "warm_start_rank":  # the spaces table (pandas, sorted copies), ids, the rank's cache, torch
        return (pairs * 200 + rank_pairs * (DIM * 2 * 2 + 26)) / GIB + 1.0
    if piece == "cache_shard":  # two caches of the share, every pair id, torch
        return (2 * rank_pairs * (DIM * 2 * _bytes(dtype) + 27) + pairs * 8) / GIB + 0.8
    if piece == "compose":  # the share's cache, ids, batches; one chunk of tables (512 MiB) and torch
        return (rank_pairs * DIM * 2 * _bytes(dtype) + rank_pairs * 400) / GIB + 1.5
    raise ValueError(piece)


def available_gib() -> float:
    with open("/proc/meminfo") as handle:
        info = {line.split(":")[0]: int(line.split()[1]) for line in handle}
    return info["MemAvailable"] / 2**20


# --- the pieces (run in a child process) ---------------------------------------------------------
def _pool(rng, rows: int = 65536):
    """Unit float32 rows to draw chunks from (the content does not matter for writing, reading or storing)."""
    import numpy as np

    pool = rng.standard_normal((rows, DIM), dtype=np.float32)
    return pool / np.linalg.norm(pool, axis=1, keepdims=True)


def run_piece(args: argparse.Namespace) -> dict:
    import numpy as np

    piece, n, dtype = args.piece, args.n, args.dtype
    path = Path(args.workdir)
    rng = np.random.default_rng(0)
    result: dict = {"disk_bytes": "", "spaces": "", "batches": "", "note": ""}
    h5 = path / f"embeddings_{n}_{dtype}.h5"
    if piece == "cache_write":
        from benchmarks.kmeans_partition import synthetic_chunks
        from falcon_cli.artifacts.embeddings import EmbeddingsWriter

        base = rss_mib()
        start, seconds = 0, 0.0
        with EmbeddingsWriter(
            h5, n=n, dim=DIM, attrs=ATTRS, dtype="float16" if dtype == "fp16" else "float32"
        ) as writer:
            for image, text in synthetic_chunks(n, DIM, 300, 0):
                tick = time.perf_counter()
                writer.write(start, image, text, np.arange(start, start + len(image), dtype=np.int64))
                seconds += time.perf_counter() - tick
                start += len(image)
            tick = time.perf_counter()
        seconds += time.perf_counter() - tick  # close: the file moved into place
        result.update(
            seconds=seconds,
            disk_bytes=h5.stat().st_size,
            data_gib=n * DIM * 2 * _bytes(dtype) / GIB,
            note="writer calls and close only (drawing the rows not counted)",
        )
    elif piece == "cache_read":
        from falcon_cli.artifacts.embeddings import read_embeddings

        base = rss_mib()
        tick = time.perf_counter()
        emb = read_embeddings(h5)
        result.update(
            seconds=time.perf_counter() - tick,
            disk_bytes=h5.stat().st_size,
            data_gib=(emb.image.nbytes + emb.text.nbytes + emb.pair_id.nbytes) / GIB,
            note="read_embeddings: whole arrays in memory, validated",
        )
    elif piece == "cache_memory":
        import torch

        from falcon_cli.sampling.cache import EmbeddingCache

        pool = torch.from_numpy(_pool(rng))
        g = torch.Generator().manual_seed(0)
        base = rss_mib()
        tick = time.perf_counter()
        ids = torch.arange(n)
        cache = EmbeddingCache(ids, dim=DIM, dtype=torch.float16 if dtype == "fp16" else torch.float32)
        for start in range(0, n, 8192):
            chunk = ids[start : start + 8192]
            cache.update(
                chunk,
                pool[torch.randint(len(pool), (len(chunk),), generator=g)],
                pool[torch.randint(len(pool), (len(chunk),), generator=g)],
            )
        tensors = (
            cache.image,
            cache.text,
            cache.pair_ids,
            cache._sorted_ids,
            cache._sorted_rows,
            cache.filled,
            cache.written,
        )
        result.update(
            seconds=time.perf_counter() - tick,
            data_gib=sum(t.nbytes for t in tensors) / GIB,
            note="EmbeddingCache of all N pairs filled by update() in 8,192-row calls (a single process's)",
        )
    elif piece == "cache_shard":
        import torch

        from falcon_cli.sampling.composers import shard_pair_ids
        from falcon_cli.sampling.sharded_cache import ShardedCache, cache_bytes_per_rank

        pool = torch.from_numpy(_pool(rng))
        g = torch.Generator().manual_seed(0)
        dtype_torch = torch.float16 if dtype == "fp16" else torch.float32
        base = rss_mib()
        ids = torch.arange(n)
        cache = ShardedCache(ids, DIM, dtype=dtype_torch, rank=0, world=args.world)
        shards = torch.Generator().manual_seed(1)
        shard = shard_pair_ids(ids, 0, args.world, shards)
        # Epoch 0 has no reading cache (nothing is written yet); epoch 1 is the steady state: reading + filling.
        for epoch in range(2):
            tick = time.perf_counter()
            next_shard = shard_pair_ids(ids, 0, args.world, shards)
            cache.begin(shard, next_shard)
            order = ids[torch.randperm(n, generator=g)]  # an epoch's steps, all-gathered: every pair once
            for start in range(0, n, 8192):
                chunk = order[start : start + 8192]
                cache.update(
                    chunk,
                    pool[torch.randint(len(pool), (len(chunk),), generator=g)],
                    pool[torch.randint(len(pool), (len(chunk),), generator=g)],
                )
            if epoch == 0:
                cache.end()  # (no reading cache: nothing to hand over, no collective)
            shard = next_shard
        expected = cache_bytes_per_rank(n, args.world, dim=DIM, dtype=dtype_torch)["device_bytes"]
        assert cache.nbytes == expected, (cache.nbytes, expected)
        result.update(
            seconds=time.perf_counter() - tick,
            data_gib=cache.nbytes / GIB,
            note=f"ShardedCache rank 0 of {args.world}: {cache.rows:,} rows (reading + filling), the second "
            "epoch's updates (seconds: that epoch); data = device bytes = cache_bytes_per_rank",
        )
    elif piece == "spaces_random":
        from falcon_cli.artifacts.tables import SEARCH_SPACES, write_table
        from falcon_cli.sampling.partition import random_partition

        out = path / f"search_spaces_{n}.parquet"
        ids = np.arange(n, dtype=np.int64)
        base = rss_mib()
        tick = time.perf_counter()
        partition = random_partition(ids, args.space, 0)
        write_table(out, partition.columns(ids, epoch=0, method="random", seed=0), SEARCH_SPACES)
        result.update(
            seconds=time.perf_counter() - tick,
            disk_bytes=out.stat().st_size,
            spaces=partition.num_spaces,
            data_gib=n * 8 * 4 / GIB,
            note="random_partition + search_spaces.parquet",
        )
    elif piece == "spaces_kmeans":
        from benchmarks.kmeans_partition import synthetic
        from falcon_cli.sampling.partition import kmeans_partition

        image, text = synthetic(n, DIM, 300, 0)
        ids = np.arange(n, dtype=np.int64)
        base = rss_mib()
        tick = time.perf_counter()
        partition = kmeans_partition(image, text, ids, args.space, 0)
        result.update(
            seconds=time.perf_counter() - tick,
            spaces=partition.num_spaces,
            data_gib=(image.nbytes + text.nbytes) / GIB,
            note="kmeans_partition (20 iterations, fp16 embeddings in memory; parquet as spaces_random)",
        )
    elif piece == "compose":
        import torch

        from falcon_cli.sampling.cache import EmbeddingCache
        from falcon_cli.sampling.composers import shard_pair_ids
        from falcon_cli.sampling.policy import SchedulerPolicy
        from falcon_cli.sampling.quantile import QuantileSpaces

        g = torch.Generator().manual_seed(0)
        share = shard_pair_ids(torch.arange(n), 0, args.world, torch.Generator().manual_seed(1))
        cache = EmbeddingCache(share, dim=DIM, dtype=torch.float16 if dtype == "fp16" else torch.float32)
        for start in range(0, len(share), 8192):
            chunk = share[start : start + 8192]
            feats = torch.nn.functional.normalize(torch.randn(len(chunk), 2, DIM, generator=g), dim=-1)
            cache.update(chunk, feats[:, 0], feats[:, 1])
        policy = SchedulerPolicy(quantiles=100).eval()
        base = rss_mib()
        tick = time.perf_counter()
        with torch.no_grad():
            spaces = QuantileSpaces(share, cache, args.space, args.batch, g, quantiles=100)
            batches = spaces.compose_all(lambda s_hat: policy(s_hat), g)
        result.update(
            seconds=time.perf_counter() - tick,
            spaces=spaces.num_spaces,
            batches=len(batches),
            data_gib=(cache.image.nbytes + cache.text.nbytes) / GIB,
            note=f"|M| {args.space}, B {args.batch}, m 100, policy at instance level; cache of the share only",
        )
        assert sum(len(b.pair_ids) for b in batches) == len(share)
    elif piece == "spaces_kmeans_sampled":
        from falcon_cli.artifacts.embeddings import open_embeddings
        from falcon_cli.artifacts.tables import SEARCH_SPACES, write_table
        from falcon_cli.sampling.partition import kmeans_partition_of, partition_summary_of

        out = path / f"search_spaces_kmeans_{n}.parquet"
        base = rss_mib()
        tick = time.perf_counter()
        with open_embeddings(h5) as embeddings:
            partition = kmeans_partition_of(embeddings, args.space, 0)
            write_table(out, partition.columns(embeddings.pair_id, epoch=0, method="kmeans", seed=0), SEARCH_SPACES)
            summary = partition_summary_of({"kmeans": partition}, embeddings)["kmeans"]
        result.update(
            seconds=time.perf_counter() - tick,
            spaces=partition.num_spaces,
            disk_bytes=out.stat().st_size,
            data_gib=(n * 8 * (8 + 4) + 256 * partition.num_spaces * DIM * 4) / GIB,
            note=f"kmeans_partition_of from the file + parquet + summary (within-space cosine joint "
            f"{summary['mean_cosine_joint']}); data = candidate lists (8 a pair) and training sample",
        )
        out.unlink()
    elif piece == "warm_start_rank":
        import torch

        from falcon_cli.sampling.warm_start import load_warm_start

        base = rss_mib()
        tick = time.perf_counter()
        warm = load_warm_start(path / f"search_spaces_{n}.parquet", h5, torch.arange(n), rank=0, world=args.world)
        cache = warm.cache
        result.update(
            seconds=time.perf_counter() - tick,
            spaces=math.ceil(n / warm.width),
            data_gib=(cache.image.nbytes + cache.text.nbytes + len(cache) * 26) / GIB,
            note=f"load_warm_start rank 0 of {args.world}: {len(cache):,} rows read; data = its cache "
            "(device memory on a GPU node)",
        )
    else:
        raise ValueError(piece)
    result.update(peak_rss_gib=max_rss_mib() / 1024, base_rss_gib=base / 1024)
    return result


# --- the driver ----------------------------------------------------------------------------------
def child(piece: str, n: int, dtype: str, world: int, args: argparse.Namespace) -> dict:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--piece",
        piece,
        "--n",
        str(n),
        "--dtype",
        dtype,
        "--world",
        str(world),
        "--space",
        str(args.space),
        "--batch",
        str(args.batch),
        "--workdir",
        args.workdir,
    ]
    command += ["--keep-files"] if args.keep_files else []
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        return {"status": f"failed (exit {done.returncode}): {done.stderr.strip().splitlines()[-1:]}"}
    return {"status": "measured", **json.loads(done.stdout.strip().splitlines()[-1])}


def fit(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """(a, b) of value = a N^b, least squares in log-log over the measured points (None: fewer than 2 sizes)."""
    points = [(x, y) for x, y in points if x > 0 and y and y > 0]
    if len({x for x, _ in points}) < 2:
        return None
    xs, ys = [math.log(x) for x, _ in points], [math.log(y) for _, y in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return math.exp(my - b * mx), b


def plan(args: argparse.Namespace) -> list[tuple[str, int, str, int]]:
    jobs = []
    for n in sorted(args.pairs):
        for dtype in args.dtypes:
            for piece in args.pieces:
                if piece == "spaces_random" and dtype != args.dtypes[0]:
                    continue  # the partition has no features
                if piece == "spaces_kmeans" and (dtype != "fp16"):
                    continue  # faiss reads the fp16 file's rows as float32 either way
                if piece in ("spaces_kmeans_sampled", "warm_start_rank") and dtype != args.dtypes[0]:
                    continue  # (read as fp32 either way; the cache is fp16)
                if piece in PER_RANK:
                    if piece == "compose" and dtype not in args.compose_dtypes:
                        continue
                    for world in args.worlds:
                        if world <= n and (world > 1 or piece == "compose"):  # (world 1: cache_memory, the old rows)
                            jobs.append((piece, n, dtype, world))
                    continue
                jobs.append((piece, n, dtype, 1))
    order = {p: i for i, p in enumerate(PIECES)}  # the read needs the file the write made
    return sorted(jobs, key=lambda j: (j[1], j[2], order[j[0]], j[3]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, nargs="+", default=[4_000_000, 14_000_000])
    parser.add_argument("--dtypes", nargs="+", default=["fp16", "fp32"], choices=["fp16", "fp32"])
    parser.add_argument(
        "--compose-dtypes",
        nargs="+",
        default=["fp16"],
        choices=["fp16", "fp32"],
        help="cache dtypes to compose from (default fp16: composition casts to fp32 either way)",
    )
    parser.add_argument("--pieces", nargs="+", default=list(PIECES), choices=PIECES)
    parser.add_argument(
        "--worlds",
        type=int,
        nargs="+",
        default=[1, 8, 16, 64],
        help="compose one rank's share at these world sizes (1: the whole epoch)",
    )
    parser.add_argument("--space", type=int, default=5664, help="|M| (FALCON's default, COCO; the 4M/14M setting too)")
    parser.add_argument("--batch", type=int, default=96, help="B per rank (FALCON Tab. 5)")
    parser.add_argument("--kmeans-max-pairs", type=int, default=1_000_000, help="larger N: k-means extrapolated")
    parser.add_argument(
        "--compose-max-pairs",
        type=int,
        default=None,
        help="compose shares larger than this are extrapolated, not run (time)",
    )
    parser.add_argument("--max-gb", type=float, default=16.0, help="no piece predicted above this peak (GiB) runs")
    parser.add_argument("--keep-free-gb", type=float, default=6.0, help="leave this much of MemAvailable to others")
    parser.add_argument("--keep-disk-gb", type=float, default=20.0, help="leave this much disk free")
    parser.add_argument("--workdir", default=None, help="where the files go (default: a temporary folder, removed)")
    parser.add_argument("--out", default="docs/results/scale_simulation.csv")
    parser.add_argument(
        "--keep-files",
        action="store_true",
        help="keep embeddings_*.h5 and search_spaces_*.parquet in --workdir (default: each removed once measured)",
    )
    # one piece, in a child process
    parser.add_argument("--piece", choices=PIECES)
    parser.add_argument("--n", type=int)
    parser.add_argument("--dtype", default="fp16")
    parser.add_argument("--world", type=int, default=1)
    args = parser.parse_args()
    if args.piece:
        print(json.dumps(run_piece(args)))
        return

    temporary = None
    if args.workdir is None:
        temporary = tempfile.TemporaryDirectory(prefix="scale_simulation_")
        args.workdir = temporary.name
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    jobs = plan(args)
    last_use = files_last_used(jobs, Path(args.workdir))
    for index, (piece, n, dtype, world) in enumerate(jobs):
        rank_pairs = math.ceil(n / world)
        row = {"piece": piece, "pairs": n, "dtype": dtype, "world": world, "rank_pairs": rank_pairs}
        need = predicted_gib(piece, n, dtype, rank_pairs)
        room = min(args.max_gb, available_gib() - args.keep_free_gb)
        disk = n * DIM * 2 * _bytes(dtype) * 1.01 / GIB
        disk_free = os.statvfs(args.workdir).f_bavail * os.statvfs(args.workdir).f_frsize / GIB - args.keep_disk_gb
        h5 = Path(args.workdir) / f"embeddings_{n}_{dtype}.h5"
        if need > room:
            row["status"] = f"skipped: predicted peak {need:.1f} GiB > {room:.1f} GiB allowed"
        elif piece == "cache_write" and disk > disk_free:
            row["status"] = f"skipped: file {disk:.1f} GiB > {disk_free:.1f} GiB disk to spare"
        elif piece in ("cache_read", "spaces_kmeans_sampled", "warm_start_rank") and not h5.exists():
            row["status"] = "skipped: no file (cache_write skipped)"
        elif piece == "warm_start_rank" and not (Path(args.workdir) / f"search_spaces_{n}.parquet").exists():
            row["status"] = "skipped: no search spaces (spaces_random skipped)"
        elif piece == "spaces_kmeans" and n > args.kmeans_max_pairs:
            row["status"] = f"skipped: N > --kmeans-max-pairs {args.kmeans_max_pairs}"
        elif piece == "compose" and args.compose_max_pairs and rank_pairs > args.compose_max_pairs:
            row["status"] = f"skipped: share > --compose-max-pairs {args.compose_max_pairs}"
        else:
            row.update(child(piece, n, dtype, world, args))
        row["load_avg"] = round(os.getloadavg()[0], 2)
        for file, last in last_use.items():
            if last == index and file.exists() and not args.keep_files:
                file.unlink()
        rows.append(row)
        print(
            " ".join(
                f"{k}={row.get(k)}"
                for k in ("piece", "pairs", "dtype", "world", "status", "seconds", "peak_rss_gib", "disk_bytes")
            ),
            flush=True,
        )
    fits = extrapolate(rows, args.pairs)
    write(rows, fits, args)
    if temporary is not None:
        temporary.cleanup()


def files_last_used(jobs: list[tuple[str, int, str, int]], workdir: Path) -> dict[Path, int]:
    """The index of the last job that reads each file the jobs make (``embeddings_*.h5``: ``cache_write``'s;
    ``search_spaces_*.parquet``: ``spaces_random``'s), so each is removed as soon as nothing needs it."""
    last: dict[Path, int] = {}
    for index, (piece, n, dtype, _) in enumerate(jobs):
        h5, parquet = workdir / f"embeddings_{n}_{dtype}.h5", workdir / f"search_spaces_{n}.parquet"
        if piece in ("cache_write", "cache_read", "spaces_kmeans_sampled", "warm_start_rank"):
            last[h5] = index
        if piece in ("spaces_random", "warm_start_rank"):
            last[parquet] = index
    return last


def _key(row: dict) -> tuple:
    return (row["piece"], row["dtype"], 1 if row["piece"] != "compose" else 0)


def linear(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """(c, k) of value = c + k N, least squares (memory: the libraries plus the data; None: fewer than 2 sizes)."""
    if len({x for x, _ in points}) < 2:
        return None
    mx, my = sum(x for x, _ in points) / len(points), sum(y for _, y in points) / len(points)
    k = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - k * mx, k


def extrapolate(rows: list[dict], sizes: list[int]) -> dict:
    """Fit the measured rows of each piece and dtype (compose: against the share's pairs, every world together):
    seconds and disk bytes as a N^b, peak RSS as c + k N; fill in the rows that were skipped."""
    fits: dict = {}
    groups: dict = {}
    for row in rows:
        groups.setdefault((row["piece"], row["dtype"]), []).append(row)
    for (piece, dtype), members in groups.items():
        x = "rank_pairs" if piece in ("compose", "cache_shard") else "pairs"
        measured = [r for r in members if r.get("status") == "measured"]
        for field in ("seconds", "peak_rss_gib", "disk_bytes"):
            points = [(float(r[x]), float(r[field])) for r in measured if r.get(field) not in ("", None)]
            model = linear(points) if field == "peak_rss_gib" else fit(points)
            if model is None:
                continue
            fits[(piece, dtype, field)] = model
            for r in members:
                if r.get("status", "").startswith("skipped"):
                    n = float(r[x])
                    value = model[0] + model[1] * n if field == "peak_rss_gib" else model[0] * n ** model[1]
                    r.setdefault("extrapolated", {})[field] = value
    for row in rows:
        extra = row.pop("extrapolated", None)
        if extra:
            row["status"] = row["status"] + "; extrapolated"
            row.update(extra)
    return fits


def write(rows: list[dict], fits: dict, args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _fmt(row.get(k, "")) for k in COLUMNS})
    lines = [
        "| piece | pairs | dtype | world | rank pairs | status | seconds | peak RSS GiB | data GiB | disk |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['piece']} | {row['pairs']:,} | {row['dtype']} | {row['world']} | {row['rank_pairs']:,} | "
            f"{row.get('status', '')} | {_fmt(row.get('seconds', ''))} | {_fmt(row.get('peak_rss_gib', ''))} | "
            f"{_fmt(row.get('data_gib', ''))} | {_human(row.get('disk_bytes', ''))} |"
        )
    lines += [
        "",
        "Growth (N: pairs; compose, cache_shard: the rank's share): seconds = a N^b, peak RSS = c + k N, disk = a N^b.",
        "",
        "| piece | dtype | seconds: b | peak RSS: c GiB | peak RSS: GiB per 1M pairs "
        "| disk: bytes per pair at the largest N |",
        "|---|---|---|---|---|---|",
    ]
    for piece, dtype in sorted({(p, d) for p, d, _ in fits}):
        t, m, d = (fits.get((piece, dtype, f)) for f in ("seconds", "peak_rss_gib", "disk_bytes"))
        largest = max(
            (
                float(r["rank_pairs" if piece in ("compose", "cache_shard") else "pairs"])
                for r in rows
                if r["piece"] == piece and r["dtype"] == dtype and r.get("status") == "measured"
            ),
            default=0,
        )
        per_pair = f"{d[0] * largest ** d[1] / largest:.1f}" if d and largest else ""
        lines.append(
            f"| {piece} | {dtype} | {f'{t[1]:.2f}' if t else ''} | {f'{m[0]:.2f}' if m else ''} | "
            f"{f'{m[1] * 1e6:.3f}' if m else ''} | {per_pair} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e6 else f"{value:.0f}"
    return str(value)


def _human(value) -> str:
    if value in ("", None):
        return ""
    value = float(value)
    return f"{value / GIB:.2f} GiB" if value >= GIB / 4 else f"{value / 2**20:.1f} MiB"


if __name__ == "__main__":
    main()
