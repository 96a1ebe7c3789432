"""The waiting queue: a list that answers ``req in queue`` in O(1) (issue 38: scale at 64x).

Every finished or aborted request leaves the queues (``Scheduler._leave_queues``), and a running request is
almost never in the waiting list, so ``req in self.waiting`` scanned the whole queue to say no: 3.5 % of a
64x ``release`` run, growing with the queue. :class:`WaitingQueue` keeps, beside the list, how many times
each object is in it (by ``id``; the list holds them, so no two alive entries share an id) and answers
membership from that count.

Invariant: ``_count`` maps ``id(x)`` to the number of entries that are ``x``, for exactly the objects in
the list. Every list method that adds or removes entries keeps it so; ordering methods (sort, reverse)
change no count. Membership is the list's own answer: identity or ``==``. The count answers it only where
``==`` is identity on both sides (neither the object asked about nor any entry defines ``__eq__``:
``Req`` is a ``dataclass(eq=False)``); a type with its own ``__eq__`` gets the list's scan.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import SupportsIndex, TypeVar, cast, overload

_IDENTITY_EQ = object.__eq__
_T = TypeVar("_T")


def _identity_eq(x: object) -> bool:
    return type(x).__eq__ is _IDENTITY_EQ


class WaitingQueue(list[_T]):
    """A list of queued requests with O(1) ``in``; otherwise a plain list (order, slicing, iteration)."""

    def __init__(self, items: Iterable[_T] = ()) -> None:
        super().__init__(items)
        self._count: dict[int, int] = {}
        self._identity = True  # every entry ever added compares by identity (else: the list's scan)
        for x in list.__iter__(self):
            self._add(x)

    def _add(self, x: object) -> None:
        k = id(x)
        self._count[k] = self._count.get(k, 0) + 1
        if self._identity and not _identity_eq(x):
            self._identity = False

    def _drop(self, x: object) -> None:
        k = id(x)
        left = self._count[k] - 1
        if left:
            self._count[k] = left
        else:
            del self._count[k]

    def _recount(self) -> None:
        self._count.clear()
        for x in list.__iter__(self):
            self._add(x)

    # ------------------------------------------------------------------ membership
    def __contains__(self, x: object) -> bool:
        if self._identity and _identity_eq(x):
            return id(x) in self._count
        return list.__contains__(self, x)

    # ------------------------------------------------------------------ what adds or removes entries
    def append(self, x: _T) -> None:
        list.append(self, x)
        self._add(x)

    def extend(self, items: Iterable[_T]) -> None:
        items = list(items)
        list.extend(self, items)
        for x in items:
            self._add(x)

    def __iadd__(self, items: Iterable[_T]) -> WaitingQueue[_T]:  # type: ignore[override,misc]
        self.extend(items)
        return self

    def __imul__(self, n: SupportsIndex) -> WaitingQueue[_T]:
        list.__imul__(self, n)
        self._recount()
        return self

    def insert(self, i: SupportsIndex, x: _T) -> None:
        list.insert(self, i, x)
        self._add(x)

    def remove(self, x: _T) -> None:
        i = list.index(self, x)  # ValueError when absent, as list.remove
        self._drop(list.__getitem__(self, i))
        list.__delitem__(self, i)

    def pop(self, i: SupportsIndex = -1) -> _T:
        x = list.pop(self, i)
        self._drop(x)
        return x

    def clear(self) -> None:
        list.clear(self)
        self._count.clear()

    @overload
    def __setitem__(self, key: SupportsIndex, value: _T) -> None: ...
    @overload
    def __setitem__(self, key: slice, value: Iterable[_T]) -> None: ...
    def __setitem__(self, key: SupportsIndex | slice, value: _T | Iterable[_T]) -> None:
        if isinstance(key, slice):
            values = list(cast("Iterable[_T]", value))
            old = list.__getitem__(self, key)
            list.__setitem__(
                self, key, values
            )  # raises before any count changes (an extended slice's length)
            for x in old:
                self._drop(x)
            for x in values:
                self._add(x)
            return
        one = cast("_T", value)
        old_one = list.__getitem__(self, key)
        list.__setitem__(self, key, one)
        self._drop(old_one)
        self._add(one)

    def __delitem__(self, key: SupportsIndex | slice) -> None:
        if isinstance(key, slice):
            old = list.__getitem__(self, key)
            list.__delitem__(self, key)
            for x in old:
                self._drop(x)
            return
        old_one = list.__getitem__(self, key)
        list.__delitem__(self, key)
        self._drop(old_one)

    def __reduce__(self) -> tuple[type[WaitingQueue[_T]], tuple[list[_T]]]:
        """Copies and pickles rebuild the count from the entries (the ids of the originals mean nothing)."""
        return (type(self), (list(self),))
