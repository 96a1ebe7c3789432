"""A faster evaluation loop for icontract's pre/postconditions and snapshots (issue 12).

icontract stays the contract library: it decorates, stores the conditions, renders violation messages,
and CrossHair reads the same decorators. What this module replaces is the loop that *evaluates* the
stored conditions on every call, and the evaluation of one class invariant. icontract 2.7's loop
re-derives, for every condition on every call, whether the condition is a coroutine function
(``inspect.iscoroutinefunction``) and which keyword arguments it takes (a dict comprehension over all
of the call's arguments). Measured on ``kvledger simulate`` with contracts on, that bookkeeping was
about a third of the contract cost.

The loop here works out each condition's argument names once (stored on the condition's ``Contract``)
and then calls it directly. A condition that returns anything but a plain ``bool``, that is a coroutine
function, or whose arguments are missing is handed to icontract's own loop, so every corner case
(numpy truth values, "require else" groups, missing-argument ``TypeError``) behaves exactly as before;
a violation is always built by icontract's ``_create_violation_error``, so messages are unchanged.

:func:`install` patches four functions of ``icontract._checkers`` that icontract's wrappers look up
at call time (CrossHair patches the first three to turn icontract off). It refuses to act on an
icontract version it was not checked against, or when those functions were already replaced by
someone else, and reports whether it installed. ``KVLEDGER_FAST_CONTRACTS=0`` keeps icontract's loop.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, cast

import icontract
import icontract._checkers as _checkers

CHECKED_VERSIONS = ("2.7.1", "2.7.2", "2.7.3")
_PLAN = "_kvledger_args"  # attribute stored on a Contract / Snapshot: its argument names, or None

_original: dict[str, Callable[..., Any]] = {}


def _plan(contract: Any) -> tuple[str, ...] | None:
    """The condition's argument names (all mandatory), or None when icontract's loop must handle it."""
    plan = contract.__dict__.get(_PLAN, False)
    if plan is False:
        condition = contract.condition
        if inspect.iscoroutinefunction(condition) or len(contract.mandatory_args) != len(contract.condition_args):
            plan = None  # async, or a condition with defaulted arguments: the general loop
        else:
            plan = tuple(contract.condition_args)
        contract.__dict__[_PLAN] = plan
    return cast("tuple[str, ...] | None", plan)


def _truth(check: Any) -> bool | None:
    """``check`` as a bool when it is one (numpy's included), None when icontract's loop must judge it."""
    if check is True or check is False:
        return check
    if type(check).__name__ == "bool_":
        return bool(check)
    return None


def _fallback(
    name: str, contracts: list[Any], resolved_kwargs: Mapping[str, Any], func: Callable[..., Any]
) -> BaseException | None:
    """icontract's own loop for the corner cases (see the module doc)."""
    result: BaseException | None = _original[name](contracts, resolved_kwargs, func)
    return result


def _assert_preconditions(
    preconditions: list[list[Any]], resolved_kwargs: Mapping[str, Any], func: Callable[..., Any]
) -> BaseException | None:
    exception: BaseException | None = None
    for group in preconditions:
        exception = None
        for contract in group:
            plan = _plan(contract)
            if plan is None:
                return _fallback("_assert_preconditions", preconditions, resolved_kwargs, func)
            try:
                kwargs = {name: resolved_kwargs[name] for name in plan}
            except KeyError:
                return _fallback("_assert_preconditions", preconditions, resolved_kwargs, func)
            truth = _truth(contract.condition(**kwargs))
            if truth is True:
                continue
            if truth is None:
                return _fallback("_assert_preconditions", preconditions, resolved_kwargs, func)
            exception = _checkers._create_violation_error(contract=contract, resolved_kwargs=resolved_kwargs)
            break
        if exception is None:
            return None
    return exception


def _assert_postconditions(
    postconditions: list[Any], resolved_kwargs: Mapping[str, Any], func: Callable[..., Any]
) -> BaseException | None:
    for contract in postconditions:
        plan = _plan(contract)
        if plan is None:
            return _fallback("_assert_postconditions", postconditions, resolved_kwargs, func)
        try:
            kwargs = {name: resolved_kwargs[name] for name in plan}
        except KeyError:
            return _fallback("_assert_postconditions", postconditions, resolved_kwargs, func)
        truth = _truth(contract.condition(**kwargs))
        if truth is True:
            continue
        if truth is None:
            return _fallback("_assert_postconditions", postconditions, resolved_kwargs, func)
        return _checkers._create_violation_error(contract=contract, resolved_kwargs=resolved_kwargs)
    return None


def _capture_old(snapshots: list[Any], resolved_kwargs: Mapping[str, Any], func: Callable[..., Any]) -> Any:
    mapping: dict[str, Any] = {}
    for snap in snapshots:
        args = snap.__dict__.get(_PLAN, False)
        if args is False:
            args = None if inspect.iscoroutinefunction(snap.capture) else tuple(snap.args)
            snap.__dict__[_PLAN] = args
        if args is None or snap.name in mapping:
            return _original["_capture_old"](snapshots, resolved_kwargs, func)
        try:
            kwargs = {name: resolved_kwargs[name] for name in args}
        except KeyError:
            return _original["_capture_old"](snapshots, resolved_kwargs, func)
        captured = snap.capture(**kwargs)
        if inspect.iscoroutine(captured):
            return _original["_capture_old"](snapshots, resolved_kwargs, func)
        mapping[snap.name] = captured
    return _checkers.Old(mapping=mapping)


def _assert_invariant(contract: Any, instance: Any) -> None:
    """One class invariant, around every public call of its class (issue 24: 70,000 evaluations in the
    default ``simulate`` run at ``full``). An invariant that takes ``self`` and answers a plain bool is
    called directly; anything else, and every violation, goes through icontract's own function."""
    if contract.__dict__.get(_PLAN, False) is False:
        contract.__dict__[_PLAN] = (
            ("self",)
            if tuple(contract.condition_args) == ("self",) and not inspect.iscoroutinefunction(contract.condition)
            else None
        )
    if contract.__dict__[_PLAN] is not None and contract.condition(instance) is True:
        return
    _original["_assert_invariant"](contract=contract, instance=instance)


_REPLACEMENTS: dict[str, Callable[..., Any]] = {
    "_assert_preconditions": _assert_preconditions,
    "_assert_postconditions": _assert_postconditions,
    "_capture_old": _capture_old,
    "_assert_invariant": _assert_invariant,
}


def installed() -> bool:
    return bool(_original) and all(getattr(_checkers, n) is f for n, f in _REPLACEMENTS.items())


def install() -> bool:
    """Use the fast loop in this process; False (and nothing changed) if it is not safe to."""
    if installed():
        return True
    if getattr(icontract, "__version__", None) not in CHECKED_VERSIONS:
        return False
    current = {name: getattr(_checkers, name, None) for name in _REPLACEMENTS}
    if any(f is None or getattr(f, "__module__", None) != _checkers.__name__ for f in current.values()):
        return False  # already replaced (CrossHair turns icontract off this way): leave it alone
    _original.update(current)  # type: ignore[arg-type]
    for name, fast in _REPLACEMENTS.items():
        setattr(_checkers, name, fast)
    return True


def uninstall() -> None:
    """Back to icontract's own loop (tests compare the two)."""
    if installed():
        for name, original in _original.items():
            setattr(_checkers, name, original)
