"""Child process of test_release_counts.py: runs at ``KVLEDGER_CHECKS`` as set by the parent.

``python tests/scheduler/release_counts_child.py MODE``, prints one JSON line:

* ``sweep``: small simulate runs over the scheduler's modes (page sizes, overlap, V1/V2, speculative,
  faults and aborts) with ``recount_every_step`` on, so the incremental sums are compared with a full
  recount after every step;
* ``no_marks``: the same first run with the write marks removed (a patch outside the reference code):
  the incremental sums miss the writes, so the comparison must fail;
* ``steps``: a busy run counting how often the full recount runs outside quiescence (must be never).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from unittest import mock

from kvledger.reference.scheduler import accounting
from kvledger.sim.simulate import SimOptions, run_simulation
from kvledger.sim.workload import GSPWorkload

SMALL = GSPWorkload(num_groups=3, prompts_per_group=6, system_prompt_len=96, question_len=40, output_len=24)
VARIANTS = (
    SimOptions(workload=SMALL),
    SimOptions(workload=SMALL, page_size=16, overlap=True),
    SimOptions(workload=SMALL, mamba_strategy="no_buffer", kv_pool_tokens=1536),
    SimOptions(workload=SMALL, hybrid=False, radix_cache=False),
    SimOptions(workload=SMALL, speculative=3, abort_rate=0.05, alloc_fault_rate=0.05, kv_pool_tokens=1024),
)


def _run(options: SimOptions) -> dict[str, object]:
    result = run_simulation(options)
    failure = result.violation or result.identity_failure
    return {
        "failed": bool(result.failed),
        "failure": None if failure is None else str(failure)[:400],
        "steps": result.steps,
    }


def main(mode: str) -> dict[str, object]:
    accounting.Accounting.recount_every_step = mode != "steps"
    if mode == "sweep":
        return {"runs": [_run(o) for o in VARIANTS]}
    if mode == "no_marks":
        with mock.patch.object(accounting, "mark_writes", lambda cls, names: None):
            return {"runs": [_run(VARIANTS[0])]}
    recounts = {"busy": 0}
    real = accounting.Accounting._request_held_recount

    def counted(self: accounting.Accounting) -> dict[str, dict[str, int]]:
        if not self.s.is_quiescent():
            recounts["busy"] += 1
        return real(self)

    with mock.patch.object(accounting.Accounting, "_request_held_recount", counted):
        out = _run(replace(VARIANTS[0], workload=replace(SMALL, num_groups=6)))
    return {"runs": [out], "busy_recounts": recounts["busy"]}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
