"""Type checks for frozen configuration dataclasses, read from their own annotations.

``SchedulerConfig`` and ``EngineSpec`` call :func:`check_fields` first thing in ``__post_init__``: every
field must have the type its annotation says (``int`` means an int and not a bool, ``float`` accepts an
int but not a bool or a non-finite value, ``X | None``, ``Literal[...]``), or the constructor raises
:class:`InvalidArgument` naming the field. A field added later is checked without touching this module.
Range rules stay with each class (they are its own business).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any

from kvledger.contracts.errors import InvalidArgument

_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of ``cls`` (resolved once per class: ``get_type_hints`` is slow)."""
    found = _HINTS.get(cls)
    if found is None:
        found = _HINTS[cls] = typing.get_type_hints(cls)
    return found


def _matches(value: Any, hint: Any) -> bool:
    if hint is Any:
        return True
    if hint is type(None) or hint is None:
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return any(value == arg and type(value) is type(arg) for arg in typing.get_args(hint))
    if origin is typing.Union or origin is types.UnionType:
        return any(_matches(value, arm) for arm in typing.get_args(hint))
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # a construct this checker does not know: left to the class's own rules


def check_fields(obj: Any) -> None:
    """Every field of the dataclass ``obj`` has the type its annotation names."""
    hints = _hints(type(obj))
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        hint = hints.get(field.name, Any)
        if not _matches(value, hint):
            if typing.get_origin(hint) is typing.Literal:  # a name outside the allowed set
                raise InvalidArgument(
                    f"unknown {field.name} {value!r}: {type(obj).__name__}.{field.name} is one of"
                    f" {', '.join(map(repr, typing.get_args(hint)))}"
                )
            raise InvalidArgument(
                f"{type(obj).__name__}.{field.name} must be {_describe(hint)}, got {type(value).__name__} {value!r}"
            )


def _describe(hint: Any) -> str:
    if hint is int:
        return "an int"
    if hint is float:
        return "a finite number"
    if hint is bool:
        return "a bool"
    return str(hint).replace("typing.", "")
