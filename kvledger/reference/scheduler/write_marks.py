"""Marks on writes of a request's tracked fields, for every build (issues 38 and 36).

The accounting counts, after a step, only the requests whose tracked fields were written (or whose owner
changed account). Those fields are written by the holdings managers only (``holdings``); each write is
marked here, at the write: the accounting gives the request's class a descriptor per tracked field that
defines ``__set__`` only. Python looks for such a descriptor on writes (it is a data descriptor) but,
having no ``__get__``, reads fall through to the instance's ``__dict__`` at C speed: a read costs nothing
more and a write of one of these few fields one Python call. (Before issue 36 a build with contracts on
replaced ``Req.__setattr__`` at import, which charged every write of every field and watched one global
set of names every pool kind added to.)
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
