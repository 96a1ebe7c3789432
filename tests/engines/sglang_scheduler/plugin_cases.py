"""Cases run by test_pytest_plugin.py in a child pytest with the plugin on (not collected on their own:
the file name has no ``test_`` prefix). SGLang's scheduler module is imported at collection, as a
project's own conftest would."""

from __future__ import annotations

import os
from typing import Any

from kvledger.engines.sglang.scheduler.build import build_scheduler, scheduler_class
from kvledger.engines.sglang.scheduler.loop import arrive, step

RELEASE = os.environ["KVLEDGER_PLUGIN_RELEASE"]
scheduler_class(RELEASE)  # imports SGLang's scheduler before the plugin's fixture runs


def test_a_built_scheduler_is_attached(sglang_attaches: list[Any]) -> None:
    scheduler = build_scheduler(RELEASE)
    assert [sw.scheduler for sw in sglang_attaches] == [scheduler]
    req = arrive(scheduler, "a", list(range(1, 20)), 4)
    while not req.finished():
        step(scheduler)
    assert sglang_attaches[0].steps >= 2


def test_a_leak_left_by_the_test_fails_at_teardown() -> None:
    scheduler = build_scheduler(RELEASE)
    arrive(scheduler, "a", list(range(1, 20)), 4)
    step(scheduler)
    scheduler.req_to_token_pool.mamba_pool.alloc(1)  # a slot taken for nobody: the plugin must say so
