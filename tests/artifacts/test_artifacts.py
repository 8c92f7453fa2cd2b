"""Artifacts: atomic writes, versioned Parquet tables, embeddings.h5, the run directory and manifest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from falcon_cli.artifacts.atomic import atomic_open, write_json
from falcon_cli.artifacts.config_diff import config_differences, with_missing_keys
from falcon_cli.artifacts.embeddings import EmbeddingsWriter, open_embeddings, read_embeddings, write_embeddings
from falcon_cli.artifacts.tables import BATCHES, SEARCH_SPACES, read_table, write_table
from falcon_cli.errors import FalconError
from falcon_cli.runtime.run_dir import RunDirectory, read_manifest, sha256_file

ATTRS = dict(model="albef-tiny", checkpoint="ckpt/10", dataset="shapes", split="train", epoch=1)


# -- atomic writes -------------------------------------------------------------------------


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    target = tmp_path / "a.json"
    write_json(target, {"v": 1})
    with pytest.raises(RuntimeError):
        with atomic_open(target) as handle:
            handle.write('{"v": 2, "half')
            raise RuntimeError("killed mid-write")
    assert json.loads(target.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"], "temporary file must be cleaned up"


def test_a_full_disk_is_one_line_naming_the_artifact_and_keeps_the_old_one(tmp_path):
    """ENOSPC (as an OSError, or as the text safetensors and torch.save raise) inside a writer, nested
    writers included: one FalconError naming the outermost target, the old file kept, no temporaries."""
    import errno

    from falcon_cli.artifacts.atomic import atomic_dir, atomic_path
    from falcon_cli.errors import storage_error

    target = tmp_path / "a.json"
    write_json(target, {"v": 1})
    with pytest.raises(FalconError, match=rf"^{target}: no space left on device; free space there"):
        with atomic_open(target) as handle:
            handle.write("{")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert json.loads(target.read_text()) == {"v": 1} and [p.name for p in tmp_path.iterdir()] == ["a.json"]
    checkpoint = tmp_path / "checkpoints" / "00000010"
    with pytest.raises(FalconError, match=rf"^{checkpoint}: no space left on device"):
        with atomic_dir(checkpoint) as tmp, atomic_path(tmp / "model.safetensors"):
            raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")
    assert list((tmp_path / "checkpoints").iterdir()) == []
    with pytest.raises(ValueError):  # anything else passes through unchanged
        with atomic_open(target):
            raise ValueError("not a storage problem")
    assert "read-only file system; use a --run-dir on a writable disk" in str(
        storage_error(OSError(errno.EROFS, "Read-only file system", "/ro/run"))
    )
    wrapped = RuntimeError("writing the manifest failed")
    wrapped.__context__ = OSError(errno.EDQUOT, "Disk quota exceeded", "/q/run/metrics.jsonl")
    assert str(storage_error(wrapped)).startswith("/q/run/metrics.jsonl: disk quota exceeded")
    assert storage_error(RuntimeError("CUDA out of memory")) is None


@pytest.fixture
def small_mount(tmp_path):
    """A small tmpfs (``mount("rw")``, ``mount("ro")``, or ``mount("rw", "200m")``): the real full disk
    and read-only directory; skipped where this process may not mount (not root, no CAP_SYS_ADMIN)."""
    mounted = []

    def mount(options: str, size: str = "2m"):
        point = tmp_path / f"mnt-{len(mounted)}"
        point.mkdir()
        if (
            os.geteuid() != 0
            or subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={size},{options}", "tmpfs", str(point)], capture_output=True
            ).returncode
            != 0
        ):
            pytest.skip("cannot mount a tmpfs here")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", str(point)], capture_output=True)


def test_the_cli_says_disk_full_and_read_only_in_one_line(small_mount, tmp_path):
    from tests.conftest import run_cli

    world = [
        "data.shapes.images=40",
        "data.tokenizer_vocab_size=200",
        "pretrain.epochs=1",
        "pretrain.batch_size=16",
        "pretrain.composer.search_space_size=48",
        "pretrain.loader.num_workers=0",
        "pretrain.eval.split=null",
        f"data.dataset={tmp_path / 'world'}",
    ]
    full = small_mount("rw") / "run"
    proc = run_cli("pretrain", "--recipe", "shapes-demo", "--run-dir", full, *world)
    assert proc.returncode == 2 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert f"{full}/" in proc.stderr and "no space left on device" in proc.stderr
    read_only = small_mount("ro") / "run"
    proc = run_cli("pretrain", "--recipe", "shapes-demo", "--run-dir", read_only, *world)
    assert proc.returncode == 2 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert f"{read_only}: read-only file system; use a --run-dir on a writable disk" in proc.stderr


def test_a_run_directory_has_one_writer_and_a_killed_one_leaves_no_lock(tmp_path):
    """A second process writing into a locked run directory gets one line naming the holder's pid and
    changes nothing; once the holder is killed (-9) the lock is gone with it."""
    import signal

    from tests.conftest import REPO, run_cli

    run_dir = tmp_path / "run"
    RunDirectory.open(run_dir, config={"seed": 0}, seed=0).close()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from falcon_cli.runtime.run_dir import acquire_lock
        acquire_lock(Path({str(run_dir)!r}))
        print("locked", flush=True)
        time.sleep(60)
    """),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = (run_dir / "manifest.json").read_bytes()
        proc = run_cli("pretrain", "--recipe", "shapes-demo", "--run-dir", run_dir)
        assert proc.returncode == 2 and "Traceback" not in proc.stdout + proc.stderr
        assert f"is being written by another falcon process (pid {holder.pid} " in " ".join(proc.stderr.split())
        assert (run_dir / "manifest.json").read_bytes() == before
        with pytest.raises(FalconError, match="is being written by another falcon process"):
            RunDirectory.open(run_dir, config={"seed": 0}, seed=0)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    run = RunDirectory.open(run_dir, config={"seed": 0}, seed=0)  # the killed holder left no stale lock
    again = RunDirectory.open(run_dir, config={"seed": 0}, seed=0)  # this process may open it again
    again.close()
    run.close()


