"""``kvledger.contracts.icontract_fast``: icontract's conditions evaluated by a leaner loop, same verdicts.

Each case runs the same calls with the fast loop installed and with icontract's own loop, and compares
what happens: the result, or the exception type and its full message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import icontract._checkers as checkers
import numpy as np
import pytest

from kvledger.contracts import icontract_fast, switch
from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.switch import ensure, require, snapshot

pytestmark = pytest.mark.skipif(not switch.ENABLED, reason="icontract decorators are off")


class Box:
    def __init__(self) -> None:
        self.items: list[int] = []

    def __repr__(self) -> str:
        return f"Box({self.items})"

    @require(lambda x: x >= 0, "x is a count")
    @require(lambda self, x: x < 100 or not self.items)
    @snapshot(lambda self: len(self.items), name="n")
    @ensure(lambda self, OLD: len(self.items) == OLD.n + 1, "one item more")
    @ensure(lambda self, x, result: result == x * 2)
    def put(self, x: int, twice: bool = True) -> int:
        self.items.append(x)
        return x * 2 if twice else x

    @ensure(lambda result: np.bool_(result > 0))  # a numpy truth value: icontract's own loop judges it
    def positive(self, value: int) -> int:
        return value

    @ensure(lambda result: result)  # a truthy non-bool: icontract's own loop judges it
    def truthy(self, value: Any) -> Any:
        return value


def _outcome(call: Callable[[], object]) -> tuple[str, str]:
    try:
        return "ok", repr(call())
    except Exception as exc:  # the comparison is the point
        return type(exc).__name__, str(exc)


CALLS: dict[str, Callable[[Box], object]] = {
    "passes": lambda b: b.put(3),
    "precondition fails": lambda b: b.put(-1),
    "second precondition fails": lambda b: (b.put(1), b.put(200)),
    "postcondition fails": lambda b: b.put(3, twice=False),
    "numpy truth holds": lambda b: b.positive(2),
    "numpy truth fails": lambda b: b.positive(-2),
    "truthy object holds": lambda b: b.truthy([1]),
    "falsy object fails": lambda b: b.truthy([]),
    "keyword arguments": lambda b: b.put(x=4, twice=True),
}


@pytest.mark.parametrize("case", sorted(CALLS))
def test_fast_loop_gives_icontracts_verdicts(case: str) -> None:
    assert icontract_fast.installed(), "switch.py installs the fast loop with contracts on"
    fast = _outcome(lambda: CALLS[case](Box()))
    icontract_fast.uninstall()
    try:
        slow = _outcome(lambda: CALLS[case](Box()))
    finally:
        assert icontract_fast.install()
    assert fast == slow
    if "fails" in case:
        assert fast[0] == ContractViolation.__name__


def test_install_leaves_replaced_functions_alone() -> None:
    """CrossHair turns icontract off by replacing these functions; the fast loop must not undo that."""
    icontract_fast.uninstall()
    original = checkers._assert_postconditions
    checkers._assert_postconditions = lambda *a, **k: None  # as CrossHair does
    try:
        assert icontract_fast.install() is False
        assert not icontract_fast.installed()
    finally:
        checkers._assert_postconditions = original
        assert icontract_fast.install()
