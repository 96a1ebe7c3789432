"""``kvledger hunt``: run the generic machines against one exhibit at a time, under a wall-clock budget.

For each exhibit: install its re-enactment, run its machine (the scheduler, the PD or the cache machine) with
Hypothesis in batches of a few examples (each batch its own seed, derived from ``--seed``) until a
check fires or the budget is spent; then let Hypothesis shrink the failure for a bounded time and
replay it. What comes back: found or not, seconds to the first failure, examples tried, the invariant ID
in the violation, and the shrunk rule calls, written as a plain Python script that builds the machine,
calls the rules (and the invariant check after each, as Hypothesis did) with the exhibit installed. The
script is run once in a fresh process to confirm it fails with the same invariant.

With no exhibit the same run is a clean run: any failure is a bug of the reference (or a machine's).
The machines know no exhibit; nothing here tells them which one is installed.
"""

from __future__ import annotations

import contextlib
import inspect
import re
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, Phase, reject, settings
from hypothesis.errors import HypothesisException, Unsatisfiable, UnsatisfiedAssumption
from hypothesis.internal.conjecture import engine as _conjecture_engine
from hypothesis.reporting import with_reporter
from hypothesis.stateful import INVARIANT_MARKER, RuleBasedStateMachine, run_state_machine_as_test

from kvledger.museum.exhibit import Exhibit
from kvledger.process.staged import staged

ENUM_REPR = re.compile(r"<([A-Za-z_]\w*)\.([A-Za-z_]\w*): [^>]*>")
INVARIANT_ID = re.compile(r"\bI-[A-Z0-9]+(?:-[A-Z0-9]+)*\b")
BATCH_EXAMPLES = 8
STEPS_PER_EXAMPLE = 40
SHRINK_SECONDS = 20.0


def machine_class(name: str) -> type[RuleBasedStateMachine]:
    if name == "scheduler":
        from kvledger.museum.machines.scheduler import SchedulerMachine

        return SchedulerMachine
    if name == "pd":
        from kvledger.museum.machines.pd import PDMachine

        return PDMachine
    if name == "cache":
        from kvledger.museum.machines.cache import CacheMachine

        return CacheMachine
    raise ValueError(f"unknown machine {name!r}")


@dataclass
class HuntResult:
    exhibit: str  # "(clean)" for a run with no exhibit
    machine: str
    found: bool
    seconds: float  # to the first failing example (the whole budget when not found)
    shrink_seconds: float
    examples: int  # examples started, shrinking excluded
    invariant: str | None
    expected: bool | None  # the invariant is one the exhibit lists as broken
    repro_steps: int | None  # rule calls in the shrunk example, init included
    repro: str | None  # path of the repro script
    repro_verified: bool | None  # ``python repro.py`` failed naming the same invariant
    message: str = ""
    steps: list[str] = field(default_factory=list)
    cpu_seconds: float = 0.0  # the hunting process's CPU seconds to the first failing example (or all)

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("steps")
        return out


PHASE_SHRINKING = "shrinking"  # the first failing example was found: Hypothesis shrinks it
PHASE_MINIMIZING = "deleting steps"  # the hunt's own pass over the shrunk example's rule calls
PHASE_VERIFYING = "verifying the repro"  # the repro script runs in a fresh process
HUNT_PHASES = (PHASE_SHRINKING, PHASE_MINIMIZING, PHASE_VERIFYING)
"""What a hunt does after its first failure, in order (``hunt(on_phase=...)``): none of it counts examples,
so a progress display says which one runs instead of standing still."""


class _Clock:
    """Shared between the hunt and the machine subclass it runs: deadlines and counts."""

    def __init__(
        self,
        budget: float,
        shrink: float,
        on_example: Callable[[int], None],
        cpu_budget: bool = False,
        on_phase: Callable[[str], None] = lambda phase: None,
    ) -> None:
        self.start = time.monotonic()
        self.cpu_start = time.process_time()
        # The budget's clock: wall seconds, or (``cpu_budget``) the CPU seconds of this process, which a
        # machine shared with other work does not inflate.
        self.budget_clock = time.process_time if cpu_budget else time.monotonic
        self.deadline = self.budget_clock() + budget
        self.shrink = shrink
        self.examples = 0
        self.first_failure: float | None = None
        self.first_failure_cpu: float | None = None
        self.on_example = on_example
        self.on_phase = on_phase

    def failed(self) -> None:
        """Record the first failing example's time, on both clocks (later calls change nothing), and say
        that shrinking starts (it runs up to ``shrink`` seconds, with no example counted)."""
        if self.first_failure is None:
            self.first_failure = time.monotonic()
            self.first_failure_cpu = time.process_time()
            self.on_phase(PHASE_SHRINKING)

    def out_of_time(self) -> bool:
        """The generation budget is spent (shrinking is bounded by Hypothesis's own deadline, set below)."""
        return self.first_failure is None and self.budget_clock() > self.deadline


