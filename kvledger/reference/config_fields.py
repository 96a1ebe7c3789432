"""Type and bound checks for frozen configuration dataclasses, read from their own annotations.

``SchedulerConfig``, ``EngineSpec``, ``ChannelConfig`` and ``PDSpec`` call :func:`check_fields` first
thing in ``__post_init__``: every field must have the type its annotation says (``int`` means an int and
not a bool, ``float`` accepts an int but not a bool or a non-finite value, ``X | None``,
``Literal[...]``), or the constructor raises :class:`InvalidArgument` naming the field. A field added
later is checked without touching this module.

Sizes. Every size, length, count and step count of a configuration is annotated :data:`Size` (an int in
``[1, MAX_SIZE]``) or :data:`Count` (``[0, MAX_SIZE]``), so its bound is stated where the field is
declared and checked before anything is allocated: a value above :data:`MAX_SIZE` is refused with
:class:`SizeOutOfRange`, one below the low bound with :class:`InvalidArgument`. The metadata pool and the
KV buffer, which take their sizes directly, use :func:`check_size` and wrap their tensor allocations in
:func:`allocating` (as ``build_parts`` wraps an engine's), so that a size within the bound that the
machine cannot hold is a typed error too, not a ``RuntimeError``. Rules that relate fields
(``chunk >= page_size``) stay with each class (they are its own business).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import types
import typing
from collections.abc import Iterator
from typing import Annotated, Any

from kvledger.contracts.errors import InvalidArgument, SizeOutOfRange

MAX_SIZE = 2**31 - 1
"""The largest value of any size, length, count or step count of a configuration or a pool.

KV slot ids and token positions are stored in int32 tables (``req_to_token``, as SGLang's), so no pool,
context, chunk, page or interval can usefully go beyond it; counts and step counts (latencies,
timeouts, pre-allocation, reserved tokens, fault repetitions) share the bound so that one rule covers
every field."""


@dataclasses.dataclass(frozen=True)
class Bounds:
    """The closed range ``[low, high]`` an int field must lie in (``Annotated[int, Bounds(...)]``)."""

    low: int
    high: int = MAX_SIZE

    def admits(self, value: int) -> bool:
        return self.low <= value <= self.high

    def __str__(self) -> str:
        return f"an int in [{self.low}, {self.high}]"


Size = Annotated[int, Bounds(1)]
"""A size, length or step count: an int in ``[1, MAX_SIZE]``."""

Count = Annotated[int, Bounds(0)]
"""A count or step count that may be zero: an int in ``[0, MAX_SIZE]``."""

_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of ``cls``, bounds kept (resolved once per class: it is slow)."""
    found = _HINTS.get(cls)
    if found is None:
        found = _HINTS[cls] = typing.get_type_hints(cls, include_extras=True)
    return found


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _matches(value: Any, hint: Any) -> bool:
    if hint is Any:
        return True
    if hint is type(None) or hint is None:
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return _is_int(value)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    origin = typing.get_origin(hint)
    if origin is Annotated:
        base, *extras = typing.get_args(hint)
        return _matches(value, base) and all(b.admits(value) for b in extras if isinstance(b, Bounds))
    if origin is typing.Literal:
        return any(value == arg and type(value) is type(arg) for arg in typing.get_args(hint))
    if origin is typing.Union or origin is types.UnionType:
        return any(_matches(value, arm) for arm in typing.get_args(hint))
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # a construct this checker does not know: left to the class's own rules


def _bounds(hint: Any) -> Bounds | None:
    """The bounds an int field declares (directly, or in the int arm of ``X | None``)."""
    origin = typing.get_origin(hint)
    if origin is Annotated:
        return next((b for b in typing.get_args(hint)[1:] if isinstance(b, Bounds)), None)
    if origin is typing.Union or origin is types.UnionType:
        return next((b for arm in typing.get_args(hint) if (b := _bounds(arm)) is not None), None)
    return None


def check_fields(obj: Any) -> None:
    """Every field of the dataclass ``obj`` has the type its annotation names, within its bounds."""
    hints = _hints(type(obj))
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        hint = hints.get(field.name, Any)
        if _matches(value, hint):
            continue
        name = f"{type(obj).__name__}.{field.name}"
        if typing.get_origin(hint) is typing.Literal:  # a name outside the allowed set
            raise InvalidArgument(
                f"unknown {field.name} {value!r}: {name} is one of {', '.join(map(repr, typing.get_args(hint)))}"
            )
        bounds = _bounds(hint)
        if bounds is not None and _is_int(value) and value > bounds.high:
            raise SizeOutOfRange(f"{name} must be at most {bounds.high} (MAX_SIZE), got {value}")
        raise InvalidArgument(f"{name} must be {_describe(hint)}, got {type(value).__name__} {value!r}")


def check_size(value: Any, what: str, low: int = 1) -> int:
    """A size passed directly (a pool's slot count): an int in ``[low, MAX_SIZE]``."""
    if not _is_int(value):
        raise InvalidArgument(f"{what} must be an int, got {type(value).__name__} {value!r}")
    if value < low:
        raise InvalidArgument(f"{what} must be >= {low}, got {value}")
    if value > MAX_SIZE:
        raise SizeOutOfRange(f"{what} must be at most {MAX_SIZE} (MAX_SIZE), got {value}")
    return value


def physical_memory() -> int | None:
    """The machine's physical memory in bytes (None where the platform does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def check_fits_memory(need: int, what: str) -> None:
    """Refuse, before anything is allocated, what needs more than the machine's physical memory (``need``:
    a lower estimate in bytes): built, it could only fail half-way or be killed by the OOM killer."""
    have = physical_memory()
    if have is not None and need > have:
        raise SizeOutOfRange(
            f"{what} needs at least {need / 2**30:.1f} GiB; this machine has {have / 2**30:.1f} GiB"
        )


@contextlib.contextmanager
def allocating(what: str) -> Iterator[None]:
    """Tensors for ``what`` that the machine cannot hold: a typed error, raised before the object exists."""
    try:
        yield
    except MemoryError:
        raise SizeOutOfRange(f"{what}: not enough memory for its tensors") from None
    except RuntimeError as exc:  # torch: "can't allocate memory", "out of memory", "size ... overflowed"
        message = str(exc).lower()
        if not any(word in message for word in ("alloc", "out of memory", "overflow")):
            raise
        raise SizeOutOfRange(
            f"{what}: its tensors cannot be allocated ({str(exc).splitlines()[0]})"
        ) from None


def _describe(hint: Any) -> str:
    if hint is int:
        return "an int"
    if hint is float:
        return "a finite number"
    if hint is bool:
        return "a bool"
    origin = typing.get_origin(hint)
    if origin is Annotated:
        bounds = _bounds(hint)
        return str(bounds) if bounds is not None else _describe(typing.get_args(hint)[0])
    if origin is typing.Union or origin is types.UnionType:
        return " or ".join("None" if arm is type(None) else _describe(arm) for arm in typing.get_args(hint))
    return str(hint).replace("typing.", "")
