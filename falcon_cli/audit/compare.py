"""Several audited runs side by side: one table and one figure from their ``audit/summary.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import pandas as pd

from falcon_cli.artifacts.atomic import atomic_dir, write_text
from falcon_cli.errors import FalconError

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


def comparison_table(run_dirs: Sequence[str | Path]) -> pd.DataFrame:
    """One row per run and kind of negative: ``run``, ``judge``, ``kind``, ``negatives``,
    ``false_negatives``, ``rate`` and, where the data has an oracle, ``oracle_rate``."""
    rows = []
    for name, run_dir in zip(run_names(run_dirs), run_dirs):
        summary = read_summary(run_dir)
        for row in summary["overall"]:
            rows.append({"run": name, "judge": summary["judge"], **row})
    table = pd.DataFrame(rows)
    columns = ["run", "judge", "kind", "negatives", "false_negatives", "rate"] + \
        (["oracle_false_negatives", "oracle_rate"] if "oracle_rate" in table.columns else [])
    return table[columns]


def write_comparison(run_dirs: Sequence[str | Path], out_dir: str | Path) -> pd.DataFrame:
    """Write ``comparison.md``, ``comparison.csv`` and ``fn_rate_comparison.png`` (FN rate per
    training-step window, one line per run) into ``out_dir`` (replaced whole); returns the table."""
    from falcon_cli.audit.report import markdown_table
    from falcon_cli.reporting.audit_figures import fn_rate_comparison

    table = comparison_table(run_dirs)
    windows = {name: pd.DataFrame(read_summary(d)["by_window"]) for name, d in zip(run_names(run_dirs), run_dirs)}
    with atomic_dir(out_dir) as out:
        write_text(out / "comparison.csv", table.to_csv(index=False))
        write_text(out / "comparison.md", "# False negatives of the used negatives, per run\n\n"
                   + "\n".join(f"- {name}: {d}" for name, d in zip(run_names(run_dirs), run_dirs)) + "\n\n"
                   + markdown_table(table, percent=("rate", "oracle_rate")))
        fn_rate_comparison(windows, out / "fn_rate_comparison.png")
    return table


__all__ = ["read_summary", "run_names", "comparison_table", "write_comparison"]
