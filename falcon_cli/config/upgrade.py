"""``falcon recipes upgrade``: rewrite a recipe file's keys renamed in 0.3.0 to their new names, keeping its
comments, its order and its values as written.

The ``pretrain:`` block's entries are moved into the sections that hold them now (``scheduler_lr: 1e-3`` becomes
``lr: 1e-3`` under ``scheduler:``), each with the comments above it and beside it; a new section is written where
its first entry was. The result reads as the same mapping as the old file under the new names (checked before
anything is written, and written atomically).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from falcon_cli.artifacts.atomic import write_text
from falcon_cli.artifacts.renamed_keys import renamed_key, renamed_mapping
from falcon_cli.errors import FalconError

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][A-Za-z0-9_]*):(?P<rest>.*)$")


@dataclass
class _Entry:
    """One key of the ``pretrain:`` block with its lines: the comments above it, its own line, the lines below it."""

    key: str
    lines: list[str]
    target: list[str] = field(default_factory=list)  # the new path below pretrain; [] = stays where it is

    def value_is_scalar(self) -> bool:
        own = next(line for line in self.lines if _KEY.match(line) and _KEY.match(line)["key"] == self.key)
        rest = _KEY.match(own)["rest"].split(" #")[0].strip()
        return bool(rest) and not rest.startswith("{")


def _block(lines: list[str]) -> tuple[int, int] | None:
    """The ``pretrain:`` block's lines ``[start, end)`` (its entries, below the ``pretrain:`` line)."""
    for i, line in enumerate(lines):
        if line.rstrip() == "pretrain:" or re.match(r"^pretrain:\s+#", line):
            end = i + 1
            while end < len(lines) and (not lines[end].strip() or lines[end][0] in " #"):
                end += 1
            while end > i + 1 and not lines[end - 1].strip():  # (blank lines after the block stay outside it)
                end -= 1
            return i + 1, end
    return None


def _entries(body: list[str]) -> tuple[list[_Entry], int]:
    """The block's entries and their indentation."""
    indent = min((len(m["indent"]) for line in body if (m := _KEY.match(line))), default=2)
    entries: list[_Entry] = []
    pending: list[str] = []
    for line in body:
        m = _KEY.match(line)
        if m and len(m["indent"]) == indent:
            entries.append(_Entry(m["key"], [*pending, line]))
            pending = []
        elif entries and line.strip() and not line.lstrip().startswith("#"):
            entries[-1].lines.append(line)  # a nested mapping or list of the entry above
        elif line.strip().startswith("#") and len(line) - len(line.lstrip()) > indent and entries:
            entries[-1].lines.append(line)  # a comment inside the entry above
        else:
            pending.append(line)  # comments and blank lines before the next entry
    if entries and pending:
        entries[-1].lines.extend(pending)
    return entries, indent


def _keep_comment_column(old: str, new: str, shift: int) -> str:
    """``new`` (``old`` with its key renamed, to be indented by ``shift``) with its end-of-line comment in the
    column it had, so comments aligned before stay aligned."""
    m = re.match(r"^(?P<code>.*?\S)(?P<gap> +)(?P<comment>#.*)$", new)
    if m is None or "#" not in old:
        return new
    column = old.index(m["comment"], len(old) - len(m["comment"]) - 1)
    gap = max(1, column - shift - len(m["code"]))
    return f"{m['code']}{' ' * gap}{m['comment']}"


def upgrade_text(text: str, source: str) -> tuple[str, list[tuple[str, str]]]:
    """A recipe's text with its renamed keys under their new names, and the ``(old, new)`` keys it moved."""
    lines = text.splitlines()
    span = _block(lines)
    if span is None:
        return text, []
    start, end = span
    entries, indent = _entries(lines[start:end])
    moves = []
    for entry in entries:
        value = None if entry.value_is_scalar() else {}
        new = renamed_key(f"pretrain.{entry.key}", value)
        if new is not None:
            entry.target = new.split(".")[1:]
            moves.append((f"pretrain.{entry.key}", new))
    if not moves:
        return text, []
    kept = {e.key for e in entries if not e.target}
    clash = sorted(kept & {e.target[0] for e in entries if e.target and len(e.target) > 1})
    if clash:
        raise FalconError(
            f"{source}: pretrain.{clash[0]} is written both ways (old keys and a new section); move the rest by hand"
        )
    out: list[str] = []

    def emit(items: list[_Entry], depth: int) -> None:
        placed: set[str] = set()
        for entry in items:
            if len(entry.target) == depth + 1 or not entry.target:
                pad = " " * (indent * depth)
                for line in entry.lines:
                    if (m := _KEY.match(line)) and m["key"] == entry.key and len(m["indent"]) == indent:
                        name = entry.target[-1] if entry.target else entry.key
                        line = _keep_comment_column(line, f"{m['indent']}{name}:{m['rest']}", len(pad))
                    out.append(pad + line if line.strip() else line)
                continue
            section = entry.target[depth]
            if section in placed:
                continue
            placed.add(section)
            out.append(" " * (indent * (depth + 1)) + f"{section}:")
            emit([e for e in items if e.target[depth : depth + 1] == [section]], depth + 1)

    emit(entries, 0)
    new_text = "\n".join([*lines[:start], *out, *lines[end:]]) + ("\n" if text.endswith("\n") else "")
    return new_text, moves


def upgrade_file(path: Path, check: bool = False) -> list[tuple[str, str]]:
    """Rewrite ``path`` under the new keys (unless ``check``); the ``(old, new)`` keys moved. Refuses, writing
    nothing, when the rewritten file would not read as the same mapping."""
    text = path.read_text(encoding="utf-8")
    new_text, moves = upgrade_text(text, str(path))
    if not moves:
        return []
    if yaml.safe_load(new_text) != renamed_mapping(yaml.safe_load(text) or {})[0]:
        raise FalconError(
            f"{path}: cannot rewrite its keys keeping its comments (an unusual layout); move them by hand "
            "(CHANGELOG 0.3.0 lists them)"
        )
    if not check:
        write_text(path, new_text)
    return moves
