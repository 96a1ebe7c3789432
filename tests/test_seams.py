"""The museum's seams: every method an exhibit replaces is marked ``@seam`` where it is defined, and every
method marked ``@seam`` is replaced by some exhibit (``kvledger/contracts/seams.py``).

What an exhibit replaces is recorded, not read from its ``replaces`` text: each exhibit's re-enactment
(and the museum's other replacement contexts, such as the pool semantics the B4 seed ran on) is entered
with :func:`kvledger.museum.exhibit.patched` instrumented, so a replacement made by any path is seen.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import pkgutil
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import kvledger.contracts
import kvledger.reference
from kvledger.contracts.seams import is_seam, seam
from kvledger.museum import catalogue, pd_bugs

exhibit = importlib.import_module("kvledger.museum.exhibit")  # the module (the package exports a function of that name)


def _definition(owner: Any, name: str) -> Any:
    """The function ``owner.name`` resolves to (through the class's MRO), unwrapped from static/classmethod."""
    value = inspect.getattr_static(owner, name)
    return value.__func__ if isinstance(value, (staticmethod, classmethod)) else value


def _replacement_contexts() -> list[tuple[str, Callable[[], contextlib.AbstractContextManager[None]]]]:
    """Every exhibit's re-enactment, and the museum's other replacement contexts (pd_bugs' helpers)."""
    out: list[tuple[str, Callable[[], contextlib.AbstractContextManager[None]]]] = [
        (e.id, e.installed) for e in catalogue.EXHIBITS if e.huntable
    ]
    reenactments = {e.reenact for e in catalogue.EXHIBITS}
    for name, fn in vars(pd_bugs).items():
        if inspect.isfunction(fn) and fn.__module__ == pd_bugs.__name__ and fn not in reenactments:
            if name.startswith("_") or inspect.signature(fn).parameters:
                continue
            out.append((f"pd_bugs.{name}", fn))
    return out


def replaced_by_the_museum(monkeypatch: pytest.MonkeyPatch) -> dict[int, tuple[Any, str, str]]:
    """id(function replaced) -> (function, "Owner.name", who replaced it), entering every context once."""
    seen: dict[int, tuple[Any, str, str]] = {}
    real = exhibit.patched
    current = [""]

    @contextlib.contextmanager
    def recording(owner: Any, name: str, wrap: Callable[[Any], Any]) -> Iterator[None]:
        fn = _definition(owner, name)
        seen.setdefault(id(fn), (fn, exhibit.replaced_name(owner, name), current[0]))
        with real(owner, name, wrap):
            yield

    monkeypatch.setattr(exhibit, "patched", recording)
    monkeypatch.setattr(pd_bugs, "patched", recording)
    for who, enter in _replacement_contexts():
        current[0] = who
        with enter():
            pass
    return seen


def marked_seams() -> dict[int, tuple[Any, str]]:
    """id(function) -> (function, "module:Owner.name") for every ``@seam`` in the reference and the spec."""
    out: dict[int, tuple[Any, str]] = {}
    for package in (kvledger.reference, kvledger.contracts):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            module = importlib.import_module(info.name)
            for name, obj in vars(module).items():
                if getattr(obj, "__module__", None) != module.__name__:
                    continue
                if inspect.isfunction(obj) and is_seam(obj):
                    out[id(obj)] = (obj, f"{module.__name__}:{name}")
                elif inspect.isclass(obj):
                    for attr, value in vars(obj).items():
                        fn = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
                        if callable(fn) and is_seam(fn):
                            out[id(fn)] = (fn, f"{module.__name__}:{obj.__qualname__}.{attr}")
    return out


def test_every_replaced_method_is_a_marked_seam(monkeypatch: pytest.MonkeyPatch) -> None:
    replaced = replaced_by_the_museum(monkeypatch)
    assert len(replaced) >= 12  # the exhibits of issue 23's count, at least
    unmarked = sorted(f"{name} (replaced by {who})" for fn, name, who in replaced.values() if not is_seam(fn))
    assert unmarked == [], "mark these with @seam (kvledger.contracts.seams) where they are defined"


def test_every_marked_seam_is_replaced_by_the_museum(monkeypatch: pytest.MonkeyPatch) -> None:
    replaced = replaced_by_the_museum(monkeypatch)
    marked = marked_seams()
    unused = sorted(where for key, (_, where) in marked.items() if key not in replaced)
    assert unused == [], "no exhibit replaces these: drop their @seam marker (or the exhibit lost its seam)"
    assert len(marked) == len(replaced)


def test_the_test_sees_a_missing_marker_and_an_unused_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks above can fail: a replaced method without the marker, and a marked method no one replaces."""

    class Engine:
        def step(self) -> int:
            return 1

        @seam
        def orphan(self) -> int:
            return 2

    seen: list[Any] = []

    @contextlib.contextmanager
    def recording(owner: Any, name: str, wrap: Callable[[Any], Any]) -> Iterator[None]:
        seen.append(_definition(owner, name))
        with exhibit.patched(owner, name, wrap):
            yield

    with recording(Engine, "step", lambda original: lambda self: 0):
        assert Engine().step() == 0
    assert Engine().step() == 1  # restored
    assert [is_seam(fn) for fn in seen] == [False]
    assert is_seam(Engine.orphan) and Engine.orphan not in seen
    assert Engine().orphan() == 2  # the marker has no behaviour
