"""Which annotation files a dataset spec names, with their format and image root.

Both the dataset builders (:mod:`falcon_cli.data.datasets`) and ``falcon data check``
(:mod:`falcon_cli.data.check`) find files through :func:`spec_sources`, so the two never
disagree on which file is read with which format and root.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from falcon_cli.data.loading import RootFor
from falcon_cli.data.nlvr2 import NLVR2_FORMAT
from falcon_cli.data.pretrain import PRETRAIN_FORMAT
from falcon_cli.data.retrieval import RETRIEVAL_EVAL_FORMAT, RETRIEVAL_TRAIN_FORMAT
from falcon_cli.data.schema import EntryFormat
from falcon_cli.data.spec import SPEC_FILENAME, DatasetSpec
from falcon_cli.data.vqa import vqa_format
from falcon_cli.errors import FalconError

SECTION_SPLITS = {
    "pretrain": ("train",),
    "retrieval": ("train", "val", "test"),
    "vqa": ("train", "val", "test"),
    "nlvr2": ("train", "dev", "test"),
}
"""The splits each spec section can name."""


@dataclass(frozen=True)
class SourceRef:
    """One annotation file named by a spec."""

    section: str
    """``pretrain``, ``retrieval``, ``vqa`` or ``nlvr2``."""
    split: str
    """``train``/``val``/``test``/``dev``, or ``answer_list`` for VQA's candidate answers."""
    path: Path
    """The file, resolved against the spec's directory."""
    fmt: EntryFormat | None
    """Its entry format (``None`` for the answer list, which is a list of strings)."""
    root: RootFor
    """Image root: a directory, or a function of the entry (VQA's ``dataset: vg``)."""
    position: int | None = None
    """Index among several files of the same split (pretrain and VQA take lists)."""

    @property
    def label(self) -> str:
        """``section/split`` (with ``[i]`` when the split has several files)."""
        suffix = f"[{self.position}]" if self.position is not None else ""
        return f"{self.section}/{self.split}{suffix}"


def spec_file(spec: DatasetSpec) -> Path:
    """The spec's YAML file, for error messages."""
    return spec.base_dir / SPEC_FILENAME


def _vqa_root(spec: DatasetSpec) -> Callable[[dict], Path]:
    assert spec.vqa is not None
    root = spec.root_for(spec.vqa.image_root)
    vg_root = spec.root_for(spec.vqa.vg_image_root) if spec.vqa.vg_image_root is not None else root
    return lambda entry: vg_root if entry.get("dataset") == "vg" else root


def _many(paths: list[Path]) -> list[tuple[Path, int | None]]:
    return [(p, i if len(paths) > 1 else None) for i, p in enumerate(paths)]


def spec_sources(spec: DatasetSpec) -> list[SourceRef]:
    """Every annotation file the spec names, in spec order (pretrain, retrieval, vqa, nlvr2)."""
    out: list[SourceRef] = []
    root = spec.root_for(None)
    for path, pos in _many(spec.pretrain):
        out.append(SourceRef("pretrain", "train", spec.resolve(path), PRETRAIN_FORMAT, root, pos))
    if spec.retrieval is not None:
        r_root = spec.root_for(spec.retrieval.image_root)
        for split in SECTION_SPLITS["retrieval"]:
            path = getattr(spec.retrieval, split)
            if path is not None:
                fmt = RETRIEVAL_TRAIN_FORMAT if split == "train" else RETRIEVAL_EVAL_FORMAT
                out.append(SourceRef("retrieval", split, spec.resolve(path), fmt, r_root))
    if spec.vqa is not None:
        v_root = _vqa_root(spec)
        for split in SECTION_SPLITS["vqa"]:
            for path, pos in _many(getattr(spec.vqa, split)):
                out.append(SourceRef("vqa", split, spec.resolve(path), vqa_format(split), v_root, pos))
        if spec.vqa.answer_list is not None:
            out.append(SourceRef("vqa", "answer_list", spec.resolve(spec.vqa.answer_list), None, v_root))
    if spec.nlvr2 is not None:
        n_root = spec.root_for(spec.nlvr2.image_root)
        for split in SECTION_SPLITS["nlvr2"]:
            path = getattr(spec.nlvr2, split)
            if path is not None:
                out.append(SourceRef("nlvr2", split, spec.resolve(path), NLVR2_FORMAT, n_root))
    return out


def split_sources(spec: DatasetSpec, section: str, split: str) -> list[SourceRef]:
    """The files of one section's split; a one-line :class:`FalconError` when the spec names none."""
    splits = SECTION_SPLITS.get(section)
    if splits is None:
        raise FalconError(f"unknown dataset section {section!r}; use one of {', '.join(SECTION_SPLITS)}")
    if split not in splits:
        raise FalconError(f"{section} has no split {split!r}; use one of {', '.join(splits)}")
    found = [s for s in spec_sources(spec) if s.section == section and s.split == split]
    if not found:
        if section == "pretrain":
            what, key = "pretrain files", "pretrain"
        else:
            what, key = f"{section} {split} file", f"{section}.{split}"
        raise FalconError(f"{spec_file(spec)}: no {what} configured; add key '{key}' to the dataset spec")
    return found
