"""Pair encoders: turn images and captions into L2-normalised joint-space features.

The ``embed`` stage needs one thing from a model: for a batch of images and a batch of
captions, one unit-norm vector each, in a shared space. Two families provide it:

* :class:`OpenClipEncoder` — any open_clip architecture (``open_clip:ViT-B-32``) with a
  pretrained tag (``laion2b_s34b_b79k``) or a local checkpoint file;
* :class:`FalconEncoder` — a falcon checkpoint (``falcon:runs/demo``): the projected ITC
  features of ``ALBEF.encode_image`` / ``ALBEF.encode_text``, with the run's own tokenizer.

:func:`load_encoder` parses the ``embed.encoder`` spec and builds either. Every encoder has
``image_transform`` (PIL image -> tensor, run in DataLoader workers), ``tokenizer``
(captions -> tensors, also run in workers; it holds no model) and :meth:`encode`.
Problems the user can fix are one-line :class:`~falcon_cli.errors.FalconError` s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Protocol

import torch
import torch.nn.functional as F
from PIL import Image

from falcon_cli.artifacts.checkpoints import WEIGHTS, latest_checkpoint
from falcon_cli.data.collate import tokenize
from falcon_cli.data.tokenizer import load_tokenizer
from falcon_cli.errors import FalconError
from falcon_cli.models.dual import open_clip_image, open_clip_text
from falcon_cli.models.open_clip_names import (
    HF_HUB,
    LOCAL_DIR,
    _check_open_clip_name,
    _check_open_clip_pretrained,
    _first_line,
    note_open_clip,
    pinned_open_clip,
)
from falcon_cli.models.pretrained import tokenizer_vocabulary, trained_text_length
from falcon_cli.models.registry import model_from_weights
from falcon_cli.models.similarity import paired_image_feature
from falcon_cli.runtime.hub import hub_hint, prepare_hub

OPEN_CLIP_PREFIX = "open_clip:"
FALCON_PREFIX = "falcon:"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pth")
"""Weight files open_clip looks for in a ``local-dir:`` directory."""
TOKENIZER_DIR = Path("data/tokenizer")
DEFAULT_MAX_TEXT_LENGTH = 25  # falcon's pretrain.encoders.max_text_length default


class PairEncoder(Protocol):
    """What the ``embed`` stage uses: transforms and tokenizer for the workers, ``encode`` for the model."""

    model_name: str
    """What to record as the ``model`` attribute (e.g. ``open_clip:ViT-B-32``, ``albef-tiny``)."""
    checkpoint: str
    """What to record as the ``checkpoint`` attribute (a pretrained tag, a file or a checkpoint directory)."""
    epoch: int | None
    """The training epoch of the weights where known (falcon checkpoints), else None."""
    image_transform: Callable[[Image.Image], torch.Tensor]
    """PIL RGB image -> image tensor [3, H, W]."""
    tokenizer: Callable[[list[str]], dict[str, torch.Tensor]]
    """Captions -> a dict of batched tensors that :meth:`encode` accepts."""

    def encode(self, images: torch.Tensor, text: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Images [B, 3, H, W] and tokenised captions -> (image features [B, D], text features [B, D]), unit norm,
        float32."""
        ...


