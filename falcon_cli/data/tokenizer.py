"""Text tokenizers: load a BERT WordPiece tokenizer, or train a small one offline.

``load_tokenizer("bert-base-uncased")`` loads from the Hugging Face hub or its local
cache; ``load_tokenizer(path)`` loads a saved directory. With no network and nothing
cached, :func:`train_wordpiece_tokenizer` builds a BERT-compatible uncased WordPiece
tokenizer from the captions themselves (what tests and the shapes world use).
"""

from __future__ import annotations

import os
import string
from pathlib import Path
from typing import Iterable

from falcon_cli.artifacts.atomic import atomic_dir
from falcon_cli.errors import FalconError

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
"""BERT's special tokens; a trained vocabulary starts with them (``[PAD]`` = 0)."""
BASE_ALPHABET = string.ascii_lowercase + string.digits + string.punctuation
"""Characters always in a trained vocabulary, so digits and punctuation never become ``[UNK]``."""
MODEL_MAX_LENGTH = 512
"""Longest sequence a BERT position table allows."""


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~")) or name.count("/") > 1 or os.sep in name and os.sep != "/"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _usable(tokenizer) -> bool:
    """Whether a loaded tokenizer has a real vocabulary with BERT's special tokens.

    transformers 5 returns a tokenizer holding only the special tokens when it finds no
    files (offline, unknown id, empty directory) instead of raising; this catches that.
    """
    vocab = tokenizer.get_vocab()
    return len(vocab) > len(SPECIAL_TOKENS) and all(token in vocab for token in SPECIAL_TOKENS)


def _from_pretrained(source: str, **kwargs):
    """``BertTokenizerFast.from_pretrained`` that returns ``(tokenizer or None, reason)``."""
    from transformers import BertTokenizerFast

    try:
        tokenizer = BertTokenizerFast.from_pretrained(source, **kwargs)
    except Exception as exc:  # OSError offline / unknown repo, ValueError on bad files, ...
        return None, _first_line(exc)
    if not _usable(tokenizer):
        return None, "no vocabulary found"
    return tokenizer, ""


def load_tokenizer(name_or_path: str | os.PathLike):
    """A ``BertTokenizerFast`` from a local directory or a hub id (``bert-base-uncased``).

    A directory that exists is loaded from disk; anything else is treated as a hub id,
    looked up in the local Hugging Face cache first and then on the hub (unless
    ``HF_HUB_OFFLINE=1``, or the hub does not answer: :func:`~falcon_cli.runtime.hub.prepare_hub`).
    Failure is a one-line :class:`FalconError`.
    """
    from falcon_cli.runtime.hub import hub_hint, prepare_hub

    name = str(name_or_path)
    path = Path(name).expanduser()
    if path.is_dir():
        tokenizer, reason = _from_pretrained(str(path))
        if tokenizer is None:
            raise FalconError(
                f"{path}: not a tokenizer directory ({reason}); it needs tokenizer.json or vocab.txt "
                "(train one with train_wordpiece_tokenizer)"
            )
        return tokenizer
    if path.exists() or _looks_like_path(name):
        raise FalconError(f"{path}: tokenizer directory not found (give a saved tokenizer directory or a hub id)")
    tokenizer, reason = _from_pretrained(name, local_files_only=True)
    if tokenizer is None and prepare_hub():
        tokenizer, reason = _from_pretrained(name)
    if tokenizer is None:
        why = hub_hint(name) or ("it is not a local directory and not in the Hugging Face cache; download it once "
                                 "with network access, or pass a saved tokenizer directory")
        raise FalconError(f"tokenizer '{name}' could not be loaded ({reason}): {why}")
    return tokenizer


