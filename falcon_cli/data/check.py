"""``falcon data check``: report every problem of a dataset spec's files without raising.

:func:`check_dataset` reads each file the spec names, counts malformed entries, empty or
non-string captions, bad labels, duplicates, and images found / missing / unreadable
(each distinct image probed once, over all files, with a progress bar). A missing file
or malformed JSON becomes a problem of that source, never an exception.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.markup import escape

from falcon_cli.data.images import ImageStatus, resolve_image_path, scan_images
from falcon_cli.data.json_io import read_json_list
from falcon_cli.data.loading import SHOWN_PATHS, missing_images_message, root_function
from falcon_cli.data.schema import EntryIssue, nonempty_string
from falcon_cli.data.shards import index_path, load_index, shard_records
from falcon_cli.data.sources import SourceRef, spec_file, spec_sources
from falcon_cli.data.spec import DatasetSpec
from falcon_cli.errors import FalconError


@dataclass
class SourceReport:
    """What ``falcon data check`` found in one annotation file."""

    label: str
    """``section/split`` (``[i]`` when a split has several files)."""
    path: str
    """The file."""
    format: str
    """Its entry format (``pretrain``, ``retrieval-train``, ``retrieval-eval``, ``vqa``, ``nlvr2``, ``answer_list``)."""
    error: str | None = None
    """A file-level problem (missing file, malformed JSON, wrong top-level type); counts are 0 then."""
    entries: int = 0
    """Entries in the file."""
    malformed: int = 0
    """Entries that are not objects, miss a required key or have a wrong type (captions and labels aside)."""
    empty_captions: int = 0
    """Entries with an empty or non-string caption (question for VQA, sentence for NLVR2)."""
    bad_labels: int = 0
    """Entries with a bad NLVR2 label or a VQA answer of the wrong type."""
    duplicates: int = 0
    """Entries repeating an earlier entry's key (see ``duplicate_label``)."""
    duplicate_label: str = ""
    """What counts as a duplicate in this format."""
    images: int = 0
    """Distinct image files referenced."""
    images_found: int = 0
    """Referenced images that exist (and decode, when images are verified)."""
    images_missing: int = 0
    """Referenced images that do not exist."""
    entries_missing_images: int = 0
    """Entries referencing a missing image (what ``on_missing=skip`` would drop)."""
    images_unreadable: int | None = 0
    """Images that exist but cannot be decoded (``None`` when images were not verified)."""
    first_missing: list[str] = field(default_factory=list)
    """The first few missing images, as written in the file."""
    first_unreadable: list[str] = field(default_factory=list)
    """The first few unreadable images, as written in the file."""
    problems: list[str] = field(default_factory=list)
    """One line per kind of problem (the file fails to load because of it)."""
    warnings: list[str] = field(default_factory=list)
    """One line per kind of oddity that does not stop loading (duplicates; missing images under ``on_missing=skip``)."""

    def to_dict(self) -> dict:
        """A JSON-ready dict of every field."""
        return asdict(self)


