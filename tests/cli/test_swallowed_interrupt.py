"""Ctrl-C still ends a command when a library caught the ``KeyboardInterrupt`` (``kvledger.cli.interrupt``).

torch swallows an interrupt that lands inside its numpy initialisation; a hunt interrupted then ran its
whole budget. Here the swallowing is done on purpose, in-process, with a real SIGINT.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvledger.cli import interrupt
from kvledger.cli.output import staged


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
