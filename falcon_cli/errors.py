"""The one exception type that reaches the user as a single line.

Library code raises :class:`FalconError` for anything the user can fix (a bad file, a
bad key, a missing image). The CLI prints ``error: <message>`` and exits non-zero; a
traceback is shown only with ``--debug``. Messages name the file (and key, line, column
where known), say what is wrong and how to fix it.
"""

from __future__ import annotations

import errno


class FalconError(Exception):
    """A user-facing error: one line that names what is wrong and how to fix it."""

    label = "error"
    """How the CLI labels the line (``error: ...``)."""

    def __init__(self, message: str, *, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


REQUEUE_EXIT = 75
"""Exit status of a preempted run (``EX_TEMPFAIL`` of sysexits.h: a temporary failure, run it again)."""


class Preempted(FalconError):
    """A run stopped on a preemption signal after checkpointing the step it was in (or, stopped at once, with its
    previous checkpoint whole): ``--resume`` continues it. Exit status :data:`REQUEUE_EXIT`; the run's record
    says ``preempted``."""

    label = "preempted"

    def __init__(self, message: str):
        super().__init__(message, exit_code=REQUEUE_EXIT)


class Refused(FalconError):
    """A command refused before it changed anything (e.g. ``--resume`` with another number of
    processes): :func:`stages.run_stages` puts the run directory's record back as it was."""


_STORAGE = {
    errno.ENOSPC: (
        "no space left on device",
        "free space there (or use a --run-dir on another disk) and run the "
        "command again, with --resume where it trains: writes are atomic, so what was finished is intact",
    ),
    errno.EDQUOT: (
        "disk quota exceeded",
        "free space within your quota (or use a --run-dir elsewhere) and run the "
        "command again, with --resume where it trains: writes are atomic, so what was finished is intact",
    ),
    errno.EROFS: ("read-only file system", "use a --run-dir on a writable disk"),
    errno.EACCES: ("permission denied", "use a --run-dir you can write to, or fix its permissions"),
    errno.EPERM: ("operation not permitted", "use a --run-dir you can write to, or fix its permissions"),
}
"""The errnos of a write that failed for want of space or permission: (what, what to do)."""

_STORAGE_TEXT = {
    "no space left on device": errno.ENOSPC,
    "os error 28": errno.ENOSPC,
    "disk quota exceeded": errno.EDQUOT,
    "read-only file system": errno.EROFS,
    "os error 30": errno.EROFS,
}
"""How libraries that do not raise ``OSError`` (safetensors, torch.save, h5py) word the same failures."""


def causes(exc: BaseException):
    """``exc`` and every exception in its chain of causes and contexts, each once."""
    seen, todo = set(), [exc]
    while todo:
        err = todo.pop()
        if err is None or id(err) in seen:
            continue
        seen.add(id(err))
        yield err
        todo += [err.__cause__, err.__context__]


def storage_error(exc: BaseException, path: object = None) -> FalconError | None:
    """The one-line error for a write that failed for want of space or permission (anywhere in
    ``exc``'s chain of causes), naming ``path`` (else the file the OS named); None for anything else."""
    for err in causes(exc):
        code = (
            err.errno
            if isinstance(err, OSError) and err.errno in _STORAGE
            else next((c for text, c in _STORAGE_TEXT.items() if text in str(err).lower()), None)
        )
        if code is not None:
            where = path or (err.filename if isinstance(err, OSError) and err.filename else "a file of the run")
            what, advice = _STORAGE[code]
            problem = FalconError(f"{where}: {what}; {advice}")
            problem.storage = err  # (an outer writer re-words it with its own target)
            return problem
    return None
