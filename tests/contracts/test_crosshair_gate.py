"""The CrossHair gate fails on counterexamples and on vacuous passes, and passes on the real arithmetic.

Each run starts ``scripts/crosshair_gate.py`` as a subprocess (about a second each with the small
targets used here). The registry's proof targets at the CI budget (~15 s) are run by
``scripts/test.sh`` itself, so here the real functions are checked one by one.

Every counterexample CrossHair reports is re-run in plain Python (tooling-notes §5: CrossHair 0.0.113
has a known false positive), so the test fails if the gate ever reports a bug that is not one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from kvledger.contracts import arith
from kvledger.contracts.invariants.proofs import PROOFS
from tests.script_module import load_script

REPO = Path(__file__).resolve().parents[2]
GATE = REPO / "scripts" / "crosshair_gate.py"
FIXTURES = Path(__file__).resolve().parent / "fixtures"

pytestmark = pytest.mark.crosshair

COUNTEREXAMPLE = re.compile(r"error: false when calling (\w+)\((.*)\) \(which returns (.*)\)$")


def load(path: Path) -> ModuleType:
    return load_script(path, f"_gate_{path.stem}")


gate = load(GATE)


def run_gate(*args: str, contracts: str = "1") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, KVLEDGER_CONTRACTS=contracts)
    return subprocess.run(
        [sys.executable, str(GATE), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def summary_of(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("crosshair gate: "), done.stdout + done.stderr
    return lines[-1]


def raw(func: object) -> object:
    """The undecorated function (icontract keeps it as ``__wrapped__``)."""
    return getattr(func, "__wrapped__", func)


# ---------------------------------------------------------------------- the gate catches bugs
def test_broken_copy_is_caught_with_a_counterexample_that_replays() -> None:
    done = run_gate("-t", "5", str(FIXTURES / "broken_arith.py"))
    assert done.returncode != 0, done.stdout
    summary = summary_of(done)
    assert summary.startswith("crosshair gate: FAIL"), summary
    found = [m.groups() for line in done.stdout.splitlines() if (m := COUNTEREXAMPLE.search(line))]
    assert {name for name, _, _ in found} == {"pages_needed", "floor_to_page"}, done.stdout
    broken = load(FIXTURES / "broken_arith.py")
    for name, args_text, returned in found:
        args = tuple(int(a) for a in args_text.split(","))
        wrong = raw(getattr(broken, name))(*args)  # type: ignore[operator]
        right = raw(getattr(arith, name))(*args)  # type: ignore[operator]
        assert repr(wrong) == returned, (name, args)
        assert wrong != right, f"{name}{args}: CrossHair's counterexample does not replay"


def test_real_functions_pass() -> None:
    targets = [
        f"kvledger.contracts.arith.{name}"
        for name in (
            "pages_needed",
            "floor_to_page",
            "ceil_to_page",
            "decode_needs_new_page",
            "extend_page_plan",
        )
    ]
    done = run_gate("-t", "5", *targets)
    summary = summary_of(done)
    assert done.returncode == 0, done.stdout + done.stderr
    assert summary.startswith("crosshair gate: PASS"), summary
    confirmed = int(re.search(r"(\d+) confirmed over all paths", summary).group(1))  # type: ignore[union-attr]
    assert confirmed >= 8, summary  # every postcondition of these five is proved, not just explored


# ---------------------------------------------------------------------- proved means confirmed
def test_a_condition_declared_proved_but_not_confirmed_fails() -> None:
    """A loop over an unbounded list is only explored: fine as "bounded", a failure when called proved."""
    fixture = str(FIXTURES / "unbounded_loop.py")
    explored = run_gate("-t", "2", fixture)
    assert explored.returncode == 0, explored.stdout
    assert "1 not confirmed" in summary_of(explored)
    claimed = run_gate("-t", "1", "--retries", "1", "--require-proof", fixture)
    assert claimed.returncode == gate.EXIT_TIMEOUT, claimed.stdout  # a timeout, not a counterexample
    assert "retrying 1 function(s) at 4 s" in claimed.stdout
    summary = summary_of(claimed)
    assert (
        "1 condition(s) declared proved timed out (neither confirmed nor refuted within 4 s):"
        " total (line 13): not confirmed" in summary
    )
    assert "0 of 1 postconditions declared proved (1 functions) are" in summary


def test_every_registry_proof_maps_to_its_postconditions() -> None:
    """The gate matches each verdict line to an ``@ensure``; every proof target has at least one."""
    conditions = gate.conditions_of([p.target for p in PROOFS])
    by_function = {c.function for c in conditions}
    assert by_function == {p.function for p in PROOFS}
    assert gate.declared_proved() == {(c.path, c.function) for c in conditions}
    assert len(conditions) == 41  # 17, the 8 of the PD decode sizing (contracts/sizing.py), 16 of Mamba V2


def test_verdict_matches_lines_to_conditions() -> None:
    path = FIXTURES / "unbounded_loop.py"
    conditions = gate.postconditions(path)
    assert [(c.function, c.first_line) for c in conditions] == [("total", 13)]
    required = {(conditions[0].path, "total")}
    ok = gate.summarize([f"{path}:13: info: Confirmed over all paths."], 0, conditions, required)
    assert ok.passed and ok.results == {conditions[0]: "confirmed"}
    missing = gate.summarize([f"{path}:99: info: Confirmed over all paths."], 0, conditions, required)
    assert not missing.passed and missing.unproved() == ["total (line 13): no verdict"]


def test_gate_forces_contracts_on() -> None:
    """With ``KVLEDGER_CONTRACTS=0`` CrossHair would see no contracts and exit 0; the gate overrides it."""
    done = run_gate("kvledger.contracts.arith.pages_needed", contracts="0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 confirmed over all paths" in summary_of(done)


def test_a_bug_among_good_targets_still_fails() -> None:
    done = run_gate("kvledger.contracts.arith.pages_needed", str(FIXTURES / "broken_arith.py"))
    assert done.returncode != 0
    assert "false when calling pages_needed(0, 1)" in done.stdout


# ---------------------------------------------------------------------- timeouts are retried, not failed at once
class FakeCrossHair:
    """Stands in for CrossHair: answers each command with canned lines, by the budget it was given."""

    def __init__(self, answers: dict[float, list[str]]) -> None:
        self.answers = answers
        self.commands: list[list[str]] = []

    def __call__(self, cmd: list[str], on_line: Callable[[str], None]) -> int:
        self.commands.append(cmd)
        budget = float(next(a for a in cmd if a.startswith("--per_condition_timeout=")).split("=")[1])
        lines = self.answers[budget]
        for line in lines:
            on_line(line)
        return 1 if any("error:" in line for line in lines) else 0


UNBOUNDED = FIXTURES / "unbounded_loop.py"


def verdict_line(what: str) -> str:
    return f"{UNBOUNDED}:13: info: {what}."


def test_a_timed_out_proof_confirmed_on_a_retry_passes() -> None:
    fake = FakeCrossHair(
        {5.0: [verdict_line("Not confirmed")], 20.0: [verdict_line("Confirmed over all paths")]}
    )
    verdict, _ = gate.run([str(UNBOUNDED)], 5.0, require_proof=True, runner=fake)
    assert verdict.passed and verdict.exit_status() == gate.EXIT_PASSED
    assert len(fake.commands) == 2
    assert fake.commands[1][-1] == f"{UNBOUNDED.resolve()}:14"  # just the function, by its def line
    assert "1 confirmed on a retry: total line 13 at 20 s" in verdict.summary(1.0, 5.0, ["t"])


def test_a_proof_still_timing_out_after_every_retry_is_a_timeout_not_a_counterexample() -> None:
    fake = FakeCrossHair({b: [verdict_line("Not confirmed")] for b in (5.0, 20.0, 80.0)})
    verdict, _ = gate.run([str(UNBOUNDED)], 5.0, require_proof=True, runner=fake)
    assert len(fake.commands) == 3  # the first run and DEFAULT_RETRIES retries, 4x each time
    assert verdict.exit_status() == gate.EXIT_TIMEOUT and not verdict.errors
    assert "timed out (neither confirmed nor refuted within 80 s)" in "; ".join(verdict.failures())


def test_a_counterexample_is_never_retried() -> None:
    fake = FakeCrossHair({5.0: [f"{UNBOUNDED}:13: error: false when calling total([1]) (which returns 0)"]})
    verdict, _ = gate.run([str(UNBOUNDED)], 5.0, require_proof=True, runner=fake)
    assert len(fake.commands) == 1
    assert verdict.exit_status() == gate.EXIT_COUNTEREXAMPLE


# ---------------------------------------------------------------------- the gate refuses vacuous passes
def test_unsatisfiable_precondition_fails() -> None:
    done = run_gate(str(FIXTURES / "unsatisfiable.py"))
    assert done.returncode != 0
    assert "Unable to meet precondition" in done.stdout
    assert "unable to meet precondition" in summary_of(done).split(":", 2)[1]


def test_no_checkable_functions_fails() -> None:
    done = run_gate(str(FIXTURES / "uncontracted.py"))
    assert done.returncode != 0
    assert "no checkable functions" in summary_of(done)


def test_bad_timeout_is_a_usage_error() -> None:
    done = run_gate("-t", "0")
    assert done.returncode == 2 and "timeout must be positive" in done.stderr


# ---------------------------------------------------------------------- the verdict, from canned output
@pytest.mark.parametrize(
    ("lines", "returncode", "passed"),
    [
        (["a.py:3: info: Confirmed over all paths."], 0, True),
        (["a.py:3: info: Not confirmed."], 0, True),
        (
            [
                "a.py:3: info: Confirmed over all paths.",
                "a.py:4: error: false when calling f(0) (which returns 1)",
            ],
            1,
            False,
        ),
        (["a.py:3: error: RecursionError: maximum recursion depth exceeded"], 1, False),
        (["error: could not import target"], 2, False),
        (["a.py:3: info: Confirmed over all paths.", "a.py:9: info: Unable to meet precondition."], 0, False),
        (["WARNING: Targets found, but contain no checkable functions."], 0, False),
        ([], 0, False),
        (["some unrelated chatter"], 0, False),
        (["a.py:3: info: Confirmed over all paths."], 1, False),
    ],
)
def test_verdict(lines: list[str], returncode: int, passed: bool) -> None:
    verdict = gate.summarize(lines, returncode)
    assert verdict.passed is passed, verdict.failures()
    summary = verdict.summary(1.0, 5, ["t"])
    assert summary.startswith("crosshair gate: PASS" if passed else "crosshair gate: FAIL")


def test_gate_runs_crosshair_the_documented_way() -> None:
    cmd = gate.crosshair_command(["kvledger/contracts/arith.py"], 5.0)
    assert cmd[1:] == [
        "-m",
        "crosshair",
        "check",
        "--analysis_kind=icontract",
        "--per_condition_timeout=5",
        "--report_all",
        "kvledger/contracts/arith.py",
    ]
    assert gate.DEFAULT_TIMEOUT == 5.0
