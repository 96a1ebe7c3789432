"""Run SGLang's Mamba machines: pick one by ``--tree``, hunt with it, or replay the rule calls it printed.

The machines live in :mod:`.drive_mamba` (tree-level rules on 0.5.20's ``MambaRadixCache`` or a release's
``UnifiedRadixCache``) and :mod:`.drive_requests` (the same rules plus SGLang's own ``Req`` life cycle);
this module only chooses and runs them, so neither machine module imports the other's runner.

Run it in a process that loads the release (``KVLEDGER_SGLANG_RELEASE_DIR``, see :mod:`.loader`):
``python -m kvledger.engines.sglang.drive_run [EXAMPLES] [STEPS] [--tree=mamba|unified|requests]`` prints
one JSON line: the first violation Hypothesis found (after shrinking) and the rule calls that lead to it,
or ``null``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from kvledger.contracts.errors import ContractViolation
from kvledger.engines.sglang.drive_mamba import FOUND_0520, SGLangMambaMachine, SGLangUnifiedMambaMachine
from kvledger.engines.sglang.drive_requests import SGLangRequestMachine
from kvledger.engines.sglang.hunting import hunt_machine
from kvledger.engines.sglang.loader import load

MACHINES: dict[str, type[SGLangMambaMachine]] = {
    "mamba": SGLangMambaMachine,
    "unified": SGLangUnifiedMambaMachine,
    "requests": SGLangRequestMachine,  # the Unified tree driven with SGLang's Req objects too
}
TREES = tuple(MACHINES)


def replay(calls: tuple[str, ...] = FOUND_0520, tree: str = "mamba") -> str | None:
    """Run the rule calls Hypothesis printed; the first line of the violation they hit, or None."""
    state = MACHINES[tree]()
    try:
        for call in calls:
            eval(call, {"state": state})  # the machine's own rule calls, as Hypothesis printed them
        state.teardown()  # the end of a passing run: everything must come back (I-IDLE-IDENTITY)
    except BaseException as exc:
        state.abandon()  # a broken state is only let go, never released again
        if isinstance(exc, ContractViolation):
            return (str(exc).splitlines() or [""])[0]
        raise
    return None


def hunt(examples: int, steps: int = 40, tree: str = "mamba") -> dict[str, Any]:
    """Run the machine; the first violation (shrunk) and the rule calls Hypothesis printed, or None."""
    load()
    return hunt_machine(MACHINES[tree], examples, steps)


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--tree=")]
    tree = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--tree=")), "mamba")
    if tree not in TREES:
        print(f"drive_run: --tree must be one of {sorted(TREES)}", file=sys.stderr)
        raise SystemExit(2)
    examples = int(args[0]) if args else 200
    steps = int(args[1]) if len(args) > 1 else 40
    print(
        json.dumps(
            {
                "version": load().version,
                "tree": tree,
                "examples": examples,
                "steps_per_example": steps,
                **hunt(examples, steps, tree),
            }
        )
    )


if __name__ == "__main__":
    main()