class OpenClipTokenizer:
    """open_clip's tokenizer as a ``captions -> {"text": LongTensor}`` callable (picklable, model-free)."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    def __call__(self, captions: list[str]) -> dict[str, torch.Tensor]:
        return {"text": self._tokenizer(list(captions))}


class OpenClipEncoder:
    """An open_clip model: ``encode_image`` / ``encode_text`` with ``normalize=True``.

    ``name`` is an architecture (``ViT-B-32``, weights from ``pretrained``: a tag or a file) or
    carries its own weights: ``local-dir:DIR`` (``DIR/open_clip_config.json`` and a weights file)
    or ``hf-hub:ORG/REPO``; for those two open_clip ignores ``pretrained``, and so does this class.
    ``hf-hub:ORG/REPO@REV`` and ``TAG@REV`` pin a revision
    (:func:`~falcon_cli.models.open_clip_names.pinned_open_clip`). ``checkpoint`` records what the weights were actually
    read from.
    """

    def __init__(self, name: str, pretrained: str | None, device: torch.device):
        import open_clip

        _check_open_clip_name(name, open_clip)
        if name.startswith((LOCAL_DIR, HF_HUB)):
            pretrained = None  # the directory / repo holds the weights (embed.pretrained's default tag does not apply)
        if pretrained is not None:
            _check_open_clip_pretrained(name, pretrained, open_clip)
        checkpoint = _open_clip_checkpoint(name, pretrained)
        what = f"embed.encoder={OPEN_CLIP_PREFIX}{name}" if pretrained is None else f"embed.pretrained={pretrained}"
        from_hub = name.startswith(HF_HUB) or (pretrained is not None and not Path(pretrained).expanduser().is_file())
        if from_hub:  # a pretrained tag or an hf-hub: repo: open_clip fetches it from the Hugging Face hub
            prepare_hub()
        try:
            load_name, load_pretrained, extra = pinned_open_clip(
                name, pretrained, open_clip, "embed.encoder", "embed.pretrained"
            )
            model, _, preprocess = open_clip.create_model_and_transforms(
                load_name, pretrained=load_pretrained, device=device, **extra
            )
        except FalconError:
            raise
        except Exception as exc:  # open_clip raises RuntimeError/ValueError/OSError for weights it cannot load
            why = (
                hub_hint(checkpoint) if from_hub else ""
            ) or "give a local checkpoint file or a tag in open_clip's cache"
            raise FalconError(
                f"{what}: open_clip could not load weights for {name} ({_first_line(exc)}); {why}"
            ) from None
        note_open_clip(name, pretrained, open_clip, "embed.encoder", "embed.pretrained")
        self.model = model.eval()
        self.device = device
        self.model_name = OPEN_CLIP_PREFIX + name
        self.checkpoint = checkpoint
        self.epoch = None
        self.image_transform = preprocess
        self.tokenizer = OpenClipTokenizer(open_clip.get_tokenizer(load_name))

    @torch.no_grad()
    def encode(self, images: torch.Tensor, text: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Unit-norm image and text features (float32) of a batch: the features a dual encoder trains on
        (:func:`~falcon_cli.models.dual.open_clip_image`, :func:`~falcon_cli.models.dual.open_clip_text`)."""
        _, image = open_clip_image(self.model, images.to(self.device))
        return _unit(image), _unit(open_clip_text(self.model, text["text"].to(self.device)))


class FalconTokenizer:
    """A falcon run's BERT tokenizer as ``captions -> {"input_ids", "attention_mask"}`` (as in pretraining)."""

    def __init__(self, tokenizer, max_length: int):
        self._tokenizer = tokenizer
        self.max_length = max_length

    def __call__(self, captions: list[str]) -> dict[str, torch.Tensor]:
        input_ids, attention_mask = tokenize(self._tokenizer, captions, self.max_length)
        return {"input_ids": input_ids, "attention_mask": attention_mask}


