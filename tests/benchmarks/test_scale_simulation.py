"""benchmarks/scale_simulation.py at a tiny size (10K pairs, |M| 960): every piece's row is there and sane."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # (a benchmark's smoke run: `make test-all`)

ROOT = Path(__file__).resolve().parents[2]


def test_scale_simulation_tiny(tmp_path):
    out, work = tmp_path / "scale.csv", tmp_path / "work"
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "scale_simulation.py"),
        "--pairs",
        "10000",
        "--dtypes",
        "fp16",
        "--pieces",
        "cache_write",
        "cache_read",
        "spaces_random",
        "compose",
        "--worlds",
        "1",
        "4",
        # the files here are megabytes: the 20 GiB the benchmark leaves free by default is for its 14M-pair rows,
        # and a CI runner may have less than that free
        "--keep-disk-gb",
        "0.1",
        "--space",
        "960",
        "--batch",
        "96",
        "--workdir",
        str(work),
        "--keep-files",
        "--out",
        str(out),
    ]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == [
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
    ]
    pieces = {(r["piece"], r["world"]): r for r in rows}
    assert set(pieces) == {
        ("cache_write", "1"),
        ("cache_read", "1"),
        ("spaces_random", "1"),
        ("compose", "1"),
        ("compose", "4"),
    }
    for row in rows:
        assert row["status"] == "measured", row
        assert float(row["seconds"]) > 0 and float(row["peak_rss_gib"]) > 0 and float(row["data_gib"]) > 0
    h5 = work / "embeddings_10000_fp16.h5"
    assert (
        int(pieces["cache_write", "1"]["disk_bytes"])
        == int(pieces["cache_read", "1"]["disk_bytes"])
        == h5.stat().st_size
    )
    assert h5.stat().st_size >= 10000 * 256 * 2 * 2  # two fp16 [N, 256] datasets at least
    parquet = work / "search_spaces_10000.parquet"
    assert int(pieces["spaces_random", "1"]["disk_bytes"]) == parquet.stat().st_size
    assert pieces["spaces_random", "1"]["spaces"] == "11"  # ceil(10000 / 960)
    assert int(pieces["compose", "4"]["rank_pairs"]) == 2500
    assert int(pieces["compose", "1"]["batches"]) == sum(-(-min(960, 10000 - s) // 96) for s in range(0, 10000, 960))
    assert int(pieces["compose", "4"]["batches"]) > 0
    assert out.with_suffix(".md").read_text().startswith("| piece | pairs |")


def test_scale_simulation_per_rank_pieces_tiny(tmp_path):
    """The pieces as they run since issue 61: k-means from the file, one rank's warm start and cache shard."""
    from falcon_cli.sampling.sharded_cache import cache_bytes_per_rank

    out, work = tmp_path / "scale.csv", tmp_path / "work"
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "scale_simulation.py"),
        "--pairs",
        "10000",
        "--dtypes",
        "fp16",
        "--pieces",
        "cache_write",
        "cache_shard",
        "spaces_random",
        "spaces_kmeans_sampled",
        "warm_start_rank",
        "--worlds",
        "1",
        "4",
        # the files here are megabytes: the 20 GiB the benchmark leaves free by default is for its 14M-pair rows,
        # and a CI runner may have less than that free
        "--keep-disk-gb",
        "0.1",
        "--space",
        "960",
        "--workdir",
        str(work),
        "--out",
        str(out),
    ]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=180,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    pieces = {(r["piece"], r["world"]): r for r in rows}
    assert set(pieces) == {
        ("cache_write", "1"),
        ("cache_shard", "4"),
        ("spaces_random", "1"),
        ("spaces_kmeans_sampled", "1"),
        ("warm_start_rank", "4"),
    }, "per-rank pieces skip world 1"
    for row in rows:
        assert row["status"] == "measured", row
        assert float(row["seconds"]) > 0 and float(row["peak_rss_gib"]) > 0 and float(row["data_gib"]) > 0
    assert (
        pieces["spaces_kmeans_sampled", "1"]["spaces"] == "11"
        and int(pieces["spaces_kmeans_sampled", "1"]["disk_bytes"]) > 0
    )
    shard = pieces["cache_shard", "4"]
    assert int(shard["rank_pairs"]) == 2500
    assert float(shard["data_gib"]) * 2**30 == pytest.approx(cache_bytes_per_rank(10000, 4)["device_bytes"], rel=1e-3)
    warm = pieces["warm_start_rank", "4"]
    assert "2,500 rows read" in warm["note"] and float(warm["data_gib"]) * 2**30 == pytest.approx(
        2500 * (256 * 4 + 26), rel=1e-3
    )
    assert list(work.iterdir()) == [], "each file removed once nothing needs it"