@dataclass
class DatasetReport:
    """What ``falcon data check`` found in every file of a dataset spec."""

    name: str
    """The spec's ``name``."""
    spec: str
    """The spec file."""
    verify_images: bool
    """Whether images were decoded (PIL ``verify()`` and a full ``load()``) or only looked for."""
    sources: list[SourceReport] = field(default_factory=list)
    """One report per annotation file, in spec order."""
    spec_problems: list[str] = field(default_factory=list)
    """Problems of the spec itself (e.g. it names no files)."""

    @property
    def problems(self) -> list[str]:
        """Every problem, one line each, naming its file."""
        return self.spec_problems + [p for s in self.sources for p in s.problems]

    @property
    def warnings(self) -> list[str]:
        """Every warning (duplicates, skipped missing images), one line each, naming its file."""
        return [w for s in self.sources for w in s.warnings]

    @property
    def ok(self) -> bool:
        """True when no problem was found (warnings allowed)."""
        return not self.problems

    def to_dict(self) -> dict:
        """A JSON-ready dict: name, spec, verify_images, ok, problems, warnings, sources."""
        return {
            "name": self.name,
            "spec": self.spec,
            "verify_images": self.verify_images,
            "ok": self.ok,
            "problems": self.problems,
            "warnings": self.warnings,
            "sources": [s.to_dict() for s in self.sources],
        }

    def render(self, console: Any) -> None:
        """Print a rich table (one row per file), then problems and warnings, to ``console``."""
        from rich.table import Table

        # Compact headers: the table must fit an 80-column terminal and a CI log.
        table = Table(title=escape(f"dataset {self.name} ({self.spec})"), box=None, header_style="bold", pad_edge=False)
        for column in (
            "source",
            "file",
            "entries",
            "images",
            "missing",
            "unread.",
            "empty cap.",
            "bad label",
            "dup.",
            "malf.",
        ):
            table.add_column(column, justify="left" if column in ("source", "file") else "right")
        for s in self.sources:
            if s.error is not None:
                table.add_row(escape(s.label), escape(Path(s.path).name), "[red]unreadable file[/red]", *[""] * 7)
                continue
            unreadable = "-" if s.images_unreadable is None else f"{s.images_unreadable:,}"
            table.add_row(
                escape(s.label),
                escape(Path(s.path).name),
                f"{s.entries:,}",
                f"{s.images:,}",
                _flag(s.images_missing),
                _flag(s.images_unreadable or 0, unreadable),
                _flag(s.empty_captions),
                _flag(s.bad_labels),
                _flag(s.duplicates, warn=True),
                _flag(s.malformed),
            )
        console.print(table)
        for line in self.problems:
            console.print(f"[red]problem:[/red] {escape(line)}", markup=True, highlight=False)
        for line in self.warnings:
            console.print(f"[yellow]warning:[/yellow] {escape(line)}", markup=True, highlight=False)
        verdict = "[green]ok[/green]" if self.ok else f"[red]{len(self.problems)} problem(s)[/red]"
        console.print(f"{escape(self.name)}: {verdict}" + ("" if self.verify_images else " (images not decoded)"))


def _flag(count: int, text: str | None = None, warn: bool = False) -> str:
    text = f"{count:,}" if text is None else text
    if not count:
        return text
    return f"[yellow]{text}[/yellow]" if warn else f"[red]{text}[/red]"


# ---------------------------------------------------------------- per-file checks


@dataclass
class _Pending:
    """A file whose entries are checked and whose images wait for the global scan."""

    report: SourceReport
    refs: list[tuple[int, str, Path, Path]]
    """(entry index, path as written, resolved path, root) for each image reference."""


def _first(issues: list[EntryIssue]) -> str:
    return issues[0].describe()


def _entries(count: int) -> str:
    """``1 entry`` / ``3 entries``."""
    return f"{count:,} {'entry' if count == 1 else 'entries'}"


