"""One way to hunt with an SGLang machine: run it under Hypothesis, return the first violation and its calls.

Every SGLang driver (the Mamba and request machines of :mod:`.drive_run`, the paged request machine of
:mod:`.drive_pages`, 0.5.23's ``req.kv`` machine of :mod:`.drive_req_kv`) reports a hunt the same way: the
first failure after shrinking, as ``{"found": "Type: first line", "steps": [the rule calls]}``, or
``{"found": None, "steps": []}`` for a clean run. The rule calls are what Hypothesis prints for the shrunk
example, so a finding can be replayed call by call against an unmodified release.
"""

from __future__ import annotations

import io
import json
import sys
from collections import Counter
from collections.abc import Callable
from contextlib import redirect_stdout
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test


def hunt_machine(
    machine: type[RuleBasedStateMachine], examples: int, steps: int, *, shrink: bool = True
) -> dict[str, Any]:
    """Run ``machine`` for ``examples`` examples of ``steps`` rule calls, derandomized (the same run on
    every machine); the first violation (shrunk, unless ``shrink`` is False: a test that only asks which
    invariant fires spares the shrinker's many replays) and the rule calls that lead to it, or None."""
    phases = tuple(Phase) if shrink else (Phase.explicit, Phase.reuse, Phase.generate)
    buf = io.StringIO()
    try:
        with redirect_stdout(buf):
            run_state_machine_as_test(
                machine,
                settings=settings(
                    max_examples=examples, stateful_step_count=steps, deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck), print_blob=False, report_multiple_bugs=False,
                    phases=phases,
                ),
            )  # fmt: skip
    except Exception as exc:  # a violation, or SGLang's own assertion: the finding
        return {"found": _headline(exc), "steps": _rule_calls(buf.getvalue(), exc)}
    return {"found": None, "steps": []}


def _headline(exc: BaseException) -> str:
    first = (str(exc).splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}"


def _rule_calls(printed: str, exc: BaseException) -> list[str]:
    """The ``state.rule(...)`` lines Hypothesis printed for the shrunk example (its teardown left out)."""
    lines = (line.strip() for line in printed.splitlines() + list(getattr(exc, "__notes__", [])))
    return [line for line in lines if line.startswith("state.") and not line.startswith("state.teardown(")]


def driver_main(
    hunt: Callable[[int, int], dict[str, Any]],
    stats: Counter[str],
    version: str,
    default_examples: int,
    argv: list[str] | None = None,
) -> int:
    """A driver's ``python -m ... [EXAMPLES [STEPS]]``: one JSON line, the release, the budget, the hunt's
    result and what the driver reached (its ``stats``, cleared first)."""
    args = sys.argv[1:] if argv is None else argv
    examples = int(args[0]) if args else default_examples
    steps = int(args[1]) if len(args) > 1 else 30
    stats.clear()
    result = hunt(examples, steps)
    out = {"version": version, "examples": examples, "steps_per_example": steps, **result}
    print(json.dumps({**out, "drove": dict(sorted(stats.items()))}))
    return 0