def _is_failure(exc: BaseException | None) -> bool:
    """A check that fired, not Hypothesis's own control flow (a rejected or overrun example)."""
    return isinstance(exc, Exception) and not isinstance(exc, UnsatisfiedAssumption)


def _hunting(base: type[RuleBasedStateMachine], clock: _Clock, seed: int) -> type[RuleBasedStateMachine]:
    """``base`` with a clock: an example started after the deadline (and before any failure) is rejected,
    so Hypothesis winds the batch down quickly."""

    def __init__(self: Any) -> None:
        if clock.out_of_time():
            reject()
        if clock.first_failure is None:
            clock.examples += 1
            clock.on_example(clock.examples)
        base.__init__(self)

    def teardown(self: Any) -> None:
        failing = _is_failure(sys.exc_info()[1])
        if failing:  # a check already fired: the drain would only add a later, secondary violation
            clock.failed()
            return
        try:
            base.teardown(self)
        except Exception as exc:
            failing = _is_failure(exc)
            raise
        finally:
            if failing:
                clock.failed()

    cls = type(base.__name__, (base,), {"__init__": __init__, "teardown": teardown})
    cls._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]
    return cls


def _settings(shrink: bool = True) -> settings:
    phases = (Phase.generate, Phase.target, Phase.shrink) if shrink else (Phase.generate, Phase.target)
    return settings(
        max_examples=BATCH_EXAMPLES,
        stateful_step_count=STEPS_PER_EXAMPLE,
        deadline=None,
        database=None,
        derandomize=False,
        # Every distinct failure is shrunk on its own and reported (an ExceptionGroup); the hunt then
        # reports the one that names an invariant (``primary_failure``). With a single report Hypothesis
        # "slips" to whichever failure has the smallest example when its shrink time runs out, which on
        # a busy machine can be a secondary plain assert instead of the violation that caused it.
        report_multiple_bugs=True,
        phases=phases,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )


def invariant_of(exc: BaseException) -> str:
    """The invariant ID a violation names (its first ID), else the exception's type."""
    found = INVARIANT_ID.search(str(exc))
    if found:
        return found.group(0)
    own = getattr(exc, "invariant", None)
    return own if isinstance(own, str) else type(exc).__name__


def primary_failure(exc: BaseException, expected: Collection[str] = ()) -> BaseException:
    """Of the distinct failures Hypothesis reports together, the one the hunt reports: a failure naming a
    registered invariant before one that does not (a plain ``assert`` is evidence of damage, the violation
    is its cause), then one naming an ``expected`` invariant (those the hunted exhibit lists), then the
    shortest example (fewest statements), then the first reported.

    ``expected`` keeps the verdict a function of the seed: the failure found while generating is among
    the reported ones whatever shrinking achieved, but a second failure met while shrinking (a drain that
    also runs out of steps, I-LIVENESS beside I-DRAIN) is found, and shrunk shorter, only as far as
    the shrink's time allows (a busy machine stops it sooner)."""
    subs = getattr(exc, "exceptions", None)  # an ExceptionGroup's (the backport's too, on Python 3.10)
    if not isinstance(subs, tuple) or not subs:
        return exc

    def rank(indexed: tuple[int, BaseException]) -> tuple[bool, bool, int, int]:
        i, sub = indexed
        inv = invariant_of(primary_failure(sub, expected))
        named = INVARIANT_ID.search(inv) is not None
        return (not named, inv not in expected, len(getattr(sub, "__notes__", [])), i)

    return primary_failure(min(enumerate(subs), key=rank)[1], expected)


def _headline(exc: BaseException) -> str:
    """The line of the violation that names its invariant (icontract starts with the file and line)."""
    lines = str(exc).splitlines() or [type(exc).__name__]
    return next((line for line in lines if INVARIANT_ID.search(line)), lines[0])[:300]


