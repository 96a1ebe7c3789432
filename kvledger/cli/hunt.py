"""``kvledger hunt``: put historical bugs back one at a time and let the generic state machines find them.

``kvledger hunt [--exhibit NAME | --all | --machine NAME] [--budget SECONDS] [--seed N] [--json]``
installs each exhibit in turn and runs the generic machine for it; with no exhibit it is a clean run of
every machine (scheduler, PD, cache): any failure is a bug. Exit status: 0 when every exhibit hunted was
found (a clean run: nothing found), 1 otherwise, 2 for a usage error (``--out`` is checked before the
first second of hunting). Progress goes to stderr: a live display on a terminal, one line per hunt
otherwise; the table (or ``--json``) to stdout.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any

from kvledger.cli.checks import add_checks_option, apply_checks
from kvledger.cli.museum import indexed
from kvledger.cli.options import UsageError, int_in, seconds
from kvledger.cli.output import console
from kvledger.process import interrupt

NAME = "hunt"
MACHINES = ("scheduler", "pd", "cache")
"""The generic machines (``kvledger.museum.machines.MACHINES``, which is behind the catalogue's import of
torch; a test keeps the two equal)."""


def add_parser(sub: Any) -> None:
    h = sub.add_parser(
        NAME,
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
        "--machine",
        metavar="NAME",
        action="append",
        choices=MACHINES,
        help=f"a clean run of one machine {MACHINES}",
    )
    h.add_argument(
        "--budget", metavar="SECONDS", type=seconds, default=60.0, help="per exhibit (default: 60)"
    )
    h.add_argument(
        "--cpu-budget",
        action="store_true",
        help=(
            "count --budget in CPU seconds of the hunting process, not wall seconds (a machine shared with"
            " other work inflates the wall clock); the reports give both either way"
        ),
    )
    h.add_argument(
        "--shrink", metavar="SECONDS", type=seconds, default=20.0, help="shrinking limit (default: 20)"
    )
    h.add_argument(
        "--seed",
        metavar="N",
        type=int_in(0, 2**63 - 1),
        default=0,
        help="base seed of the batches (default: 0)",
    )
    h.add_argument(
        "--batches",
        metavar="N",
        type=int_in(1, 100_000),
        default=None,
        help=(
            "also stop each hunt after N batches of 8 examples: a bound that does not depend on the"
            " machine's load (default: the budget alone)"
        ),
    )
    h.add_argument(
        "--seeds",
        metavar="N",
        type=int_in(1, 1000),
        default=None,
        help=(
            "measure detection: hunt at N seeds (--seed, --seed+1, ...), each stopped at its first failing"
            " example (no shrink, no repro); report per exhibit in how many seeds it was found within the"
            " budget, the median examples and seconds"
        ),
    )
    h.add_argument(
        "--out",
        metavar="DIR",
        type=Path,
        default=Path("hunt-repros"),
        help="directory for the repro scripts, made when the first one is written (default: hunt-repros)",
    )
    h.add_argument("--no-verify", action="store_true", help="do not run each repro script to confirm it")
    h.add_argument(
        "--json", action="store_true", help="print one JSON document on stdout (progress on stderr)"
    )
    add_checks_option(h)  # detection per checking level (spec/checking-levels.md)


def out_dir_problem(path: Path) -> str | None:
    """Why ``--out`` cannot hold the repro scripts, or None. Nothing is created here."""
    import os

    if path.exists():
        if not path.is_dir():
            return f"--out {path}: exists and is not a directory"
        ancestor = path
    else:
        ancestor = path.parent
        while not ancestor.exists() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            return f"--out {path}: {ancestor} is not a directory"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"--out {path}: {ancestor} is not writable"
    return None


def _targets(ns: argparse.Namespace) -> list[tuple[Any, str | None]]:
    """(exhibit, None) per exhibit to hunt, or (None, machine) per machine of a clean run."""
    from kvledger.museum import catalogue

    if ns.all:
        return [(e, None) for e in catalogue.huntable()]
    if not ns.exhibit:
        return [(None, name) for name in ns.machine or MACHINES]
    return [(catalogue.exhibit(name), None) for name in ns.exhibit]  # names checked in run()


class _Lines:
    """Progress off a terminal: one line on stderr when a hunt starts and one when it ends."""

    def __enter__(self) -> _Lines:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def start(self, label: str, budget: float) -> Any:
        print(f"hunt {label}: started (budget {budget:g} s)", file=sys.stderr, flush=True)
        return lambda n: None

    def phase(self, label: str, phase: str) -> None:
        print(f"hunt {label}: found, {phase}", file=sys.stderr, flush=True)

    def end(self, label: str, verdict: str) -> None:
        print(f"hunt {label}: {verdict}", file=sys.stderr, flush=True)


class _Live:
    """Progress on a terminal: a spinner, a bar over the budget and the examples tried, per hunt."""

    def __init__(self, budget: float) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.budget = budget
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[examples]} examples"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        self.task: Any = None

    def __enter__(self) -> _Live:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(None, None, None)

    def start(self, label: str, budget: float) -> Any:
        self.task = task = self.progress.add_task(f"hunt {label}", total=budget, examples=0)

        def tick(n: int) -> None:
            elapsed = self.progress.tasks[task].elapsed or 0.0
            self.progress.update(task, examples=n, completed=min(elapsed, budget))

        return tick

    def phase(self, label: str, phase: str) -> None:
        """After the first failure: the bar pulses (no total) and says what runs, which counts no example."""
        self.progress.update(self.task, total=None, description=f"hunt {label}: found, {phase}")

    def end(self, label: str, verdict: str) -> None:
        self.progress.update(
            self.task, total=self.budget, completed=self.budget, description=f"hunt {label}: {verdict}"
        )


def run(ns: argparse.Namespace) -> int:
    problem = out_dir_problem(ns.out)
    if problem is not None:
        raise UsageError(problem)
    for name in ns.exhibit or ():
        indexed(name)  # an unknown or out-of-scope name is refused before the catalogue (torch) loads
    apply_checks(ns)  # another level than the process's: a new process, started at it
    targets = _targets(ns)
    if ns.seeds is not None:
        from kvledger.cli.hunt_seeds import run_seeds

        return run_seeds(ns, targets, _Live(ns.budget) if sys.stderr.isatty() else _Lines())
    from kvledger.museum.hunt import HuntResult, hunt

    results: list[HuntResult] = []
    with _Live(ns.budget) if sys.stderr.isatty() else _Lines() as progress:
        for exhibit, machine in targets:
            label = exhibit.id if exhibit else f"(clean) {machine}"
            tick = progress.start(label, ns.budget)

            def on_example(n: int, tick: Any = tick) -> None:
                interrupt.check()  # a swallowed Ctrl-C stops the hunt at its next example
                tick(n)

            result = hunt(
                exhibit,
                machine=machine,
                budget=ns.budget,
                seed=ns.seed,
                shrink_seconds=ns.shrink,
                out_dir=ns.out,
                verify=not ns.no_verify,
                on_example=on_example,
                max_batches=ns.batches,
                cpu_budget=ns.cpu_budget,
                on_phase=functools.partial(progress.phase, label),
            )
            results.append(result)
            progress.end(
                label, f"found {result.invariant} in {result.seconds:.1f} s" if result.found else "not found"
            )
    if ns.json:
        from kvledger.contracts.switch import LEVEL

        doc = {"budget_s": ns.budget, "seed": ns.seed, "checks": LEVEL.label, "results": [r.as_json() for r in results]}
        print(json.dumps(doc, indent=1))
    else:
        _summary(results)
    if not ns.all and not ns.exhibit:  # a clean run
        return 1 if any(r.found for r in results) else 0
    return 0 if all(r.found for r in results) else 1


def _summary(results: list[Any]) -> None:
    """The results as a table; on a terminal too narrow for it, one short block per hunt instead (a table
    folded to 80 columns turns every row into three-line cells)."""
    from rich.table import Table

    out = console()
    table = Table(title="kvledger hunt")
    key = ("exhibit", "invariant", "repro")  # never cut: they fold on a narrow terminal
    for col in (
        "exhibit",
        "machine",
        "found",
        "seconds",
        "examples",
        "invariant",
        "expected",
        "repro steps",
        "repro",
    ):
        table.add_column(col, overflow="fold" if col in key else "ellipsis")
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
    if out.measure(table, options=out.options.update_width(100_000)).maximum <= out.width:
        out.print(table)
        return
    for r in results:
        out.print(_block(r), markup=False, highlight=False, soft_wrap=True)


def _block(r: Any) -> str:
    """One hunt's result in two lines, for a narrow terminal."""
    if not r.found:
        return f"{r.exhibit} ({r.machine}): not found in {r.seconds:.1f} s, {r.examples} examples"
    expected = "" if r.expected is None else (" (listed)" if r.expected else " (NOT listed by the exhibit)")
    head = f"{r.exhibit} ({r.machine}): found {r.invariant}{expected} in {r.seconds:.1f} s, {r.examples} examples"
    if r.repro is None:
        return head
    verified = "verified" if r.repro_verified else "NOT verified"
    return f"{head}\n  repro: {r.repro} ({r.repro_steps} steps, {verified})"
