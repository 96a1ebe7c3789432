"""``kvledger.contracts.icontract_fast``: icontract's conditions evaluated by a leaner loop and called
through leaner wrappers, same verdicts.

Each case runs the same calls with the fast loop (and, for the wrappers, a class decorated while they are
installed) and with icontract's own, and compares what happens: the result, or the exception type and its
full message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import icontract._checkers as checkers
import numpy as np
import pytest

from kvledger.contracts import icontract_fast, switch
from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.switch import ensure, invariant, require, snapshot

pytestmark = pytest.mark.skipif(not switch.ENABLED, reason="icontract decorators are off")


def _shelf_class() -> type:
    """A class with an invariant and checked methods, decorated by whatever wrappers are installed now."""

    @invariant(lambda self: len(self.items) < 4, "at most three items")
    class Shelf:
        def __init__(self) -> None:
            self.items: list[int] = []

        def __repr__(self) -> str:
            return f"Shelf({self.items})"

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

        def put_unchecked(self, x: int) -> None:  # the invariant only
            self.items.append(x)

        def count(self, *extra: int) -> int:  # *args: icontract's own invariant wrapper
            return len(self.items) + len(extra)

        @require(lambda self, x, limit: x <= limit, "under the limit")
        @ensure(lambda self, result, scale: result == len(self.items) * scale)
        def put_scaled(self, x: int, *, limit: int = 10, scale: int = 1) -> int:  # keyword-only parameters
            self.items.append(x)
            return len(self.items) * scale

    return Shelf


Box = _shelf_class()
"""Decorated at import, as kvledger's classes are: the fast wrappers and loop when contracts are on."""


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


def _wrapper_modules(method: Any) -> list[str]:
    """The file of each wrapper around ``method``, outermost first (the invariant's, then the checker's)."""
    out = []
    while hasattr(method, "__wrapped__"):
        out.append(method.__code__.co_filename.rsplit("/", 1)[-1])
        method = method.__wrapped__
    return out


SHELF_CALLS: dict[str, Callable[[Any], object]] = {
    "passes": lambda s: s.put(3),
    "default argument filled": lambda s: s.put(3, True),
    "keyword arguments": lambda s: s.put(x=4, twice=False),
    "self by keyword": lambda s: type(s).put(self=s, x=2),
    "precondition fails": lambda s: s.put(-1),
    "postcondition fails": lambda s: s.put(3, twice=False),
    "invariant fails after the call": lambda s: [s.put_unchecked(i) for i in range(5)],
    "invariant fails before the call": lambda s: (s.items.extend(range(6)), s.put(1)),
    "variadic method": lambda s: (s.put(1), s.count(7, 8)),
    "missing argument": lambda s: s.put(),
    "keyword-only defaults": lambda s: s.put_scaled(3),
    "keyword-only given": lambda s: s.put_scaled(3, limit=5, scale=2),
    "keyword-only precondition fails": lambda s: s.put_scaled(30, limit=5),
    "keyword-only passed by position": lambda s: s.put_scaled(3, 5),
}


@pytest.mark.parametrize("case", sorted(SHELF_CALLS))
def test_fast_wrappers_give_icontracts_verdicts(case: str) -> None:
    """The leaner wrappers (pre/postconditions and invariants) against icontract's own, built the same way."""
    fast_class = _shelf_class()
    assert _wrapper_modules(fast_class.put) == ["icontract_fast.py", "icontract_fast.py"]
    assert _wrapper_modules(fast_class.count) == ["_checkers.py"]  # *args: icontract's own
    assert _wrapper_modules(fast_class.put_scaled) == ["icontract_fast.py", "icontract_fast.py"]
    icontract_fast.uninstall()
    try:
        slow_class = _shelf_class()
        assert _wrapper_modules(slow_class.put) == ["_checkers.py", "_checkers.py"]
        slow = _outcome(lambda: SHELF_CALLS[case](slow_class()))
    finally:
        assert icontract_fast.install()
    fast = _outcome(lambda: SHELF_CALLS[case](fast_class()))
    assert fast == slow
    if "fails" in case:
        assert fast[0] == ContractViolation.__name__
