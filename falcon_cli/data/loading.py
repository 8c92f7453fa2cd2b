"""The loading pipeline every format shares: read, validate, resolve images, apply the missing-image policy.

:func:`load_source` turns one annotation file into validated entries with resolved image
paths, and a :class:`LoadReport` that says how many entries were dropped for missing
images (stages record it in the run manifest).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Literal, Union

from torch.utils.data import Dataset

from falcon_cli.data.images import ImageStatus, resolve_image_path, scan_images
from falcon_cli.data.json_io import read_json_list
from falcon_cli.data.schema import EntryFormat
from falcon_cli.errors import FalconError

OnMissing = Literal["fail", "skip"]
"""``fail``: stop with the count and the first missing paths; ``skip``: drop those entries and count them."""

RootFor = Union[Path, Callable[[dict], Path]]
"""The image root of a file: one directory, or a function of the entry (VQA's ``dataset: vg``)."""

SHOWN_PATHS = 3
"""How many example paths an error message or report shows."""


@dataclass
class LoadReport:
    """How one annotation file was loaded: entries read, kept and dropped for missing images."""

    source: str
    """The annotation file."""
    entries: int
    """Entries in the file."""
    kept: int
    """Entries kept (all of them unless ``on_missing=skip`` dropped some)."""
    images: int
    """Distinct image files the entries reference."""
    missing_images: int
    """Distinct image files that do not exist."""
    on_missing: str
    """The policy applied (``fail`` or ``skip``)."""
    first_missing: list[str] = field(default_factory=list)
    """The first few missing image paths, as written in the file."""

    @property
    def dropped(self) -> int:
        """Entries dropped because an image they reference is missing."""
        return self.entries - self.kept

    def to_dict(self) -> dict:
        """A JSON-ready dict (for the run manifest), including ``dropped``."""
        return {**asdict(self), "dropped": self.dropped}


@dataclass
class LoadedSource:
    """One validated annotation file: the kept entries, their resolved images and the load report."""

    path: Path
    indices: list[int]
    """Position in the file of each kept entry (stable ids survive skipped entries)."""
    entries: list[dict]
    """The kept entries, unchanged (extra keys included)."""
    images: list[list[Path]]
    """Resolved image paths of each kept entry (one, or two for NLVR2)."""
    report: LoadReport


def root_function(root: RootFor) -> Callable[[dict], Path]:
    """The image root of an entry, whether ``root`` is one directory or already a function."""
    return root if callable(root) else (lambda entry: root)  # type: ignore[return-value]


def missing_images_message(
    path: Path,
    missing_refs: list[str],
    missing: int,
    total: int,
    roots: list[Path],
    hint: str = "fix image_root in dataset.yaml or set on_missing=skip",
) -> str:
    """The one-line message for missing images: count, roots, first paths, then ``hint``."""
    under = f" under {', '.join(str(r) for r in roots)}" if roots else ""
    first = ", ".join(missing_refs[:SHOWN_PATHS])
    return f"{path}: {missing:,} of {total:,} images are missing{under} (first: {first}); {hint}"


def load_source(path: str | Path, fmt: EntryFormat, root: RootFor, on_missing: OnMissing = "fail") -> LoadedSource:
    """Read and validate one annotation file, resolve its images and apply the missing-image policy.

    Raises :class:`FalconError` for a missing or malformed file, the first bad entry, and
    (with ``on_missing="fail"``) any missing image. With ``on_missing="skip"`` entries with
    a missing image are dropped and counted in the returned report.
    """
    if on_missing not in ("fail", "skip"):
        raise FalconError(f"on_missing must be 'fail' or 'skip', got {on_missing!r}")
    path = Path(path)
    raw = read_json_list(path, what=f"{fmt.name} entries")
    fmt.raise_on_issues(path, raw)
    root_for = root_function(root)

    resolved: list[list[Path]] = []
    entry_roots: list[Path] = []
    for entry in raw:
        entry_root = root_for(entry)
        entry_roots.append(entry_root)
        resolved.append([resolve_image_path(ref, entry_root) for ref in fmt.image_refs(entry)])
    status = scan_images((p for paths in resolved for p in paths), description=f"finding images of {path.name}")

    distinct = {p for paths in resolved for p in paths}
    missing_paths = {p for p in distinct if status[p] is not ImageStatus.OK}
    missing_refs: list[str] = []
    missing_roots: list[Path] = []
    keep: list[int] = []
    for i, (entry, paths) in enumerate(zip(raw, resolved)):
        bad = [ref for ref, p in zip(fmt.image_refs(entry), paths) if p in missing_paths]
        if not bad:
            keep.append(i)
            continue
        for ref in bad:
            if ref not in missing_refs and len(missing_refs) < SHOWN_PATHS:
                missing_refs.append(ref)
            if not Path(ref).expanduser().is_absolute() and entry_roots[i] not in missing_roots:
                missing_roots.append(entry_roots[i])

    if missing_paths and on_missing == "fail":
        raise FalconError(missing_images_message(path, missing_refs, len(missing_paths), len(distinct), missing_roots))
    report = LoadReport(
        source=str(path),
        entries=len(raw),
        kept=len(keep),
        images=len(distinct),
        missing_images=len(missing_paths),
        on_missing=on_missing,
        first_missing=missing_refs,
    )
    return LoadedSource(
        path=path,
        indices=keep,
        entries=[raw[i] for i in keep],
        images=[resolved[i] for i in keep],
        report=report,
    )


class LoadedDataset(Dataset):
    """Base of every falcon dataset: remembers how its files were loaded.

    ``load_reports`` has one :class:`LoadReport` per annotation file; ``dropped`` is the
    number of entries ``on_missing=skip`` left out (stages record both in the manifest).
    """

    load_reports: list[LoadReport]

    @property
    def dropped(self) -> int:
        """Entries dropped for missing images, over all files."""
        return sum(r.dropped for r in self.load_reports)

    def load_summary(self) -> dict:
        """``{"dropped": n, "sources": [report dicts]}`` for the run manifest."""
        return {"dropped": self.dropped, "sources": [r.to_dict() for r in self.load_reports]}
