"""The SGLang plugin that puts every ``Scheduler`` a server process builds under :func:`.ledgers.attach_scheduler`.

How it reaches the scheduler process: SGLang's own plugin framework (``sglang.srt.plugins``). SGLang's
``run_scheduler_process`` calls ``load_plugins()`` as its first statement, in the child it was spawned
into (``multiprocessing`` with the ``spawn`` start method: a fresh interpreter that inherits the
parent's environment and ``sys.path``), before it publishes the server arguments and constructs the
``Scheduler``. ``load_plugins`` runs every entry point of the ``sglang.srt.plugins`` group, then applies
the hooks they registered with SGLang's ``HookRegistry``. :mod:`.serve` (the launcher) makes this
module's :func:`install` such an entry point (a ``.dist-info`` folder it puts on the path) and sets
:data:`ATTACH_ENV`; :func:`install` registers one AFTER hook on ``Scheduler.__init__``, which attaches
the scheduler as its constructor returns. SGLang's source is untouched; nothing else changes in the
process (without :data:`ATTACH_ENV`, :func:`install` registers nothing).

What a violation does in a live server (:data:`ATTACH_ENV`):

``raise``
    one log line ``kvledger: <invariant> in scheduler pid N: <evidence>`` (the ids, their owners and
    histories), appended to :data:`REPORT_ENV`'s file as JSON, then raised in the scheduler's step:
    SGLang's ``run_scheduler_process`` logs "Scheduler hit an exception" and SIGQUITs the server, which
    exits. The server stops at the first bad step.
``log``
    the same log line and report, then the attach detaches (its ledgers can no longer be trusted) and
    the server keeps serving, unchecked from there on. SGLang's own errors (its memory check) are
    re-raised as SGLang raises them.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

from kvledger.contracts.errors import ContractViolation, InvalidArgument

ATTACH_ENV = "KVLEDGER_SGLANG_ATTACH"
"""``raise`` / ``log``: what a violation does in the attached scheduler process (unset: no attach)."""

REPORT_ENV = "KVLEDGER_SGLANG_ATTACH_REPORT"
"""A file the scheduler process appends each violation to, one JSON object a line (unset: the log only)."""

MODES = ("raise", "log")
SCHEDULER_INIT = "sglang.srt.managers.scheduler.Scheduler.__init__"

logger = logging.getLogger("kvledger.sglang.serve")


def mode() -> str | None:
    """:data:`ATTACH_ENV` as this process sees it; a value outside :data:`MODES` is a typed error."""
    value = os.environ.get(ATTACH_ENV) or None
    if value is not None and value not in MODES:
        raise InvalidArgument(f"{ATTACH_ENV}={value!r}: expected one of {MODES}")
    return value


def install() -> None:
    """The entry point SGLang's ``load_plugins`` calls: with :data:`ATTACH_ENV` set, register the hook
    that attaches each ``Scheduler`` when its ``__init__`` returns. Post: nothing registered otherwise."""
    if mode() is None:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(SCHEDULER_INIT, attach_after_init, HookType.AFTER)


def attach_after_init(result: Any, scheduler: Any, *_: Any, **__: Any) -> None:
    """The AFTER hook on ``Scheduler.__init__``: attach once (a subclass's ``__init__`` chaining to the
    hooked one passes here once), with the reporting of :func:`reporter`."""
    from kvledger.engines.sglang.scheduler.ledgers import attach_scheduler

    if "kvledger_watch" in vars(scheduler):
        return None
    chosen = mode() or "raise"
    sw = attach_scheduler(scheduler)
    sw.on_violation = reporter(sw, chosen)
    logger.info("kvledger: scheduler pid %d attached (on violation: %s)", os.getpid(), chosen)
    return None


def reporter(sw: Any, chosen: str) -> Any:
    """The listener a live attach reports through: log line and report file, then raise (``raise``) or
    detach and let the step's result through (``log``)."""

    def on_violation(error: ContractViolation, cause: BaseException | None) -> None:
        record = {
            "pid": os.getpid(),
            "time": time.time(),
            "step": sw.steps,
            "kind": type(error).__name__,
            "invariant": getattr(error, "invariant", None),
            "verdict": getattr(error, "kind", None),
            "message": str(error),
            "mode": chosen,
        }
        logger.error("kvledger: %s in scheduler pid %d: %s", record["kind"], record["pid"], error)
        path = os.environ.get(REPORT_ENV)
        if path:
            with open(path, "a", encoding="utf-8") as out:
                out.write(json.dumps(record) + "\n")
        if chosen == "raise":
            raise error from cause
        if "kvledger_watch" in vars(sw.scheduler):
            sw.detach()
            logger.error(
                "kvledger: attach detached after the violation above; the server keeps serving unchecked"
            )

    return on_violation
