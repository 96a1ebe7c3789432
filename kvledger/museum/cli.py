"""``kvledger hunt`` and ``kvledger museum``: the command-line side of the museum.

``kvledger museum`` lists the exhibits (id, scope, what each replaces, the invariants it breaks).
``kvledger hunt [--exhibit NAME | --all] [--budget SECONDS] [--seed N] [--json]`` installs each exhibit in
turn and runs the generic machine for it; with neither option it is a clean run of every machine
(scheduler, PD, cache; ``--machine NAME`` for one): any failure is a bug. Exit status: 0 when every
exhibit hunted was found (a clean run: nothing found), 1 otherwise, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kvledger.museum.machines import MACHINES

COMMANDS = ("hunt", "museum", "explore")
EXPLORED = ("scheduler", "cache")  # exhibits the explorer's scheduler scopes run (the scheduler runs the caches)


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def add_commands(sub: Any) -> None:
    h = sub.add_parser(
        "hunt",
        help="put historical bugs back one at a time and let the generic state machines find them",
        description=(
            "Install a museum exhibit (a historical bug re-enacted by replacing one method), run the generic"
            " state machine for it under a wall-clock budget, and report: found or not, seconds, examples,"
            " the invariant that fired, and a shrunk repro script. With no exhibit: a clean run."
        ),
    )
    which = h.add_mutually_exclusive_group()
    which.add_argument(
        "--exhibit", metavar="NAME", action="append", help="an exhibit id (B5, #16067, N4, ...); repeatable"
    )
    which.add_argument("--all", action="store_true", help="every in-scope exhibit")
    which.add_argument(
        "--machine", metavar="NAME", action="append", choices=MACHINES, help=f"a clean run of one machine {MACHINES}"
    )
    h.add_argument("--budget", metavar="SECONDS", type=_positive, default=60.0, help="per exhibit (default: 60)")
    h.add_argument("--shrink", metavar="SECONDS", type=_positive, default=20.0, help="shrinking limit (default: 20)")
    h.add_argument("--seed", metavar="N", type=_seed, default=0, help="base seed of the batches (default: 0)")
    h.add_argument("--out", metavar="DIR", type=Path, default=Path("hunt-repros"), help="where repro scripts go")
    h.add_argument("--no-verify", action="store_true", help="do not run each repro script to confirm it")
    h.add_argument("--json", action="store_true", help="print one JSON document on stdout (progress on stderr)")
    sub.add_parser("museum", help="list the museum's exhibits", description="List the museum's exhibits.")
    x = sub.add_parser(
        "explore",
        help="every schedule up to a depth on tiny scopes (bounded-exhaustive), clean and per exhibit",
        description=(
            "Breadth-first over every schedule of at most DEPTH actions on each tiny scope (8 KV tokens,"
            " 2 Mamba slots, 3 requests, page 1 and 2), with state hashing; the scheduler machine's checks"
            " after every action and a checked drain at every new state. Clean, or with exhibits installed."
        ),
    )
    xw = x.add_mutually_exclusive_group()
    xw.add_argument("--exhibit", metavar="NAME", action="append", help="an exhibit id; repeatable")
    xw.add_argument("--all", action="store_true", help="every in-scope scheduler exhibit")
    x.add_argument("--depth", metavar="K", type=int, default=6, help="schedule length bound (default: 6)")
    x.add_argument("--max-states", metavar="N", type=int, default=20_000, help="per scope (default: 20000)")
    x.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def run(ns: argparse.Namespace) -> int:
    if ns.command == "museum":
        return _list()
    if ns.command == "explore":
        return _explore(ns)
    return _hunt(ns)


def _explore(ns: argparse.Namespace) -> int:
    from dataclasses import asdict

    from rich.console import Console
    from rich.table import Table

    from kvledger.museum import catalogue
    from kvledger.museum.explore import SCOPES, explore

    console = Console(stderr=ns.json)
    if ns.depth < 1 or ns.max_states < 1:
        print("kvledger explore: error: --depth and --max-states must be >= 1", file=sys.stderr)
        return 2
    if ns.all:
        exhibits: list[Any] = [e for e in catalogue.huntable() if e.machine in EXPLORED]
    elif ns.exhibit:
        try:
            exhibits = [catalogue.exhibit(n) for n in ns.exhibit]
        except KeyError as exc:
            print(f"kvledger explore: error: {exc.args[0]}", file=sys.stderr)
            return 2
        bad = [e.id for e in exhibits if not e.huntable or e.machine not in EXPLORED]
        if bad:
            print(f"kvledger explore: error: {', '.join(bad)}: not scheduler or cache exhibits", file=sys.stderr)
            return 2
    else:
        exhibits = [None]
    rows: list[dict[str, Any]] = []
    for e in exhibits:
        for scope in SCOPES:
            label = e.id if e else "(clean)"
            status = console.status(f"explore {label} on {scope.name} to depth {ns.depth}")
            with status, e.installed() if e else _nothing():
                r = explore(scope, ns.depth, max_states=ns.max_states)
            row = {"exhibit": label, **asdict(r)}
            rows.append(row)
            if r.violation and e is not None:
                break  # found on this scope: the other scopes are not needed for the verdict
    if ns.json:
        print(json.dumps({"depth": ns.depth, "scopes": [s.describe() for s in SCOPES], "runs": rows}, indent=1))
    else:
        table = Table(title=f"kvledger explore (depth {ns.depth})")
        for col in ("exhibit", "scope", "states", "schedules", "depth", "seconds", "found", "invariant", "path"):
            table.add_column(col)
        for row in rows:
            table.add_row(
                row["exhibit"], row["scope"], str(row["states"]), str(row["schedules"]),
                f"{row['depth_reached']}/{row['depth']}" + ("" if row["complete"] else " (cut)"),
                f"{row['seconds']:.1f}", "yes" if row["violation"] else "no", row["invariant"] or "-",
                " ".join(f"{a}({v})" for a, v in row["path"]) or "-",
            )
        console.print(table)
    clean = exhibits == [None]
    found = [r for r in rows if r["violation"]]
    return (1 if found else 0) if clean else 0


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _list() -> int:
    from rich.console import Console
    from rich.table import Table

    from kvledger.museum import EXHIBITS

    table = Table(title="kvledger museum")
    for col in ("id", "scope", "machine", "replaces", "breaks", "title"):
        table.add_column(col)
    for e in EXHIBITS:
        table.add_row(
            e.id, e.scope, e.machine if e.huntable else "-", e.replaces or "-", ", ".join(e.breaks), e.title
        )
    Console().print(table)
    return 0


def _hunt(ns: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from kvledger.museum import catalogue
    from kvledger.museum.hunt import HuntResult, hunt

    console = Console(stderr=ns.json)
    targets: list[tuple[Any, str | None]]
    if ns.all:
        targets = [(e, None) for e in catalogue.huntable()]
    elif ns.exhibit:
        targets = []
        for name in ns.exhibit:
            try:
                e = catalogue.exhibit(name)
            except KeyError as exc:
                print(f"kvledger hunt: error: {exc.args[0]}", file=sys.stderr)
                return 2
            if not e.huntable:
                why = e.why_out_of_scope
                print(f"kvledger hunt: error: {e.id} is out of the model's scope: {why}", file=sys.stderr)
                return 2
            targets.append((e, None))
    else:
        targets = [(None, name) for name in ns.machine or MACHINES]
    results: list[HuntResult] = []
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[examples]} examples"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        for exhibit, machine in targets:
            label = exhibit.id if exhibit else f"(clean) {machine}"
            task = progress.add_task(f"hunt {label}", total=ns.budget, examples=0)

            def tick(n: int, task: Any = task) -> None:
                elapsed = progress.tasks[task].elapsed or 0.0
                progress.update(task, examples=n, completed=min(elapsed, ns.budget))

            result = hunt(
                exhibit,
                machine=machine,
                budget=ns.budget,
                seed=ns.seed,
                shrink_seconds=ns.shrink,
                out_dir=ns.out,
                verify=not ns.no_verify,
                on_example=tick,
            )
            results.append(result)
            verdict = (
                f"found {result.invariant} in {result.seconds:.1f} s" if result.found else "not found"
            )
            progress.update(task, completed=ns.budget, description=f"hunt {label}: {verdict}")
    clean_run = not ns.all and not ns.exhibit
    if ns.json:
        print(json.dumps({"budget_s": ns.budget, "seed": ns.seed, "results": [r.as_json() for r in results]}, indent=1))
    else:
        _summary(console, results)
    if clean_run:
        return 1 if any(r.found for r in results) else 0
    return 0 if all(r.found for r in results) else 1


def _summary(console: Any, results: list[Any]) -> None:
    from rich.table import Table

    table = Table(title="kvledger hunt")
    for col in ("exhibit", "machine", "found", "seconds", "examples", "invariant", "expected", "repro steps", "repro"):
        table.add_column(col)
    for r in results:
        table.add_row(
            r.exhibit,
            r.machine,
            "yes" if r.found else "no",
            f"{r.seconds:.1f}",
            str(r.examples),
            r.invariant or "-",
            "-" if r.expected is None else ("yes" if r.expected else "no"),
            "-" if r.repro_steps is None else str(r.repro_steps),
            "-" if r.repro is None else (r.repro + ("" if r.repro_verified else " (NOT verified)")),
        )
    console.print(table)
