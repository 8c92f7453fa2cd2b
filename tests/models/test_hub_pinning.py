"""Hub ids pinned and recorded: ``NAME@REVISION`` everywhere a hub id is accepted, the revision handed to every
loader, the commit each id resolved to in the run's manifest, and no unpinned download call in the code.

Nothing here reaches the network: the hub cache is a temporary directory laid out as a download leaves it
(``models--org--name/snapshots/<sha>/``, ``refs/<revision>``) and the process is offline; loaders that would
fetch big models have their download functions replaced by ones that record what they were asked.
"""

from __future__ import annotations

import ast
import json
import logging
import subprocess
import sys

import pytest
import torch

from falcon_cli.errors import FalconError
from falcon_cli.runtime import hub
from falcon_cli.runtime.hub import HubRef, is_local
from falcon_cli.runtime.run_dir import sha256_path
from tests.conftest import REPO

SHA_MAIN = "1111111111111111111111111111111111111111"
SHA_V1 = "2222222222222222222222222222222222222222"
BERT_REPO = "falcon-test/tiny-bert"
DEIT = "deit_tiny_patch16_224.fb_in1k"
BERT_SIZES = dict(
    text_width=64,
    text_heads=2,
    text_layers=2,
    fusion_layers=2,
    intermediate_size=128,
    vocab_size=100,
    max_position_embeddings=64,
)


class Stop(Exception):
    """Raised by a replaced loader once it has recorded its arguments."""


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """An empty hub cache under ``tmp_path``, this process offline, no notes or warnings left from other tests."""
    from huggingface_hub import constants

    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "_sources", [])
    monkeypatch.setattr(hub, "_warned", set())
    return cache


def snapshot(cache, repo: str, sha: str, *refs: str):
    """The snapshot directory of ``repo`` at commit ``sha`` in ``cache``, with ``refs/<ref>`` naming it."""
    folder = cache / ("models--" + repo.replace("/", "--"))
    for ref in refs:
        (folder / "refs").mkdir(parents=True, exist_ok=True)
        (folder / "refs" / ref).write_text(sha)
    path = folder / "snapshots" / sha
    path.mkdir(parents=True, exist_ok=True)
    return path


def tiny_bert(path, seed: int) -> None:
    """A tiny BERT with a WordPiece tokenizer, saved into ``path`` as ``save_pretrained`` does."""
    from transformers import BertConfig, BertForMaskedLM

    from falcon_cli.data.tokenizer import train_wordpiece_tokenizer

    torch.manual_seed(seed)
    BertForMaskedLM(
        BertConfig(
            vocab_size=100,
            hidden_size=64,
            num_hidden_layers=4,
            num_attention_heads=2,
            intermediate_size=128,
            max_position_embeddings=64,
        )
    ).save_pretrained(path)
    tokenizer_dir = path.parent / f".tok-{path.name}"
    train_wordpiece_tokenizer(["a red circle left of a blue square"] * 3, tokenizer_dir, vocab_size=100)
    for file in tokenizer_dir.iterdir():
        (path / file.name).write_bytes(file.read_bytes())


def word_embeddings(model) -> torch.Tensor:
    return model.text_encoder.embeddings.word.weight.detach().clone()


# --- parsing ---------------------------------------------------------------------------------------


def test_hub_ids_parse_into_repository_and_revision():
    assert HubRef.parse("org/name@abc1234") == HubRef("org/name", "abc1234")
    assert HubRef.parse("bert-base-uncased") == HubRef("bert-base-uncased", None)
    assert HubRef.parse(f"timm:{DEIT}@v1.0") == HubRef(DEIT, "v1.0", "timm:")
    assert HubRef.parse("hf-hub:org/x@refs/pr/1") == HubRef("org/x", "refs/pr/1", "hf-hub:")
    assert str(HubRef.parse(f"timm:{DEIT}@{SHA_V1}")) == f"timm:{DEIT}@{SHA_V1}"
    assert HubRef.parse(f"org/name@{SHA_V1}").pinned and not HubRef.parse("org/name@main").pinned
    assert not HubRef.parse("org/name").pinned


@pytest.mark.parametrize(
    "text", ["org/x@", "@abc1234", "org/x@a b", "org/x@a..b", "org/x@v1@v2", "org/x@-v1", "org/x@v1/"]
)
def test_a_malformed_revision_is_one_line_naming_the_key(text):
    with pytest.raises(FalconError) as caught:
        HubRef.parse(text, "pretrain.encoders.text_weights")
    message = str(caught.value)
    assert (
        "\n" not in message
        and message.startswith(f"pretrain.encoders.text_weights={text!r}:")
        and "NAME@REVISION" in message
    )


