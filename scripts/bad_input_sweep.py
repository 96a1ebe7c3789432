#!/usr/bin/env python
"""The bad-input sweep's counts: every row of ``tests/sweep`` run outside pytest, classified, as JSON.

For each bad call: ``typed`` (a KVLedgerError) or ``untyped`` (any other exception, a ContractViolation
included) or ``accepted`` (returned normally); separately, whether the full snapshot ``changed`` and
whether the pools' and caches' audits failed afterwards; and whether the typed error was of the class
the row names. One line per checking level (``KVLEDGER_CHECKS``, read at import, so each level runs in
its own child process), every row at every level, nothing forced on::

    scripts/bad_input_sweep.py                          # release, owners, ledger, full: one JSON line each
    scripts/bad_input_sweep.py --levels release,owners  # some levels
    scripts/bad_input_sweep.py --code /tmp/main         # the same rows against another checkout's kvledger

Each line counts every row (``outcomes``) and, apart, the rows the level claims to refuse
(``claimed``: every row from ``owners`` up; at ``release`` the rows that need no owner, see
spec/checking-levels.md): ``claimed_outcomes.accepted`` and ``.changed`` must be 0. ``unclaimed`` says what
``release`` does with the ownership rows it does not claim (which of them it accepts and which change
state). Against a checkout without levels, ``KVLEDGER_CONTRACTS`` is set as well (1 for ``full``, else 0).
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


def _count(outcomes: list[Any]) -> dict[str, int]:
    counts: collections.Counter[str] = collections.Counter(o.kind for o in outcomes)
    counts["changed"] = sum(bool(o.changed) for o in outcomes)
    counts["audit_failed"] = sum(o.audit_error is not None for o in outcomes)
    counts["clean"] = sum(o.clean for o in outcomes)
    return {k: counts[k] for k in ("clean", "typed", "untyped", "accepted", "changed", "audit_failed")}


def _child(show: int) -> dict[str, Any]:
    from kvledger.contracts import switch
    from tests.sweep import table
    from tests.sweep.cases import CASES, NO_BAD_CALL, NOT_ENTRY_POINTS, QUERIES
    from tests.sweep.table import public_members, run_case, run_query

    needs_owners = [getattr(c, "needs_owners", getattr(c, "needs_ledger", False)) for c in CASES]
    claimed_by_level = getattr(table, "claimed", None)
    by_category: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    outcomes, claimed, unclaimed = [], [], []
    problems: list[str] = []
    for case in CASES:
        outcome = run_case(case)
        outcomes.append(outcome)
        by_category[case.category][outcome.kind] += 1
        is_claimed = claimed_by_level(case) if claimed_by_level is not None else True
        (claimed if is_claimed else unclaimed).append(outcome)
        if outcome.kind == "typed" and not outcome.expected_class:
            by_category[case.category]["typed_other_class"] += 1
        if is_claimed and not outcome.clean:
            problems.append(outcome.describe()[:300])
    query_problems = []
    for query in QUERIES:
        raised, changed = run_query(query)
        if raised is not None or changed:
            query_problems.append(f"{query.member}: {raised!r} {changed}")
    members = public_members()
    covered = {c.member for c in CASES} | {q.member for q in QUERIES} | set(NO_BAD_CALL)
    level = getattr(switch, "LEVEL", None)
    return {
        "level": level.label if level is not None else ("full" if switch.ENABLED else "release"),
        "contracts": switch.ENABLED,
        "members": len(members),
        "members_covered": len([m for m in members if m in covered]),
        "members_not_entry_points": len([m for m in members if m in NOT_ENTRY_POINTS]),
        "members_uncovered": [m for m in members if m not in covered and m not in NOT_ENTRY_POINTS],
        "calls_tried": len(CASES),
        "needs_owners_rows": sum(needs_owners),
        "no_argument_members_checked": len(QUERIES),
        "outcomes": _count(outcomes),
        "claimed_rows": len(claimed),
        "claimed_outcomes": _count(claimed),
        "unclaimed_rows": len(unclaimed),
        "unclaimed_outcomes": _count(unclaimed),
        "unclaimed_accepted": [o.case.id for o in unclaimed if o.raised is None][:show] if show else None,
        "typed_other_class": sum(1 for o in outcomes if o.kind == "typed" and not o.expected_class),
        "by_category": {cat: dict(c) for cat, c in sorted(by_category.items())},
        "query_problems": query_problems,
        "problems": problems[:show],
        "problems_total": len(problems),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", help="the checkout whose kvledger is swept (default: this one)")
    parser.add_argument(
        "--levels", default="release,owners,ledger,full", help="comma-separated checking levels (default: all)"
    )
    parser.add_argument("--show", type=int, default=0, help="list up to this many failing rows")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        sys.path[:0] = [p for p in (args.code, str(REPO)) if p]
        print(json.dumps(_child(args.show)))
        return 0
    for level in [lv.strip() for lv in args.levels.split(",") if lv.strip()]:
        env = dict(os.environ, KVLEDGER_CHECKS=level, KVLEDGER_CONTRACTS="1" if level == "full" else "0")
        if args.code:
            env["PYTHONPATH"] = os.pathsep.join([args.code, str(REPO)])
        cmd = [sys.executable, __file__, "--child", "--show", str(args.show)]
        cmd += ["--code", args.code] if args.code else []
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, cwd=REPO)
        if proc.returncode:
            sys.stderr.write(proc.stderr[-4000:])
            return proc.returncode
        print(proc.stdout.strip().splitlines()[-1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
