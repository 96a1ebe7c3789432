"""The example of ``spec/event-log.md`` audits clean, and its planted leak reads as the page shows."""

from __future__ import annotations

import re
from pathlib import Path

from kvledger.audit import audit_lines

SPEC = Path(__file__).resolve().parents[2] / "spec" / "event-log.md"


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", SPEC.read_text(encoding="utf-8"), re.S)


def test_the_spec_example_audits_clean() -> None:
    (log,) = _blocks("json")
    report = audit_lines(log.splitlines())
    assert report.clean, report.violation
    assert report.requests == 2 and report.steps == 4 and report.by_kind["cow"] == 1


def test_the_spec_leak_reads_as_documented() -> None:
    (log,) = _blocks("json")
    (expected,) = _blocks("text")
    lines = log.splitlines()
    assert lines[15] == '{"ev":"free","pool":"req","ids":[0],"from":"req#7"}'
    report = audit_lines(lines[:15] + lines[16:])
    assert report.violation_event == 16
    assert report.violation == expected.rstrip("\n")
