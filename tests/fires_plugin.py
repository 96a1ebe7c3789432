"""``@pytest.mark.fires("I-...", ...)``: a test that declares it makes invariants fire is held to it.

While such a test runs, every ContractViolation and KVLedgerError constructed is recorded (kvledger
builds one only to raise it; ``pytest.raises`` may catch it). When the test has passed, each declared ID
must be named in one of their messages; otherwise the test fails and says what it did see. The
traceability check (``python -m kvledger.contracts.invariants check``) requires every registered
invariant to have at least one such test in the default run.

With contracts off (``KVLEDGER_CONTRACTS=0``) most checks are compiled out, so nothing is verified
there; CI runs with contracts on. Loaded by ``tests/conftest.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from kvledger.contracts import switch
from kvledger.contracts.errors import INVARIANT_ID, ContractViolation, KVLedgerError

RECORDED = (ContractViolation, KVLedgerError)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "fires(*ids): the test makes these invariants fire; verified during the run (tests/fires_plugin.py)",
    )


@contextlib.contextmanager
def recording_errors() -> Iterator[list[BaseException]]:
    """Record every ContractViolation and KVLedgerError constructed inside the block."""
    seen: list[BaseException] = []
    patched: list[tuple[type[BaseException], Any]] = []
    for cls in RECORDED:
        own = cls.__dict__.get("__init__")
        original: Any = cls.__init__

        def recording(self: BaseException, *args: Any, _original: Any = original, **kwargs: Any) -> None:
            _original(self, *args, **kwargs)
            seen.append(self)

        setattr(cls, "__init__", recording)  # noqa: B010  (mypy refuses assigning to a method)
        patched.append((cls, own))
    try:
        yield seen
    finally:
        for cls, own in reversed(patched):
            if own is None:
                delattr(cls, "__init__")
            else:
                setattr(cls, "__init__", own)  # noqa: B010

def missing_ids(wanted: list[str], seen: list[BaseException]) -> list[str]:
    """The declared IDs that no recorded error names."""
    named = {m for exc in seen for m in INVARIANT_ID.findall(str(exc))}
    return [i for i in dict.fromkeys(wanted) if i not in named]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    wanted = [i for mark in item.iter_markers("fires") for i in mark.args]
    if not wanted:
        return (yield)
    bad = [i for i in wanted if not isinstance(i, str) or not INVARIANT_ID.fullmatch(i)]
    if bad:
        pytest.fail(f"@pytest.mark.fires takes invariant IDs, got {bad!r}", pytrace=False)
    if not switch.ENABLED:
        return (yield)
    with recording_errors() as seen:
        result = yield
    missing = missing_ids(wanted, seen)
    if missing:
        saw = "; ".join(f"{type(e).__name__}: {str(e).splitlines()[0][:120]}" for e in seen[:4]) or "none"
        pytest.fail(
            f"declared @pytest.mark.fires({', '.join(map(repr, missing))}) but no ContractViolation or"
            f" KVLedgerError naming it was raised (saw: {saw})",
            pytrace=False,
        )
    return result
