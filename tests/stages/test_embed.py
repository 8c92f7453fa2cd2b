"""The embed stage and `falcon embed`: open_clip and falcon encoders, the h5 contents, kill + resume, errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from falcon_cli.artifacts.embeddings import read_embeddings
from falcon_cli.errors import FalconError
from tests.conftest import REPO, run_cli

TINY_WORLD = ["data.shapes.images=40", "data.tokenizer_vocab_size=200", "data.verify_images=false"]
TINY_CLIP = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 16},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}
CLIP_NAME = "falcon-test-tiny-clip"


def embed_args(run_dir, world, *extra):
    return ["embed", "--recipe", "shapes-demo", "--run-dir", str(run_dir), f"data.dataset={world}", *TINY_WORLD, *extra]


def in_process(*args: str) -> int:
    """Run ``falcon ARGS`` in this process (the tiny open_clip config is registered only here); the exit code."""
    from falcon_cli.cli.app import main

    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    return exit_info.value.code


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    """A tiny open_clip architecture registered with open_clip, and random weights saved to a local file."""
    import open_clip

    root = tmp_path_factory.mktemp("clip")
    (root / f"{CLIP_NAME}.json").write_text(json.dumps(TINY_CLIP))
    open_clip.add_model_config(root / f"{CLIP_NAME}.json")
    torch.manual_seed(0)
    model = open_clip.create_model(CLIP_NAME)
    weights = root / "tiny_clip.pt"
    torch.save(model.state_dict(), weights)
    return weights


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return tmp_path_factory.mktemp("embed") / "world"


@pytest.fixture(scope="module")
def clip_run(world, tiny_clip, tmp_path_factory):
    """`falcon embed` with the tiny open_clip model (generates the world, runs the data stage first), fp32."""
    run_dir = tmp_path_factory.mktemp("clip_run") / "run"
    code = in_process(
        *embed_args(
            run_dir,
            world,
            f"embed.encoder=open_clip:{CLIP_NAME}",
            f"embed.pretrained={tiny_clip}",
            "embed.fp16=false",
            "embed.num_workers=0",
            "embed.batch_size=32",
            "embed.chunk_size=64",
            "embed.device=cpu",
        )
    )  # compared with the model's CPU fp32 features (no cuDNN TF32)
    assert code == 0
    return run_dir


def dataset_pairs(world):
    from falcon_cli.data.spec import load_spec
    from stages.embed import split_pairs

    pairs, _, _ = split_pairs(load_spec(world), "pretrain", None, 0)
    return pairs


def test_open_clip_embeddings_are_the_models_features(clip_run, world, tiny_clip):
    import open_clip

    from falcon_cli.data.images import load_image

    emb = read_embeddings(clip_run / "embeddings" / "embeddings.h5")
    pairs = dataset_pairs(world)
    assert emb.image.shape == emb.text.shape == (len(pairs), 16) and emb.image.dtype == np.float32
    assert emb.pair_id.tolist() == [p.pair_id for p in pairs]
    np.testing.assert_allclose(np.linalg.norm(emb.image, axis=1), 1, atol=1e-5)
    assert emb.attrs["model"] == f"open_clip:{CLIP_NAME}" and emb.attrs["checkpoint"] == str(tiny_clip)
    assert emb.attrs["split"] == "pretrain" and emb.attrs["dataset"]

    # The stored rows are the loaded weights' own features (not a random re-init).
    model, _, preprocess = open_clip.create_model_and_transforms(CLIP_NAME, pretrained=str(tiny_clip))
    tokenizer = open_clip.get_tokenizer(CLIP_NAME)
    rows = [0, 37, len(pairs) - 1]
    with torch.no_grad():
        image = model.encode_image(torch.stack([preprocess(load_image(pairs[i].image)) for i in rows]), normalize=True)
        text = model.encode_text(tokenizer([pairs[i].caption for i in rows]), normalize=True)
    np.testing.assert_allclose(emb.image[rows], image.numpy(), atol=1e-5)
    np.testing.assert_allclose(emb.text[rows], text.numpy(), atol=1e-5)

    manifest = json.loads((clip_run / "manifest.json").read_text())
    assert manifest["artifacts"]["embeddings/embeddings.h5"]["schema"] == "embeddings"
    result = manifest["stages"]["embed"]["result"]
    assert result["pairs"] == len(pairs) and result["dim"] == 16 and result["dtype"] == "float32"
    assert result["images_failed"] == 0 and result["chunks"] == 3 and result["pairs_per_s"] > 0
    assert not (clip_run / "embeddings" / "embeddings.h5.partial").exists()


@pytest.fixture(scope="module")
def falcon_source(clip_run):
    """A falcon run directory with one albef-tiny checkpoint (random weights), using the clip run's tokenizer."""
    from falcon_cli.data.tokenizer import load_tokenizer
    from falcon_cli.models import create_model
    from falcon_cli.runtime.checkpoint import save_checkpoint

    torch.manual_seed(0)
    model = create_model("albef-tiny", vocab_size=len(load_tokenizer(clip_run / "data" / "tokenizer")))
    save_checkpoint(clip_run / "checkpoints", 7, {"model": model}, {}, {"epoch": 1, "model": "albef-tiny"})
    return clip_run