def test_every_loader_names_its_key_for_a_malformed_revision(hf_cache, tmp_path):
    import open_clip

    from falcon_cli.data.tokenizer import load_tokenizer
    from falcon_cli.judges.blip import _load_blip
    from falcon_cli.models import create_model
    from falcon_cli.models.open_clip_names import pinned_open_clip
    from falcon_cli.models.qformer import resolve_checkpoint_dir
    from falcon_cli.models.weights import _timm_state_dict

    loaders = {
        "data.tokenizer": lambda: load_tokenizer("org/tok@a b", "data.tokenizer"),
        "text_weights": lambda: create_model("albef-tiny", text_weights="org/bert@x..y", **BERT_SIZES),
        "vision_weights": lambda: _timm_state_dict(f"timm:{DEIT}@", "vision_weights"),
        "audit.judge_model": lambda: _load_blip("org/blip@-1", "audit.judge_model"),
        "qformer_weights": lambda: resolve_checkpoint_dir("org/q@a b", "qformer_weights"),
        "embed.encoder": lambda: pinned_open_clip(
            "hf-hub:org/x@a b", None, open_clip, "embed.encoder", "embed.pretrained"
        ),
        "embed.pretrained": lambda: pinned_open_clip(
            "ViT-B-32", "laion2b_s34b_b79k@a b", open_clip, "embed.encoder", "embed.pretrained"
        ),
    }
    for key, load in loaders.items():
        with pytest.raises(FalconError) as caught:
            load()
        assert str(caught.value).startswith(f"{key}=") and "is not a revision" in str(caught.value), key
        assert "\n" not in str(caught.value), key


def test_a_local_path_with_an_at_sign_wins(hf_cache, tmp_path, monkeypatch):
    from falcon_cli.data.tokenizer import load_tokenizer
    from falcon_cli.models import create_model

    monkeypatch.chdir(tmp_path)
    tiny_bert(tmp_path / "bert@v1", seed=0)
    assert is_local("bert@v1") and not is_local("bert@v2") and is_local("./bert@v2") and is_local("a/b/c@v1")
    model = create_model("albef-tiny", text_weights="bert@v1", **BERT_SIZES)
    tokenizer = load_tokenizer("bert@v1", "data.tokenizer")
    assert tokenizer.get_vocab()["[MASK]"] == 4 and model is not None
    notes = hub.take_sources()
    assert {"key": "text_weights", "path": str(tmp_path / "bert@v1")} in notes
    assert {"key": "data.tokenizer", "path": str(tmp_path / "bert@v1")} in notes


# --- the revision reaches the loader -------------------------------------------------------------------


def test_bert_weights_and_tokenizer_load_the_revision_asked_for(hf_cache):
    """Two commits in the cache: ``main`` and the tag ``v1``; each id loads its own, an unknown tag fails."""
    from falcon_cli.data.tokenizer import load_tokenizer
    from falcon_cli.models import create_model

    tiny_bert(snapshot(hf_cache, BERT_REPO, SHA_MAIN, "main"), seed=0)
    tiny_bert(snapshot(hf_cache, BERT_REPO, SHA_V1, "v1"), seed=1)
    main = word_embeddings(create_model("albef-tiny", text_weights=BERT_REPO, **BERT_SIZES))
    tagged = word_embeddings(create_model("albef-tiny", text_weights=f"{BERT_REPO}@v1", **BERT_SIZES))
    pinned = word_embeddings(create_model("albef-tiny", text_weights=f"{BERT_REPO}@{SHA_V1}", **BERT_SIZES))
    assert not torch.equal(main, tagged) and torch.equal(tagged, pinned)
    with pytest.raises(FalconError, match="cannot load BERT weights"):
        create_model("albef-tiny", text_weights=f"{BERT_REPO}@v2", **BERT_SIZES)
    assert load_tokenizer(f"{BERT_REPO}@v1", "data.tokenizer").get_vocab()["[MASK]"] == 4
    with pytest.raises(FalconError, match="could not be loaded"):
        load_tokenizer(f"{BERT_REPO}@v2", "data.tokenizer")


def test_timm_weights_load_the_revision_asked_for(hf_cache):
    import timm
    from safetensors.torch import save_file

    from falcon_cli.models.weights import load_vision_weights

    torch.manual_seed(3)
    source = timm.create_model(DEIT, pretrained=False)
    save_file(source.state_dict(), str(snapshot(hf_cache, f"timm/{DEIT}", SHA_V1, "v1") / "model.safetensors"))
    encoder = timm.create_model(DEIT, pretrained=False, num_classes=0)
    load_vision_weights(encoder, f"timm:{DEIT}@v1")
    assert torch.equal(encoder.pos_embed, source.pos_embed)
    with pytest.raises(FalconError, match="cannot load pretrained timm weights"):  # main is not in the cache
        load_vision_weights(encoder, f"timm:{DEIT}")
    assert hub.take_sources() == [
        {"key": "vision_weights", "source": f"timm:{DEIT}@v1", "repo": f"timm/{DEIT}", "revision": "v1", "sha": SHA_V1}
    ]