def _steps(report: list[str], failure: BaseException, machine: str) -> list[str]:
    """The shrunk example's statements (``state = X()``, rule calls, invariant checks), as Hypothesis printed
    them (to the reporter, or in the failure's notes); a statement may span lines (a long repr)."""
    text = "\n".join([*report, *getattr(failure, "__notes__", [])])
    statements: list[str] = []
    for line in text.splitlines():
        if line.startswith("state"):
            statements.append(line)
        elif statements and line.startswith(" "):
            statements[-1] += "\n" + line
        elif statements:
            break  # the block of statements ended
    if "state.teardown()" in statements:
        statements = statements[: statements.index("state.teardown()") + 1]
    statements = [ENUM_REPR.sub(r"\1.\2", s) for s in statements]  # <Fault.DROP: 'drop'> -> Fault.DROP
    return [f"state = {machine}()" if s.startswith("state = ") else s for s in statements]


def _checks(machine: str) -> tuple[str, ...]:
    """How the machine's invariant checks start in the printed statements (``state.identities_hold(``)."""
    members = inspect.getmembers(machine_class(machine))
    return tuple(f"state.{name}(" for name, f in members if getattr(f, INVARIANT_MARKER, None) is not None)


def _rule_calls(steps: list[str], machine: str) -> int:
    skip = ("state = ", "state.teardown(", *_checks(machine))
    return sum(1 for s in steps if not s.startswith(skip))


def _units(steps: list[str], machine: str) -> list[list[str]]:
    """Statements grouped: a rule call (or ``state = ...`` / ``init``) with the invariant checks after it."""
    checks = _checks(machine)
    units: list[list[str]] = []
    for statement in steps:
        if statement.startswith(checks) and units:
            units[-1].append(statement)
        else:
            units.append([statement])
    return units


def _replay_namespace(machine: str) -> dict[str, Any]:
    from kvledger.reference.disagg import ChannelConfig, Component, Fault, PDSpec
    from kvledger.reference.engine import EngineSpec

    base = machine_class(machine)
    return {
        base.__name__: base, "EngineSpec": EngineSpec, "PDSpec": PDSpec, "ChannelConfig": ChannelConfig,
        "Component": Component, "Fault": Fault,
    }  # fmt: skip


def _fails_with(steps: list[str], invariant: str, machine: str) -> bool:
    namespace = _replay_namespace(machine)
    try:
        for statement in steps:
            exec(statement, namespace)
    except Exception as exc:
        return invariant_of(exc) == invariant
    return False


def minimize_steps(steps: list[str], invariant: str, machine: str, seconds: float) -> list[str]:
    """Delete rule calls one at a time (last first) while the replay still fails naming ``invariant``.

    Hypothesis's stateful shrinker leaves redundant calls when its time runs out (every attempt replays
    the machine and its checks); this pass replays the printed statements directly, to a fixed point or
    the deadline. The first two units (``state = ...``, ``init``) and the teardown stay."""
    deadline = time.monotonic() + seconds
    units = _units(steps, machine)
    if not _fails_with(steps, invariant, machine):
        return steps  # the replay does not reproduce: leave Hypothesis's example as it is
    changed = True
    while changed and time.monotonic() < deadline:
        changed = False
        for i in range(len(units) - 1, 1, -1):
            if time.monotonic() > deadline:
                break
            if i >= len(units) or units[i][0].startswith("state.teardown("):
                continue
            candidate = units[:i] + units[i + 1 :]
            if _fails_with([s for u in candidate for s in u], invariant, machine):
                units = candidate
                changed = True
    return [s for u in units for s in u]


REPRO_TEMPLATE = '''"""Repro written by ``kvledger hunt``: {title}.

Machine {machine_name}; the shrunk example's rule calls, each followed by the machine's invariant check
(as Hypothesis ran them). Expected: {expected}.
Run: python {filename}
"""

import contextlib

from kvledger.museum import exhibit
from {module} import {machine_name}
from kvledger.reference.disagg import ChannelConfig, Component, Fault, PDSpec  # noqa: F401
from kvledger.reference.engine import EngineSpec  # noqa: F401

EXHIBIT = {exhibit_id!r}


def run() -> None:
{body}


if __name__ == "__main__":
    with exhibit(EXHIBIT).installed() if EXHIBIT else contextlib.nullcontext():
        run()
'''


