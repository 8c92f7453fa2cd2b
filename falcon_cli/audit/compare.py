"""Several audited runs side by side: one table and one figure from their ``audit/summary.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd

from falcon_cli.artifacts.atomic import atomic_dir, write_text
from falcon_cli.audit.report import markdown_table
from falcon_cli.errors import FalconError
from falcon_cli.reporting.audit_figures import fn_rate_comparison

SUMMARY = Path("audit") / "summary.json"


def read_summary(run_dir: str | Path) -> dict:
    """A run's ``audit/summary.json`` (one-line error when the run was not audited)."""
    path = Path(run_dir) / SUMMARY
    if not path.exists():
        raise FalconError(f"{path}: not found; audit the run first (falcon audit-false-negatives {run_dir})")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise FalconError(f"{path}: line {exc.lineno}: invalid JSON ({exc.msg}); audit the run again") from None


def run_names(run_dirs: Sequence[str | Path]) -> list[str]:
    """Short names for the runs: the directory names, or the paths where names repeat."""
    names = [Path(d).name for d in run_dirs]
    return names if len(set(names)) == len(names) else [str(d) for d in run_dirs]


def read_summaries(run_dirs: Sequence[str | Path]) -> dict[str, dict]:
    """Every run's ``audit/summary.json``, by the run's short name (:func:`run_names`)."""
    return {name: read_summary(run_dir) for name, run_dir in zip(run_names(run_dirs), run_dirs)}


def comparison_table(summaries: Mapping[str, dict]) -> pd.DataFrame:
    """One row per run and kind of negative: ``run``, ``judge``, ``kind``, ``negatives``,
    ``false_negatives``, ``rate`` and, where the data has an oracle, ``oracle_rate``
    (``summaries`` from :func:`read_summaries`)."""
    table = pd.DataFrame(
        [
            {"run": name, "judge": summary["judge"], **row}
            for name, summary in summaries.items()
            for row in summary["overall"]
        ]
    )
    columns = ["run", "judge", "kind", "negatives", "false_negatives", "rate"] + (
        ["oracle_false_negatives", "oracle_rate"] if "oracle_rate" in table.columns else []
    )
    return table[columns]


def write_comparison(run_dirs: Sequence[str | Path], out_dir: str | Path) -> pd.DataFrame:
    """Write ``comparison.md``, ``comparison.csv`` and ``fn_rate_comparison.png`` (FN rate per
    training-step window, one line per run) into ``out_dir`` (replaced whole); returns the table."""
    summaries = read_summaries(run_dirs)
    table = comparison_table(summaries)
    with atomic_dir(out_dir) as out:
        write_text(out / "comparison.csv", table.to_csv(index=False))
        write_text(
            out / "comparison.md",
            "# False negatives of the used negatives, per run\n\n"
            + "\n".join(f"- {name}: {d}" for name, d in zip(summaries, run_dirs))
            + "\n\n"
            + markdown_table(table, percent=("rate", "oracle_rate")),
        )
        fn_rate_comparison(
            {name: pd.DataFrame(s["by_window"]) for name, s in summaries.items()}, out / "fn_rate_comparison.png"
        )
    return table


__all__ = ["read_summary", "read_summaries", "run_names", "comparison_table", "write_comparison"]
