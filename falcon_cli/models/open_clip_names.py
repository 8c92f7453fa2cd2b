"""open_clip model names and weight tags: the prefixes open_clip resolves itself, one-line checks of a
name and a tag before open_clip is asked to build them, and their revisions (for the dual-encoder models and
the embed stage's encoders alike, below both).

``hf-hub:ORG/REPO@REVISION`` and ``TAG@REVISION`` pin the hub repository a model or a tag comes from. open_clip
(3.3) takes no revision, so :func:`pinned_open_clip` fetches a pinned source at its revision and hands open_clip
the local copy; :func:`note_open_clip` notes what was loaded for the run's manifest.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from falcon_cli.errors import FalconError
from falcon_cli.runtime.hub import HubRef, hub_file, hub_snapshot, note_hub, note_local, note_url

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
        raise FalconError(
            f"embed.encoder=open_clip:{name}: unknown open_clip model; did you mean "
            f"{', '.join(near)}? (`python -c 'import open_clip; print(open_clip.list_models())'` lists all)"
        )


def _check_open_clip_pretrained(name: str, pretrained: str, open_clip) -> None:
    candidate = Path(pretrained).expanduser()
    if candidate.is_file():
        return
    tag = pretrained.partition("@")[0]  # (a tag's revision is checked where it is parsed: pinned_open_clip)
    looks_like_file = "/" in tag or Path(tag).suffix in (".pt", ".pth", ".bin", ".safetensors", ".npz")
    if looks_like_file:
        raise FalconError(f"embed.pretrained={pretrained}: checkpoint file not found")
    if ":" in name:
        return
    tags = open_clip.list_pretrained_tags_by_model(name)
    if tag not in tags:
        hint = (
            f"tags for {name}: {', '.join(tags[:6])}"
            if tags
            else f"open_clip has no pretrained tags for {name}; give a local file"
        )
        raise FalconError(f"embed.pretrained={pretrained}: not a pretrained tag of {name} nor a file; {hint}")


def _tag_hub_file(name: str, tag: str, open_clip) -> tuple[str | None, str, str]:
    """(the hub repository open_clip takes ``name``'s pretrained ``tag`` from, or None; the weights file in it; the
    tag's download URL, or "")."""
    from open_clip.constants import HF_WEIGHTS_NAME

    cfg = open_clip.get_pretrained_cfg(name, tag) or {}
    repo, filename = os.path.split(
        cfg.get("hf_hub") or ""
    )  # 'org/model/' or 'org/model/file.pt', as open_clip reads it
    return repo or None, filename or HF_WEIGHTS_NAME, cfg.get("url") or ""


def _hub_weights(ref: HubRef, filename: str) -> str:
    """The local path of weights ``filename`` of ``ref`` at its revision, its safetensors twin first when the
    repository has one (open_clip's own preference)."""
    from huggingface_hub.errors import EntryNotFoundError
    from open_clip.constants import HF_SAFE_WEIGHTS_NAME, HF_WEIGHTS_NAME

    twin = (
        HF_SAFE_WEIGHTS_NAME
        if filename == HF_WEIGHTS_NAME
        else (filename.rsplit(".", 1)[0] + ".safetensors" if filename.endswith((".bin", ".pth")) else None)
    )
    if twin is not None:
        try:
            return hub_file(ref, twin)
        except EntryNotFoundError:  # no safetensors in the repository (or, offline, in the cache)
            pass
    return hub_file(ref, filename)


def pinned_open_clip(
    name: str, pretrained: str | None, open_clip, what: str, what_weights: str
) -> tuple[str, str | None, dict]:
    """What to hand open_clip for model ``name`` and weights ``pretrained`` (checked already) so that a revision is
    honoured: ``(model name, pretrained, extra keyword arguments of create_model_and_transforms)``.

    ``hf-hub:ORG/REPO@REV``: the repository's config, tokenizer files and weights at REV, as ``local-dir:`` their
    snapshot directory. ``TAG@REV``: the tag's weights file at REV in the repository open_clip takes the tag from,
    with the tag's preprocessing (mean, std, interpolation, resize mode: what open_clip applies for the tag itself).
    Anything without a revision is handed over unchanged. ``what`` and ``what_weights`` name the config keys of
    ``name`` and ``pretrained``, for errors."""
    from open_clip.constants import HF_WEIGHTS_NAME

    if name.startswith(HF_HUB):
        ref = HubRef.parse(name, what)
        if ref.revision is None:
            return name, pretrained, {}
        snapshot = hub_snapshot(ref, ["*.json", "*.txt", "*.model"])  # open_clip_config.json and the tokenizer's files
        _hub_weights(HubRef(ref.repo, snapshot.name), HF_WEIGHTS_NAME)  # the weights of the same commit, beside them
        return LOCAL_DIR + str(snapshot), None, {}
    if pretrained is None or Path(pretrained).expanduser().is_file():
        return name, pretrained, {}
    ref = HubRef.parse(pretrained, what_weights)
    if ref.revision is None:
        return name, pretrained, {}
    repo, filename, url = _tag_hub_file(name, ref.repo, open_clip)
    if repo is None:
        raise FalconError(
            f"{what_weights}={pretrained}: open_clip takes {name}'s {ref.repo} weights "
            f"from {url or 'no hub repository'}, "
            f"not the Hugging Face hub, so no revision can be pinned; drop '@{ref.revision}'"
        )
    cfg = open_clip.get_pretrained_cfg(name, ref.repo)
    preprocess = {
        "image_mean": cfg.get("mean"),
        "image_std": cfg.get("std"),
        "image_interpolation": cfg.get("interpolation"),
        "image_resize_mode": cfg.get("resize_mode"),
    }
    weights = _hub_weights(HubRef(repo, ref.revision), filename)
    return name, weights, {key: value for key, value in preprocess.items() if value is not None}


def note_open_clip(name: str, pretrained: str | None, open_clip, what: str, what_weights: str) -> None:
    """Note for the run's manifest where an open_clip model's weights came from, as the user named them: an
    ``hf-hub:`` repository or a pretrained tag (the hub repository and the commit it resolved to), a ``local-dir:``
    directory or a checkpoint file (path; the run directory adds the sha256)."""
    if name.startswith(HF_HUB):
        note_hub(HubRef.parse(name, what), what)
    elif name.startswith(LOCAL_DIR):
        note_local(name[len(LOCAL_DIR) :], what)
    elif pretrained is not None and Path(pretrained).expanduser().is_file():
        note_local(pretrained, what_weights)
    elif pretrained is not None:
        ref = HubRef.parse(pretrained, what_weights)
        repo, _, url = _tag_hub_file(name, ref.repo, open_clip)
        if repo is not None:
            note_hub(ref, what_weights, repo=repo)
        else:
            note_url(str(ref), url, what_weights)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
