"""Webdataset shards read by pair id: the index, its checks, the CLI, and training that cannot tell shards from
files."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest

from falcon_cli.data.datasets import pretrain_dataset, pretrain_records
from falcon_cli.data.images import ImageStatus, ShardImage, load_image, probe_image
from falcon_cli.data.shards import build_index, convert_to_shards, expand_braces, load_index, split_key
from falcon_cli.data.spec import load_spec
from falcon_cli.errors import FalconError
from tests.conftest import run_cli


def test_brace_patterns_expand_as_img2dataset_writes_them():
    assert expand_braces("s/{000..002}.tar") == ["s/000.tar", "s/001.tar", "s/002.tar"]
    assert expand_braces("{a,b}/{8..10}.tar") == ["a/8.tar", "a/9.tar", "a/10.tar", "b/8.tar", "b/9.tar", "b/10.tar"]
    assert expand_braces("plain.tar") == ["plain.tar"]
    with pytest.raises(FalconError, match="runs backwards"):
        expand_braces("{5..1}.tar")
    with pytest.raises(FalconError, match="neither a range"):
        expand_braces("{x}.tar")


def test_keys_split_at_the_first_dot_of_the_file_name():
    assert split_key("dir.v1/000123.jpg") == ("dir.v1/000123", "jpg")
    assert split_key("000123.seg.PNG") == ("000123", "seg.png")
    assert split_key("README") == ("README", "")


@pytest.fixture(scope="module")
def shards(tiny_shapes_world, tmp_path_factory):
    """The tiny world's pretraining pairs as shards of 64 pairs (``falcon data shards``), with their index."""
    out = tmp_path_factory.mktemp("shards") / "world-shards"
    convert_to_shards(tiny_shapes_world["spec"], tiny_shapes_world["records"], out, samples_per_shard=64)
    return out


def test_shards_give_the_same_pairs_as_the_files(tiny_shapes_world, shards):
    files, sharded = tiny_shapes_world["records"], pretrain_dataset(load_spec(shards), transform=None).records
    assert [r.pair_id for r in sharded] == [r.pair_id for r in files]
    assert [r.captions for r in sharded] == [r.captions for r in files]
    assert [r.extra for r in sharded] == [r.extra for r in files]  # image_id, caption_id: the oracle still judges
    for a, b in zip(files[::7], sharded[::7]):
        assert isinstance(b.image, ShardImage) and b.image.read_bytes() == a.image.read_bytes()
        assert np.array_equal(np.asarray(load_image(a.image)), np.asarray(load_image(b.image)))
    # the address a manifest or an audit table records, read back from its text form
    text = str(sharded[3].image)
    assert text.endswith(".tar#" + sharded[3].image.member) and np.array_equal(
        np.asarray(load_image(text)), np.asarray(load_image(sharded[3].image))
    )


def test_the_index_is_stable_across_builds_and_processes(shards):
    spec = load_spec(shards)
    first = load_index(spec)
    rebuilt = build_index(spec)
    assert rebuilt.fingerprint == first.fingerprint and rebuilt.table.equals(first.table)
    code = (
        "from falcon_cli.data.spec import load_spec; from falcon_cli.data.datasets import pretrain_records; "
        f"print([r.pair_id for r in pretrain_records(load_spec({str(shards)!r}))[0]][-3:])"
    )
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str([r.pair_id for r in pretrain_records(spec)[0]][-3:])


def _copy(shards: Path, tmp_path: Path) -> Path:
    import shutil

    target = tmp_path / "copy"
    shutil.copytree(shards, target)
    return target


def _add_shard(root: Path, name: str, members: dict[str, bytes]) -> None:
    with tarfile.open(root / "shards" / name, "w") as tar:
        for member, data in members.items():
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    import yaml

    spec = root / "dataset.yaml"
    raw = yaml.safe_load(spec.read_text())
    spec.write_text(yaml.safe_dump({**raw, "pretrain_shards": [*raw["pretrain_shards"], f"shards/{name}"]}))


def test_bad_shards_are_one_line_naming_the_shard_and_key(shards, tmp_path):
    root = _copy(shards, tmp_path)
    spec = load_spec(root)
    index_before = (root / "shards-index.parquet").read_bytes()

    # a shard that changed after indexing: the index no longer matches it
    os.truncate(root / "shards" / "00001.tar", 20_000)
    with pytest.raises(FalconError, match=r"00001\.tar: shard has 20,000 bytes, the index says .*`falcon data index"):
        pretrain_records(spec)
    # ... and re-indexing a truncated shard names the key it cuts through; the old index is untouched
    with pytest.raises(FalconError, match=r"00001\.tar: truncated at key \d+ .*re-download"):
        build_index(spec)
    assert (root / "shards-index.parquet").read_bytes() == index_before
    proc = run_cli("data", "check", root, "--no-images")
    assert proc.returncode == 1 and "index no longer matches its shards" in proc.stderr

    # keys without an image or a caption: fail by default, left out (pair id spent) under skip
    (root / "shards" / "00001.tar").write_bytes((shards / "shards" / "00001.tar").read_bytes())
    png = (shards / "shards" / "00000.tar").read_bytes()  # any bytes will do for a caption-less key
    _add_shard(root, "extra.tar", {"k1.txt": b"a caption with no image", "k2.png": png[:100]})
    spec = load_spec(root)
    with pytest.raises(FalconError, match=r"extra\.tar: key k1 has no image .*on_missing: skip"):
        build_index(spec)
    with pytest.raises(
        FalconError, match=r"no longer matches pretrain_shards in dataset.yaml \(\d+ shards named, \d+ indexed\)"
    ):
        pretrain_records(spec)
    index = build_index(spec, on_missing="skip")
    assert index.incomplete_count == 2 and index.incomplete == ["extra.tar:k1", "extra.tar:k2"]
    with pytest.raises(FalconError, match=r"2 keys have no image or caption \(first: extra.tar:k1"):
        pretrain_records(spec)
    records, (report,) = pretrain_records(spec, on_missing="skip")
    assert report.dropped == 2 and len(records) == index.table.num_rows

    # no index at all, and a spec naming both JSON files and shards
    (root / "shards-index.parquet").unlink()
    with pytest.raises(FalconError, match=r"no shard index; build it once with `falcon data index"):
        pretrain_records(spec)
    (root / "dataset.yaml").write_text((root / "dataset.yaml").read_text() + "pretrain: [x.json]\n")
    with pytest.raises(FalconError, match=r"JSON files \(pretrain\) or from shards \(pretrain_shards\), not both"):
        load_spec(root)


