"""``kvledger explore``: every schedule up to a depth on tiny scopes (bounded-exhaustive), clean or with
exhibits installed. Progress (one line per scope and depth reached) goes to stderr as it happens: a deep
exploration takes minutes."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import asdict
from typing import Any

from kvledger.cli.museum import indexed
from kvledger.cli.options import UsageError, int_in
from kvledger.cli.output import console

NAME = "explore"
EXPLORED = (
    "scheduler",
    "cache",
)  # exhibits the explorer's scheduler scopes run (the scheduler runs the caches)


def add_parser(sub: Any) -> None:
    x = sub.add_parser(
        NAME,
        help="every schedule up to a depth on tiny scopes (bounded-exhaustive), clean and per exhibit",
        description=(
            "Breadth-first over every schedule of at most DEPTH actions on each tiny scope (8 KV tokens,"
            " 2 Mamba slots, 3 requests, page 1 and 2), with state hashing; the scheduler machine's checks"
            " after every action and a checked drain at every new state. Clean, or with exhibits installed."
            " Progress goes to stderr, one line per scope and depth."
        ),
    )
    xw = x.add_mutually_exclusive_group()
    xw.add_argument("--exhibit", metavar="NAME", action="append", help="an exhibit id; repeatable")
    xw.add_argument("--all", action="store_true", help="every in-scope scheduler exhibit")
    x.add_argument(
        "--depth",
        metavar="K",
        type=int_in(1, 64),
        default=6,
        help="schedule length bound (1 to 64; default: 6)",
    )
    x.add_argument(
        "--max-states",
        metavar="N",
        type=int_in(1, 10**8),
        default=20_000,
        help="per scope (1 to 100,000,000; default: 20000)",
    )
    x.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def _exhibits(ns: argparse.Namespace) -> list[Any]:
    from kvledger.museum import catalogue

    if ns.all:
        return [e for e in catalogue.huntable() if e.machine in EXPLORED]
    if not ns.exhibit:
        return [None]
    return [catalogue.exhibit(n) for n in ns.exhibit]  # names checked in run()


def _check_names(names: list[str]) -> None:
    """Refuse an unknown, out-of-scope or PD exhibit before the catalogue (torch) loads."""
    bad = [e["id"] for e in map(indexed, names) if e["machine"] not in EXPLORED]
    if bad:
        raise UsageError(f"{', '.join(bad)}: not scheduler or cache exhibits")


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run(ns: argparse.Namespace) -> int:
    _check_names(ns.exhibit or [])
    from kvledger.museum.explore import SCOPES, explore

    exhibits = _exhibits(ns)
    rows: list[dict[str, Any]] = []
    for e in exhibits:
        label = e.id if e else "(clean)"
        for scope in SCOPES:
            where = f"explore {label} on {scope.name}"
            _say(f"{where}: to depth {ns.depth}")

            def level(done: int, states: int, where: str = where) -> None:
                # Called when the schedules of length ``done`` start to be extended.
                _say(f"{where}: depth {done} of {ns.depth} reached, {states:,} states so far")

            with e.installed() if e else contextlib.nullcontext():
                r = explore(scope, ns.depth, max_states=ns.max_states, on_level=level)
            verdict = (
                f"found {r.invariant}" if r.violation else ("clean" if r.complete else "cut at --max-states")
            )
            _say(f"{where}: {verdict} ({r.states:,} states, {r.schedules:,} schedules, {r.seconds:.1f} s)")
            rows.append({"exhibit": label, **asdict(r)})
            if r.violation and e is not None:
                break  # found on this scope: the other scopes are not needed for the verdict
    if ns.json:
        print(
            json.dumps({"depth": ns.depth, "scopes": [s.describe() for s in SCOPES], "runs": rows}, indent=1)
        )
    else:
        _table(ns.depth, rows)
    found = [r for r in rows if r["violation"]]
    return (1 if found else 0) if exhibits == [None] else 0


def _table(depth: int, rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    table = Table(title=f"kvledger explore (depth {depth})")
    key = ("exhibit", "scope", "invariant", "path")
    for col in ("exhibit", "scope", "states", "schedules", "depth", "seconds", "found", "invariant", "path"):
        table.add_column(col, overflow="fold" if col in key else "ellipsis")
    for row in rows:
        table.add_row(
            row["exhibit"],
            row["scope"],
            str(row["states"]),
            str(row["schedules"]),
            f"{row['depth_reached']}/{row['depth']}" + ("" if row["complete"] else " (cut)"),
            f"{row['seconds']:.1f}",
            "yes" if row["violation"] else "no",
            row["invariant"] or "-",
            " ".join(f"{a}({v})" for a, v in row["path"]) or "-",
        )
    console().print(table)
