"""What a test may assert about a figure read from a clock: its type and its domain, never its size.

A rate or a duration measured on a shared machine depends on the load, not on the code; a test that
asserts ``rate > 0`` fails by chance when a short interval reads as 0 (issue 8). A benchmark reports
``None`` for a figure it could not measure, otherwise a finite, non-negative float.
"""

from __future__ import annotations

import math
from typing import Any


def assert_clock_figure(value: Any, what: str = "figure") -> None:
    """``value`` is None (not measurable) or a finite float >= 0."""
    if value is None:
        return
    assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{what}: {value!r} is not a number"
    assert math.isfinite(value), f"{what}: {value!r} is not finite"
    assert value >= 0, f"{what}: {value!r} is negative"
