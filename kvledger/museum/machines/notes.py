"""``hypothesis.event`` and ``hypothesis.target`` that do nothing outside a Hypothesis test.

A hunt's repro script calls a machine's rules as plain Python; there, Hypothesis's own functions would
raise (no test context). The machines call these instead.
"""

from __future__ import annotations

from hypothesis import event as _event
from hypothesis import target as _target
from hypothesis.control import currently_in_test_context


def event(text: str) -> None:
    if currently_in_test_context():
        _event(text)


def target(value: float, label: str) -> None:
    if currently_in_test_context():
        _target(value, label=label)
