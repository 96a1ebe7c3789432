"""A faster evaluation loop for icontract's pre/postconditions and snapshots (issue 12), and leaner
wrappers around the checked functions (issue 24).

icontract stays the contract library: it decorates, stores the conditions, renders violation messages,
and CrossHair reads the same decorators. What this module replaces is the loop that *evaluates* the
stored conditions on every call, and the evaluation of one class invariant. icontract 2.7's loop
re-derives, for every condition on every call, whether the condition is a coroutine function
(``inspect.iscoroutinefunction``) and which keyword arguments it takes (a dict comprehension over all
of the call's arguments). Measured on ``kvledger simulate`` with contracts on, that bookkeeping was
about a third of the contract cost.

The loop here works out each condition's arguments once (an ``itemgetter`` stored on the condition's
``Contract``) and then calls it with them by position. A condition that returns anything but a plain
``bool``, that is a coroutine function, or whose arguments are missing is handed to icontract's own
loop, so every corner case (numpy truth values, "require else" groups, missing-argument ``TypeError``)
behaves exactly as before; a violation is always built by icontract's ``_create_violation_error``, so
messages are unchanged.

:func:`install` patches four functions of ``icontract._checkers`` that icontract's wrappers look up at
call time (CrossHair patches the first three to turn icontract off), and the two that build the
wrappers when a module is decorated (see "the wrappers" below; ``kvledger.contracts.switch`` installs
them before any decorated kvledger module is imported). It refuses to act on an icontract version it
was not checked against, or when those functions were already replaced by someone else, and reports
whether it installed. ``KVLEDGER_FAST_CONTRACTS=0`` keeps icontract's loop and wrappers.
"""

from __future__ import annotations

import functools
import inspect
import operator
from collections.abc import Callable, Mapping
from typing import Any, cast

import icontract
import icontract._checkers as _checkers

CHECKED_VERSIONS = ("2.7.1", "2.7.2", "2.7.3")
_PLAN = "_kvledger_args"  # attribute stored on a Contract / Snapshot: its argument names, or None

_original: dict[str, Callable[..., Any]] = {}
# icontract's recursion guard (a ContextVar made once at its import): the functions being checked and the
# instances whose invariants are being checked, per context; shared with icontract's own wrappers.
_IN_PROGRESS = _checkers._IN_PROGRESS


_Plan = tuple[int, Callable[[Mapping[str, Any]], Any]]  # (argument count, their getter from the call's arguments)


def _plan(contract: Any) -> _Plan | None:
    """How to call the condition: its argument count and an ``itemgetter`` of its arguments (all mandatory,
    passed by position in the order they are declared), or None when icontract's loop must handle it."""
    plan = contract.__dict__.get(_PLAN, False)
    if plan is False:
        condition = contract.condition
        if inspect.iscoroutinefunction(condition) or len(contract.mandatory_args) != len(contract.condition_args):
            plan = None  # async, or a condition with defaulted arguments: the general loop
        else:
            names = tuple(contract.condition_args)
            plan = (len(names), operator.itemgetter(*names) if names else (lambda _: ()))
        contract.__dict__[_PLAN] = plan
    return cast("_Plan | None", plan)


def _evaluate(contract: Any, plan: _Plan, resolved_kwargs: Mapping[str, Any]) -> bool | None:
    """The condition's verdict as a bool, or None when icontract's loop must judge it (an argument the call
    does not have, a verdict that is not a bool)."""
    n, arguments = plan
    try:
        args = arguments(resolved_kwargs)
    except KeyError:
        return None
    return _truth(contract.condition(args) if n == 1 else contract.condition(*args))


def _truth(check: Any) -> bool | None:
    """``check`` as a bool when it is one (numpy's included), None when icontract's loop must judge it."""
    if check is True or check is False:
        return check
    if type(check).__name__ == "bool_":
        return bool(check)
    return None


def _violation(contract: Any, resolved_kwargs: Mapping[str, Any]) -> BaseException:
    """The error icontract raises for ``contract`` violated by this call (its message, its error type)."""
    error: BaseException = _checkers._create_violation_error(contract=contract, resolved_kwargs=resolved_kwargs)
    return error


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
            truth = None if plan is None else _evaluate(contract, plan, resolved_kwargs)
            if truth is True:
                continue
            if truth is None:
                return _fallback("_assert_preconditions", preconditions, resolved_kwargs, func)
            exception = _violation(contract, resolved_kwargs)
            break
        if exception is None:
            return None
    return exception


def _assert_postconditions(
    postconditions: list[Any], resolved_kwargs: Mapping[str, Any], func: Callable[..., Any]
) -> BaseException | None:
    for contract in postconditions:
        plan = _plan(contract)
        truth = None if plan is None else _evaluate(contract, plan, resolved_kwargs)
        if truth is True:
            continue
        if truth is None:
            return _fallback("_assert_postconditions", postconditions, resolved_kwargs, func)
        return _violation(contract, resolved_kwargs)
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


# ------------------------------------------------------------------------------------ the wrappers
# icontract builds one wrapper per decorated function (pre/postconditions) and one per public method of a
# class with invariants. Their per-call bookkeeping (argument resolution through a general helper, three
# attribute reads, a check for reserved names, the search for ``self``) was a third of a checked call in
# the ``full`` level's default run (issue 24: 21,000 checked calls and 32,500 invariant-wrapped ones).
# The wrappers below do the same steps in the same order for a plain synchronous function, with the
# argument names worked out once; they call the module's ``_assert_*`` functions at call time, as
# icontract's do, so CrossHair's switch (it replaces those functions) and :func:`uninstall` still
# apply. Anything else (coroutines, ``__init__``, ``*args`` or ``**kwargs`` in the signature) keeps
# icontract's own wrapper.
_SIMPLE_KINDS = (
    inspect.Parameter.POSITIONAL_OR_KEYWORD,
    inspect.Parameter.POSITIONAL_ONLY,
    inspect.Parameter.KEYWORD_ONLY,
)


