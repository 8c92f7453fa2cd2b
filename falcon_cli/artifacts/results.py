"""Result tables: ``results/<name>.{json,csv,md}``, one row per model or split, explicit keys, percent.

The JSON holds ``{"meta": {...}, "rows": [{...}, ...]}``: ``meta`` says what produced the numbers
(split, checkpoint, resolution, scoring and k, units), each row names what it measured in its
``model`` (or ``split``) column. All three files are written atomically and recorded in the manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from falcon_cli.artifacts.atomic import write_json, write_text

RESULTS = Path("results")
SCHEMA = "results"
SCHEMA_VERSION = 1


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    return "" if value is None else str(value)


def markdown_table(rows: Sequence[dict], columns: Sequence[str] | None = None) -> str:
    """A Markdown table of ``rows`` (floats to two decimals); ``columns`` default: every key, in first-seen order.

    A column ``X`` with ``X_lo`` and ``X_hi`` beside it (an interval) is shown as one cell, ``12.34 [10.1, 14.8]``.
    """
    columns = list(columns or dict.fromkeys(k for row in rows for k in row))
    bounded = {c for c in columns if f"{c}_lo" in columns and f"{c}_hi" in columns}
    hidden = {f"{b}_{end}" for b in bounded for end in ("lo", "hi")}
    columns = [c for c in columns if c not in hidden]

    def cell(row: dict, c: str) -> str:
        lo, hi = row.get(f"{c}_lo"), row.get(f"{c}_hi")
        if c in bounded and isinstance(lo, float) and isinstance(hi, float) and row.get(c) is not None:
            return f"{_cell(row.get(c))} [{lo:.1f}, {hi:.1f}]"
        return _cell(row.get(c))

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row, c) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def results_name(kind: str, split: str) -> str:
    """The results file of a retrieval evaluation (``retrieval``, ``near_misses``) on ``split``: the kind itself for
    the val and test splits (one evaluation split per run), with ``_pretrain`` for the pretraining pairs, which are
    scored beside them."""
    return f"{kind}_pretrain" if split == "pretrain" else kind


def write_results(run, name: str, rows: Sequence[dict], meta: dict, title: str) -> str:
    """Write ``results/<name>.json|csv|md`` into ``run`` (a RunDirectory) and return the Markdown."""
    import pandas as pd

    columns = list(dict.fromkeys(k for row in rows for k in row))
    write_json(run.path / RESULTS / f"{name}.json", {"meta": meta, "rows": list(rows)})
    write_text(
        run.path / RESULTS / f"{name}.csv",
        pd.DataFrame(list(rows), columns=columns).to_csv(index=False, float_format="%.4f"),
    )
    described = ", ".join(f"{k} {v}" for k, v in meta.items() if v is not None and not isinstance(v, (dict, list)))
    md = f"{title}\n\n{described}\n\n{markdown_table(rows, columns)}\n"
    write_text(run.path / RESULTS / f"{name}.md", md)
    for suffix in ("json", "csv", "md"):
        run.add_artifact(RESULTS / f"{name}.{suffix}", schema=f"{name}_results", schema_version=SCHEMA_VERSION)
    return md


__all__ = ["RESULTS", "markdown_table", "results_name", "write_results"]
