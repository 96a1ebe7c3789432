"""Detection measured across seeds: in how many of N seeds the hunt finds an exhibit within its budget.

One seed says whether *that* example stream reached the bug; a rate over seeds says whether the machine
reaches it (issue 25: several exhibits were found at one seed and not at another). Each seed is a full
hunt (:func:`.hunt.hunt`) stopped at the first failing example: no shrink, no step deletion, no repro
script, so a measurement costs the time to find and nothing after it. Per exhibit the result gives
the seeds found within the budget, the median examples and seconds to the first failing example over
those seeds, the slowest, and the invariants that fired (each checked against the exhibit's list).

Examples are the figure that does not depend on the machine's load; wall seconds do (the JSON carries
the load average at the start and the end of the measurement). CPU seconds of the hunting process are
reported alongside, and the budget may be counted in them (``cpu_budget``): on a machine shared with
other work they stay close to what the hunt costs alone.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvledger.museum.exhibit import Exhibit
from kvledger.museum.hunt import HuntResult, hunt


@dataclass
class SeedRun:
    """One seed's hunt, as far as detection is concerned."""

    seed: int
    found: bool
    seconds: float  # to the first failing example; the whole budget when not found
    examples: int  # examples started up to the first failing one (all of them when not found)
    invariant: str | None
    expected: bool | None  # the invariant is one the exhibit lists (None: a clean run)
    cpu_seconds: float = 0.0  # the hunting process's CPU seconds, to the same point

    @classmethod
    def of(cls, seed: int, result: HuntResult) -> SeedRun:
        return cls(
            seed, result.found, result.seconds, result.examples, result.invariant, result.expected,
            result.cpu_seconds,
        )  # fmt: skip


@dataclass
class Detection:
    """An exhibit (or a clean machine) hunted at several seeds."""

    exhibit: str  # "(clean)" for a clean run
    machine: str
    budget: float
    runs: list[SeedRun]

    @property
    def found_in(self) -> int:
        return sum(r.found for r in self.runs)

    @property
    def expected_in(self) -> int:
        """Seeds whose find named an invariant the exhibit lists."""
        return sum(bool(r.found and r.expected) for r in self.runs)

    def _found(self, attr: str) -> list[float]:
        return [float(getattr(r, attr)) for r in self.runs if r.found]

    @property
    def median_examples(self) -> float | None:
        found = self._found("examples")
        return statistics.median(found) if found else None

    @property
    def median_seconds(self) -> float | None:
        found = self._found("seconds")
        return statistics.median(found) if found else None

    @property
    def median_cpu_seconds(self) -> float | None:
        found = self._found("cpu_seconds")
        return statistics.median(found) if found else None

    @property
    def max_cpu_seconds(self) -> float | None:
        found = self._found("cpu_seconds")
        return max(found) if found else None

    @property
    def max_seconds(self) -> float | None:
        found = self._found("seconds")
        return max(found) if found else None

    @property
    def invariants(self) -> list[str]:
        return sorted({r.invariant for r in self.runs if r.invariant})

    def as_json(self) -> dict[str, Any]:
        return {
            "exhibit": self.exhibit,
            "machine": self.machine,
            "budget_s": self.budget,
            "seeds": len(self.runs),
            "found_in": self.found_in,
            "expected_in": self.expected_in,
            "median_examples": self.median_examples,
            "median_seconds": self.median_seconds,
            "max_seconds": self.max_seconds,
            "median_cpu_seconds": self.median_cpu_seconds,
            "max_cpu_seconds": self.max_cpu_seconds,
            "invariants": self.invariants,
            "runs": [vars(r) for r in self.runs],
        }


def seeds_from(first: int, count: int) -> list[int]:
    """The seeds of a measurement: ``count`` consecutive ones from ``first``."""
    return list(range(first, first + count))


def load_average() -> float | None:
    """The one-minute load average (None where the platform has none): the context of the seconds."""
    try:
        return os.getloadavg()[0]
    except OSError:  # pragma: no cover - no load average on this platform
        return None


def detect(
    exhibit: Exhibit | None,
    seeds: Sequence[int],
    *,
    machine: str | None = None,
    budget: float = 60.0,
    max_batches: int | None = None,
    on_start: Callable[[int], Callable[[int], None]] = lambda seed: lambda n: None,
    on_seed: Callable[[SeedRun], None] = lambda run: None,
    cpu_budget: bool = False,
) -> Detection:
    """Hunt ``exhibit`` (or run ``machine`` clean) once per seed, each stopped at its first failing example.
    ``on_start(seed)`` is called as a seed's hunt starts and returns what is called with the examples
    started so far (progress, an interrupt check); ``on_seed`` gets each seed's run as it ends."""
    runs: list[SeedRun] = []
    name = machine or (exhibit.machine if exhibit else "scheduler")
    for seed in seeds:
        on_example = on_start(seed)
        result = hunt(
            exhibit,
            machine=name,
            budget=budget,
            seed=seed,
            max_batches=max_batches,
            out_dir=None,
            verify=False,
            on_example=on_example,
            shrink=False,
            cpu_budget=cpu_budget,
        )
        run = SeedRun.of(seed, result)
        runs.append(run)
        on_seed(run)
    return Detection(exhibit.id if exhibit else "(clean)", name, budget, runs)