def _check_entries(ref: SourceRef, entries: list, report: SourceReport) -> list[tuple[int, str, Path, Path]]:
    fmt = ref.fmt
    assert fmt is not None
    report.duplicate_label = fmt.duplicate_label
    root_for = root_function(ref.root)
    by_kind: dict[str, list[EntryIssue]] = {"malformed": [], "caption": [], "label": []}
    counts: Counter = Counter()
    refs: list[tuple[int, str, Path, Path]] = []
    seen: dict[Any, int] = {}
    first_duplicate: tuple[int, Any] | None = None
    image_keys = set(fmt.image_keys)
    for index, entry in enumerate(entries):
        issues = fmt.entry_issues(entry, index)
        for kind in {i.kind for i in issues}:
            counts[kind] += 1
            by_kind[kind].append(next(i for i in issues if i.kind == kind))
        if not isinstance(entry, dict):
            continue
        if not any(i.key in image_keys for i in issues):
            root = root_for(entry)
            refs.extend((index, r, resolve_image_path(r, root), root) for r in fmt.image_refs(entry))
        try:
            key = fmt.duplicate_key(entry)
            if key is not None:
                if key in seen:
                    report.duplicates += 1
                    if first_duplicate is None:
                        first_duplicate = (index, key)
                else:
                    seen[key] = index
        except TypeError:  # unhashable key: the entry is malformed and already counted
            pass
    report.malformed, report.empty_captions, report.bad_labels = counts["malformed"], counts["caption"], counts["label"]
    path = ref.path
    if report.malformed:
        first = _first(by_kind["malformed"])
        report.problems.append(f"{path}: {_entries(report.malformed)} malformed (first: {first})")
    if report.empty_captions:
        report.problems.append(
            f"{path}: {_entries(report.empty_captions)} with an empty or non-string caption "
            f"(first: {_first(by_kind['caption'])})"
        )
    if report.bad_labels:
        first = _first(by_kind["label"])
        report.problems.append(f"{path}: {_entries(report.bad_labels)} with a bad label or answer (first: {first})")
    if first_duplicate is not None:
        index, key = first_duplicate
        report.warnings.append(
            f"{path}: {report.duplicates:,} duplicate {fmt.duplicate_label} "
            f"(first: entry {index} repeats entry {seen[key]}: {key!r})"
        )
    return refs


def _check_answer_list(ref: SourceRef, entries: list, report: SourceReport) -> None:
    bad = [i for i, answer in enumerate(entries) if nonempty_string(answer) is not None]
    report.malformed = len(bad)
    if bad:
        report.problems.append(
            f"{ref.path}: {_entries(len(bad))} not a non-empty string (first: entry {bad[0]}: {entries[bad[0]]!r})"
        )
    counts = Counter(a for a in entries if isinstance(a, str))
    report.duplicates = sum(c - 1 for c in counts.values() if c > 1)
    report.duplicate_label = "answers"
    if report.duplicates:
        first = next(a for a in entries if isinstance(a, str) and counts[a] > 1)
        report.warnings.append(f"{ref.path}: {report.duplicates:,} duplicate answers (first: {first!r})")


def _read_source(ref: SourceRef) -> _Pending:
    fmt_name = ref.fmt.name if ref.fmt is not None else "answer_list"
    report = SourceReport(label=ref.label, path=str(ref.path), format=fmt_name)
    try:
        entries = read_json_list(ref.path, what="answers" if ref.fmt is None else f"{fmt_name} entries")
    except FalconError as exc:
        report.error = str(exc)
        report.problems.append(str(exc))
        return _Pending(report, [])
    report.entries = len(entries)
    if ref.fmt is None:
        _check_answer_list(ref, entries, report)
        return _Pending(report, [])
    return _Pending(report, _check_entries(ref, entries, report))


def _count_images(pending: _Pending, status: dict[Path, ImageStatus], verified: bool, on_missing: str) -> None:
    report = pending.report
    distinct: dict[Path, tuple[str, Path]] = {}
    for _, written, resolved, root in pending.refs:
        distinct.setdefault(resolved, (written, root))
    report.entries_missing_images = len({i for i, _, p, _ in pending.refs if status[p] is ImageStatus.MISSING})
    report.images = len(distinct)
    missing = [p for p in distinct if status[p] is ImageStatus.MISSING]
    unreadable = [p for p in distinct if status[p] is ImageStatus.UNREADABLE]
    report.images_missing = len(missing)
    report.images_unreadable = len(unreadable) if verified else None
    report.images_found = report.images - len(missing) - len(unreadable)
    report.first_missing = [distinct[p][0] for p in missing[:SHOWN_PATHS]]
    report.first_unreadable = [distinct[p][0] for p in unreadable[:SHOWN_PATHS]]
    path = Path(report.path)
    if missing:
        roots: list[Path] = []
        for p in missing:
            written, root = distinct[p]
            if not Path(written).expanduser().is_absolute() and root not in roots:
                roots.append(root)
        counts = (path, report.first_missing, len(missing), len(distinct), roots)
        if on_missing == "skip":
            hint = f"on_missing=skip drops the {_entries(report.entries_missing_images)} that use them"
            report.warnings.append(missing_images_message(*counts, hint=hint))
        else:
            report.problems.append(missing_images_message(*counts))
    if unreadable:
        report.problems.append(
            f"{path}: {len(unreadable):,} of {len(distinct):,} images cannot be decoded "
            f"(first: {', '.join(report.first_unreadable)}); re-download or remove them"
        )