FALCON_EMBED = ["embed.chunk_size=16", "embed.batch_size=8", "embed.num_workers=1"]


@pytest.fixture(scope="module")
def falcon_run(world, falcon_source, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("falcon_run") / "run"
    run_cli(*embed_args(run_dir, world, f"embed.encoder=falcon:{falcon_source}", *FALCON_EMBED), check=True)
    return run_dir


def test_falcon_embeddings_are_the_checkpoints_projected_features(falcon_run, falcon_source, world):
    from falcon_cli.data.collate import PretrainCollate
    from falcon_cli.data.images import load_image
    from falcon_cli.data.tokenizer import load_tokenizer
    from falcon_cli.data.transforms import build_transform
    from falcon_cli.models import model_from_weights

    emb = read_embeddings(falcon_run / "embeddings" / "embeddings.h5")
    pairs = dataset_pairs(world)
    assert emb.image.shape == (len(pairs), 256) and emb.image.dtype == np.float16  # fp16 is the default
    assert emb.pair_id.tolist() == [p.pair_id for p in pairs]
    checkpoint = falcon_source / "checkpoints" / "00000007"
    assert emb.attrs["model"] == "albef-tiny" and emb.attrs["checkpoint"] == str(checkpoint) and emb.attrs["epoch"] == 1

    model = model_from_weights(checkpoint / "model.safetensors").eval()
    transform = build_transform("test", model.config.image_size)
    rows = [0, 5, len(pairs) - 1]
    items = [
        {"image": transform(load_image(pairs[i].image)), "caption": pairs[i].caption, "pair_id": pairs[i].pair_id}
        for i in rows
    ]
    batch = PretrainCollate(load_tokenizer(falcon_source / "data" / "tokenizer"), 25)(items)
    with torch.no_grad():
        _, image = model.encode_image(batch["images"])
        _, text = model.encode_text(batch["input_ids"], batch["attention_mask"])
    np.testing.assert_allclose(
        emb.image[rows].astype(np.float32), torch.nn.functional.normalize(image, dim=-1).numpy(), atol=2e-3
    )
    np.testing.assert_allclose(
        emb.text[rows].astype(np.float32), torch.nn.functional.normalize(text, dim=-1).numpy(), atol=2e-3
    )


KILL_AFTER_TWO_CHUNKS = """
import os, signal, sys
import stages.embed as stage
write_chunk, written = stage._write_chunk, []
def write_then_die(*args, **kwargs):
    write_chunk(*args, **kwargs)
    written.append(1)
    if len(written) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
stage._write_chunk = write_then_die
from falcon_cli.cli.app import main
main(sys.argv[1:])
"""


def test_kill_and_resume_gives_the_uninterrupted_file(falcon_run, falcon_source, world, tmp_path):
    run_dir = tmp_path / "run"
    args = embed_args(run_dir, world, f"embed.encoder=falcon:{falcon_source}", *FALCON_EMBED)
    env = {**os.environ, "FALCON_PROGRESS": "0", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    killed = subprocess.run(
        [sys.executable, "-c", KILL_AFTER_TWO_CHUNKS, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    partial = run_dir / "embeddings" / "embeddings.h5.partial"
    assert sorted(p.name for p in partial.glob("chunk_*.npz")) == ["chunk_000000.npz", "chunk_000001.npz"]
    assert not (run_dir / "embeddings" / "embeddings.h5").exists(), "no final file before every chunk is in"

    run_cli(*args, "--resume", check=True)
    resumed = read_embeddings(run_dir / "embeddings" / "embeddings.h5")
    reference = read_embeddings(falcon_run / "embeddings" / "embeddings.h5")
    np.testing.assert_array_equal(resumed.pair_id, reference.pair_id)
    np.testing.assert_array_equal(resumed.image, reference.image)
    np.testing.assert_array_equal(resumed.text, reference.text)
    result = json.loads((run_dir / "manifest.json").read_text())["stages"]["embed"]["result"]
    assert result["chunks_resumed"] == 2 and result["chunks"] == 10
    assert not partial.exists()


def test_unreadable_images_are_skipped_and_counted_or_stop_the_stage(falcon_source, world, tiny_clip, tmp_path):
    import shutil

    copy = tmp_path / "world"
    shutil.copytree(world, copy)
    pairs = dataset_pairs(copy)
    broken = pairs[3].image
    broken.write_bytes(b"not an image")
    affected = sum(p.image == broken for p in pairs)
    clip = [f"embed.encoder=open_clip:{CLIP_NAME}", f"embed.pretrained={tiny_clip}", "embed.num_workers=0"]

    assert in_process(*embed_args(tmp_path / "skip", copy, *clip, "data.on_missing=skip")) == 0
    emb = read_embeddings(tmp_path / "skip" / "embeddings" / "embeddings.h5")
    assert len(emb.pair_id) == len(pairs) - affected and pairs[3].pair_id not in emb.pair_id
    result = json.loads((tmp_path / "skip" / "manifest.json").read_text())["stages"]["embed"]["result"]
    assert result["images_unreadable"] == result["images_failed"] == affected

    # Under on_missing=fail the same image stops the stage with one line naming it (the data stage's report precedes
    # it).
    proc = run_cli(
        *embed_args(tmp_path / "fail", copy, f"embed.encoder=falcon:{falcon_source}", "data.on_missing=fail")
    )
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0] == proc.stderr.strip().splitlines()[-1] and "Traceback" not in proc.stderr
    assert str(broken) in errors[0] and "cannot decode image" in errors[0] and "data.on_missing=skip" in errors[0]
    assert not (tmp_path / "fail" / "embeddings" / "embeddings.h5").exists()


def test_open_clip_local_dir_records_the_weights_it_loaded(clip_run, world, tiny_clip, tmp_path):
    """`open_clip:local-dir:DIR`: the directory's weights are used and recorded (not embed.pretrained's default tag)."""
    import shutil

    directory = tmp_path / "clip-dir"
    directory.mkdir()
    (directory / "open_clip_config.json").write_text(json.dumps({"model_cfg": TINY_CLIP, "preprocess_cfg": {}}))
    shutil.copy(tiny_clip, directory / "open_clip_pytorch_model.bin")
    run_dir = tmp_path / "run"
    code = in_process(
        *embed_args(
            run_dir,
            world,
            f"embed.encoder=open_clip:local-dir:{directory}",
            "embed.fp16=false",
            "embed.num_workers=0",
            "embed.device=cpu",
        )
    )  # embed.pretrained keeps its default tag
    assert code == 0
    emb = read_embeddings(run_dir / "embeddings" / "embeddings.h5")
    weights = str((directory / "open_clip_pytorch_model.bin").resolve())
    assert emb.attrs["model"] == f"open_clip:local-dir:{directory}" and emb.attrs["checkpoint"] == weights
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["stages"]["embed"]["result"]["checkpoint"] == weights
    same = read_embeddings(clip_run / "embeddings" / "embeddings.h5")  # the same weights given as a file
    np.testing.assert_allclose(emb.image, same.image, atol=1e-5)
    np.testing.assert_allclose(emb.text, same.text, atol=1e-5)


def test_cli_error_is_one_line(clip_run, world, tmp_path):
    proc = run_cli(*embed_args(tmp_path / "run", world, "embed.encoder=falcon:/nonexistent/run"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: embed.encoder=falcon:/nonexistent/run: not found; give a falcon run directory or a checkpoint directory"
    )


def test_encoder_errors_are_one_line(tmp_path, tiny_clip):
    from falcon_cli.models.encoders import load_encoder

    cases = [
        (("clip:ViT-B-32", None), "unknown encoder; use open_clip:<model name>"),
        (("open_clip:ViT-B-33", None), "did you mean ViT-B-32"),
        ((f"open_clip:{CLIP_NAME}", str(tmp_path / "missing.pt")), "missing.pt: checkpoint file not found"),
        ((f"open_clip:{CLIP_NAME}", "laion9000"), "not a pretrained tag"),
        ((f"falcon:{tmp_path / 'nope'}", None), "nope: not found"),
        ((f"falcon:{tmp_path}", None), "neither a run directory"),
        ((f"open_clip:local-dir:{tmp_path}", "laion2b_s34b_b79k"), "open_clip_config.json not found"),
    ]
    for (spec, pretrained), message in cases:
        with pytest.raises(FalconError, match=message) as info:
            load_encoder(spec, pretrained, "cpu")
        assert "\n" not in str(info.value)


def test_retrieval_test_split_embeds_one_pair_per_caption(clip_run, world, tiny_clip, tmp_path):
    """`embed.split=test`: ids are the caption indices of the split, each with its own image's features."""
    import open_clip

    from falcon_cli.data.datasets import retrieval_dataset
    from falcon_cli.data.spec import load_spec

    run_dir = tmp_path / "run"
    code = in_process(
        *embed_args(
            run_dir,
            world,
            f"embed.encoder=open_clip:{CLIP_NAME}",
            f"embed.pretrained={tiny_clip}",
            "embed.fp16=false",
            "embed.num_workers=0",
            "embed.split=test",
            "embed.device=cpu",
        )
    )
    assert code == 0
    emb = read_embeddings(run_dir / "embeddings" / "embeddings.h5")
    split = retrieval_dataset(load_spec(world), "test", transform=None)
    assert emb.pair_id.tolist() == list(range(len(split.text))) and emb.attrs["split"] == "test"
    # row t holds the features of caption t's own image (txt2img) and of caption t
    model, _, preprocess = open_clip.create_model_and_transforms(CLIP_NAME, pretrained=str(tiny_clip))
    model.eval()
    from PIL import Image

    for t in (0, len(split.text) - 1):
        image = preprocess(Image.open(split.image[split.txt2img[t]]).convert("RGB"))[None]
        with torch.no_grad():
            expected = model.encode_image(image, normalize=True)[0].numpy()
        assert np.allclose(emb.image[t], expected, atol=1e-5), t
    assert open_clip  # the tiny architecture is registered in this process by the fixture


# --- the dataset fingerprint: embeddings of another dataset of the same size are refused ---------------
def test_pairs_fingerprint_is_stable_and_follows_ids_paths_and_captions(tmp_path):
    from falcon_cli.data.pairs import Pair, pairs_fingerprint

    pairs = [
        Pair(0, tmp_path / "images" / "a.png", "a red circle"),
        Pair(1, tmp_path / "images" / "b.png", "a blue square"),
    ]
    reference = pairs_fingerprint(pairs, tmp_path)
    assert reference == pairs_fingerprint(list(pairs), tmp_path) and len(reference) == 64
    moved = [Pair(p.pair_id, tmp_path / "elsewhere" / p.image.relative_to(tmp_path), p.caption) for p in pairs]
    assert pairs_fingerprint(moved, tmp_path / "elsewhere") == reference  # relative to the dataset root
    assert pairs_fingerprint([pairs[0], Pair(1, pairs[1].image, "a blue circle")], tmp_path) != reference
    assert pairs_fingerprint([pairs[0], Pair(2, pairs[1].image, pairs[1].caption)], tmp_path) != reference
    assert pairs_fingerprint(pairs[::-1], tmp_path) != reference
    multi = Pair(0, pairs[0].image, "a red circle", ("a red circle", "a ball"))
    assert pairs_fingerprint([multi], tmp_path) != pairs_fingerprint(
        [Pair(0, pairs[0].image, "a red circle")], tmp_path
    )


def test_embeddings_record_the_dataset_fingerprint(clip_run, world):
    from falcon_cli.data.datasets import pretrain_dataset
    from falcon_cli.data.pairs import pairs_fingerprint, records_fingerprint
    from falcon_cli.data.spec import load_spec

    emb = read_embeddings(clip_run / "embeddings" / "embeddings.h5")
    spec = load_spec(world)
    assert emb.attrs["dataset_fingerprint"] == pairs_fingerprint(dataset_pairs(world), spec.base_dir)
    records = pretrain_dataset(spec, transform=None).records  # what the pretrain stage holds
    assert records_fingerprint(records, spec.base_dir) == emb.attrs["dataset_fingerprint"]


def spaces_args(run_dir, world, embeddings, *extra):
    return [
        "build-search-spaces",
        "--recipe",
        "shapes-demo",
        "--run-dir",
        run_dir,
        f"data.dataset={world}",
        *TINY_WORLD,
        f"search_spaces.embeddings={embeddings}",
        "search_spaces.size=8",
        "search_spaces.compare=false",
        *extra,
    ]


def test_search_spaces_refuse_embeddings_of_another_dataset_of_the_same_size(clip_run, world, tmp_path):
    from falcon_cli.config.recipes import load_recipe
    from falcon_cli.data.shapes import generate_world
    from tests.conftest import run_cli

    embeddings = clip_run / "embeddings" / "embeddings.h5"
    config, _ = load_recipe("shapes-demo", [f"data.dataset={world}", *TINY_WORLD])
    other = tmp_path / "other"
    seed = config.data.shapes.seed + 1
    generate_world(config.data.shapes.model_copy(update={"seed": seed}), other, workers=1)
    assert len(dataset_pairs(other)) == len(dataset_pairs(world))  # same size: only the fingerprint tells them apart

    proc = run_cli(*spaces_args(tmp_path / "run", other, embeddings, f"data.shapes.seed={seed}"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [
        line for line in proc.stderr.splitlines() if line.startswith("error:")
    ]  # (the data stage prints its table first)
    assert "Traceback" not in proc.stderr and len(errors) == 1 and proc.stderr.strip().endswith(errors[0]), proc.stderr
    assert str(embeddings) in errors[0] and str(other) in errors[0] and "different dataset" in errors[0]
    assert "re-run `falcon embed` for this dataset" in errors[0]
    assert not (tmp_path / "run" / "search_spaces.parquet").exists()

    same = run_cli(*spaces_args(tmp_path / "same", world, embeddings))
    assert same.returncode == 0, same.stdout + same.stderr
    assert "warning" not in same.stderr and (tmp_path / "same" / "search_spaces.parquet").is_file()


def test_search_spaces_read_embeddings_without_fingerprint_with_a_warning(clip_run, world, tmp_path):
    import h5py

    from tests.conftest import run_cli

    legacy = tmp_path / "legacy.h5"
    legacy.write_bytes((clip_run / "embeddings" / "embeddings.h5").read_bytes())
    with h5py.File(legacy, "a") as handle:
        del handle.attrs["dataset_fingerprint"]
    proc = run_cli(*spaces_args(tmp_path / "run", world, legacy))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"warning: {legacy}: no dataset_fingerprint attribute" in " ".join(proc.stderr.split())
