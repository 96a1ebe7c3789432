"""Detection measured across seeds (``kvledger hunt --seeds N``, ``kvledger.museum.detection``).

Bounded by batches, never by the clock, so what is asserted (found or not, the examples) is a function of
the seeds; the seconds are reported, never asserted.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from kvledger.contracts import switch
from kvledger.museum import exhibit
from kvledger.museum.detection import Detection, SeedRun, detect, seeds_from
from tests.cli.process import kvledger

needs_contracts = pytest.mark.skipif(not switch.ENABLED, reason="contracts are off (KVLEDGER_CONTRACTS=0)")


def test_the_summary_counts_finds_and_takes_medians_over_the_seeds_that_found() -> None:
    runs = [
        SeedRun(0, True, 2.0, 7, "I-COUNT", True),
        SeedRun(1, False, 60.0, 900, None, None),
        SeedRun(2, True, 4.0, 13, "I-EXCLUSIVE", False),
        SeedRun(3, True, 1.0, 3, "I-COUNT", True),
    ]
    d = Detection("B1", "scheduler", 60.0, runs)
    assert (d.found_in, d.expected_in) == (3, 2)
    assert (d.median_examples, d.median_seconds, d.max_seconds) == (7, 2.0, 4.0)
    assert d.invariants == ["I-COUNT", "I-EXCLUSIVE"]
    assert d.as_json()["runs"][1] == {
        "seed": 1, "found": False, "seconds": 60.0, "examples": 900, "invariant": None, "expected": None,
        "cpu_seconds": 0.0,
    }  # fmt: skip
    nothing = Detection("(clean)", "cache", 60.0, [SeedRun(5, False, 60.0, 100, None, None)])
    assert nothing.median_examples is None and nothing.max_seconds is None and nothing.invariants == []
    assert seeds_from(3, 4) == [3, 4, 5, 6]


@needs_contracts
def test_each_seed_stops_at_its_first_failing_example_with_the_same_draws_as_a_hunt() -> None:
    started: list[int] = []

    def on_start(seed: int) -> Callable[[int], None]:
        started.append(seed)
        return lambda n: None

    d = detect(exhibit("B8"), [0, 1], budget=3600, max_batches=8, on_start=on_start)
    assert started == [0, 1] and d.found_in == 2 and d.expected_in == 2, d
    assert all(r.examples <= 8 * 8 for r in d.runs)
    again = detect(exhibit("B8"), [0], budget=3600, max_batches=8)  # a function of the seed
    assert again.runs[0].examples == d.runs[0].examples


@needs_contracts
def test_the_command_reports_per_exhibit_as_json_and_a_table(tmp_path: Path) -> None:
    done = kvledger("hunt", "--exhibit", "B8", "--seeds", "2", "--batches", "8", "--json", see_imports=False)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert doc["seeds"] == [0, 1] and doc["batches"] == 8 and doc["load_average_start"] is not None
    (b8,) = doc["results"]
    assert b8["exhibit"] == "B8" and b8["found_in"] == 2 and b8["median_examples"] > 0
    assert "hunt B8 seed 1: found I-ROW-EXCLUSIVE-WHILE-IN-FLIGHT" in done.stderr
    table = kvledger("hunt", "--machine", "cache", "--seeds", "1", "--batches", "1", see_imports=False)
    assert table.returncode == 0, table.stderr[-2000:]  # a clean run that found nothing
    assert "detection over seeds 0..0" in table.stdout and "0/1" in table.stdout


def test_cpu_seconds_are_summarised_like_wall_seconds() -> None:
    runs = [SeedRun(0, True, 9.0, 7, "I-COUNT", True, 3.0), SeedRun(1, True, 20.0, 9, "I-COUNT", True, 5.0)]
    d = Detection("B1", "scheduler", 60.0, runs)
    assert (d.median_cpu_seconds, d.max_cpu_seconds) == (4.0, 5.0)
    assert d.as_json()["median_cpu_seconds"] == 4.0


@needs_contracts
def test_a_cpu_budget_bounds_the_hunt_by_this_processs_cpu_seconds() -> None:
    """A budget of 0.5 CPU seconds stops a clean hunt after a few examples; the result gives the CPU
    seconds spent, which a CPU budget keeps near it (one example's overrun at most)."""
    d = detect(None, [0], machine="cache", budget=0.5, max_batches=50, cpu_budget=True)
    (run,) = d.runs
    assert not run.found and 0 < run.examples < 50 * 8
    assert 0.5 <= run.cpu_seconds < 0.5 + 30
    done = kvledger(
        "hunt", "--machine", "cache", "--seeds", "1", "--budget", "0.5", "--cpu-budget", "--json",
        see_imports=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert doc["budget_clock"] == "cpu" and doc["results"][0]["runs"][0]["cpu_seconds"] >= 0.5
