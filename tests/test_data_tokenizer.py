"""Tokenizers: train a BERT-compatible WordPiece tokenizer offline, save, reload; clear load errors."""

from __future__ import annotations

import huggingface_hub.constants
import pytest
from transformers import BertTokenizerFast

from falcon_cli.data.tokenizer import SPECIAL_TOKENS, load_tokenizer, train_wordpiece_tokenizer
from falcon_cli.errors import FalconError

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

    script = ("import sys; from falcon_cli.data.tokenizer import train_wordpiece_tokenizer as t; "
              "t([f'a red circle left of a blue square {i % 7}' for i in range(300)] + ['crimson ball', 'tiny box'], "
              "sys.argv[1], vocab_size=400)")
    for name in ("a", "b"):
        subprocess.run([sys.executable, "-c", script, str(tmp_path / name)], check=True)
    for file in ("vocab.txt", "tokenizer.json"):
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes(), file
    tokenizer = load_tokenizer(tmp_path / "a")
    assert tokenizer.tokenize("a crimson zebra") == ["a", "crimson", "z", "##e", "##b", "##r", "##a"]
