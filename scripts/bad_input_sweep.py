#!/usr/bin/env python
"""The bad-input sweep's counts: every row of ``tests/sweep`` run outside pytest, classified, as JSON.

For each bad call: ``typed`` (a KVLedgerError) or ``untyped`` (any other exception, a ContractViolation
included) or ``accepted`` (returned normally); separately, whether the full snapshot ``changed`` and
whether the pools' and caches' audits failed afterwards; and whether the typed error was of the class
the row names. One line per setting of ``KVLEDGER_CONTRACTS`` (read at import, so each runs in its own
child process)::

    scripts/bad_input_sweep.py                  # contracts on and off, one JSON line each
    scripts/bad_input_sweep.py --code /tmp/main # the same rows against another checkout's kvledger
    scripts/bad_input_sweep.py --bare           # rows that need the ledger run without one, too

``--bare`` shows what a build with neither contracts nor a ledger does with the rows that only the
ownership ledger can judge (which owner holds an id): the sweep builds their scenes with a ledger.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def _child(bare: bool, show: int) -> dict[str, Any]:
    from kvledger.contracts import switch
    from tests.sweep.cases import CASES, NO_BAD_CALL, NOT_ENTRY_POINTS, QUERIES
    from tests.sweep.table import public_members, run_case, run_query

    counts: collections.Counter[str] = collections.Counter()
    by_category: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    problems: list[str] = []
    for case in CASES:
        if bare and case.needs_ledger:
            case = type(case)(**{**case.__dict__, "needs_ledger": False})
        outcome = run_case(case)
        counts[outcome.kind] += 1
        by_category[case.category][outcome.kind] += 1
        if outcome.changed:
            counts["changed"] += 1
        if outcome.audit_error is not None:
            counts["audit_failed"] += 1
        if outcome.kind == "typed" and not outcome.expected_class:
            counts["typed_other_class"] += 1
        if outcome.clean:
            counts["clean"] += 1
        else:
            problems.append(outcome.describe()[:300])
    query_problems = []
    for query in QUERIES:
        raised, changed = run_query(query)
        if raised is not None or changed:
            query_problems.append(f"{query.member}: {raised!r} {changed}")
    members = public_members()
    covered = {c.member for c in CASES} | {q.member for q in QUERIES} | set(NO_BAD_CALL)
    return {
        "contracts": switch.ENABLED,
        "bare": bare,
        "members": len(members),
        "members_covered": len([m for m in members if m in covered]),
        "members_not_entry_points": len([m for m in members if m in NOT_ENTRY_POINTS]),
        "members_uncovered": [m for m in members if m not in covered and m not in NOT_ENTRY_POINTS],
        "calls_tried": len(CASES),
        "needs_ledger_rows": sum(c.needs_ledger for c in CASES),
        "no_argument_members_checked": len(QUERIES),
        "outcomes": {k: counts[k] for k in ("clean", "typed", "untyped", "accepted", "changed", "audit_failed")},
        "typed_other_class": counts["typed_other_class"],
        "by_category": {cat: dict(c) for cat, c in sorted(by_category.items())},
        "query_problems": query_problems,
        "problems": problems[:show],
        "problems_total": len(problems),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", help="the checkout whose kvledger is swept (default: this one)")
    parser.add_argument("--bare", action="store_true", help="also run the ledger rows without a ledger")
    parser.add_argument("--show", type=int, default=0, help="list up to this many failing rows")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        sys.path[:0] = [p for p in (args.code, str(REPO)) if p]
        print(json.dumps(_child(args.bare, args.show)))
        return 0
    settings = [("1", False), ("0", False)] + ([("0", True)] if args.bare else [])
    for switch_value, bare in settings:
        env = dict(os.environ, KVLEDGER_CONTRACTS=switch_value)
        if args.code:
            env["PYTHONPATH"] = os.pathsep.join([args.code, str(REPO)])
        cmd = [sys.executable, __file__, "--child", "--show", str(args.show)]
        cmd += ["--code", args.code] if args.code else []
        cmd += ["--bare"] if bare else []
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, cwd=REPO)
        if proc.returncode:
            sys.stderr.write(proc.stderr[-4000:])
            return proc.returncode
        print(proc.stdout.strip().splitlines()[-1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