def test_opening_a_run_removes_the_temporaries_an_interrupted_writer_left(tmp_path):
    run_dir = tmp_path / "run"
    RunDirectory.open(run_dir, config={"seed": 0}, seed=0).close()
    stale_checkpoint = run_dir / "checkpoints" / ".00000056.k2j3.tmp"
    stale_checkpoint.mkdir(parents=True)
    (stale_checkpoint / "model.safetensors").write_bytes(b"half")
    stale_embeddings = run_dir / "embeddings" / ".embeddings.h5.x81.tmp"
    stale_embeddings.parent.mkdir()
    stale_embeddings.write_bytes(b"half")
    keep = [run_dir / "checkpoints" / "00000050" / "model.safetensors", run_dir / "embeddings" / "epoch_000.h5"]
    for path in keep:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"whole")
    RunDirectory.open(run_dir, config={"seed": 0}, seed=0).close()
    assert not stale_checkpoint.exists() and not stale_embeddings.exists() and all(p.exists() for p in keep)
    assert "removed 2 temporary file(s) an interrupted writer left" in (run_dir / "log.txt").read_text()


def test_a_finished_run_on_a_read_only_disk_gives_one_line_to_every_command(small_mount, tmp_path):
    """--resume, evaluate and audit of a run whose disk became read-only: one line each, no traceback."""
    from tests.conftest import run_cli

    point = small_mount("rw", "200m")
    run_dir = point / "run"
    world = [
        "data.shapes.images=40",
        "data.tokenizer_vocab_size=200",
        "pretrain.epochs=1",
        "pretrain.batch_size=16",
        "pretrain.composer.search_space_size=48",
        "pretrain.loader.num_workers=0",
        "pretrain.eval.split=null",
        f"data.dataset={tmp_path / 'world'}",
    ]
    assert run_cli("pretrain", "--recipe", "shapes-demo", "--run-dir", run_dir, *world).returncode == 0
    assert subprocess.run(["mount", "-o", "remount,ro", str(point)], capture_output=True).returncode == 0
    for args in (
        ["pretrain", "--recipe", "shapes-demo", "--run-dir", run_dir, *world, "--resume"],
        ["evaluate", "retrieval", run_dir, "--false-negatives", "none"],
        ["audit-false-negatives", run_dir, "--judge", "oracle"],
    ):
        proc = run_cli(*args)
        assert proc.returncode == 2 and "Traceback" not in proc.stdout + proc.stderr, (args, proc.stderr)
        assert f"{run_dir}" in proc.stderr and "read-only file system" in proc.stderr, (args, proc.stderr)


