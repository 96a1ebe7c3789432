#!/usr/bin/env python
"""CI gate around ``crosshair check``: fail on counterexamples *and* on silent, vacuous passes.

Runs::

    crosshair check --analysis_kind=icontract --per_condition_timeout=N --report_all TARGET...

with ``KVLEDGER_CONTRACTS=1`` (with the switch off the decorators vanish and CrossHair reports "no
checkable functions" and exits 0), streams CrossHair's output, then prints one summary line.

Exit status 0 only if all of these hold (tooling-notes §5):

* no ``error:`` line (a counterexample, or an exception while checking);
* no "no checkable functions" warning (nothing was checked at all);
* no "Unable to meet precondition" (a function whose preconditions CrossHair could never satisfy was
  not checked, e.g. a torch-typed argument or contradictory preconditions);
* at least one "Confirmed over all paths" / "Not confirmed" info line was printed (otherwise the run
  was vacuous);
* CrossHair itself exited 0.

"Not confirmed" is not a failure: the condition held on every path explored within the budget.

Usage::

    scripts/crosshair_gate.py                                   # kvledger/contracts/arith.py, 5 s
    scripts/crosshair_gate.py -t 30 kvledger/contracts/arith.py # nightly budget
    scripts/crosshair_gate.py kvledger.contracts.arith.pages_needed kvledger.contracts.arith.floor_to_page
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

DEFAULT_TARGETS = ("kvledger/contracts/arith.py",)
DEFAULT_TIMEOUT = 5.0

_ERROR = re.compile(r"(^|:\s*)error:")
_CONFIRMED = "info: Confirmed over all paths."
_NOT_CONFIRMED = "info: Not confirmed."
_UNABLE = "Unable to meet precondition"
_NO_CHECKABLE = "no checkable functions"


@dataclass
class Verdict:
    """What the gate saw in CrossHair's output."""

    confirmed: int = 0
    not_confirmed: int = 0
    errors: list[str] = field(default_factory=list)
    unable: list[str] = field(default_factory=list)
    no_checkable: bool = False
    returncode: int = 0

    def feed(self, line: str) -> None:
        if _CONFIRMED in line:
            self.confirmed += 1
        elif _NOT_CONFIRMED in line:
            self.not_confirmed += 1
        if _ERROR.search(line):
            self.errors.append(line.rstrip())
        if _UNABLE in line:
            self.unable.append(line.rstrip())
        if _NO_CHECKABLE in line:
            self.no_checkable = True

    @property
    def vacuous(self) -> bool:
        return self.confirmed + self.not_confirmed == 0

    def failures(self) -> list[str]:
        out = []
        if self.errors:
            out.append(f"{len(self.errors)} error line(s)")
        if self.unable:
            out.append(f"{len(self.unable)} condition(s) unable to meet precondition")
        if self.no_checkable:
            out.append("no checkable functions")
        if self.vacuous:
            out.append("no condition was confirmed or explored (vacuous run)")
        if self.returncode != 0:
            out.append(f"crosshair exited {self.returncode}")
        return out

    @property
    def passed(self) -> bool:
        return not self.failures()

    def summary(self, seconds: float, timeout: float, targets: Iterable[str]) -> str:
        status = "PASS" if self.passed else "FAIL (" + "; ".join(self.failures()) + ")"
        return (
            f"crosshair gate: {status}: {self.confirmed} confirmed over all paths, {self.not_confirmed} not"
            f" confirmed within {timeout:g} s, {len(self.errors)} error(s), {len(self.unable)} unable to meet"
            f" precondition; targets {' '.join(targets)}; {seconds:.1f} s"
        )


def summarize(lines: Iterable[str], returncode: int = 0) -> Verdict:
    """The verdict for a finished CrossHair run's output (used by the gate and its tests)."""
    verdict = Verdict(returncode=returncode)
    for line in lines:
        verdict.feed(line)
    return verdict


def crosshair_command(targets: Iterable[str], timeout: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "crosshair",
        "check",
        "--analysis_kind=icontract",
        f"--per_condition_timeout={timeout:g}",
        "--report_all",
        *targets,
    ]


def run(targets: list[str], timeout: float) -> tuple[Verdict, float]:
    env = dict(os.environ)
    env["KVLEDGER_CONTRACTS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    start = time.monotonic()
    verdict = Verdict()
    with subprocess.Popen(
        crosshair_command(targets, timeout),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            verdict.feed(line)
        verdict.returncode = proc.wait()
    return verdict, time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "targets",
        nargs="*",
        default=list(DEFAULT_TARGETS),
        help="files, directories, modules or module.function names (default: %(default)s)",
    )
    parser.add_argument(
        "-t",
        "--per-condition-timeout",
        "--per_condition_timeout",
        dest="timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help="seconds CrossHair may spend on each condition (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error("the per-condition timeout must be positive")
    verdict, seconds = run(args.targets, args.timeout)
    print(verdict.summary(seconds, args.timeout, args.targets), flush=True)
    if verdict.passed:
        return 0
    return 1 if verdict.errors else 2


if __name__ == "__main__":
    sys.exit(main())
