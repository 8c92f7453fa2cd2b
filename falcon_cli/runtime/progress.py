"""Progress bars: rich on rank 0 when stderr is a terminal, silent otherwise.

Every long step wraps its loop in :func:`track`. In CI, in pipes and on ranks other than 0
nothing is drawn, so logs stay clean. Training loops also call :func:`log_epoch` after each epoch,
which writes one line to the run's ``log.txt`` whether or not a bar is drawn, so a run started
without a terminal (a sweep, a cluster job) still shows how far it got.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Iterable, Iterator, TypeVar

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from falcon_cli.runtime.distributed import is_main_process

T = TypeVar("T")


def progress_enabled() -> bool:
    """Whether progress bars should be drawn: rank 0, a TTY on stderr, FALCON_PROGRESS != 0."""
    if os.environ.get("FALCON_PROGRESS", "") == "0":
        return False
    if os.environ.get("FALCON_PROGRESS", "") == "1":
        return is_main_process()
    return is_main_process() and sys.stderr.isatty()


def make_progress() -> Progress:
    """A rich Progress with the columns every falcon bar uses (description, bar, n/N, ETA)."""
    from rich.console import Console

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=False,
        disable=not progress_enabled(),
    )


_live = 0  # bars drawing now: a loop inside a tracked loop (a judge inside a training step) draws none


def track(iterable: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """Iterate over ``iterable`` with a progress bar (drawn only when :func:`progress_enabled`, and
    not inside another tracked loop: rich allows one live display at a time)."""
    global _live
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    if not progress_enabled() or _live:
        yield from iterable
        return
    _live += 1
    try:
        with make_progress() as bar:
            task = bar.add_task(description, total=total)
            for item in iterable:
                yield item
                bar.advance(task)
    finally:
        _live -= 1


def log_epoch(stage: str, epoch: int, epochs: int, **figures) -> None:
    """One ``log.txt`` line for a finished epoch (rank 0): ``pretrain epoch 3/11: steps 157, loss 2.3101, ...``.

    ``epoch`` counts from 0 as everywhere in falcon; the line says ``epoch + 1`` of ``epochs``. Floats are
    written with 4 significant digits; None values are left out.
    """
    if not is_main_process():
        return
    parts = [
        f"{name.replace('_', ' ')} {value:.4g}" if isinstance(value, float) else f"{name.replace('_', ' ')} {value}"
        for name, value in figures.items()
        if value is not None
    ]
    logging.getLogger("falcon").info("%s epoch %d/%d: %s", stage, epoch + 1, epochs, ", ".join(parts))
