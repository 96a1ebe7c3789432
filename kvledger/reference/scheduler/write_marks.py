"""Marks on writes of a request's tracked fields for builds without contracts (issue 38).

With contracts on, ``Req.__setattr__`` is replaced at import (``request._tracking_setattr``), and every
write of a tracked field tells the request's ``watch``. Below ``full`` nothing was told, so the count
identities recounted every queued request after every step: O(queue) per step, 44 % of a 16x release run.

Here the tracked fields get a descriptor that defines ``__set__`` only. Python looks for such a
descriptor on writes (it is a data descriptor) but, having no ``__get__``, reads fall through to the
instance's ``__dict__`` at C speed: a read costs nothing more and a write of one of these few fields one
Python call, where a replaced ``__setattr__`` would charge every write of every field.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class _MarkOnWrite:
    """Store the value in the instance's dict, then tell its watcher (if any) which field changed."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __set__(self, obj: Any, value: Any) -> None:
        d = obj.__dict__
        d[self.name] = value
        watch = d.get("watch")
        if watch is not None:
            watch.touch(obj, self.name)


_marked: dict[type, frozenset[str]] = {}


def mark_writes(cls: type, names: Iterable[str]) -> None:
    """Give ``cls`` (a request class) a marking descriptor for each of ``names`` it lacks one for.

    Idempotent and per concrete class, so a subclass that redeclares a field (its default is a class
    attribute that would shadow the base's descriptor) gets its own. A field must already be set on every
    instance (a dataclass field is, by ``__init__``): a read of an unset one would return the descriptor.
    """
    want = frozenset(names)
    have = _marked.get(cls, frozenset())
    for name in want - have:
        setattr(cls, name, _MarkOnWrite(name))
    _marked[cls] = have | want
