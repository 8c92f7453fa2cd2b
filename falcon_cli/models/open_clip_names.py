"""open_clip model names and weight tags: the prefixes open_clip resolves itself, and one-line checks of a
name and a tag before open_clip is asked to build them (for the dual-encoder models and the embed stage's
encoders alike, below both)."""

from __future__ import annotations

import difflib
from pathlib import Path

from falcon_cli.errors import FalconError

LOCAL_DIR = "local-dir:"
"""open_clip's prefix for a local directory holding ``open_clip_config.json`` and the weights."""
HF_HUB = "hf-hub:"
"""open_clip's prefix for a Hugging Face hub repository holding its config and weights."""


def _check_open_clip_name(name: str, open_clip) -> None:
    if ":" in name:  # hf-hub:org/repo, local-dir:/path: open_clip resolves these itself
        return
    known = open_clip.list_models()
    if name not in known:
        near = difflib.get_close_matches(name, known, n=3, cutoff=0.5) or known[:3]
        raise FalconError(f"embed.encoder=open_clip:{name}: unknown open_clip model; did you mean "
                          f"{', '.join(near)}? (`python -c 'import open_clip; print(open_clip.list_models())'` lists all)")


def _check_open_clip_pretrained(name: str, pretrained: str, open_clip) -> None:
    candidate = Path(pretrained).expanduser()
    if candidate.is_file():
        return
    looks_like_file = "/" in pretrained or candidate.suffix in (".pt", ".pth", ".bin", ".safetensors", ".npz")
    if looks_like_file:
        raise FalconError(f"embed.pretrained={pretrained}: checkpoint file not found")
    if ":" in name:
        return
    tags = open_clip.list_pretrained_tags_by_model(name)
    if pretrained not in tags:
        hint = f"tags for {name}: {', '.join(tags[:6])}" if tags else f"open_clip has no pretrained tags for {name}; give a local file"
        raise FalconError(f"embed.pretrained={pretrained}: not a pretrained tag of {name} nor a file; {hint}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