def _plain_params(func: Callable[..., Any]) -> list[str] | None:
    """The parameter names, in order, when the signature has neither ``*args`` nor ``**kwargs``."""
    params = inspect.signature(func).parameters.values()
    return [p.name for p in params] if all(p.kind in _SIMPLE_KINDS for p in params) else None


def decorate_with_checker(func: Callable[..., Any]) -> Callable[..., Any]:
    """icontract's checker for ``func`` (its validation, its condition lists) with a leaner call path."""
    checker: Callable[..., Any] = _original["decorate_with_checker"](func)
    param_names = _plain_params(func)
    if param_names is None or inspect.iscoroutinefunction(func):
        return checker
    kwdefaults = _checkers.resolve_kwdefaults(inspect.signature(func))
    n_params, id_func, progress = len(param_names), id(func), _IN_PROGRESS

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if kwargs:
            kwargs_error = _checkers._assert_no_invalid_kwargs(kwargs)
            if kwargs_error:
                raise kwargs_error
        in_progress = progress.get()
        if in_progress is None:
            in_progress = set()
            progress.set(in_progress)
        if id_func in in_progress:  # a recursive call of a function being checked: not checked again
            return func(*args, **kwargs)
        in_progress.add(id_func)
        try:
            preconditions = wrapper.__preconditions__  # type: ignore[attr-defined]
            snapshots = wrapper.__postcondition_snapshots__  # type: ignore[attr-defined]
            postconditions = wrapper.__postconditions__  # type: ignore[attr-defined]
            if not kwargs and len(args) == n_params:  # every parameter given by position: no default to fill
                resolved: dict[str, Any] = dict(zip(param_names, args, strict=True))
                resolved["_ARGS"], resolved["_KWARGS"] = args, kwargs
            else:
                resolved = dict(_checkers.kwargs_from_call(param_names, kwdefaults, args, kwargs))
            if postconditions:
                type_error = _checkers._assert_resolved_kwargs_valid(postconditions, resolved)
                if type_error:
                    raise type_error
            if preconditions:
                violation = _checkers._assert_preconditions(
                    preconditions=preconditions, resolved_kwargs=resolved, func=func
                )
                if violation:
                    raise violation
            if postconditions and snapshots:
                resolved["OLD"] = _checkers._capture_old(snapshots=snapshots, resolved_kwargs=resolved, func=func)
            result = func(*args, **kwargs)
            if postconditions:
                resolved["result"] = result
                violation = _checkers._assert_postconditions(
                    postconditions=postconditions, resolved_kwargs=resolved, func=func
                )
                if violation:
                    raise violation
            return result
        finally:
            in_progress.discard(id_func)

    functools.update_wrapper(wrapper=wrapper, wrapped=func)
    for name in ("__preconditions__", "__postcondition_snapshots__", "__postconditions__"):
        setattr(wrapper, name, getattr(checker, name))  # the same lists: later decorators append to them
    return wrapper


def _decorate_with_invariants(func: Callable[..., Any], cls: type, is_init: bool) -> Callable[..., Any]:
    """icontract's invariant wrapper of a public method (before and after every call), with ``self``
    found by its position, worked out once."""
    original: Callable[..., Any] = _original["_decorate_with_invariants"]
    param_names = _plain_params(func)
    if (
        is_init
        or param_names is None
        or "self" not in param_names
        or inspect.iscoroutinefunction(func)
        or _checkers._already_decorated_with_invariants(func=func)
    ):
        icontracts: Callable[..., Any] = original(func, cls, is_init)
        return icontracts
    self_at = param_names.index("self")
    on_setattr = func.__name__ == "__setattr__"
    progress = _IN_PROGRESS

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        instance = args[self_at] if self_at < len(args) else kwargs["self"]
        klass = instance.__class__
        invariants = klass.__invariants_on_setattr__ if on_setattr else klass.__invariants_on_call__
        in_progress = progress.get()
        if in_progress is None:
            in_progress = set()
            progress.set(in_progress)
        id_instance = id(instance)
        if id_instance in in_progress:  # an invariant is being checked on this instance: no recursion
            return func(*args, **kwargs)
        in_progress.add(id_instance)
        try:
            assert_invariant = _checkers._assert_invariant
            for invariant in invariants:
                assert_invariant(contract=invariant, instance=instance)
            result = func(*args, **kwargs)
            for invariant in invariants:
                assert_invariant(contract=invariant, instance=instance)
            return result
        finally:
            in_progress.discard(id_instance)

    functools.update_wrapper(wrapper=wrapper, wrapped=func)
    wrapper.__is_invariant_check__ = True  # type: ignore[attr-defined]
    return wrapper


_REPLACEMENTS: dict[str, Callable[..., Any]] = {
    "_assert_preconditions": _assert_preconditions,
    "_assert_postconditions": _assert_postconditions,
    "_capture_old": _capture_old,
    "_assert_invariant": _assert_invariant,
    "decorate_with_checker": decorate_with_checker,
    "_decorate_with_invariants": _decorate_with_invariants,
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
