"""Derived figures for the benchmarks' JSON: rates and ratios that never divide by a zero clock reading.

A figure computed from a clock is a property of the machine at that moment, not of the code: on a
loaded machine a short interval can read as 0, and a rate rounded to two decimals can read as 0.0.
The benchmarks therefore report raw, unrounded floats, and ``None`` for a figure whose denominator was
not positive (nothing measurable), instead of crashing or printing ``Infinity``.
"""

from __future__ import annotations


def per_second(count: float, seconds: float) -> float | None:
    """``count / seconds``, or None when the interval did not register (``seconds <= 0``)."""
    return count / seconds if seconds > 0 else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, or None when either is missing or the denominator is not positive."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator
