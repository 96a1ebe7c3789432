"""Output files written whole or not at all.

:func:`staged` is the one place an output file is written (an event log, a plot, a hunt's repro script):
under a temporary name in the same directory, renamed into place when the whole block has succeeded.
Ctrl-C, an error or a violation stop that raises leaves neither the file nor the temporary behind (a
cut-off event log would otherwise be mistaken for a whole run). A target that exists and is not a
regular file (``/dev/stdout``, a FIFO) is written directly: it cannot be renamed over.

It lives below every room (the museum writes repro scripts with it, the CLI its outputs), beside
:mod:`.interrupt`, whose remembered Ctrl-C it checks before publishing.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from kvledger.process import interrupt

PARTIAL = ".partial"
"""Part of every temporary name: ``.NAME.partial-PID.SUFFIX`` (the suffix kept: matplotlib reads the
image format from it)."""


def temporary_name(target: Path) -> Path:
    return target.with_name(f".{target.name}{PARTIAL}-{os.getpid()}{target.suffix}")


def _is_special(path: Path) -> bool:
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode)


def _missing_parents(path: Path) -> list[Path]:
    """The ancestors of ``path`` that do not exist yet, outermost first."""
    missing = []
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    return missing[::-1]


@contextlib.contextmanager
def staged(*targets: Path) -> Iterator[tuple[Path, ...]]:
    """Yield the paths to write instead of ``targets``; publish them all when the block ends normally.

    Every path the block wrote is renamed onto its target (a path it did not write publishes nothing).
    On any exception, Ctrl-C included, the temporaries are removed, and so are the directories this call
    created for them, and the exception goes on.
    """
    created: list[Path] = []
    paths: list[Path] = []
    try:
        for target in targets:
            if _is_special(target):
                paths.append(target)
                continue
            for parent in _missing_parents(target):
                parent.mkdir()
                created.append(parent)
            paths.append(temporary_name(target))
        yield tuple(paths)
        interrupt.check()  # interrupted, even if the interrupt was swallowed: publish nothing
    except BaseException:
        for path, target in zip(paths, targets, strict=False):
            if path != target:
                path.unlink(missing_ok=True)
        for parent in reversed(created):
            with contextlib.suppress(OSError):  # not empty: something else wrote there meanwhile
                parent.rmdir()
        raise
    for path, target in zip(paths, targets, strict=True):
        if path != target and path.exists():
            os.replace(path, target)
