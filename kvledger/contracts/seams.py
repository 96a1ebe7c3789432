"""The seam marker: ``@seam`` on a method (or function) of the reference that a museum exhibit replaces.

An exhibit re-enacts a historical bug by replacing one method of the reference for the duration of a
``with`` block (``kvledger/museum/exhibit.py``). Those methods are the reference's seams: renaming one,
or folding it into its caller, silently disarms the exhibit. ``@seam`` makes them visible where they are
defined, and ``tests/test_seams.py`` keeps the two lists equal: every marked method is replaced by some
exhibit, and every method an exhibit replaces is marked.

No behaviour: the decorator returns the function itself, with one attribute set on it (which
``functools.wraps`` carries over to icontract's wrappers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

SEAM_ATTR = "__kvledger_seam__"

F = TypeVar("F", bound=Callable[..., Any])


def seam(fn: F) -> F:
    """Mark ``fn`` as a seam the museum replaces (see the module doc); returns ``fn`` unchanged."""
    setattr(fn, SEAM_ATTR, True)
    return fn


def is_seam(obj: object) -> bool:
    """Whether ``obj`` (a function, possibly wrapped by icontract) carries the seam marker."""
    return getattr(obj, SEAM_ATTR, False) is True