def check_dataset(spec: DatasetSpec, *, verify_images: bool = True) -> DatasetReport:
    """Check every file a spec names and return a :class:`DatasetReport`; never raises on data problems.

    Missing images are problems under ``spec.on_missing == "fail"`` and warnings (with the
    number of entries a load would drop) under ``"skip"``; unreadable images are always
    problems, since training would stop on them.

    With ``verify_images`` each distinct image is verified and fully decoded by PIL (slow on
    large sets); without it images are only looked for.
    """
    report = DatasetReport(name=spec.name, spec=str(spec_file(spec)), verify_images=verify_images)
    refs = spec_sources(spec)
    if not refs and not spec.pretrain_shards:
        report.spec_problems.append(
            f"{spec_file(spec)}: names no annotation files; add pretrain, retrieval, vqa or nlvr2 files"
        )
    pending = [_read_source(ref) for ref in refs]
    all_paths = [resolved for p in pending for _, _, resolved, _ in p.refs]
    distinct = len(set(all_paths))
    status = scan_images(all_paths, verify=verify_images, description=f"checking {distinct:,} images")
    if spec.pretrain_shards:
        report.sources.append(_check_shards(spec, verify_images))
    for p in pending:
        _count_images(p, status, verify_images, spec.on_missing)
        report.sources.append(p.report)
    return report


def _check_shards(spec: DatasetSpec, verify: bool) -> SourceReport:
    """The shards of ``pretrain_shards`` through their index: the index matches them, every key has an image and a
    caption, and (with ``verify``) every image decodes from its byte range."""
    report = SourceReport(label="pretrain/shards", path=str(index_path(spec)), format="webdataset")
    try:
        index = load_index(spec)
    except FalconError as exc:
        report.error = str(exc)
        report.problems.append(str(exc))
        return report
    report.entries = index.keys
    if index.incomplete_count:
        line = (
            f"{index.path}: {index.incomplete_count:,} of {index.keys:,} keys have no image or caption "
            f"(first: {', '.join(index.incomplete)})"
        )
        if spec.on_missing == "skip":
            report.warnings.append(f"{line}; on_missing=skip leaves them out")
        else:
            report.problems.append(f"{line}; fix the shards and re-index, or set on_missing: skip")
    records, _ = shard_records(spec, on_missing="skip", index=index)
    images = [r.image for r in records]
    status = scan_images(images, verify=verify, description=f"checking {len(images):,} shard images")
    missing = [str(i) for i in images if status[i] is ImageStatus.MISSING]
    unreadable = [str(i) for i in images if status[i] is ImageStatus.UNREADABLE]
    report.images, report.images_missing = len(images), len(missing)
    report.images_unreadable = len(unreadable) if verify else None
    report.images_found = len(images) - len(missing) - len(unreadable)
    report.first_missing, report.first_unreadable = missing[:SHOWN_PATHS], unreadable[:SHOWN_PATHS]
    if missing:
        report.problems.append(
            f"{index.path}: {len(missing):,} images lie past the end of their shard (first: "
            f"{', '.join(report.first_missing)}); the shards are truncated: re-download them "
            f"and run `falcon data index {spec.base_dir}`"
        )
    if unreadable:
        report.problems.append(
            f"{index.path}: {len(unreadable):,} of {len(images):,} images cannot be decoded "
            f"(first: {', '.join(report.first_unreadable)}); re-download or remove them"
        )
    return report