class FalconEncoder:
    """A falcon checkpoint (ALBEF, BLIP-2 or a dual encoder): the projected, normalised ITC features of its image and
    text encoders."""

    def __init__(self, path: str | Path, device: torch.device):
        from falcon_cli.data.transforms import build_transform  # (lazy: torchvision and torch._dynamo, ~1.2 s)

        checkpoint, run_dir = locate_falcon_checkpoint(path)
        tokenizer_dir = run_dir / TOKENIZER_DIR if run_dir is not None else None
        if tokenizer_dir is None or not tokenizer_dir.is_dir():
            where = tokenizer_dir if tokenizer_dir is not None else f"the run directory around {checkpoint}"
            raise FalconError(
                f"embed.encoder=falcon:{path}: the run's tokenizer ({where}) is not there; "
                "give the falcon run directory (it holds data/tokenizer and checkpoints/)"
            )
        tokenizer = load_tokenizer(tokenizer_dir)
        self.model = model_from_weights(checkpoint / WEIGHTS).to(device).eval()
        if tokenizer_vocabulary(self.model.config) != len(tokenizer):
            raise FalconError(
                f"{checkpoint / WEIGHTS}: vocabulary of {tokenizer_vocabulary(self.model.config)} tokens, but "
                f"{tokenizer_dir} has {len(tokenizer)}; the checkpoint belongs to another run"
            )
        meta = _read_json(checkpoint / "meta.json")
        self.device = device
        self.model_name = str(meta.get("model") or "albef")
        self.checkpoint = str(checkpoint)
        self.epoch = meta.get("epoch")
        self.image_transform = build_transform("test", self.model.config.image_size)
        self.tokenizer = FalconTokenizer(tokenizer, trained_text_length(checkpoint) or DEFAULT_MAX_TEXT_LENGTH)

    @torch.no_grad()
    def encode(self, images: torch.Tensor, text: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Unit-norm projected image and text features (float32) of a batch (BLIP-2: per pair, the query
        feature most similar to its own caption, as in its pretraining cache)."""
        _, image = self.model.encode_image(images.to(self.device))
        _, caption = self.model.encode_text(text["input_ids"].to(self.device), text["attention_mask"].to(self.device))
        return _unit(paired_image_feature(image, caption)), _unit(caption)


def load_encoder(spec: str, pretrained: str | None, device: torch.device | str) -> OpenClipEncoder | FalconEncoder:
    """Build the encoder an ``embed.encoder`` spec names, on ``device``, in eval mode.

    ``open_clip:<model name>`` with ``pretrained`` (a tag or a local checkpoint file; None =
    random weights), or ``falcon:<run directory or checkpoint directory>`` (``pretrained`` is ignored).
    """
    device = torch.device(device)
    if spec.startswith(OPEN_CLIP_PREFIX) and spec[len(OPEN_CLIP_PREFIX) :]:
        return OpenClipEncoder(spec[len(OPEN_CLIP_PREFIX) :], pretrained, device)
    if spec.startswith(FALCON_PREFIX) and spec[len(FALCON_PREFIX) :]:
        return FalconEncoder(spec[len(FALCON_PREFIX) :], device)
    raise FalconError(
        f"embed.encoder={spec!r}: unknown encoder; use open_clip:<model name> (e.g. open_clip:ViT-B-32) "
        "or falcon:<run or checkpoint directory> (e.g. falcon:runs/demo)"
    )


def locate_falcon_checkpoint(path: str | Path) -> tuple[Path, Path | None]:
    """(checkpoint directory, run directory or None) for a falcon run directory or one checkpoint directory."""

    path = Path(path).expanduser()
    if not path.exists():
        raise FalconError(
            f"embed.encoder=falcon:{path}: not found; give a falcon run directory or a checkpoint directory"
        )
    if (path / WEIGHTS).is_file():
        run_dir = path.parent.parent if path.parent.name == "checkpoints" else None
        # a fine-tuned checkpoint (finetune/<task>/best, finetune/<task>/checkpoints/<step>) reads its run's tokenizer
        finetuned = [p.parent for p in path.parents[:3] if p.name == "finetune" and (p.parent / TOKENIZER_DIR).is_dir()]
        return path, finetuned[0] if finetuned else run_dir
    if (path / "checkpoints").is_dir():
        checkpoint = latest_checkpoint(path / "checkpoints")
        if checkpoint is None:
            raise FalconError(
                f"{path / 'checkpoints'}: no checkpoint (no 'latest' pointer); "
                "pretrain first or give a checkpoint directory"
            )
        return checkpoint, path
    raise FalconError(
        f"embed.encoder=falcon:{path}: neither a run directory (with checkpoints/) nor a checkpoint "
        f"directory (with {WEIGHTS})"
    )


def _open_clip_checkpoint(name: str, pretrained: str | None) -> str:
    """What an open_clip model's weights are read from, for the record: for ``local-dir:DIR`` the weights
    file open_clip picks in DIR (a one-line error when there is none: the model would be random), for
    ``hf-hub:REPO`` the repo, else the ``pretrained`` tag or file ("" = random weights)."""
    if name.startswith(HF_HUB):
        return name
    if not name.startswith(LOCAL_DIR):
        return "" if pretrained is None else str(pretrained)
    import open_clip.factory

    directory = Path(name[len(LOCAL_DIR) :]).expanduser()
    spec = f"embed.encoder={OPEN_CLIP_PREFIX}{name}"
    if not (directory / "open_clip_config.json").is_file():
        raise FalconError(
            f"{spec}: {directory / 'open_clip_config.json'} not found (a local-dir: directory holds "
            "open_clip_config.json and the weights, as open_clip's push_to_hf_hub writes them)"
        )
    if not any(p.suffix in WEIGHT_SUFFIXES for p in directory.iterdir()):
        raise FalconError(f"{spec}: no weights file ({', '.join('*' + s for s in WEIGHT_SUFFIXES)}) in {directory}")
    find = getattr(open_clip.factory, "_find_checkpoint_in_dir", None)  # open_clip's own choice among several files
    found = find(directory) if find is not None else None
    return str(Path(found).resolve() if found else directory.resolve())


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _unit(features: torch.Tensor) -> torch.Tensor:
    return F.normalize(features.float(), dim=-1)


__all__ = ["PairEncoder", "OpenClipEncoder", "FalconEncoder", "load_encoder", "locate_falcon_checkpoint"]
