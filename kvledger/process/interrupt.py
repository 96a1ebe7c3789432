"""Ctrl-C ends a command even when a library swallowed the ``KeyboardInterrupt`` it raised.

Python turns SIGINT into a ``KeyboardInterrupt`` wherever the main thread is, and some start-up code
does not let it through: torch initialises numpy from C++ and, when that import fails (an interrupt
raised inside numpy's extension module counts), warns and carries on. A hunt interrupted in the first
half second then ran its whole budget, or reported the half-imported module's ``AttributeError`` as a
finding. So the command's handler also remembers the signal, and the places that publish something (an
output file renamed into place, the next example of a hunt) check it first.

Where Python cannot raise at all (a garbage-collector callback, such as Hypothesis's, or a ``__del__``),
it prints the interrupt as an "Exception ignored in ..." traceback; the command's one-line report would
then come second. While a command runs, that report of our own remembered interrupt is dropped; every
other unraisable exception is reported as before.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

_seen = False


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    global _seen
    _seen = True
    raise KeyboardInterrupt


def _quiet_about_ctrl_c(previous: object) -> object:
    """An unraisable hook that drops a remembered ``KeyboardInterrupt`` (:func:`check` raises it again at
    the next place that looks) and hands anything else to ``previous``."""

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        if _seen and isinstance(unraisable.exc_value, KeyboardInterrupt):
            return
        previous(unraisable)  # type: ignore[operator]

    return hook


@contextmanager
def watching() -> Iterator[None]:
    """For the duration of a command: SIGINT raises ``KeyboardInterrupt`` as usual and is remembered. A
    process that ignores SIGINT (a shell's background job) keeps ignoring it."""
    global _seen
    _seen = False
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.default_int_handler:
        yield
        return
    signal.signal(signal.SIGINT, _on_sigint)
    previous_hook = sys.unraisablehook
    sys.unraisablehook = _quiet_about_ctrl_c(previous_hook)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.unraisablehook = previous_hook
        signal.signal(signal.SIGINT, previous)


def check() -> None:
    """Raise ``KeyboardInterrupt`` if Ctrl-C was pressed during this command, whoever caught it since."""
    if _seen:
        raise KeyboardInterrupt
