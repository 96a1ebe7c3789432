"""Where the commands' output goes: consoles that never cut an ID or a path; files are written whole or not
at all by :func:`kvledger.process.staged.staged`.
"""

from __future__ import annotations

import sys
from typing import Any


def console(*, stderr: bool = False) -> Any:
    """A rich Console for tables. On a terminal it wraps at the terminal's width; anywhere else (a pipe,
    a file, a CI log) it never wraps or cuts a cell, so IDs, invariant names and paths stay whole."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=100_000, no_color=True, highlight=False)
