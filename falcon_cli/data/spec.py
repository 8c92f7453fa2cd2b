"""The dataset spec: one YAML file (``dataset.yaml``) that says where a dataset's files are.

Every stage finds its data through a spec, so the same code runs on COCO, Flickr30k,
VQA, NLVR2 and the generated shapes world. Relative paths are resolved against the
directory that holds the spec file. Example::

    # dataset.yaml
    name: coco
    image_root: /data/coco/images          # images referenced by relative paths live here
    pretrain: [coco_pretrain.json]          # ALBEF pretraining JSON files
    # or, for web-scale sets: pretrain_shards: "cc3m/{00000..00331}.tar" (then `falcon data index`)
    retrieval:
      train: coco_karpathy_train.json
      val: coco_karpathy_val.json
      test: coco_karpathy_test.json
    vqa:
      train: [vqa_train.json, vg_qa.json]
      test: [vqa_test.json]
      answer_list: answer_list.json
      vg_image_root: /data/vg/images
    nlvr2:
      train: nlvr_train.json
      dev: nlvr_dev.json
      test: nlvr_test.json
      image_root: /data/nlvr2/images
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from falcon_cli.errors import FalconError

SPEC_FILENAME = "dataset.yaml"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _as_list(value):
    if value is None:
        return []
    if isinstance(value, (str, Path)):
        return [value]
    return value


class RetrievalSources(_Section):
    """Karpathy-style retrieval splits (COCO 5K, Flickr 1K, or the shapes world)."""

    train: Path | None = None
    """Train file: one entry per caption, ``{"image", "caption": str, "image_id"}``."""
    val: Path | None = None
    """Validation file: one entry per image, ``{"image", "caption": [captions]}``."""
    test: Path | None = None
    """Test file: one entry per image, ``{"image", "caption": [captions]}``."""
    image_root: Path | None = None
    """Overrides the spec's ``image_root`` for these files."""


class VQASources(_Section):
    """VQA question files and the candidate answer list."""

    train: list[Path] = []
    """Training question files (``answer`` present: a list of answers or one string)."""
    val: list[Path] = []
    """Validation question files (answers present, for local accuracy)."""
    test: list[Path] = []
    """Test question files (answers may be absent)."""
    answer_list: Path | None = None
    """JSON list of candidate answers used to rank at inference."""
    image_root: Path | None = None
    """Overrides the spec's ``image_root`` for VQA (COCO) images."""
    vg_image_root: Path | None = None
    """Image root for entries whose ``dataset`` is ``vg`` (Visual Genome QA)."""

    _lists = field_validator("train", "val", "test", mode="before")(_as_list)


class NLVR2Sources(_Section):
    """NLVR2 statement files: ``{"images": [left, right], "sentence", "label": "True"|"False"}``."""

    train: Path | None = None
    """Training statements."""
    dev: Path | None = None
    """Development statements."""
    test: Path | None = None
    """Public test statements (test-P)."""
    image_root: Path | None = None
    """Overrides the spec's ``image_root`` for NLVR2 images."""


class DatasetSpec(_Section):
    """Where one dataset's annotation files and images live (``dataset.yaml``)."""

    name: str = "dataset"
    """A short name recorded in manifests and artifact attributes."""
    image_root: Path | None = None
    """Directory that relative image paths are resolved against (absolute paths are used as is)."""
    pretrain: list[Path] = []
    """ALBEF pretraining JSON files: a list of ``{"image", "caption": str | [str, ...]}``."""
    pretrain_shards: list[str] = []
    """Pretraining pairs as webdataset tar shards instead (img2dataset's ``{key}.jpg`` + ``.txt``/``.json``): paths or
    brace patterns (``shards/{00000..00099}.tar``), relative to the spec. Read by pair id through the index that
    ``falcon data index`` builds once (:mod:`falcon_cli.data.shards`)."""
    shard_index: Path | None = None
    """Where the shard index lives (default: ``shards-index.parquet`` beside ``dataset.yaml``)."""
    retrieval: RetrievalSources | None = None
    """Karpathy retrieval splits."""
    vqa: VQASources | None = None
    """VQA files."""
    nlvr2: NLVR2Sources | None = None
    """NLVR2 files."""
    shapes_world: Path | None = None
    """For generated shapes worlds: the directory with scenes and captions, so the oracle can judge any pair."""
    on_missing: Literal["fail", "skip"] = "fail"
    """What to do with entries whose image file is missing: ``fail`` (default) or ``skip`` (drop and count)."""

    _lists = field_validator("pretrain", "pretrain_shards", mode="before")(_as_list)

    @model_validator(mode="after")
    def _one_pretrain_source(self):
        if self.pretrain and self.pretrain_shards:
            raise ValueError(
                "pretraining pairs come from JSON files (pretrain) or from shards (pretrain_shards), "
                "not both; keep one key"
            )
        return self

    # Set by load_spec: the directory relative paths are resolved against.
    base_dir: Path = Path(".")
    """Directory of the spec file (set when loading; relative paths resolve against it)."""

    def resolve(self, path: Path | None) -> Path | None:
        """Resolve a path from the spec against the spec file's directory."""
        if path is None:
            return None
        path = Path(path).expanduser()
        return path if path.is_absolute() else (self.base_dir / path)

    def root_for(self, override: Path | None = None) -> Path:
        """The image root to use for a section (its override, else the spec's, else the spec dir)."""
        root = override if override is not None else self.image_root
        return self.resolve(root) if root is not None else self.base_dir


def load_spec(path: str | Path) -> DatasetSpec:
    """Read a dataset spec from a YAML file or a directory holding ``dataset.yaml``.

    Raises :class:`FalconError` with the file and the offending key on any problem.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        path = path / SPEC_FILENAME
    if not path.exists():
        raise FalconError(f"{path}: dataset spec not found (give a dataset.yaml or the directory that holds it)")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise FalconError(f"{path}:{where} is not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(raw, dict):
        raise FalconError(f"{path}: a dataset spec must be a mapping of keys, got {type(raw).__name__}")
    raw.pop("base_dir", None)
    try:
        spec = DatasetSpec.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        raise FalconError(f"{path}: key '{key}': {err['msg']}") from None
    spec.base_dir = path.parent.resolve()
    return spec