def test_a_damaged_image_in_a_shard_is_found_by_data_check(shards, tmp_path):
    root = _copy(shards, tmp_path)
    records, _ = pretrain_records(load_spec(root))
    target = records[5].image
    with open(target.shard, "r+b") as handle:  # scramble the PNG's pixel data, keep the size
        handle.seek(target.offset + target.size // 2)
        handle.write(b"\x00" * 64)
    assert probe_image(target) is ImageStatus.UNREADABLE and probe_image(records[6].image) is ImageStatus.OK
    proc = run_cli("data", "check", root)
    assert proc.returncode == 1 and "1 of" in proc.stderr + proc.stdout and "cannot be decoded" in proc.stderr


def test_cli_converts_indexes_and_checks(tiny_shapes_world, tmp_path):
    out = tmp_path / "converted"
    proc = run_cli("data", "shards", tiny_shapes_world["dir"], "--out", out, "--samples-per-shard", "100", check=True)
    assert "indexed" in proc.stdout and sorted(p.name for p in (out / "shards").iterdir())[0] == "00000.tar"
    proc = run_cli("data", "index", out, check=True)
    assert f"{len(tiny_shapes_world['records']):,} pairs" in proc.stdout
    assert run_cli("data", "check", out, "--no-images").returncode == 0
    again = run_cli("data", "shards", tiny_shapes_world["dir"], "--out", out)
    assert again.returncode != 0 and "already exists" in again.stderr


TINY = [
    "data.tokenizer_vocab_size=200",
    "data.shapes=null",
    "data.verify_images=false",
    "pretrain.epochs=2",
    "pretrain.batch_size=16",
    "pretrain.composer.search_space_size=48",
    "pretrain.logging.every=1",
    "pretrain.optim.warmup_steps=4",
    "pretrain.scheduler.quantile_levels=10",
    "pretrain.runtime.device=cpu",
    "pretrain.loader.num_workers=0",
    "pretrain.eval.split=null",
]


@pytest.mark.slow  # (two tiny trainings, shards and files: about 45 s on 2 cores)
def test_training_on_shards_is_training_on_files(tiny_shapes_world, shards, tmp_path):
    """The same world as shards and as files trains to the same losses and batches (same seed, one thread), and
    the stages after pretraining (embed, k-means search spaces, the audit) run on shards."""
    from falcon_cli.runtime.metrics import read_metrics
    from falcon_cli.sampling.batch_log import read_batch_log

    runs = {}
    for name, world in (("files", tiny_shapes_world["dir"]), ("shards", shards)):
        runs[name] = tmp_path / name
        proc = run_cli("pretrain", "--recipe", "shapes-falcon", "--run-dir", runs[name], f"data.dataset={world}", *TINY)
        assert proc.returncode == 0, proc.stderr[-3000:]
    files, sharded = (read_metrics(runs[n] / "metrics.jsonl") for n in ("files", "shards"))
    losses = [[r["loss"] for r in log if "loss" in r] for log in (files, sharded)]
    assert len(losses[0]) == 20 and losses[0] == losses[1]
    columns = ["epoch", "step", "slot", "pair_id", "anchor_pair_id", "q"]
    a, b = (read_batch_log(runs[n] / "batches.parquet") for n in ("files", "shards"))
    assert set(a["sampler"]) >= {"falcon"} and a[columns].equals(b[columns])
    manifest = json.loads((runs["shards"] / "manifest.json").read_text())
    recorded = manifest["stages"]["data"]["result"]["shard_index"]
    assert recorded["fingerprint"] == load_index(load_spec(shards)).fingerprint and recorded["shards"] == len(
        load_index(load_spec(shards)).shards
    )

    common = [
        "--recipe",
        "shapes-demo",
        "--run-dir",
        tmp_path / "emb",
        f"data.dataset={shards}",
        *TINY[:3],
        f"embed.encoder=falcon:{runs['shards']}",
        "embed.fp16=false",
        "embed.num_workers=0",
        "embed.device=cpu",
        "search_spaces.size=48",
        "search_spaces.compare=false",
    ]
    proc = run_cli("embed", *common)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_cli("build-search-spaces", *common)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "emb" / "search_spaces.parquet").exists()
    proc = run_cli("audit-false-negatives", runs["shards"], "--judge", "oracle", "--max-pairs", "500")
    assert proc.returncode == 0, proc.stderr[-3000:]
