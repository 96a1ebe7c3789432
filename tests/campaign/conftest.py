"""The fuzz campaign's plumbing (``scripts/campaign.py``; README "Campaigns"): collected only when asked.

``tests/campaign/test_machines.py`` runs the generic machines for as long as it is told, so the default
test run must not collect it: it is collected when ``KVLEDGER_CAMPAIGN=1`` (the campaign script sets it).
Each item records the examples it ran and its seconds (``record_property``); the controller (with
pytest-xdist, the process that collects every worker's reports) adds them up and writes
``$KVLEDGER_CAMPAIGN_JSON``: examples, seconds, examples per second of wall time, per machine and per
worker, and the failures with the invariant each names.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

if os.environ.get("KVLEDGER_CAMPAIGN") != "1":
    collect_ignore_glob = ["test_*.py"]

_STARTED = time.monotonic()  # the controller's start: wall time includes the workers' start-up
_REPORTS: list[dict[str, Any]] = []


def pytest_runtest_logreport(report: Any) -> None:
    """Every item's call report, whichever worker ran it (xdist replays workers' reports here)."""
    if report.when != "call" or not report.nodeid.startswith("tests/campaign/"):
        return
    props = dict(report.user_properties)
    if "examples" not in props:
        return
    _REPORTS.append(
        {
            "item": report.nodeid.split("::", 1)[-1],
            "worker": getattr(report, "node", None) and report.node.gateway.id,
            **props,
            "passed": report.passed,
            "failure": None if report.passed else _failure(report),
        }
    )


def _failure(report: Any) -> str:
    """The failure's one line, and every invariant ID its report names (a hunt machine's checks name one)."""
    from kvledger.museum.hunt import INVARIANT_ID

    text = str(report.longrepr)
    crash = getattr(report.longrepr, "reprcrash", None)
    line = crash.message.splitlines()[0] if crash is not None and crash.message else text.splitlines()[-1]
    ids = sorted(set(INVARIANT_ID.findall(text)))
    return f"{line[:300]} [invariants named: {' '.join(ids) or 'none'}]"


def pytest_sessionfinish(session: Any) -> None:
    out = os.environ.get("KVLEDGER_CAMPAIGN_JSON")
    if not out or hasattr(session.config, "workerinput"):  # a worker: the controller writes the total
        return
    wall = time.monotonic() - _STARTED
    examples = sum(int(r["examples"]) for r in _REPORTS)
    by_machine: dict[str, int] = {}
    by_worker: dict[str, int] = {}
    busy: dict[str, float] = {}  # seconds each worker spent in items (its start-up, importing torch, excluded)
    for r in _REPORTS:
        busy[str(r["worker"])] = busy.get(str(r["worker"]), 0.0) + float(r["seconds"])
        by_machine[r["machine"]] = by_machine.get(r["machine"], 0) + int(r["examples"])
        by_worker[str(r["worker"])] = by_worker.get(str(r["worker"]), 0) + int(r["examples"])
    doc = {
        "workers": session.config.getoption("numprocesses", None) or 1,
        "items": len(_REPORTS),
        "examples": examples,
        "wall_s": wall,
        "examples_per_s": examples / wall if wall else None,
        "busy_s_by_worker": busy,
        # examples over the longest worker's busy time: the campaign's rate once its workers are up
        "examples_per_busy_s": examples / max(busy.values()) if busy and max(busy.values()) else None,
        "examples_by_machine": by_machine,
        "examples_by_worker": by_worker,
        "failures": [r for r in _REPORTS if not r["passed"]],
        "load_average": os.getloadavg()[0],
        "items_detail": _REPORTS,
    }
    Path(out).write_text(json.dumps(doc, indent=1))
