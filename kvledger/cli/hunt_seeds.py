"""``kvledger hunt --seeds N``: detection measured across seeds (:mod:`kvledger.museum.detection`).

Every target (an exhibit, or a machine run clean) is hunted at N consecutive seeds from ``--seed``, each
stopped at its first failing example. The table (or ``--json``) gives, per target, in how many seeds it
was found within ``--budget`` (wall seconds, or with ``--cpu-budget`` CPU seconds of the hunting
process), in how many the invariant that fired is one the exhibit lists, the median examples, wall
seconds and CPU seconds to the first failing example over the seeds that found it, the slowest, and the
invariants. Exit status: 0 when every exhibit was found at every seed (a clean run: nothing found at any
seed), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from kvledger.cli.output import console
from kvledger.process import interrupt


def run_seeds(ns: argparse.Namespace, targets: list[tuple[Any, str | None]], progress: Any) -> int:
    from kvledger.museum.detection import Detection, SeedRun, detect, load_average, seeds_from

    seeds = seeds_from(ns.seed, ns.seeds)
    load_start = load_average()
    detections: list[Detection] = []
    with progress:
        for exhibit, machine in targets:
            label = exhibit.id if exhibit else f"(clean) {machine}"

            def on_start(seed: int, label: str = label) -> Callable[[int], None]:
                tick = progress.start(f"{label} seed {seed}", ns.budget)

                def on_example(n: int) -> None:
                    interrupt.check()  # a swallowed Ctrl-C stops the measurement at its next example
                    tick(n)

                return on_example

            def on_seed(run: SeedRun, label: str = label) -> None:
                verdict = (
                    f"found {run.invariant} in {run.seconds:.1f} s, {run.cpu_seconds:.1f} CPU s"
                    f" ({run.examples} examples)"
                    if run.found
                    else f"not found ({run.examples} examples)"
                )
                progress.end(f"{label} seed {run.seed}", verdict)

            detections.append(
                detect(
                    exhibit,
                    seeds,
                    machine=machine,
                    budget=ns.budget,
                    max_batches=ns.batches,
                    on_start=on_start,
                    on_seed=on_seed,
                    cpu_budget=ns.cpu_budget,
                )
            )
    load_end = load_average()
    if ns.json:
        doc = {
            "budget_s": ns.budget,
            "budget_clock": "cpu" if ns.cpu_budget else "wall",
            "batches": ns.batches,
            "seeds": seeds,
            "load_average_start": load_start,
            "load_average_end": load_end,
            "results": [d.as_json() for d in detections],
        }
        print(json.dumps(doc, indent=1))
    else:
        _table(detections, seeds, ns.budget, ns.batches, load_start, load_end, ns.cpu_budget)
    every_run = [run for d in detections for run in d.runs]
    if not ns.all and not ns.exhibit:  # a clean run
        return 1 if any(run.found for run in every_run) else 0
    return 0 if all(run.found for run in every_run) else 1


def _number(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _table(
    detections: list[Any],
    seeds: list[int],
    budget: float,
    batches: int | None,
    load_start: Any,
    load_end: Any,
    cpu_budget: bool = False,
) -> None:
    from rich.table import Table

    loads = "" if load_start is None else f", load average {load_start:.1f} -> {load_end:.1f}"
    clock = "CPU s" if cpu_budget else "s"
    bound = f"budget {budget:g} {clock}" + ("" if batches is None else f" or {batches} batches of 8 examples")
    title = f"kvledger hunt: detection over seeds {seeds[0]}..{seeds[-1]}, {bound}{loads}"
    table = Table(title=title)
    for col in (
        "exhibit",
        "machine",
        "found",
        "listed",
        "median examples",
        "median s",
        "max s",
        "median CPU s",
        "max CPU s",
        "invariants",
    ):
        table.add_column(col, overflow="fold" if col in ("exhibit", "invariants") else "ellipsis")
    n = len(seeds)
    for d in detections:
        table.add_row(
            d.exhibit,
            d.machine,
            f"{d.found_in}/{n}",
            "-" if d.exhibit == "(clean)" else f"{d.expected_in}/{n}",
            _number(d.median_examples, "g"),
            _number(d.median_seconds, ".1f"),
            _number(d.max_seconds, ".1f"),
            _number(d.median_cpu_seconds, ".1f"),
            _number(d.max_cpu_seconds, ".1f"),
            " ".join(d.invariants) or "-",
        )
    console().print(table)
