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


def figure(
    benchmark: str,
    name: str,
    unit: str,
    *,
    release: float | None = None,
    contracts_on: float | None = None,
    ratio: bool = True,
    higher_is_better: bool = True,
    target: str | None = None,
    note: str | None = None,
    **extra: object,
) -> dict[str, object]:
    """One row of ``benchmarks/run_all.py``'s table (and one of its JSON lines).

    ``on_off_ratio`` is the cost of the contracts: contracts-on time over release time, i.e.
    ``release / contracts_on`` for a rate (``higher_is_better``) and ``contracts_on / release`` for a
    duration; None when ``ratio`` is False (a figure that is not a cost, such as a memory slope) or a
    value is missing. ``extra`` adds fields (a baseline, its ratio) as they are.
    """
    row: dict[str, object] = {
        "benchmark": benchmark,
        "figure": name,
        "unit": unit,
        "release": release,
        "contracts_on": contracts_on,
        "on_off_ratio": None,
    }
    if ratio:
        row["on_off_ratio"] = (
            _ratio(release, contracts_on) if higher_is_better else _ratio(contracts_on, release)
        )
    row["target"] = target
    row["note"] = note
    row.update(extra)
    return row


_ratio = ratio