def test_killed_writer_leaves_no_partial_artifact(tmp_path):
    target = tmp_path / "big.txt"
    script = textwrap.dedent(f"""
        import os
        from falcon_cli.artifacts.atomic import atomic_open
        with atomic_open({str(target)!r}) as f:
            f.write("x" * 1000)
            f.flush()
            os._exit(9)  # the process dies before the rename
    """)
    proc = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert proc.returncode == 9
    assert not target.exists()


# -- Parquet tables ------------------------------------------------------------------------


def spaces_frame(n=6):
    return pd.DataFrame(
        {
            "pair_id": np.arange(n),
            "space_id": np.arange(n) // 3,
            "position": np.arange(n) % 3,
            "epoch": 1,
            "method": "random",
            "seed": 0,
        }
    )


def test_table_roundtrip_and_metadata(tmp_path):
    path = write_table(tmp_path / "search_spaces.parquet", spaces_frame(), SEARCH_SPACES)
    frame = read_table(path, SEARCH_SPACES)
    assert list(frame.columns) == SEARCH_SPACES.names
    assert frame["pair_id"].tolist() == list(range(6))
    assert pq.read_schema(path).metadata[b"falcon.schema_version"] == b"1"


def test_table_writer_rejects_wrong_columns_and_duplicates(tmp_path):
    with pytest.raises(FalconError, match=r"missing \['seed'\]"):
        write_table(tmp_path / "s.parquet", spaces_frame().drop(columns="seed"), SEARCH_SPACES)
    dup = spaces_frame()
    dup.loc[1, "pair_id"] = 0
    with pytest.raises(FalconError, match=r"duplicate rows for \(epoch=1, pair_id=0\)"):
        write_table(tmp_path / "s.parquet", dup, SEARCH_SPACES)
    assert not (tmp_path / "s.parquet").exists()


def test_table_reader_names_file_and_problem(tmp_path):
    path = write_table(tmp_path / "s.parquet", spaces_frame(), SEARCH_SPACES)
    with pytest.raises(FalconError, match=r"s.parquet: holds a 'search_spaces' table, expected 'batches'"):
        read_table(path, BATCHES)
    # a table written by something else (no falcon metadata, wrong version, wrong dtype)
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.Table.from_pandas(spaces_frame(), preserve_index=False), plain)
    with pytest.raises(FalconError, match=r"plain.parquet: holds a 'None' table"):
        read_table(plain, SEARCH_SPACES)
    old = tmp_path / "old.parquet"
    table = pa.Table.from_pandas(spaces_frame(), schema=SEARCH_SPACES.arrow, preserve_index=False)
    pq.write_table(
        table.replace_schema_metadata({b"falcon.schema": b"search_spaces", b"falcon.schema_version": b"0"}), old
    )
    with pytest.raises(FalconError, match=r"schema version 0, this falcon reads version 1"):
        read_table(old, SEARCH_SPACES)
    wrong = tmp_path / "wrong.parquet"
    frame = spaces_frame().astype({"pair_id": "float64"})
    arrow = pa.Table.from_pandas(frame, preserve_index=False).replace_schema_metadata(SEARCH_SPACES.arrow.metadata)
    pq.write_table(arrow, wrong)
    with pytest.raises(FalconError, match=r"column 'pair_id' has type double, expected int64"):
        read_table(wrong, SEARCH_SPACES)
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not parquet")
    with pytest.raises(FalconError, match="garbage.parquet: not a readable Parquet file"):
        read_table(garbage, SEARCH_SPACES)


# -- embeddings.h5 -------------------------------------------------------------------------


def random_unit(n, d, seed):
    x = np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_embeddings_roundtrip(tmp_path, dtype):
    image, text = random_unit(10, 8, 0), random_unit(10, 8, 1)
    path = write_embeddings(tmp_path / "embeddings.h5", image, text, np.arange(100, 110), ATTRS, dtype=dtype)
    emb = read_embeddings(path)
    assert emb.image.dtype == np.dtype(dtype)
    np.testing.assert_allclose(emb.image.astype(np.float32), image, atol=1e-3)
    np.testing.assert_allclose(emb.text.astype(np.float32), text, atol=1e-3)
    assert emb.pair_id.tolist() == list(range(100, 110))
    assert emb.attrs["schema_version"] == 1 and emb.attrs["model"] == "albef-tiny" and emb.attrs["epoch"] == 1


def test_embeddings_writer_in_chunks_normalises_and_is_atomic(tmp_path):
    path = tmp_path / "embeddings.h5"
    with EmbeddingsWriter(path, n=6, dim=4, attrs=ATTRS, dtype="float32") as writer:
        writer.write(0, np.ones((3, 4)) * 2, np.ones((3, 4)), [0, 1, 2])
        assert not path.exists(), "the file must appear only when complete"
        writer.write(3, np.ones((3, 4)), np.ones((3, 4)) * 5, [3, 4, 5])
    emb = read_embeddings(path)
    np.testing.assert_allclose(emb.image, 0.5)
    with pytest.raises(ValueError, match="never written"):
        with EmbeddingsWriter(tmp_path / "partial.h5", n=4, dim=4, attrs=ATTRS) as writer:
            writer.write(0, np.ones((2, 4)), np.ones((2, 4)), [0, 1])
    assert not (tmp_path / "partial.h5").exists()


def test_embeddings_reader_validates(tmp_path):
    path = tmp_path / "e.h5"

    def make(**changes):
        with h5py.File(path, "w") as f:
            f["image"] = changes.get("image", random_unit(4, 3, 0))
            f["text"] = changes.get("text", random_unit(4, 3, 1))
            f["pair_id"] = changes.get("pair_id", np.arange(4, dtype=np.int64))
            f.attrs["schema_version"] = changes.get("version", 1)
            for k, v in ATTRS.items():
                f.attrs[k] = v
        return path

    with pytest.raises(FalconError, match=r"e.h5: embeddings schema_version 2"):
        read_embeddings(make(version=2))
    with pytest.raises(FalconError, match=r"'image' \(4, 3\) and 'text' \(5, 3\)"):
        read_embeddings(make(text=random_unit(5, 3, 1)))
    with pytest.raises(FalconError, match="'pair_id' has duplicates"):
        read_embeddings(make(pair_id=np.array([0, 1, 1, 2], dtype=np.int64)))
    with pytest.raises(FalconError, match="'pair_id' has dtype int32"):
        read_embeddings(make(pair_id=np.arange(4, dtype=np.int32)))
    with pytest.raises(FalconError, match=r"'image' row 0 has norm 2.0000"):
        read_embeddings(make(image=random_unit(4, 3, 0) * 2))
    (tmp_path / "junk.h5").write_bytes(b"junk")
    with pytest.raises(FalconError, match="junk.h5: not a readable HDF5 file"):
        read_embeddings(tmp_path / "junk.h5")


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_open_embeddings_reads_rows_and_sorted_picks_as_read_embeddings_holds_them(tmp_path, monkeypatch, dtype):
    from falcon_cli.artifacts import embeddings as module

    monkeypatch.setattr(module, "READ_ROWS", 64)  # several slices per pick, and gaps that start new ones
    monkeypatch.setattr(module, "READ_GAP", 5)
    image, text = random_unit(500, 8, 0), random_unit(500, 8, 1)
    path = write_embeddings(tmp_path / "e.h5", image, text, np.arange(1000, 500, -1), ATTRS, dtype=dtype)
    whole = read_embeddings(path)
    picks = [
        np.array([], dtype=np.int64),
        np.array([0]),
        np.array([499]),
        np.arange(500),
        np.sort(np.random.default_rng(0).choice(500, 77, replace=False)),
        np.array([3, 3, 4, 200, 201, 499]),
    ]
    with open_embeddings(path) as source:
        assert (source.n, source.dim, source.dtype) == (500, 8, np.dtype(dtype))
        assert source.pair_id.tolist() == whole.pair_id.tolist() and source.attrs == whole.attrs
        for rows in picks:
            got = source.take(rows)
            assert got[0].dtype == np.dtype(dtype)
            assert np.array_equal(got[0], whole.image[rows]) and np.array_equal(got[1], whole.text[rows])
        image_rows, text_rows = source.rows(120, 260)
        assert np.array_equal(image_rows, whole.image[120:260]) and np.array_equal(text_rows, whole.text[120:260])
        with pytest.raises(ValueError, match="ascending"):
            source.take(np.array([5, 4]))
        with pytest.raises(ValueError, match="within 0..499"):
            source.take(np.array([500]))
    in_memory = whole.take(np.array([1, 7]))  # the arrays answer the same questions
    assert (whole.n, whole.dim) == (500, 8) and np.array_equal(in_memory[1], whole.text[[1, 7]])


