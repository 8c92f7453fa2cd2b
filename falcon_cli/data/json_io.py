"""Reading annotation JSON with errors that point at the file, line and column.

Every format (pretraining, retrieval, VQA, NLVR2, answer lists) reads its files through
:func:`read_json_list`, so a truncated download or a stray comma is reported the same
way everywhere: ``coco_train.json: line 3 column 17: invalid JSON (Expecting ',' ...)``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from falcon_cli.errors import FalconError


def json_type_name(value: Any) -> str:
    """JSON's name for a Python value's type (object, list, string, number, boolean, null)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def read_json(path: str | Path) -> Any:
    """Parse a JSON file; raise :class:`FalconError` naming the file (and line/column) on failure."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FalconError(f"{path}: file not found (check the path in dataset.yaml)") from None
    except IsADirectoryError:
        raise FalconError(f"{path}: is a directory, expected a JSON file") from None
    except UnicodeDecodeError as exc:
        raise FalconError(f"{path}: byte {exc.start}: not UTF-8 text (re-save the file as UTF-8 JSON)") from None
    except OSError as exc:
        raise FalconError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise FalconError(
            f"{path}: line {exc.lineno} column {exc.colno}: invalid JSON ({exc.msg}); fix the file or re-export it"
        ) from None


def read_json_list(path: str | Path, *, what: str = "entries") -> list:
    """Parse a JSON file whose top level must be a list; ``what`` names the items in errors."""
    data = read_json(path)
    if not isinstance(data, list):
        raise FalconError(f"{Path(path)}: top level must be a JSON list of {what}, got {json_type_name(data)}")
    return data
