"""What an exhibit is: one historical bug, described as data and put back by replacing one method.

An :class:`Exhibit` carries its catalogue id (``sglang-memory-model.md`` B1-B22,
``pd-disaggregation-and-2026-bugs.md`` N1-N18, ``other-engines.md`` for vLLM), the upstream thread, a
paragraph on the mechanism, the IDs of the invariants it breaks (they must exist in the invariant
registry, ``kvledger.contracts.invariants``), the machine that should find it, and ``reenact``: a context
manager that installs the historical behaviour for the duration of a ``with`` block by replacing one
method, function or policy (:func:`patched`), restoring it afterwards; a bug that lived in several places
at once (B2: retraction without the drain, the result path that skipped the retracted request, the
inferred release length) replaces each of them together (:func:`replacing_all`). The reference code
itself has no fault branches (house rule). An exhibit outside the model's scope says so (``scope``) and has no
``reenact``: it is never faked.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

Scope = Literal["in scope", "out of scope"]
MachineName = Literal["scheduler", "pd", "cache"]


@dataclass(frozen=True)
class Exhibit:
    id: str  # catalogue id (B5, N4, vLLM-1, ...)
    upstream: str  # the thread(s), fix included
    title: str
    mechanism: str  # one paragraph: what the code did and why it broke the accounting
    breaks: tuple[str, ...]  # invariant IDs; the first is the check that fires first in kvledger
    reenact: Callable[[], contextlib.AbstractContextManager[None]] | None
    machine: MachineName = "scheduler"  # the generic machine the hunt runs for it
    replaces: str = ""  # the method(s)/function(s)/policy the re-enactment replaces, ", "-separated
    scope: Scope = "in scope"
    why_out_of_scope: str = ""

    @property
    def replaced(self) -> tuple[str, ...]:
        """Each dotted name ``replaces`` lists."""
        return tuple(n for n in self.replaces.split(", ") if n)

    @property
    def huntable(self) -> bool:
        return self.reenact is not None

    def installed(self) -> contextlib.AbstractContextManager[None]:
        """The re-enactment as a context manager (refuses an out-of-scope exhibit)."""
        if self.reenact is None:
            raise LookupError(f"{self.id} is out of the model's scope: {self.why_out_of_scope}")
        return self.reenact()


@contextlib.contextmanager
def patched(owner: Any, name: str, wrap: Callable[[Any], Any]) -> Iterator[None]:
    """Replace ``owner.name`` by ``wrap(original)`` for the duration of the block (a method of the class
    ``owner``, possibly inherited, or a module function); the original is restored afterwards."""
    own = name in vars(owner)
    original = vars(owner)[name] if own else getattr(owner, name)
    setattr(owner, name, wrap(original))
    try:
        yield
    finally:
        if own:
            setattr(owner, name, original)
        else:
            delattr(owner, name)  # it was inherited: remove the override


Reenact = Callable[[], contextlib.AbstractContextManager[None]]


def replacing(owner: Any, name: str, wrap: Callable[[Any], Any]) -> Reenact:
    """``reenact`` for an exhibit that replaces ``owner.name`` by ``wrap(original)``."""
    return lambda: patched(owner, name, wrap)


def replaced_name(owner: Any, name: str) -> str:
    return f"{getattr(owner, '__qualname__', getattr(owner, '__name__', owner))}.{name}"


Patch = tuple[Any, str, Callable[[Any], Any]]  # (owner, name, wrap) as :func:`patched` takes them


def replacing_all(*patches: Patch) -> Reenact:
    """``reenact`` for an exhibit that replaces several methods together (each restored afterwards)."""

    @contextlib.contextmanager
    def installed() -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for owner, name, wrap in patches:
                stack.enter_context(patched(owner, name, wrap))
            yield

    return installed


def replaced_names(*patches: Patch) -> str:
    """``replaces`` for :func:`replacing_all`'s patches."""
    return ", ".join(replaced_name(owner, name) for owner, name, _ in patches)
