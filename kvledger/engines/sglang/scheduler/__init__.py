"""SGLang's real ``Scheduler`` on CPU under kvledger (issue 35): build per release, fake tagging worker.

Each release runs in its own process (two SGLang releases cannot share one): :mod:`.release` imports
it, :mod:`.build` builds the real ``Scheduler`` with three overrides, :mod:`.worker` is the fake model
worker that writes and checks data tags, :mod:`.loop` feeds requests and runs the loop body step by
step. :mod:`.ledgers` (``attach_scheduler``) puts a live scheduler's pools, tree and requests under
kvledger's ledgers; :mod:`.pytest_plugin` does it for every scheduler a test builds; :mod:`.machine` is
the Hypothesis machine over the attached loop. See spec/sglang-scheduler.md.
"""

from kvledger.engines.sglang.scheduler.ledgers import (
    SchedulerLedgerViolation,
    SchedulerWatch,
    SGLangCheckVerdict,
    attach_scheduler,
)

__all__ = ["SGLangCheckVerdict", "SchedulerLedgerViolation", "SchedulerWatch", "attach_scheduler"]
