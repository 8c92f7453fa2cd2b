"""Text tokenizers: load a BERT WordPiece or a dual encoder's tokenizer, or train a small one offline.

``load_tokenizer("bert-base-uncased")`` loads from the Hugging Face hub or its local
cache (``bert-base-uncased@<commit sha>`` pins a revision); ``load_tokenizer(path)`` loads a
saved directory. With no network and nothing cached, :func:`train_wordpiece_tokenizer` builds a
BERT-compatible uncased WordPiece tokenizer from the captions themselves (what tests and the shapes
world use).

Other tokenizers load too: a source whose ``tokenizer_config.json`` names a non-BERT
``tokenizer_class`` (CLIP's BPE ``openai/clip-vit-base-patch16``, SigLIP's SentencePiece
``timm/ViT-B-16-SigLIP``, ...) is read with transformers' ``AutoTokenizer`` and made ready
for :func:`falcon_cli.data.collate.tokenize` (a pad token, right padding).
"""

from __future__ import annotations

import os
import string
from pathlib import Path
from typing import Iterable

from falcon_cli.artifacts.atomic import atomic_dir
from falcon_cli.errors import FalconError
from falcon_cli.runtime.hub import HubRef, hub_hint, is_local, note_hub, note_local, prepare_hub

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
"""BERT's special tokens; a trained vocabulary starts with them (``[PAD]`` = 0)."""
BASE_ALPHABET = string.ascii_lowercase + string.digits + string.punctuation
"""Characters always in a trained vocabulary, so digits and punctuation never become ``[UNK]``."""
MODEL_MAX_LENGTH = 512
"""Longest sequence a BERT position table allows."""
WORDPIECE_CLASSES = ("BertTokenizer", "DistilBertTokenizer")
"""``tokenizer_class`` values (with or without ``Fast``) loaded as BERT WordPiece tokenizers, as is a
source that names no class (``bert-base-uncased``'s config names none); any other class loads with
``AutoTokenizer``."""


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


def _from_pretrained(source: str, revision: str | None = None, **kwargs):
    """``BertTokenizerFast.from_pretrained`` that returns ``(tokenizer or None, reason)``."""
    from transformers import BertTokenizerFast

    try:
        tokenizer = BertTokenizerFast.from_pretrained(source, revision=revision, **kwargs)
    except Exception as exc:  # OSError offline / unknown repo, ValueError on bad files, ...
        return None, _first_line(exc)
    if not _usable(tokenizer):
        return None, "no vocabulary found"
    return tokenizer, ""


def _declared_class(source: str, revision: str | None = None, **kwargs) -> str | None:
    """The ``tokenizer_class`` named by ``source``'s ``tokenizer_config.json`` (None: no file, no field)."""
    from transformers.models.auto.tokenization_auto import get_tokenizer_config

    try:
        return get_tokenizer_config(source, revision=revision, **kwargs).get("tokenizer_class")
    except Exception:  # unreadable JSON, offline, unknown repo: decided by what loads
        return None


def _is_wordpiece(class_name: str | None) -> bool:
    """Whether a tokenizer class name (or none) means a BERT WordPiece tokenizer (:data:`WORDPIECE_CLASSES`)."""
    return class_name is None or class_name.removesuffix("Fast") in WORDPIECE_CLASSES


def _from_auto(source: str, declared: str | None = None, revision: str | None = None, **kwargs):
    """``AutoTokenizer.from_pretrained`` that returns ``(tokenizer or None, reason)``; where that fails, the
    ``declared`` class (the one ``source``'s ``tokenizer_config.json`` names, :func:`_declared_class`).

    Usable means more than one ordinary token (neither special nor added): with no vocabulary
    file, transformers 5 builds a model class's tokenizer from its defaults, holding only
    special tokens (and at most a word-boundary marker).
    """
    from transformers import AutoTokenizer
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    try:
        tokenizer = AutoTokenizer.from_pretrained(source, revision=revision, **kwargs)
    except Exception as exc:  # OSError offline / unknown repo, ValueError / ImportError on files it cannot read
        # transformers 5.17's AutoTokenizer always reads the repo's config.json first, and open_clip's hub
        # repos (timm/ViT-B-16-SigLIP2) have none: offline that fails even with the tokenizer cached. The
        # class its tokenizer_config.json names loads without it.
        declared_class = tokenizer_class_from_name(declared or "")
        if declared_class is None:
            return None, _first_line(exc)
        try:
            tokenizer = declared_class.from_pretrained(source, revision=revision, **kwargs)
        except Exception:
            return None, _first_line(exc)
    extra = set(tokenizer.get_added_vocab()) | set(tokenizer.all_special_tokens)
    if len(set(tokenizer.get_vocab()) - extra) <= 1:
        return None, f"no vocabulary found for {type(tokenizer).__name__}"
    return tokenizer, ""


