"""The one exception type that reaches the user as a single line.

Library code raises :class:`FalconError` for anything the user can fix (a bad file, a
bad key, a missing image). The CLI prints ``error: <message>`` and exits non-zero; a
traceback is shown only with ``--debug``. Messages name the file (and key, line, column
where known), say what is wrong and how to fix it.
"""

from __future__ import annotations


class FalconError(Exception):
    """A user-facing error: one line that names what is wrong and how to fix it."""

    def __init__(self, message: str, *, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


class Refused(FalconError):
    """A command refused before it changed anything (e.g. ``--resume`` with another number of
    processes): :func:`stages.run_stages` puts the run directory's record back as it was."""