def train_wordpiece_tokenizer(
    texts: Iterable[str],
    out_dir: str | os.PathLike,
    *,
    vocab_size: int = 8000,
    min_frequency: int = 1,
):
    """Build a BERT-compatible uncased WordPiece tokenizer from ``texts`` and save it to ``out_dir``.

    Deterministic: the same texts give byte-identical files in any process. The vocabulary
    holds every character seen (plus ASCII letters, digits and punctuation) as a word start
    and as a ``##`` continuation, then the most frequent whole words (ties by spelling) up
    to ``vocab_size`` (which the characters alone may already exceed for tiny sizes).

    The tokenizer has BERT's normaliser (lower-case and accent stripping, like ``bert-base-uncased``)
    and pre-tokenizer, the special tokens ``[PAD] [UNK] [CLS] [SEP] [MASK]``
    (ids 0-4), every lower-case ASCII letter, digit and punctuation mark,
    ``[CLS] A [SEP]`` / ``[CLS] A [SEP] B [SEP]`` post-processing and a ``##``
    WordPiece decoder. ``out_dir`` gets ``tokenizer.json``, ``tokenizer_config.json`` and
    ``vocab.txt``, written into a temporary directory and renamed into place. Returns the
    tokenizer as :func:`load_tokenizer` would load it.
    """
    from collections import Counter

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import BertTokenizerFast

    if vocab_size <= len(SPECIAL_TOKENS):
        raise FalconError(f"vocab_size must exceed the {len(SPECIAL_TOKENS)} special tokens, got {vocab_size}")
    out_dir = Path(out_dir).expanduser()
    normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, lowercase=True)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()

    # Count words exactly as the tokenizer will see them (normalised, pre-tokenised).
    counts: Counter[str] = Counter()
    counted = 0
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise FalconError(f"cannot train a tokenizer: text {i} is a {type(text).__name__}, expected a string")
        if text.strip():
            counted += 1
            counts.update(word for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text)))
    if counted == 0:
        raise FalconError("cannot train a tokenizer: the texts given were empty")

    # A deterministic WordPiece vocabulary (the library's trainer breaks ties in hash-map order, so
    # two processes could build different vocabularies from the same captions): every character as
    # a word start and as a "##" continuation, so any word can be spelled, then whole words by
    # (frequency desc, word asc) while there is room.
    chars = sorted(set(BASE_ALPHABET) | {c for word in counts for c in word})
    vocab = list(SPECIAL_TOKENS) + chars + [f"##{c}" for c in chars]
    if min_frequency > 1:
        counts = Counter({w: n for w, n in counts.items() if n >= min_frequency})
    words = [w for w, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0])) if len(w) > 1]
    vocab += words[: max(0, vocab_size - len(vocab))]
    tok = Tokenizer(models.WordPiece({token: i for i, token in enumerate(vocab)}, unk_token="[UNK]",
                                     continuing_subword_prefix="##", max_input_chars_per_word=100))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    tok.decoder = decoders.WordPiece(prefix="##")
    bert = BertTokenizerFast(tokenizer_object=tok, do_lower_case=True, model_max_length=MODEL_MAX_LENGTH)
    with atomic_dir(out_dir) as tmp:
        bert.save_pretrained(str(tmp))
        vocab = sorted(tok.get_vocab().items(), key=lambda item: item[1])
        (tmp / "vocab.txt").write_text("".join(f"{token}\n" for token, _ in vocab), encoding="utf-8")
    return load_tokenizer(out_dir)


RUN_TOKENIZER_DIR = Path("data/tokenizer")
"""Where the data stage saves a run's tokenizer, relative to the run directory."""


def load_run_tokenizer(run_dir: str | os.PathLike, recipe: str = "RECIPE"):
    """The tokenizer the data stage saved in ``run_dir`` (every later stage reads captions with it)."""
    path = Path(run_dir) / RUN_TOKENIZER_DIR
    if not path.exists():
        raise FalconError(f"{path}: not found; run the data stage first (falcon run --recipe {recipe} --run-dir {run_dir})")
    return load_tokenizer(path)
