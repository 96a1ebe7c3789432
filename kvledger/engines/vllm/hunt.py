"""Run the generic machine against one vLLM release and report what it finds (JSON on stdout).

    python -m kvledger.engines.vllm.hunt --release 0.29.0 [--examples N] [--steps N] [--seed S]

One release per process (both are the package ``vllm``), so comparing a release pair is two runs;
:func:`hunt_in_subprocesses` does that for tests. Shrinking is off: the figures are the managers built and CPU
seconds to the *first* failure, the cost of finding the bug, not of minimising it. A clean run reports
``found: null`` with the whole budget spent.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import hypothesis.core
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvledger.engines.vllm.loader import RELEASE_DIR_ENV, load
from kvledger.engines.vllm.machine import HybridMachine, machine_for

INVARIANT = re.compile(r"\bI-[A-Z]+(?:-[A-Z]+)*\b")


@dataclass(frozen=True)
class HuntResult:
    """``found`` is the first invariant ID named by the failure (None when clean); ``error`` its message.
    ``managers_built`` counts the machine's runs that got as far as building a manager (Hypothesis also
    counts runs it discards, so it can exceed ``budget_examples`` on a clean hunt)."""

    release: str
    found: str | None
    managers_built: int
    cpu_s: float
    budget_examples: int
    steps: int
    seed: int
    error: str = ""


def hunt(release: str, examples: int = 200, steps: int = 40, seed: int = 0) -> HuntResult:
    """Pre: ``release`` is installed and no other is imported here. Post: the machine ran until its
    first failure or ``examples`` examples, with Hypothesis seeded by ``seed`` (reproducible)."""
    machine = machine_for(release)
    budget = settings(
        max_examples=examples,
        stateful_step_count=steps,
        phases=[Phase.generate],
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    load(release)  # the import (seconds) is not part of the hunt's cost
    found, error = None, ""
    started = time.process_time()
    try:
        _seeded_run(machine, budget, seed)
    except Exception as exc:  # the failure is the finding: report it, whatever its type
        error = str(exc).splitlines()[0][:600]
        match = INVARIANT.search(str(exc))
        found = match.group(0) if match else type(exc).__name__
    cpu = round(time.process_time() - started, 2)
    return HuntResult(release, found, machine.examples, cpu, examples, steps, seed, error)


def _seeded_run(machine: type[HybridMachine], budget: settings, seed: int) -> None:
    # the same global the pytest plugin's --hypothesis-seed sets: one seed, one reproducible run
    before = hypothesis.core.global_force_seed
    hypothesis.core.global_force_seed = seed  # type: ignore[assignment]
    try:
        run_state_machine_as_test(machine, settings=budget)
    finally:
        hypothesis.core.global_force_seed = before


def hunt_in_subprocesses(
    releases: Sequence[str], examples: int, steps: int = 40, seed: int = 0, timeout: float = 600
) -> list[HuntResult]:
    """:func:`hunt` on each release, each in a fresh interpreter (one vLLM per process), all at once:
    most of a short hunt is vLLM's import, which the processes then overlap."""
    procs = []
    for release in releases:
        argv = [sys.executable, "-m", "kvledger.engines.vllm.hunt", "--release", release]
        argv += ["--examples", str(examples), "--steps", str(steps), "--seed", str(seed)]
        # each release from its own side-by-side folder: a folder override would give all the same one
        env = {k: v for k, v in os.environ.items() if k != RELEASE_DIR_ENV}
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    results = []
    for release, proc in zip(releases, procs, strict=True):
        out, err = proc.communicate(timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"hunt on vLLM {release} exited {proc.returncode}: {err[-2000:]}")
        results.append(HuntResult(**json.loads(out.strip().splitlines()[-1])))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", required=True)
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(json.dumps(asdict(hunt(args.release, args.examples, args.steps, args.seed))))


if __name__ == "__main__":
    main()
