"""benchmarks/scale_simulation.py at a tiny size (10K pairs, |M| 960): every piece's row is there and sane."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_scale_simulation_tiny(tmp_path):
    out, work = tmp_path / "scale.csv", tmp_path / "work"
    command = [sys.executable, str(ROOT / "benchmarks" / "scale_simulation.py"), "--pairs", "10000", "--dtypes", "fp16",
               "--pieces", "cache_write", "cache_read", "spaces_random", "compose", "--worlds", "1", "4",
               "--space", "960", "--batch", "96", "--workdir", str(work), "--keep-files", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["piece", "pairs", "dtype", "world", "rank_pairs", "spaces", "batches", "status", "seconds",
                             "peak_rss_gib", "base_rss_gib", "data_gib", "disk_bytes", "load_avg", "note"]
    pieces = {(r["piece"], r["world"]): r for r in rows}
    assert set(pieces) == {("cache_write", "1"), ("cache_read", "1"), ("spaces_random", "1"), ("compose", "1"),
                           ("compose", "4")}
    for row in rows:
        assert row["status"] == "measured", row
        assert float(row["seconds"]) > 0 and float(row["peak_rss_gib"]) > 0 and float(row["data_gib"]) > 0
    h5 = work / "embeddings_10000_fp16.h5"
    assert int(pieces["cache_write", "1"]["disk_bytes"]) == int(pieces["cache_read", "1"]["disk_bytes"]) == h5.stat().st_size
    assert h5.stat().st_size >= 10000 * 256 * 2 * 2  # two fp16 [N, 256] datasets at least
    parquet = work / "search_spaces_10000.parquet"
    assert int(pieces["spaces_random", "1"]["disk_bytes"]) == parquet.stat().st_size
    assert pieces["spaces_random", "1"]["spaces"] == "11"  # ceil(10000 / 960)
    assert int(pieces["compose", "4"]["rank_pairs"]) == 2500
    assert int(pieces["compose", "1"]["batches"]) == sum(-(-min(960, 10000 - s) // 96) for s in range(0, 10000, 960))
    assert int(pieces["compose", "4"]["batches"]) > 0
    assert out.with_suffix(".md").read_text().startswith("| piece | pairs |")
