"""``metrics.jsonl``: one JSON object per line, appended and flushed as training goes; the same numbers go to the
run's other loggers (TensorBoard, wandb, MLflow: :mod:`falcon_cli.runtime.loggers`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from falcon_cli.artifacts.atomic import write_text
from falcon_cli.runtime.distributed import is_main_process
from falcon_cli.runtime.loggers import RunLoggers


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf
    return value


class MetricsLog:
    """Append-only metrics log (rank 0 writes). Lines are complete JSON objects even after a kill.

    ``loggers`` (optional): the run's other sinks; every record's numbers go to them too, and
    :meth:`histogram` / :meth:`image` reach them alone."""

    def __init__(self, path: str | Path, loggers: RunLoggers | None = None):
        self.path = Path(path)
        self.loggers = loggers

    def write(self, **record: Any) -> None:
        """Append one record, e.g. ``write(step=10, epoch=0, loss=1.2, lr=1e-4)``."""
        if not is_main_process():
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        record = {k: _plain(v) for k, v in record.items()}
        line = json.dumps(record, ensure_ascii=False)
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
        if self.loggers:
            self.loggers.scalars(record)

    def histogram(self, tag: str, values: Any, step: int) -> None:
        """A histogram for the other loggers (``metrics.jsonl`` keeps summaries: ``q_p10``, ...)."""
        if self.loggers and is_main_process():
            self.loggers.histogram(tag, values, step)

    def image(self, tag: str, path: str | Path, step: int) -> None:
        """A figure (PNG) the stage wrote, for the other loggers."""
        if self.loggers and is_main_process():
            self.loggers.image(tag, path, step)

    def close(self) -> None:
        """Close the other loggers (``metrics.jsonl`` needs nothing)."""
        if self.loggers is not None:
            self.loggers.close()

    def truncate_after(self, step: int) -> None:
        """Drop records past ``step`` (a resumed run rewrites what the killed run logged after its checkpoint), and
        start the other loggers there (TensorBoard purges its later events; wandb and MLflow continue their run)."""
        if not is_main_process():
            return
        if self.loggers:
            self.loggers.open(step)
        if not self.path.exists():
            return
        kept = [
            line
            for line in self.path.read_text(encoding="utf-8").splitlines()
            if line.strip() and json.loads(line).get("step", -1) <= step
        ]
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
