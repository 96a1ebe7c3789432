"""The cost of the data oracle (issue 25, item 1): the hunt's examples per CPU second with and without it.

A clean hunt (no exhibit) of each generic machine for a fixed number of batches and a fixed seed, with
the data tags on (the machines as they are: the tagged hash runner, the checks after every rule) and off
(``with_data_tags`` replaced by the identity: the plain hash runner, no KV buffer, the oracle a no-op).
The tags change no token and no draw, so both settings run the very same examples; the figure is CPU
time (``time.process_time``, less sensitive to other processes than the wall clock), rounds alternating
so that a slow spell of the machine hits both. Budget of issue 25: ``slowdown <= 1.3``.

    python benchmarks/data_oracle_cost.py [--machines scheduler,pd,cache] [--batches N] [--rounds N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _figures import per_second, ratio


@contextlib.contextmanager
def data_tags(on: bool) -> Iterator[None]:
    from kvledger.museum.machines import pd, scheduler

    if on:
        yield
        return
    with (
        mock.patch.object(scheduler, "with_data_tags", lambda spec: spec),
        mock.patch.object(pd, "with_data_tags_pd", lambda spec: spec),
    ):
        yield


def one_run(machine: str, batches: int, seed: int, on: bool) -> tuple[int, float]:
    from kvledger.museum.hunt import hunt

    with data_tags(on):
        start = time.process_time()
        result = hunt(
            None,
            machine=machine,
            max_batches=batches,
            seed=seed,
            shrink_seconds=0,
            minimize_seconds=0,
            verify=False,
            budget=3600,
        )
        cpu = time.process_time() - start
    if result.found:
        raise SystemExit(f"{machine}: the clean hunt failed ({result.message})")
    return result.examples, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machines", default="scheduler,cache,pd")
    ap.add_argument("--batches", type=int, default=6, help="batches of 8 examples per run (default 6)")
    ap.add_argument("--rounds", type=int, default=2, help="alternating off/on rounds (default 2)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out: dict[str, Any] = {"benchmark": "data_oracle_cost", "batches": args.batches, "seed": args.seed}
    for machine in args.machines.split(","):
        totals = {False: [0, 0.0], True: [0, 0.0]}
        for _ in range(args.rounds):
            for on in (False, True):
                examples, cpu = one_run(machine, args.batches, args.seed, on)
                totals[on][0] += examples
                totals[on][1] += cpu
        off = per_second(totals[False][0], totals[False][1])
        on_rate = per_second(totals[True][0], totals[True][1])
        out[machine] = {
            "examples_per_run": totals[True][0] // args.rounds,
            "examples_per_cpu_s_without_tags": off,
            "examples_per_cpu_s_with_tags": on_rate,
            "slowdown": ratio(off, on_rate),
        }
        print(json.dumps({machine: out[machine]}), file=sys.stderr, flush=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