def _load(source: str, revision: str | None = None, **kwargs):
    """``(tokenizer or None, reason)``: ``AutoTokenizer`` when ``source`` names a non-BERT tokenizer class;
    otherwise BERT WordPiece (:func:`_from_pretrained`), and ``AutoTokenizer`` only if that fails and
    gives a non-BERT tokenizer (the reason stays BERT's). ``revision``: the hub revision (None: main)."""
    declared = _declared_class(source, revision, **kwargs)
    if not _is_wordpiece(declared):
        return _from_auto(source, declared, revision, **kwargs)
    tokenizer, reason = _from_pretrained(source, revision, **kwargs)
    if tokenizer is None:
        other, _ = _from_auto(source, declared, revision, **kwargs)
        if other is not None and not _is_wordpiece(type(other).__name__):
            return other, ""
    return tokenizer, reason


def _ready(tokenizer, source: str):
    """``tokenizer`` made ready for :func:`~falcon_cli.data.collate.tokenize`: a pad token (its eos token
    when it has none) and right padding (falcon's text encoders read position 0). A no-op for BERT
    tokenizers. Both settings are saved by ``save_pretrained``."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise FalconError(
                f"{source}: the tokenizer has no pad token and no eos token to pad with "
                "(set pad_token in its tokenizer_config.json)"
            )
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    return tokenizer


def load_tokenizer(name_or_path: str | os.PathLike, what: str | None = None):
    """A tokenizer from a local directory or a hub id: a ``BertTokenizerFast`` for BERT WordPiece
    tokenizers (``bert-base-uncased``, :func:`train_wordpiece_tokenizer`'s), else transformers'
    ``AutoTokenizer`` (a dual encoder's: ``openai/clip-vit-base-patch16``, ``timm/ViT-B-16-SigLIP``),
    with a pad token (:func:`_ready`).

    A directory that exists is loaded from disk; anything else is treated as a hub id
    (``NAME@REVISION`` pins a revision: :class:`~falcon_cli.runtime.hub.HubRef`), looked up in the
    local Hugging Face cache first and then on the hub (unless ``HF_HUB_OFFLINE=1``, or the hub does
    not answer: :func:`~falcon_cli.runtime.hub.prepare_hub`). Failure is a one-line :class:`FalconError`.
    ``what`` names the config key the value came from (``data.tokenizer``): errors name it, and the run's
    manifest records the source (a hub id is recorded whatever ``what``; a directory only with it).
    """
    name = str(name_or_path)
    path = Path(name).expanduser()
    if path.is_dir():
        tokenizer, reason = _load(str(path))
        if tokenizer is None:
            raise FalconError(
                f"{path}: not a tokenizer directory ({reason}); it needs tokenizer.json or vocab.txt "
                "(train one with train_wordpiece_tokenizer)"
            )
        if what is not None:
            note_local(path, what)
        return _ready(tokenizer, str(path))
    if is_local(name):
        raise FalconError(f"{path}: tokenizer directory not found (give a saved tokenizer directory or a hub id)")
    ref = HubRef.parse(name, what or "tokenizer")
    tokenizer, reason = _load(ref.repo, ref.revision, local_files_only=True)
    if tokenizer is None and prepare_hub():
        tokenizer, reason = _load(ref.repo, ref.revision)
    if tokenizer is None:
        why = hub_hint(name) or (
            "it is not a local directory and not in the Hugging Face cache; download it once "
            "with network access, or pass a saved tokenizer directory"
        )
        raise FalconError(f"tokenizer '{name}' could not be loaded ({reason}): {why}")
    note_hub(ref, what or "tokenizer")
    return _ready(tokenizer, f"tokenizer '{name}'")


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
    tok = Tokenizer(
        models.WordPiece(
            {token: i for i, token in enumerate(vocab)},
            unk_token="[UNK]",
            continuing_subword_prefix="##",
            max_input_chars_per_word=100,
        )
    )
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
        raise FalconError(
            f"{path}: not found; run the data stage first (falcon run --recipe {recipe} --run-dir {run_dir})"
        )
    return load_tokenizer(path)
