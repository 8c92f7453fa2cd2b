"""Tokenizers: train a BERT-compatible WordPiece tokenizer offline, save, reload; clear load errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import huggingface_hub.constants
import pytest
from transformers import BertTokenizerFast

from falcon_cli.data.tokenizer import SPECIAL_TOKENS, load_tokenizer, train_wordpiece_tokenizer
from falcon_cli.errors import FalconError
from tests.conftest import REPO

CAPTIONS = [
    "a red circle",
    "A small red circle left of a blue square",
    "a blue square above a green triangle",
    "three shapes",
    "a large green ball",
    "two red circles and a yellow square",
] * 4


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok") / "wordpiece"
    returned = train_wordpiece_tokenizer(CAPTIONS, out, vocab_size=400, min_frequency=1)
    return out, returned


def test_trained_tokenizer_is_saved_and_reloads_as_bert(trained):
    out, returned = trained
    assert {"tokenizer.json", "tokenizer_config.json", "vocab.txt"} <= {p.name for p in out.iterdir()}
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")], "temporary directories left behind"
    tok = load_tokenizer(out)
    assert isinstance(tok, BertTokenizerFast) and isinstance(returned, BertTokenizerFast)
    assert isinstance(BertTokenizerFast.from_pretrained(str(out)), BertTokenizerFast)
    vocab_lines = (out / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert vocab_lines[:5] == list(SPECIAL_TOKENS) and len(vocab_lines) == len(tok.get_vocab())
    special_ids = [tok.pad_token_id, tok.unk_token_id, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id]
    assert special_ids == [0, 1, 2, 3, 4]
    assert tok.model_max_length == 512


def test_trained_tokenizer_encodes_like_bert_uncased(trained):
    tok = load_tokenizer(trained[0])
    ids = tok("a red circle")["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == ["[CLS]", "a", "red", "circle", "[SEP]"]
    # the literal string with special tokens encodes to the same ids
    assert tok("[CLS] a red circle [SEP]", add_special_tokens=False)["input_ids"] == ids
    # uncased: upper case and punctuation split like BERT
    assert tok("A RED Circle")["input_ids"] == ids
    tokens = tok.convert_ids_to_tokens(tok("circle, square!")["input_ids"])
    assert tokens == ["[CLS]", "circle", ",", "square", "!", "[SEP]"]
    assert tok.decode(ids, skip_special_tokens=True) == "a red circle"
    pair = tok("a red circle", "three shapes")
    assert pair["token_type_ids"] == [0, 0, 0, 0, 0, 1, 1, 1]
    batch = tok(["a red circle", "three"], padding="max_length", max_length=8, truncation=True)
    assert batch["input_ids"][1][-1] == tok.pad_token_id and batch["attention_mask"][1][-1] == 0
    assert "[UNK]" not in tok.convert_ids_to_tokens(tok("squares")["input_ids"])  # word pieces, not [UNK]


def test_retraining_replaces_the_directory(tmp_path):
    out = tmp_path / "tok"
    train_wordpiece_tokenizer(CAPTIONS, out, vocab_size=400)
    (out / "stale.txt").write_text("old", encoding="utf-8")
    train_wordpiece_tokenizer(["zebra zebra okapi"] * 3, out, vocab_size=200)
    assert not (out / "stale.txt").exists()
    assert "zebra" in load_tokenizer(out).get_vocab()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tok"]


def test_training_rejects_bad_arguments(tmp_path):
    with pytest.raises(FalconError, match="vocab_size"):
        train_wordpiece_tokenizer(CAPTIONS, tmp_path / "t", vocab_size=3)
    with pytest.raises(FalconError, match="empty"):
        train_wordpiece_tokenizer([], tmp_path / "t2", vocab_size=50)


def _one_line_error(name) -> str:
    with pytest.raises(FalconError) as info:
        load_tokenizer(name)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_load_tokenizer_missing_directory(tmp_path):
    message = _one_line_error(tmp_path / "no_such_tokenizer")
    assert str(tmp_path / "no_such_tokenizer") in message and "not found" in message
    (tmp_path / "empty").mkdir()
    message = _one_line_error(tmp_path / "empty")
    assert "empty" in message and "not a tokenizer directory" in message


def test_load_tokenizer_unknown_hub_id_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    message = _one_line_error("falcon-tests/definitely-not-a-tokenizer")
    assert "'falcon-tests/definitely-not-a-tokenizer'" in message and "could not be loaded" in message


def test_training_is_deterministic_across_processes(tmp_path):
    """Two processes building from the same captions write byte-identical tokenizers (runs are reproducible)."""
    import subprocess
    import sys

    script = (
        "import sys; from falcon_cli.data.tokenizer import train_wordpiece_tokenizer as t; "
        "t([f'a red circle left of a blue square {i % 7}' for i in range(300)] + ['crimson ball', 'tiny box'], "
        "sys.argv[1], vocab_size=400)"
    )
    for name in ("a", "b"):
        subprocess.run([sys.executable, "-c", script, str(tmp_path / name)], check=True)
    for file in ("vocab.txt", "tokenizer.json"):
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes(), file
    tokenizer = load_tokenizer(tmp_path / "a")
    assert tokenizer.tokenize("a crimson zebra") == ["a", "crimson", "z", "##e", "##b", "##r", "##a"]


# --- Non-BERT tokenizers (dual encoders: CLIP's BPE, SigLIP's SentencePiece) -------------------------------


def _clip_bpe(out):
    """A tiny CLIP-style BPE tokenizer (``</w>`` word ends, ``<|startoftext|> ... <|endoftext|>``) saved as
    transformers' CLIPTokenizerFast; returns its vocabulary."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import CLIPTokenizerFast

    letters = "abcdefghijklmnopqrstuvwxyz"
    merges = [("r", "e"), ("re", "d</w>"), ("c", "i"), ("ci", "r"), ("cir", "c"), ("l", "e</w>"), ("circ", "le</w>")]
    tokens = list(letters) + [c + "</w>" for c in letters] + [a + b for a, b in merges]
    vocab = {token: i for i, token in enumerate(tokens + ["<|startoftext|>", "<|endoftext|>"])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, end_of_word_suffix="</w>", unk_token="<|endoftext|>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.BPEDecoder(suffix="</w>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|startoftext|> $A <|endoftext|>",
        special_tokens=[("<|startoftext|>", vocab["<|startoftext|>"]), ("<|endoftext|>", vocab["<|endoftext|>"])],
    )
    CLIPTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|startoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=77,
    ).save_pretrained(str(out))
    return vocab


