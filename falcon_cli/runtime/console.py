"""The rich consoles every command prints through.

On a terminal rich measures the width itself; in pipes, CI logs and files it would fall
back to 80 columns and truncate tables, so there a wide fixed width is used instead.
"""

from __future__ import annotations

import sys

from rich.console import Console

PIPE_WIDTH = 160
"""Line width when output is not a terminal (CI logs wrap nothing; tables stay whole)."""


def make_console(stderr: bool = False) -> Console:
    """A console for stdout (results) or stderr (progress, reports, errors)."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, highlight=False, soft_wrap=True, width=None if stream.isatty() else PIPE_WIDTH)