def write_repro(path: Path, result: HuntResult, exhibit: Exhibit | None) -> None:
    """Write the repro script whole or not at all (Ctrl-C mid-write leaves no half script)."""
    base = machine_class(result.machine)
    body = "\n".join("    " + line.replace("\n", "\n    ") for line in result.steps)
    text = REPRO_TEMPLATE.format(
        title=(f"exhibit {exhibit.id} ({exhibit.title})" if exhibit else "a clean run's failure"),
        machine_name=base.__name__,
        module=base.__module__,
        expected=f"a violation naming {result.invariant}",
        filename=path.name,
        exhibit_id=exhibit.id if exhibit else None,
        body=body or "    pass",
    )
    with staged(path) as (temp,):
        temp.write_text(text)


def repro_for_failure(
    machine: str, failure: BaseException, report: list[str], exhibit: Exhibit | None, out_dir: Path, name: str
) -> Path | None:
    """A repro script for a failure a machine met outside :func:`hunt` (a campaign's item, a replay from a
    shared database): the statements Hypothesis printed for it, written as :func:`hunt` writes its own.
    None when Hypothesis printed no statements (a failure outside the machine's steps)."""
    base = machine_class(machine)
    chosen = primary_failure(failure, exhibit.breaks if exhibit else ())
    steps = _steps(report if chosen is failure else [], chosen, base.__name__)
    if not steps:
        return None
    inv = invariant_of(chosen)
    result = HuntResult(
        exhibit=exhibit.id if exhibit else "(clean)",
        machine=machine,
        found=True,
        seconds=0.0,
        shrink_seconds=0.0,
        examples=0,
        invariant=inv,
        expected=(inv in exhibit.breaks) if exhibit else None,
        repro_steps=_rule_calls(steps, machine),
        repro=None,
        repro_verified=None,
        message=_headline(chosen),
        steps=steps,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"repro_{re.sub(r'[^A-Za-z0-9]+', '_', name).strip('_')}.py"
    write_repro(path, result, exhibit)
    return path


def verify_repro(path: Path, invariant: str, timeout: float = 120.0) -> bool:
    """Run the script in a fresh process: it must fail, naming ``invariant``."""
    try:
        proc = subprocess.run(
            [sys.executable, str(path)], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return False
    return proc.returncode != 0 and invariant in (proc.stderr + proc.stdout)


@contextlib.contextmanager
def _shrinking_for(seconds: float) -> Iterator[None]:
    """Hypothesis shrinks for up to 5 minutes; a hunt gives it ``seconds``."""
    saved = _conjecture_engine.MAX_SHRINKING_SECONDS
    _conjecture_engine.MAX_SHRINKING_SECONDS = max(1, int(seconds))
    try:
        yield
    finally:
        _conjecture_engine.MAX_SHRINKING_SECONDS = saved


@contextlib.contextmanager
def _without_local_constants() -> Iterator[None]:
    """Hypothesis draws about 5 % of its values from the constants of the *local* modules the process has
    imported so far, a pool that grows as modules load. The same seed then draws different examples
    depending on what ran before in the process: the CI hunt found N5 at example 7 on its own and not in
    64 examples after a test had run ``kvledger simulate`` in-process (which imports more of kvledger). A
    hunt's result must be a function of its seed, machine and exhibit, so the hunt runs with that pool
    empty (Hypothesis's own boundary constants stay). A Hypothesis without the pool is left as it is."""
    try:
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.constants_ast import Constants
    except ImportError:  # pragma: no cover - an older Hypothesis draws no local constants
        yield
        return
    providers.CONSTANTS_CACHE.cache.clear()  # filtered pools cached from the local constants so far
    try:
        with mock.patch.object(providers, "_get_local_constants", Constants):  # every call: a fresh, empty pool
            yield
    finally:
        providers.CONSTANTS_CACHE.cache.clear()


@contextlib.contextmanager
def _installed(exhibit: Exhibit | None) -> Iterator[None]:
    if exhibit is None:
        yield
        return
    with exhibit.installed():
        yield


def hunt(
    exhibit: Exhibit | None,
    *,
    machine: str | None = None,
    budget: float = 60.0,
    seed: int = 0,
    shrink_seconds: float = SHRINK_SECONDS,
    out_dir: Path | None = None,
    verify: bool = True,
    max_batches: int | None = None,
    minimize_seconds: float = 20.0,
    on_example: Callable[[int], None] = lambda n: None,
    shrink: bool = True,
    cpu_budget: bool = False,
    on_phase: Callable[[str], None] = lambda phase: None,
) -> HuntResult:
    """Hunt one exhibit (or, with ``exhibit=None``, run clean) with its machine for ``budget`` seconds, or
    for ``max_batches`` batches of ``BATCH_EXAMPLES`` examples (a bound that does not depend on the
    clock: with a fixed seed the hunt is then deterministic, which is what a test may assert).
    ``shrink=False`` stops at the first failing example (no shrink, no step deletion): what a detection
    measurement (:mod:`.detection`) needs, at a fraction of the cost. ``cpu_budget`` counts ``budget`` in
    CPU seconds of this process instead of wall seconds (a shared machine inflates the latter); either
    way the result gives both. ``on_phase`` is told each of :data:`HUNT_PHASES` as it starts."""
    name = machine or (exhibit.machine if exhibit else "scheduler")
    base = machine_class(name)
    clock = _Clock(budget, shrink_seconds, on_example, cpu_budget, on_phase if shrink else lambda phase: None)
    report: list[str] = []
    failure: BaseException | None = None
    batch = 0
    with _installed(exhibit), _shrinking_for(shrink_seconds), _without_local_constants():
        while failure is None and not clock.out_of_time() and (max_batches is None or batch < max_batches):
            cls = _hunting(base, clock, seed * 1_000_003 + batch)
            batch += 1
            report.clear()
            try:
                with with_reporter(lambda value: report.append(str(value))):
                    run_state_machine_as_test(cls, settings=_settings(shrink))
            except Unsatisfiable:
                break  # the whole batch started after the deadline
            except Exception as exc:
                failure = primary_failure(exc, exhibit.breaks if exhibit else ())
                if failure is not exc:
                    report.clear()  # the printed examples are of every failure; the chosen one's are its notes
    end, end_cpu = time.monotonic(), time.process_time()
    label = exhibit.id if exhibit else "(clean)"
    if failure is not None and clock.first_failure is None and isinstance(failure, HypothesisException):
        failure = None  # Hypothesis's own complaint (the deadline's rejections mid-batch), not a finding
    if failure is None:
        return HuntResult(
            label, name, False, end - clock.start, 0.0, clock.examples, None, None, None, None, None,
            cpu_seconds=end_cpu - clock.cpu_start,
        )  # fmt: skip
    first = clock.first_failure or end
    first_cpu = clock.first_failure_cpu or end_cpu
    inv = invariant_of(failure)
    steps = _steps(report, failure, base.__name__)
    if steps and shrink and minimize_seconds > 0:
        on_phase(PHASE_MINIMIZING)
        with _installed(exhibit):
            steps = minimize_steps(steps, inv, name, minimize_seconds)
    end = time.monotonic()
    result = HuntResult(
        exhibit=label,
        machine=name,
        found=True,
        seconds=first - clock.start,
        shrink_seconds=end - first,
        examples=clock.examples,
        invariant=inv,
        expected=(inv in exhibit.breaks) if exhibit else None,
        repro_steps=_rule_calls(steps, name),
        repro=None,
        repro_verified=None,
        message=_headline(failure),
        steps=steps,
        cpu_seconds=first_cpu - clock.cpu_start,
    )
    if out_dir is not None and steps:
        _save_repro(result, inv, exhibit, out_dir, verify, on_phase)
    return result


def _save_repro(
    result: HuntResult,
    invariant: str,
    exhibit: Exhibit | None,
    out_dir: Path,
    verify: bool,
    on_phase: Callable[[str], None],
) -> None:
    """Write the found failure's repro script into ``out_dir`` (``result.repro``) and, with ``verify``, run
    it on its own to see it fail naming the same invariant (``result.repro_verified``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9]+", "_", result.exhibit).strip("_") or "clean"
    path = out_dir / f"repro_{slug}.py"
    write_repro(path, result, exhibit)
    result.repro = str(path)
    if verify:
        on_phase(PHASE_VERIFYING)
        result.repro_verified = verify_repro(path, invariant)
