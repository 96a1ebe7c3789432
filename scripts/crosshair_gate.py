#!/usr/bin/env python
"""CI gate around ``crosshair check``: fail on counterexamples, on vacuous passes, and on unproved "proofs".

Runs::

    crosshair check --analysis_kind=icontract --per_condition_timeout=N --report_all TARGET...

with ``KVLEDGER_CONTRACTS=1`` (with the switch off the decorators vanish and CrossHair reports "no
checkable functions" and exits 0), streams CrossHair's output, then prints one summary line.

Without targets it checks the registry's proof targets (``kvledger/contracts/invariants/proofs.py``).
Each postcondition of a target is matched, by line, to its ``@ensure`` decorator. Exit status 0 only if:

* no ``error:`` line (a counterexample, or an exception while checking);
* no "no checkable functions" warning and no "Unable to meet precondition" (something was not checked);
* at least one condition was confirmed or explored (otherwise the run was vacuous);
* every postcondition of a function the registry declares ``proved`` (all of them, with
  ``--require-proof``) is "Confirmed over all paths", and each of them got a verdict;
* CrossHair itself exited 0.

"Not confirmed" (explored within the budget, not exhausted) passes only for a function declared
``bounded``, which the spec lists as checked only up to its bound.

CrossHair's per-condition budget is wall-clock, so on a busy machine a proof that needs 3 s alone may
not finish in 5 s. A postcondition declared proved that is "not confirmed" (or got no verdict) is a
*timeout*, not a disproof: the gate re-checks just that function with a larger budget (4x, then 16x the
first by default, ``--retries``), and only a postcondition still unconfirmed after the last retry fails
the gate. A timeout is reported apart from a counterexample, and exits with its own status:

* 0: passed (proofs confirmed, possibly on a retry: the summary says which and at what budget);
* 1: a counterexample or an error while checking;
* 2: nothing was checked (a vacuous run, a precondition never met, no checkable functions), or usage;
* 3: only timeouts: some proof was neither confirmed nor refuted within the largest budget.

Usage::

    scripts/crosshair_gate.py                                   # the registry's targets, 5 s per condition
    scripts/crosshair_gate.py -t 30                             # nightly budget
    scripts/crosshair_gate.py --retries 0                       # no retry of a timed-out proof
    scripts/crosshair_gate.py kvledger.contracts.arith.pages_needed --require-proof
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make the registry importable
    sys.path.insert(0, str(ROOT))

from kvledger.contracts.invariants.proofs import PROOFS, ProofStatus  # noqa: E402

DEFAULT_TIMEOUT = 5.0
DEFAULT_RETRIES = 2
RETRY_FACTOR = 4.0
"""Each retry of a timed-out proof gets ``RETRY_FACTOR`` times the previous budget (5 s -> 20 s -> 80 s)."""

EXIT_PASSED, EXIT_COUNTEREXAMPLE, EXIT_UNCHECKED, EXIT_TIMEOUT = 0, 1, 2, 3

_ERROR = re.compile(r"(^|:\s*)error:")
_VERDICT = re.compile(
    r"^(?P<path>.+?):(?P<line>\d+): info: (?P<what>Confirmed over all paths|Not confirmed)\."
)
_CONFIRMED = "info: Confirmed over all paths."
_NOT_CONFIRMED = "info: Not confirmed."
_UNABLE = "Unable to meet precondition"
_NO_CHECKABLE = "no checkable functions"


# ---------------------------------------------------------------------- postconditions, by line
@dataclass(frozen=True)
class Condition:
    """One ``@ensure`` of one function: where it is, so a verdict line can be matched to it."""

    path: str  # resolved file path
    function: str
    first_line: int
    last_line: int
    def_line: int = 0  # the ``def`` line: ``path:def_line`` targets just this function on a retry


def postconditions(path: Path) -> list[Condition]:
    """Every ``@ensure(...)`` on a top-level function of ``path``."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return []
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for dec in node.decorator_list:
                func = dec.func if isinstance(dec, ast.Call) else dec
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name == "ensure":
                    end = dec.end_lineno or dec.lineno
                    out.append(Condition(str(path.resolve()), node.name, dec.lineno, end, node.lineno))
    return out