def test_the_blip_judge_passes_the_revision_to_both_loaders(hf_cache, monkeypatch):
    from transformers import AutoProcessor, BlipForImageTextRetrieval

    from falcon_cli.judges.blip import _load_blip

    asked = []

    def processor(source, **kwargs):
        asked.append(("processor", source, kwargs))
        return object()

    def model(source, **kwargs):
        asked.append(("model", source, kwargs))
        raise Stop

    monkeypatch.setattr(AutoProcessor, "from_pretrained", processor)
    monkeypatch.setattr(BlipForImageTextRetrieval, "from_pretrained", model)
    with pytest.raises(FalconError):
        _load_blip(f"Salesforce/blip-itm-base-coco@{SHA_V1}", "audit.judge_model")
    assert asked == [(what, "Salesforce/blip-itm-base-coco", {"revision": SHA_V1}) for what in ("processor", "model")]


def test_qformer_weights_fetch_the_revision(hf_cache, monkeypatch, tmp_path):
    import huggingface_hub

    from falcon_cli.models.qformer import resolve_checkpoint_dir

    asked = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda **kwargs: asked.append(kwargs) or str(tmp_path))
    assert resolve_checkpoint_dir("Salesforce/blip2-itm-vit-g@v1", "qformer_weights") == tmp_path
    assert asked[0]["repo_id"] == "Salesforce/blip2-itm-vit-g" and asked[0]["revision"] == "v1"


def test_open_clip_sources_are_fetched_at_their_revision(hf_cache, monkeypatch, tmp_path):
    """open_clip takes no revision: a pinned tag becomes its weights file at that revision (with the tag's
    preprocessing), a pinned ``hf-hub:`` repository the ``local-dir:`` of its snapshot at that commit."""
    import huggingface_hub
    import open_clip

    from falcon_cli.models.open_clip_names import note_open_clip, pinned_open_clip

    files, snapshots = [], []
    snap = snapshot(hf_cache, "org/clip", SHA_V1, "v1")

    def download(**kwargs):
        files.append(kwargs)
        return str(tmp_path / kwargs["filename"])

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda **kwargs: snapshots.append(kwargs) or str(snap))

    name, weights, extra = pinned_open_clip(
        "ViT-B-32", "laion2b_s34b_b79k@v1", open_clip, "embed.encoder", "embed.pretrained"
    )
    repo = "laion/CLIP-ViT-B-32-laion2B-s34B-b79K"
    assert (name, weights) == ("ViT-B-32", str(tmp_path / "open_clip_model.safetensors"))
    assert files == [{"repo_id": repo, "filename": "open_clip_model.safetensors", "revision": "v1"}]
    assert extra["image_mean"] == open_clip.get_pretrained_cfg("ViT-B-32", "laion2b_s34b_b79k")["mean"]
    assert pinned_open_clip("ViT-B-32", "laion2b_s34b_b79k", open_clip, "e", "p") == (
        "ViT-B-32",
        "laion2b_s34b_b79k",
        {},
    )

    files.clear()
    name, weights, extra = pinned_open_clip("hf-hub:org/clip@v1", None, open_clip, "embed.encoder", "embed.pretrained")
    assert (name, weights, extra) == (f"local-dir:{snap}", None, {})
    assert snapshots[0]["repo_id"] == "org/clip" and snapshots[0]["revision"] == "v1"
    assert files == [{"repo_id": "org/clip", "filename": "open_clip_model.safetensors", "revision": SHA_V1}]

    note_open_clip("hf-hub:org/clip@v1", None, open_clip, "embed.encoder", "embed.pretrained")
    note_open_clip("ViT-B-32", "laion2b_s34b_b79k@v1", open_clip, "embed.encoder", "embed.pretrained")
    assert hub.take_sources() == [
        {"key": "embed.encoder", "source": "hf-hub:org/clip@v1", "repo": "org/clip", "revision": "v1", "sha": SHA_V1},
        {"key": "embed.pretrained", "source": "laion2b_s34b_b79k@v1", "repo": repo, "revision": "v1", "sha": None},
    ]


# --- the record --------------------------------------------------------------------------------------


