"""Whatever a file holds, ``audit_file`` gives one of its documented outcomes and nothing else.

A report whose verdict is clean, violation or incomplete, or an :class:`EventLogError` naming the line:
never a raw Python error (RecursionError, UnicodeDecodeError, OverflowError, MemoryError, KeyError...).
Inputs: valid recorded logs mutated (lines dropped, repeated, swapped, a field replaced by any JSON
value, the file cut at any byte, a byte overwritten), and arbitrary bytes.
"""

from __future__ import annotations

import functools
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kvledger.audit import EventLogError, audit_file
from tests.audit._logs import PLAIN, record

SPEC = Path(__file__).resolve().parents[2] / "spec" / "event-log.md"


@functools.cache
def base_logs() -> tuple[bytes, ...]:
    (spec,) = re.findall(r"```json\n(.*?)```", SPEC.read_text(encoding="utf-8"), re.S)
    plain = "\n".join(record(PLAIN, max_new=2)) + "\n"
    return spec.encode(), plain.encode()


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([0, 1, -1, 2**26, 2**40, 2**63, 10**30])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


@st.composite
def mutated_logs(draw: st.DrawFn) -> bytes:
    data = draw(st.sampled_from(base_logs()))
    for _ in range(draw(st.integers(1, 3))):
        lines = data.splitlines(keepends=True)
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        kind = draw(st.sampled_from(["drop", "repeat", "swap", "field", "cut", "byte"]))
        if kind == "drop":
            del lines[i]
        elif kind == "repeat":
            lines.insert(i, lines[i])
        elif kind == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif kind == "field":
            try:
                ev = json.loads(lines[i])
            except ValueError:
                continue
            if isinstance(ev, dict) and ev:
                _replace_somewhere(draw, ev)
                lines[i] = json.dumps(ev).encode() + b"\n"
        data = b"".join(lines)
        if kind == "cut":
            data = data[: draw(st.integers(0, len(data)))]
        elif kind == "byte" and data:
            k = draw(st.integers(0, len(data) - 1))
            data = data[:k] + bytes([draw(st.integers(0, 255))]) + data[k + 1 :]
    return data


def _replace_somewhere(draw: st.DrawFn, ev: dict[str, Any]) -> None:
    """Replace one value at any depth of ``ev`` (a field, an id in ``ids``, a term in ``terms``)."""
    container: Any = ev
    while True:
        keys = sorted(container) if isinstance(container, dict) else list(range(len(container)))
        if not keys:
            return
        key = draw(st.sampled_from(keys))
        inner = container[key]
        if isinstance(inner, (dict, list)) and inner and draw(st.booleans()):
            container = inner
            continue
        container[key] = draw(json_values)
        return


def _audit_bytes(data: bytes) -> None:
    fd, name = tempfile.mkstemp(suffix=".jsonl")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        try:
            report = audit_file(name)
        except EventLogError as exc:
            text = str(exc)
            assert text.startswith("event ") or "an empty log" in text, text
            assert "I-EVENT-LOG" in text
            return
    finally:
        os.unlink(name)
    assert report.verdict in ("clean", "violation", "incomplete")
    if report.clean:
        last: Any = json.loads(data.splitlines()[-1])
        assert last["ev"] == "end" and last["events"] == report.events - 1
    else:
        assert report.violation and report.violation_event is not None


@settings(max_examples=60)
@given(mutated_logs())
def test_a_mutated_log_gives_a_documented_outcome(data: bytes) -> None:
    _audit_bytes(data)


@settings(max_examples=30)
@given(st.binary(max_size=600))
def test_arbitrary_bytes_give_a_documented_outcome(data: bytes) -> None:
    _audit_bytes(data)


def test_the_unmutated_logs_audit_clean() -> None:
    """The fuzz starts from clean logs: the mutations, not the base, make them fail."""
    for data in base_logs():
        fd, name = tempfile.mkstemp(suffix=".jsonl")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            report = audit_file(name)
        finally:
            os.unlink(name)
        assert report.clean, report.violation
