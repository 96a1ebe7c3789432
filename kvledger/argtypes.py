"""Bounded argparse value types, shared by every command line of the package (the ``kvledger`` CLI and a
tool's own, such as an engine's hunt): a value outside its range is refused while the arguments are
parsed, before anything is built, and the message names the range.

A leaf module (argparse only): it stands below every floor of the house, so any room may use it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable


def grouped(n: int) -> str:
    """``n`` with thousands separators, as every range in a usage message is written."""
    return f"{n:,}"


def int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """An integer in ``low .. high`` (``high`` None: no upper bound, for seeds)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be <= {grouped(high)}, got {grouped(value)}")
        return value

    parse.__name__ = f"integer >= {low}" if high is None else f"integer in {low}..{high}"
    return parse


def seconds(text: str) -> float:
    """A positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a probability in [0, 1], got {value}")
    return value
