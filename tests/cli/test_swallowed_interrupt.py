"""Ctrl-C still ends a command when a library caught the ``KeyboardInterrupt`` (``kvledger.process.interrupt``).

torch swallows an interrupt that lands inside its numpy initialisation; a hunt interrupted then ran its
whole budget. Here the swallowing is done on purpose, in-process, with a real SIGINT.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvledger.process import interrupt
from kvledger.process.staged import staged


@pytest.fixture(autouse=True)
def terminal_sigint() -> Iterator[None]:
    """Python's own SIGINT handler for each test, as a process started from a terminal has it: a suite run
    as a background job (a CI runner's ``cmd &``) starts with SIGINT ignored, which only the last test
    here is about, and it sets that up itself."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def swallowed_ctrl_c() -> None:
    with contextlib.suppress(KeyboardInterrupt):  # what torch's numpy initialisation does
        signal.raise_signal(signal.SIGINT)


def test_a_swallowed_ctrl_c_is_remembered_for_the_command() -> None:
    with interrupt.watching():
        swallowed_ctrl_c()
        with pytest.raises(KeyboardInterrupt):
            interrupt.check()
    with interrupt.watching():  # a new command starts clean
        interrupt.check()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # and the handler is restored


def test_nothing_is_published_after_a_swallowed_ctrl_c(tmp_path: Path) -> None:
    target = tmp_path / "run.jsonl"
    with interrupt.watching(), pytest.raises(KeyboardInterrupt), staged(target) as (path,):
        path.write_text("{}\n")
        swallowed_ctrl_c()
    assert list(tmp_path.iterdir()) == []  # neither the file nor its temporary


def test_a_process_that_ignores_sigint_keeps_ignoring_it() -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with interrupt.watching():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            signal.raise_signal(signal.SIGINT)  # ignored: nothing raised, nothing remembered
            interrupt.check()
    finally:
        signal.signal(signal.SIGINT, previous)


class _InterruptedOnCollection:
    """An object whose ``__del__`` gets Ctrl-C, as Hypothesis's garbage-collector callback did in a CI run:
    Python cannot raise there and reports the exception as unraisable instead."""

    def __del__(self) -> None:
        signal.raise_signal(signal.SIGINT)


class _BrokenOnCollection:
    def __del__(self) -> None:
        raise ValueError("a real bug in a finaliser")


@pytest.fixture
def reported(monkeypatch: pytest.MonkeyPatch) -> list[BaseException | None]:
    """The unraisable exceptions that reach the hook in place before the command (Python's default
    prints them as "Exception ignored in ..."), recorded instead."""
    seen: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: seen.append(unraisable.exc_value))
    return seen


def test_a_ctrl_c_python_cannot_raise_is_not_reported_and_is_raised_at_the_next_check(
    reported: list[BaseException | None],
) -> None:
    with interrupt.watching():
        obj = _InterruptedOnCollection()
        del obj  # the interrupt lands in __del__: unraisable
        assert reported == []  # no "Exception ignored in ..." before the one-line report
        with pytest.raises(KeyboardInterrupt):
            interrupt.check()


def test_other_unraisable_exceptions_are_still_reported_while_watching(
    reported: list[BaseException | None],
) -> None:
    with interrupt.watching():
        obj = _BrokenOnCollection()
        del obj
        interrupt.check()  # no interrupt was invented
    assert [type(e) for e in reported] == [ValueError]


def test_outside_a_command_a_ctrl_c_python_cannot_raise_is_reported(reported: list[BaseException | None]) -> None:
    obj = _InterruptedOnCollection()
    del obj
    assert [type(e) for e in reported] == [KeyboardInterrupt]


def test_the_unraisable_hook_is_restored_after_the_command(reported: list[BaseException | None]) -> None:
    before = sys.unraisablehook
    with interrupt.watching():
        assert sys.unraisablehook is not before
    assert sys.unraisablehook is before