def target_path(target: str) -> tuple[Path, str | None]:
    """``file.py``, ``dir``, ``pkg.mod`` or ``pkg.mod.func`` -> (file, function or None)."""
    p = Path(target)
    if p.suffix == ".py" or p.exists():
        return p, None
    module_file = ROOT / (target.replace(".", "/") + ".py")
    if module_file.is_file():
        return module_file, None
    module, _, func = target.rpartition(".")
    return ROOT / (module.replace(".", "/") + ".py"), func


def conditions_of(targets: Iterable[str]) -> list[Condition]:
    out: list[Condition] = []
    for t in targets:
        path, func = target_path(t)
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for f in files:
            out += [c for c in postconditions(f) if func is None or c.function == func]
    return out


def declared_proved() -> set[tuple[str, str]]:
    """(resolved path, function) of every registry target declared proved."""
    out = set()
    for proof in PROOFS:
        if proof.status is ProofStatus.PROVED:
            out.add((str((ROOT / proof.path).resolve()), proof.function))
    return out


# ---------------------------------------------------------------------- the verdict
@dataclass
class Verdict:
    """What the gate saw in CrossHair's output."""

    confirmed: int = 0
    not_confirmed: int = 0
    errors: list[str] = field(default_factory=list)
    unable: list[str] = field(default_factory=list)
    no_checkable: bool = False
    returncode: int = 0
    conditions: list[Condition] = field(default_factory=list)  # postconditions of the targets
    required: set[tuple[str, str]] = field(default_factory=set)  # (path, function) that must be proved
    results: dict[Condition, str] = field(default_factory=dict)  # condition -> "confirmed" / "not confirmed"
    budget: float = DEFAULT_TIMEOUT  # the largest per-condition budget any condition was given
    confirmed_on_retry: dict[Condition, float] = field(
        default_factory=dict
    )  # condition -> budget that did it

    def feed(self, line: str) -> None:
        if _CONFIRMED in line:
            self.confirmed += 1
        elif _NOT_CONFIRMED in line:
            self.not_confirmed += 1
        if (m := _VERDICT.search(line.strip())) is not None:
            self._record(m.group("path"), int(m.group("line")), m.group("what"))
        if _ERROR.search(line):
            self.errors.append(line.rstrip())
        if _UNABLE in line:
            self.unable.append(line.rstrip())
        if _NO_CHECKABLE in line:
            self.no_checkable = True

    def _record(self, path: str, line: int, what: str) -> None:
        resolved = str(Path(path).resolve())
        for c in self.conditions:
            if c.path == resolved and c.first_line <= line <= c.last_line:
                self.results[c] = "confirmed" if what.startswith("Confirmed") else "not confirmed"
                return

    @property
    def vacuous(self) -> bool:
        return self.confirmed + self.not_confirmed == 0

    def unproved_conditions(self) -> list[Condition]:
        """Required postconditions that are not confirmed over all paths (or got no verdict)."""
        return [
            c
            for c in self.conditions
            if (c.path, c.function) in self.required and self.results.get(c) != "confirmed"
        ]

    def unproved(self) -> list[str]:
        return [
            f"{c.function} (line {c.first_line}): {self.results.get(c, 'no verdict')}"
            for c in self.unproved_conditions()
        ]

    def merge_retry(self, retry: Verdict, budget: float) -> None:
        """Take a retry's verdicts for its conditions; its errors and refusals count like the first run's."""
        self.budget = max(self.budget, budget)
        for c, result in retry.results.items():
            self.results[c] = result
            if result == "confirmed":
                self.confirmed_on_retry[c] = budget
        self.errors += retry.errors
        self.unable += retry.unable
        self.no_checkable = self.no_checkable or retry.no_checkable
        if retry.returncode != 0:
            self.returncode = retry.returncode

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
        if unproved := self.unproved():
            out.append(
                f"{len(unproved)} condition(s) declared proved timed out (neither confirmed nor refuted"
                f" within {self.budget:g} s): {'; '.join(unproved)}"
            )
        if self.returncode != 0:
            out.append(f"crosshair exited {self.returncode}")
        return out

    @property
    def passed(self) -> bool:
        return not self.failures()

    def exit_status(self) -> int:
        """0 passed, 1 a counterexample or error, 2 nothing checked, 3 only timeouts (see the module doc)."""
        if self.passed:
            return EXIT_PASSED
        if self.errors:
            return EXIT_COUNTEREXAMPLE
        if self.unable or self.no_checkable or self.vacuous or (self.returncode != 0 and not self.unproved()):
            return EXIT_UNCHECKED
        return EXIT_TIMEOUT

    def summary(self, seconds: float, timeout: float, targets: Iterable[str]) -> str:
        targets = list(targets)
        status = "PASS" if self.passed else "FAIL (" + "; ".join(self.failures()) + ")"
        required = [c for c in self.conditions if (c.path, c.function) in self.required]
        proved = sum(1 for c in required if self.results.get(c) == "confirmed")
        functions = len({(c.path, c.function) for c in required})
        shown = " ".join(targets) if len(targets) <= 3 else f"{len(targets)} targets"
        retried = ""
        if self.confirmed_on_retry:
            each = ", ".join(
                f"{c.function} line {c.first_line} at {b:g} s" for c, b in self.confirmed_on_retry.items()
            )
            retried = f" ({len(self.confirmed_on_retry)} confirmed on a retry: {each})"
        return (
            f"crosshair gate: {status}: {self.confirmed} confirmed over all paths, {self.not_confirmed} not"
            f" confirmed within {timeout:g} s; {proved} of {len(required)} postconditions declared proved"
            f" ({functions} functions) are{retried}; {len(self.errors)} error(s), {len(self.unable)} unable"
            f" to meet precondition; {shown}; {seconds:.1f} s"
        )