def test_open_embeddings_validates_as_read_embeddings_and_checks_the_norms_it_reads(tmp_path):
    path = tmp_path / "e.h5"
    with h5py.File(path, "w") as f:
        f["image"] = random_unit(6, 3, 0)
        text = random_unit(6, 3, 1)
        text[4] *= 3
        f["text"] = text
        f["pair_id"] = np.arange(6, dtype=np.int64)
        f.attrs["schema_version"] = 1
        for k, v in ATTRS.items():
            f.attrs[k] = v
    with open_embeddings(path) as source:
        assert source.take(np.array([0, 5]))[0].shape == (2, 3)  # row 4 not read, not checked
        with pytest.raises(FalconError, match=r"e.h5: 'text' row 4 has norm 3.0000; embeddings must be L2-normalised"):
            source.take(np.array([1, 4]))
        with pytest.raises(FalconError, match=r"'text' row 4 has norm"):
            source.rows(3, 6)
    with h5py.File(path, "a") as f:
        f.attrs["schema_version"] = 2
    with pytest.raises(FalconError, match=r"e.h5: embeddings schema_version 2"):
        open_embeddings(path)


# -- run directory -------------------------------------------------------------------------


def test_run_directory_manifest(tmp_path):
    run = RunDirectory.open(
        tmp_path / "run", config={"seed": 3, "data": {"dataset": "x"}}, seed=3, command=["falcon", "run"]
    )
    (run.path / "out.txt").write_text("hello")
    run.add_artifact("out.txt", schema="text", schema_version=1)
    run.record_stage("data", start="t0", status="completed", result={"n": 1})
    run.close()
    manifest = read_manifest(run.path)
    assert manifest["status"] == "completed" and manifest["end"] is not None
    assert manifest["command"] == ["falcon", "run"] and manifest["seed"] == 3 and manifest["world_size"] == 1
    assert manifest["config"] == {"seed": 3, "data": {"dataset": "x"}}
    assert manifest["artifacts"]["out.txt"]["sha256"] == sha256_file(run.path / "out.txt")
    assert manifest["stages"]["data"]["result"] == {"n": 1}
    assert manifest["stages"]["data"]["git"] == manifest["git"]  # the code and machine the stage ran with
    assert manifest["stages"]["data"]["host"] == manifest["host"]
    assert manifest["packages"]["numpy"] == np.__version__
    assert {"sha", "dirty"} <= set(manifest["git"]) and manifest["host"]["hostname"]
    assert (run.path / "config.yaml").read_text().startswith("seed: 3")
    assert (run.path / "log.txt").exists()


def test_run_directory_refuses_a_different_config(tmp_path):
    RunDirectory.open(tmp_path / "run", config={"seed": 1}, seed=1).close()
    again = RunDirectory.open(tmp_path / "run", config={"seed": 1}, seed=1)  # same config: continue
    again.close()
    assert len(read_manifest(tmp_path / "run")["history"]) == 2
    with pytest.raises(FalconError, match=r"different config \(seed: 1 -> 2\).*--overwrite"):
        RunDirectory.open(tmp_path / "run", config={"seed": 2}, seed=2)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "thesis.tex").write_text("precious")
    with pytest.raises(FalconError, match="not a falcon run"):
        RunDirectory.open(tmp_path / "other", config={}, seed=0)


def test_read_manifest_errors(tmp_path):
    with pytest.raises(FalconError, match="manifest.json: not found"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text('{"schema_version": 1,')
    with pytest.raises(FalconError, match=r"manifest.json: line 1, column \d+: invalid JSON"):
        read_manifest(tmp_path)


def test_config_differences():
    assert config_differences({"a": {"b": 1}, "c": 2}, {"a": {"b": 2}, "c": 2}) == ["a.b: 1 -> 2"]
    assert config_differences({"a": {"b": 1}}, {"a": 3, "d": None}) == ["a: {'b': 1} -> 3"]


def test_missing_keys_are_filled_at_every_depth_and_recorded_values_kept():
    stored = {"a": {"b": 1}, "c": 2}
    current = {"a": {"b": 5, "new": "x"}, "c": 3, "d": {"e": None}}
    assert with_missing_keys(stored, current) == {"a": {"b": 1, "new": "x"}, "c": 2, "d": {"e": None}}
    assert stored == {"a": {"b": 1}, "c": 2}  # (not changed in place)