def test_the_manifest_records_what_each_stage_loaded(hf_cache, tmp_path, caplog):
    from falcon_cli.data.tokenizer import load_tokenizer
    from falcon_cli.models import create_model
    from falcon_cli.runtime.run_dir import RunDirectory, now, read_manifest

    tiny_bert(snapshot(hf_cache, BERT_REPO, SHA_MAIN, "main"), seed=0)
    tiny_bert(snapshot(hf_cache, BERT_REPO, SHA_V1, "v1"), seed=1)
    tiny_bert(tmp_path / "local-bert", seed=2)
    load_tokenizer(f"{BERT_REPO}@v1", "data.tokenizer")  # before the run: neither recorded nor counted as warned
    run = RunDirectory.open(tmp_path / "run", config={"name": "pinning"}, seed=0, command=["test"])
    try:
        with caplog.at_level(logging.WARNING, logger="falcon"):
            start = now()
            load_tokenizer(BERT_REPO, "data.tokenizer")
            load_tokenizer(BERT_REPO, "data.tokenizer")
            run.record_stage("data", start=start, status="completed")
            create_model("albef-tiny", text_weights=f"{BERT_REPO}@v1", **BERT_SIZES)
            create_model("albef-tiny", text_weights=f"{BERT_REPO}@{SHA_MAIN}", **BERT_SIZES)
            create_model("albef-tiny", text_weights=str(tmp_path / "local-bert"), **BERT_SIZES)
            run.record_stage("pretrain", start=start, status="completed")
    finally:
        run.close()
    stages = read_manifest(run.path)["stages"]
    assert stages["data"]["sources"] == [
        {"key": "data.tokenizer", "source": BERT_REPO, "repo": BERT_REPO, "revision": None, "sha": SHA_MAIN}
    ]
    hub_ids, local = stages["pretrain"]["sources"][:2], stages["pretrain"]["sources"][2]
    assert hub_ids == [
        {"key": "text_weights", "source": f"{BERT_REPO}@v1", "repo": BERT_REPO, "revision": "v1", "sha": SHA_V1},
        {
            "key": "text_weights",
            "source": f"{BERT_REPO}@{SHA_MAIN}",
            "repo": BERT_REPO,
            "revision": SHA_MAIN,
            "sha": SHA_MAIN,
        },
    ]
    assert local == {
        "key": "text_weights",
        "path": str(tmp_path / "local-bert"),
        **sha256_path(tmp_path / "local-bert"),
    }
    assert len(local["sha256"]) == 64 and local["files"] >= 2
    warnings = [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "pin it as" in r.getMessage()
    ]
    assert len([w for w in warnings if f"pin it as {BERT_REPO}@{SHA_MAIN}" in w]) == 1, warnings  # once per id
    assert len([w for w in warnings if f"'{BERT_REPO}@v1'" in w and f"pin it as {BERT_REPO}@{SHA_V1}" in w]) == 2, (
        warnings
    )
    assert not any(SHA_MAIN in w and f"@{SHA_MAIN}'" in w for w in warnings)  # a commit sha is pinned: no warning


def test_the_resolved_commit_is_read_from_the_cache(hf_cache):
    snapshot(hf_cache, "org/name", SHA_V1, "main", "v1")
    assert hub.resolved_sha("org/name") == SHA_V1 and hub.resolved_sha("org/name", "v1") == SHA_V1
    assert hub.resolved_sha("org/name", "v2") is None and hub.resolved_sha("org/other") is None
    assert hub.resolved_sha("org/other", SHA_MAIN) == SHA_MAIN  # a commit is its own answer


# --- no unpinned download in the code ----------------------------------------------------------------

DOWNLOADS = ("from_pretrained", "hf_hub_download", "snapshot_download")
"""Calls that fetch from the hub: each must say which revision (bandit's B615 and the check below)."""


def unpinned_calls() -> list[str]:
    """Hub-fetching calls in falcon_cli and stages without an explicit ``revision=`` (our own
    ``AlbefVQA.from_pretrained``, which builds from a model in memory, aside), and timm's ``pretrained=True``
    without a ``pretrained_cfg_overlay`` (where the revision goes)."""
    found = []
    for package in ("falcon_cli", "stages"):
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                owner = getattr(func.value, "id", "") if isinstance(func, ast.Attribute) else ""
                keywords = {k.arg for k in node.keywords}
                pretrained = any(
                    k.arg == "pretrained" and isinstance(k.value, ast.Constant) and k.value.value is True
                    for k in node.keywords
                )
                if (name in DOWNLOADS and owner != "AlbefVQA" and "revision" not in keywords) or (
                    name == "create_model" and pretrained and "pretrained_cfg_overlay" not in keywords
                ):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} {name}()")
    return found


def test_every_hub_download_passes_a_revision():
    found = unpinned_calls()
    assert not found, "hub downloads without revision= (pass the parsed HubRef's revision):\n" + "\n".join(found)


def test_bandit_finds_no_unpinned_hub_download():
    pytest.importorskip("bandit", reason="bandit is in the test extra (pip install -e .[test])")
    proc = subprocess.run(
        [sys.executable, "-m", "bandit", "-q", "-t", "B615", "-r", "falcon_cli", "stages", "-f", "json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(proc.stdout)
    findings = [f"{r['filename']}:{r['line_number']} {r['issue_text']}" for r in report["results"]]
    assert not findings and not report["errors"], findings or report["errors"]