def summarize(
    lines: Iterable[str],
    returncode: int = 0,
    conditions: list[Condition] | None = None,
    required: set[tuple[str, str]] | None = None,
) -> Verdict:
    """The verdict for a finished CrossHair run's output (used by the gate and its tests)."""
    verdict = Verdict(returncode=returncode, conditions=conditions or [], required=required or set())
    for line in lines:
        verdict.feed(line)
    return verdict


# ---------------------------------------------------------------------- running it
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


Runner = Callable[[list[str], Callable[[str], None]], int]
"""Runs a command, hands each output line to the callback, returns the exit status (tests pass a fake)."""


def stream(cmd: list[str], on_line: Callable[[str], None]) -> int:
    env = dict(os.environ)
    env["KVLEDGER_CONTRACTS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    with subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            on_line(line)
        return proc.wait()


def retry_targets(unproved: list[Condition]) -> list[str]:
    """One ``file.py:LINE`` target per function with an unproved condition (CrossHair checks just it)."""
    seen: dict[tuple[str, str], str] = {}
    for c in unproved:
        seen.setdefault((c.path, c.function), f"{c.path}:{c.def_line}")
    return list(seen.values())


def run(
    targets: list[str],
    timeout: float,
    require_proof: bool = False,
    retries: int = DEFAULT_RETRIES,
    runner: Runner = stream,
) -> tuple[Verdict, float]:
    conditions = conditions_of(targets)
    required = declared_proved()
    if require_proof:
        required |= {(c.path, c.function) for c in conditions}
    verdict = Verdict(conditions=conditions, required=required, budget=timeout)
    start = time.monotonic()
    verdict.returncode = runner(crosshair_command(targets, timeout), verdict.feed)
    budget = timeout
    for _ in range(retries):
        # Only timeouts are retried: a counterexample is a disproof, and a bigger budget cannot undo it.
        pending = verdict.unproved_conditions()
        if not pending or verdict.errors:
            break
        budget *= RETRY_FACTOR
        again = retry_targets(pending)
        print(
            f"crosshair gate: {len(pending)} proof(s) timed out; retrying {len(again)} function(s) at {budget:g} s",
            flush=True,
        )
        retry = Verdict(conditions=conditions, required=required)
        retry.returncode = runner(crosshair_command(again, budget), retry.feed)
        verdict.merge_retry(retry, budget)
    return verdict, time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "targets",
        nargs="*",
        help="files, directories, modules or module.function names (default: the registry's proof targets)",
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
    parser.add_argument(
        "--retries",
        type=int,
        default=DEFAULT_RETRIES,
        help=f"re-checks of a timed-out proof, each with {RETRY_FACTOR:g}x the budget (default: %(default)s)",
    )
    parser.add_argument(
        "--require-proof",
        action="store_true",
        help="every postcondition of the targets must be confirmed over all paths, not only the registry's",
    )
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error("the per-condition timeout must be positive")
    if args.retries < 0:
        parser.error("--retries must be 0 or more")
    targets = args.targets or [p.target for p in PROOFS]
    verdict, seconds = run(targets, args.timeout, args.require_proof, args.retries)
    print(verdict.summary(seconds, args.timeout, targets), flush=True)
    return verdict.exit_status()


if __name__ == "__main__":
    sys.exit(main())
