"""A pytest plugin: every SGLang ``Scheduler`` built during a test runs under :func:`.ledgers.attach_scheduler`.

    pytest -p kvledger.engines.sglang.scheduler.pytest_plugin tests/...

For the duration of each test, ``Scheduler.__init__`` of the SGLang already imported in the process is
wrapped (a scoped patch through ``monkeypatch``; SGLang's source is untouched, the class is restored at
teardown): a scheduler attaches itself when its ``__init__`` returns. Its steps are checked as they run
(:class:`.ledgers.SchedulerLedgerViolation`, :class:`.ledgers.SGLangCheckVerdict` raise in the test);
at teardown each attach checks the identity once more (a leak left by the test's last step) and
detaches. The attaches are the ``sglang_attaches`` fixture, in build order.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from kvledger.engines.sglang.scheduler.ledgers import SchedulerWatch, attach_scheduler

SCHEDULER_MODULE = "sglang.srt.managers.scheduler"


@pytest.fixture(autouse=True)
def sglang_attaches(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[SchedulerWatch]]:
    """The attaches of the schedulers built in this test (empty when SGLang's scheduler is not imported)."""
    attaches: list[SchedulerWatch] = []
    module = sys.modules.get(SCHEDULER_MODULE)
    if module is not None:
        original = module.Scheduler.__init__

        @functools.wraps(original)
        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            if "kvledger_watch" not in vars(self):  # a subclass's __init__ chains here once
                attaches.append(attach_scheduler(self))

        monkeypatch.setattr(module.Scheduler, "__init__", init)
    yield attaches
    try:
        for sw in attaches:
            sw.take_back()
            sw.end_step()  # the state the test left: every id a live request's, the tree's or free
    finally:
        for sw in attaches:
            sw.detach()
