"""``metrics.jsonl``: one JSON object per line, appended and flushed as training goes."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from falcon_cli.artifacts.atomic import write_text
from falcon_cli.runtime.distributed import is_main_process


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf
    return value


class MetricsLog:
    """Append-only metrics log (rank 0 writes). Lines are complete JSON objects even after a kill."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def write(self, **record: Any) -> None:
        """Append one record, e.g. ``write(step=10, epoch=0, loss=1.2, lr=1e-4)``."""
        if not is_main_process():
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({k: _plain(v) for k, v in record.items()}, ensure_ascii=False)
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()

    def truncate_after(self, step: int) -> None:
        """Drop records past ``step`` (a resumed run rewrites what the killed run logged after its checkpoint)."""
        if not is_main_process() or not self.path.exists():
            return
        kept = [line for line in self.path.read_text(encoding="utf-8").splitlines()
                if line.strip() and json.loads(line).get("step", -1) <= step]
        write_text(self.path, "".join(f"{line}\n" for line in kept))


def read_metrics(path: str | Path) -> list[dict]:
    """All records of a ``metrics.jsonl`` (a torn last line from a kill is ignored)."""
    records = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