def _unigram(out, tokenizer_class=None, **special):
    """A tiny SentencePiece-style Unigram tokenizer (``▁`` word starts, ``</s>`` appended) saved as a generic
    fast tokenizer with the given special tokens; ``tokenizer_class`` rewrites the class its config names."""
    import json

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    pieces = [
        ("<pad>", 0.0),
        ("</s>", 0.0),
        ("<unk>", 0.0),
        ("▁a", -2.0),
        ("▁red", -3.0),
        ("▁circle", -3.0),
        ("▁", -4.0),
    ] + [(c, -6.0) for c in "abcdefghijklmnopqrstuvwxyz"]
    tok = Tokenizer(models.Unigram(pieces, unk_id=2, byte_fallback=False))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    PreTrainedTokenizerFast(tokenizer_object=tok, **special).save_pretrained(str(out))
    if tokenizer_class:
        config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
        config["tokenizer_class"] = tokenizer_class
        (out / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return {token: i for i, (token, _) in enumerate(pieces)}


def _encode(tokenizer, texts, max_length=16):
    from falcon_cli.data.collate import tokenize

    ids, mask = tokenize(tokenizer, texts, max_length)
    return ids.tolist(), mask.tolist()


def test_load_tokenizer_clip_bpe_directory(tmp_path):
    vocab = _clip_bpe(tmp_path / "clip")
    tok = load_tokenizer(tmp_path / "clip")
    assert not isinstance(tok, BertTokenizerFast) and type(tok).__name__.startswith("CLIPTokenizer")
    bos, eos = vocab["<|startoftext|>"], vocab["<|endoftext|>"]
    ids, mask = _encode(tok, ["a red circle", "Red"])
    assert ids == [
        [bos, vocab["a</w>"], vocab["red</w>"], vocab["circle</w>"], eos],
        [bos, vocab["red</w>"], eos, eos, eos],
    ]
    assert mask == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert _encode(tok, ["a red circle"], max_length=3) == ([[bos, vocab["a</w>"], eos]], [[1, 1, 1]])  # truncated
    tok.save_pretrained(str(tmp_path / "again"))  # what the data stage does with the run's tokenizer
    again = load_tokenizer(tmp_path / "again")
    assert type(again) is type(tok) and _encode(again, ["a red circle", "red"]) == _encode(tok, ["a red circle", "red"])


def test_load_tokenizer_unigram_pads_with_eos_on_the_right(tmp_path):
    # Only an eos token: BertTokenizerFast would read this file and add BERT's special tokens itself,
    # so the class its config names must decide (a generic fast tokenizer here).
    pieces = _unigram(tmp_path / "uni", eos_token="</s>", padding_side="left")
    tok = load_tokenizer(tmp_path / "uni")
    assert not isinstance(tok, BertTokenizerFast) and tok.pad_token == "</s>" and tok.padding_side == "right"
    ids, mask = _encode(tok, ["a red circle", "red"])
    assert ids == [[pieces["▁a"], pieces["▁red"], pieces["▁circle"], 1], [pieces["▁red"], 1, 1, 1]]
    assert mask == [[1, 1, 1, 1], [1, 1, 0, 0]]
    tok.save_pretrained(str(tmp_path / "again"))
    again = load_tokenizer(tmp_path / "again")
    assert again.pad_token == "</s>" and _encode(again, ["a red circle", "red"]) == (ids, mask)


def test_load_tokenizer_sentencepiece_from_the_hub_cache(tmp_path):
    """A hub id (one '/', as ``timm/ViT-B-16-SigLIP``) found in the local Hugging Face cache, offline;
    its config names T5TokenizerFast (SigLIP's tokenizer is T5's SentencePiece one).

    In a fresh process whose environment names the cache, as a user sets it: transformers 5.17 with
    huggingface_hub 1.33 (an H100 machine's) read the cache path into their own modules at import, so patching
    ``huggingface_hub.constants`` in this process reached only newer versions."""
    commit = "0" * 40
    repo = tmp_path / "hub" / "models--falcon-tests--tiny-siglip"
    _unigram(
        repo / "snapshots" / commit,
        tokenizer_class="T5TokenizerFast",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
    )
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit, encoding="utf-8")
    (repo / ".no_exist" / commit).mkdir(parents=True)  # the hub said: no config.json (open_clip repos have none)
    (repo / ".no_exist" / commit / "config.json").touch()
    code = (
        "import json; from falcon_cli.data.tokenizer import load_tokenizer; "
        "tok = load_tokenizer('falcon-tests/tiny-siglip'); "
        "out = tok(['a red circle', 'red'], padding='longest', truncation=True, max_length=16); "
        "print(json.dumps([type(tok).__name__, tok.pad_token_id, out['input_ids'], out['attention_mask']]))"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    name, pad, ids, mask = json.loads(proc.stdout.strip().splitlines()[-1])
    assert name.startswith("T5Tokenizer") and pad == 0
    assert (ids, mask) == ([[3, 4, 5, 1], [4, 1, 0, 0]], [[1, 1, 1, 1], [1, 1, 0, 0]])
    assert _encode(load_tokenizer(repo / "snapshots" / commit), ["a red circle", "red"]) == (ids, mask)


def test_a_tokenizer_whose_repo_has_no_model_config_loads_by_its_declared_class(tmp_path, monkeypatch):
    """transformers 5.17's AutoTokenizer reads config.json before the tokenizer's files and fails where a repo
    has none (open_clip's hub repos); the class tokenizer_config.json names is loaded instead."""
    from transformers import AutoTokenizer

    _unigram(tmp_path / "t5", tokenizer_class="T5TokenizerFast", eos_token="</s>", unk_token="<unk>", pad_token="<pad>")
    expected = _encode(load_tokenizer(tmp_path / "t5"), ["a red circle", "red"])

    def no_config(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", no_config)
    tok = load_tokenizer(tmp_path / "t5")
    assert type(tok).__name__.startswith("T5Tokenizer") and _encode(tok, ["a red circle", "red"]) == expected
    _unigram(tmp_path / "unknown", tokenizer_class="NoSuchTokenizer", eos_token="</s>")
    with pytest.raises(FalconError, match="couldn't connect"):  # no class to fall back on: AutoTokenizer's reason
        load_tokenizer(tmp_path / "unknown")


def test_load_tokenizer_unusable_non_bert_directories(tmp_path):
    (tmp_path / "config_only").mkdir()  # names a class, holds no vocabulary
    (tmp_path / "config_only" / "tokenizer_config.json").write_text('{"tokenizer_class": "CLIPTokenizer"}')
    message = _one_line_error(tmp_path / "config_only")
    assert str(tmp_path / "config_only") in message and "not a tokenizer directory" in message
    _unigram(tmp_path / "no_pad", unk_token="<unk>")  # nothing to pad with
    message = _one_line_error(tmp_path / "no_pad")
    assert str(tmp_path / "no_pad") in message and "no pad token and no eos token" in message


def test_hub_id_tokenizer_passes_config_validation(tmp_path, monkeypatch):
    """``data.tokenizer: timm/ViT-B-16-SigLIP`` stays a hub id (not made a path), and loading it offline
    with nothing cached says it could not be loaded (not 'directory not found')."""
    from falcon_cli.config.paths import absolute_input_paths
    from falcon_cli.config.schema import DataConfig

    monkeypatch.chdir(tmp_path)
    config = absolute_input_paths(DataConfig(dataset="shapes", tokenizer="timm/ViT-B-16-SigLIP"))
    assert config.tokenizer == "timm/ViT-B-16-SigLIP"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    message = _one_line_error("timm/ViT-B-16-SigLIP")
    assert "'timm/ViT-B-16-SigLIP' could not be loaded" in message


@pytest.mark.parametrize("kind", ["wordpiece", "clip-bpe", "unigram"])
def test_caption_tokens_equal_tokenize_and_tokenise_each_caption_once(kind, trained, tmp_path):
    """PretrainCollate's cached token ids give exactly what tokenising the batch gives (truncated, right-padded
    to the longest, the same mask), for BERT's WordPiece, CLIP's BPE and a SentencePiece unigram tokenizer,
    and a caption seen before is not tokenised again."""
    import random

    import torch

    from falcon_cli.data.collate import CaptionTokens, PretrainCollate, tokenize

    tokenizer = {
        "wordpiece": lambda: load_tokenizer(trained[0]),
        "clip-bpe": lambda: (_clip_bpe(tmp_path / "clip"), load_tokenizer(tmp_path / "clip"))[1],
        "unigram": lambda: (_unigram(tmp_path / "uni", eos_token="</s>"), load_tokenizer(tmp_path / "uni"))[1],
    }[kind]()
    words = ["a", "red", "circle", "left", "of", "blue", "square", "two", "big", "Red.", "triangles", "élan"]
    rng = random.Random(0)
    captions = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 14))) for _ in range(40)]
    cached = CaptionTokens(tokenizer, max_length=9)
    for _ in range(6):  # batches with repeats, in any order, some captions longer than 9 tokens
        batch = [rng.choice(captions) for _ in range(rng.randint(1, 12))]
        ids, mask = cached(batch)
        expected_ids, expected_mask = tokenize(tokenizer, batch, 9)
        assert torch.equal(ids, expected_ids) and torch.equal(mask, expected_mask)
        assert ids.dtype == expected_ids.dtype == torch.int64
    calls = []
    original = cached.tokenizer
    cached.tokenizer = lambda texts, **kw: (calls.append(list(texts)), original(texts, **kw))[1]
    cached.tokenizer.pad_token_id, cached.tokenizer.padding_side = original.pad_token_id, "right"
    seen = list(cached.ids)
    cached(seen[:5] + ["a brand new caption", "a brand new caption"])
    assert calls == [["a brand new caption"]], "only the caption not seen before is tokenised, once"
    collate = PretrainCollate(tokenizer, 9)
    items = [{"caption": c, "pair_id": i} for i, c in enumerate(captions[:7])]
    out = collate(items)
    assert torch.equal(out["input_ids"], tokenize(tokenizer, captions[:7], 9)[0]) and out["images"] is None
