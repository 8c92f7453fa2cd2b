"""Entry validation shared by every annotation format.

A format is an :class:`EntryFormat`: the keys its entries need, a check per key, how to
find the entry's image paths and what counts as a duplicate. Loaders call
:meth:`EntryFormat.raise_on_issues` (fail on the first bad entry, naming file, entry
index and key); ``falcon data check`` calls :meth:`EntryFormat.issues` and counts them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Hashable, Literal, Sequence

from falcon_cli.data.json_io import json_type_name
from falcon_cli.errors import FalconError

IssueKind = Literal["malformed", "caption", "label"]
"""``malformed``: not an object, a missing key or a wrong type; ``caption``: an empty or
non-string caption/question/sentence; ``label``: a bad NLVR2 label or VQA answer."""

Check = Callable[[Any], "str | None"]
"""A value check: returns ``None`` when the value is fine, else what is wrong (``must be ..., got ...``)."""


@dataclass(frozen=True)
class EntryIssue:
    """One problem with one entry of an annotation file."""

    index: int
    """Position of the entry in the file's top-level list (0-based)."""
    key: str | None
    """The offending key (``None`` when the entry itself is not an object)."""
    kind: IssueKind
    """Which counter of ``falcon data check`` this issue goes to."""
    detail: str
    """What is wrong, e.g. ``key 'caption' is an empty string``."""

    def describe(self) -> str:
        """``entry <index>: <detail>``."""
        return f"entry {self.index}: {self.detail}"


# ---------------------------------------------------------------- value checks


def _got(value: Any) -> str:
    if isinstance(value, str):
        return "an empty string" if not value.strip() else f"string {value[:40]!r}"
    return json_type_name(value)


def nonempty_string(value: Any) -> str | None:
    """A string with at least one non-space character."""
    if isinstance(value, str) and value.strip():
        return None
    return f"must be a non-empty string, got {_got(value)}"


def identifier(value: Any) -> str | None:
    """An id: an integer or a non-empty string."""
    if (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, str) and value.strip()):
        return None
    return f"must be an integer or a non-empty string, got {_got(value)}"


def string_or_strings(value: Any) -> str | None:
    """A non-empty string, or a non-empty list of non-empty strings (a caption or captions)."""
    if isinstance(value, list):
        if not value:
            return "must be a non-empty string or list of strings, got an empty list"
        for i, item in enumerate(value):
            if not (isinstance(item, str) and item.strip()):
                return f"item {i} must be a non-empty string, got {_got(item)}"
        return None
    if isinstance(value, str) and value.strip():
        return None
    return f"must be a non-empty string or list of strings, got {_got(value)}"


def string_pair(value: Any) -> str | None:
    """A list of exactly two non-empty strings (NLVR2's ``images``)."""
    if not isinstance(value, list) or len(value) != 2:
        got = f"a list of {len(value)}" if isinstance(value, list) else json_type_name(value)
        return f"must be a list of two image paths [left, right], got {got}"
    for i, item in enumerate(value):
        if not (isinstance(item, str) and item.strip()):
            return f"item {i} must be a non-empty string, got {_got(item)}"
    return None


def one_of(*allowed: str) -> Check:
    """A check that accepts only the given strings."""

    def check(value: Any) -> str | None:
        if isinstance(value, str) and value in allowed:
            return None
        shown = f"{value!r}" if isinstance(value, str) else json_type_name(value)
        return f"must be one of {', '.join(repr(a) for a in allowed)}, got {shown}"

    return check


def answer_value(value: Any) -> str | None:
    """A VQA answer: a string or a non-empty list of strings."""
    if isinstance(value, str):
        return None
    if isinstance(value, list) and value:
        for i, item in enumerate(value):
            if not isinstance(item, str):
                return f"item {i} must be a string, got {json_type_name(item)}"
        return None
    got = "an empty list" if isinstance(value, list) else json_type_name(value)
    return f"must be a string or a non-empty list of strings, got {got}"


# ---------------------------------------------------------------- formats


@dataclass(frozen=True)
class Field:
    """One key of an entry: its check, whether it is required, and which counter a failure goes to."""

    key: str
    check: Check
    required: bool = True
    kind: IssueKind = "malformed"


@dataclass(frozen=True)
class EntryFormat:
    """What the entries of one annotation format look like."""

    name: str
    """Short name used in reports (``pretrain``, ``retrieval-train``, ...)."""
    fields: tuple[Field, ...]
    """The keys an entry has; unknown keys are allowed and kept."""
    image_keys: tuple[str, ...] = ("image",)
    """Keys holding image paths (a string or a list of strings)."""
    duplicate_key: Callable[[dict], Hashable | None] = field(default=lambda entry: None)
    """What makes two entries duplicates (``None``: the entry takes no part in the check)."""
    duplicate_label: str = ""
    """How duplicates are named in reports (``question_id values``, ...)."""

    @property
    def required_keys(self) -> list[str]:
        """Keys every entry must have."""
        return [f.key for f in self.fields if f.required]

    def entry_issues(self, entry: Any, index: int) -> list[EntryIssue]:
        """Every problem with one entry (empty when it is fine)."""
        if not isinstance(entry, dict):
            keys = ", ".join(self.required_keys)
            detail = f"must be a JSON object with keys {keys}, got {json_type_name(entry)}"
            return [EntryIssue(index, None, "malformed", detail)]
        issues = []
        for f in self.fields:
            if f.key not in entry:
                if f.required:
                    issues.append(EntryIssue(index, f.key, "malformed", f"missing required key '{f.key}'"))
                continue
            problem = f.check(entry[f.key])
            if problem is not None:
                issues.append(EntryIssue(index, f.key, f.kind, f"key '{f.key}' {problem}"))
        return issues

    def issues(self, entries: Sequence[Any]) -> list[EntryIssue]:
        """Every problem with every entry of a file, in file order."""
        return [issue for i, entry in enumerate(entries) for issue in self.entry_issues(entry, i)]

    def image_refs(self, entry: dict) -> list[str]:
        """The image paths an entry references, as written in the file."""
        refs: list[str] = []
        for key in self.image_keys:
            value = entry.get(key)
            refs.extend(value if isinstance(value, list) else [value])
        return refs

    def raise_on_issues(self, path: str | Path, entries: Sequence[Any]) -> None:
        """Raise one :class:`FalconError` for the first bad entry (naming file, index and key)."""
        for i, entry in enumerate(entries):
            found = self.entry_issues(entry, i)
            if found:
                more = sum(len(self.entry_issues(e, j)) for j, e in enumerate(entries[i + 1 :], start=i + 1))
                more += len(found) - 1
                tail = f" ({more:,} more problems in this file; `falcon data check` lists them)" if more else ""
                raise FalconError(f"{Path(path)}: {found[0].describe()}; fix or remove the entry{tail}")
