"""The process's checking level, and the switches derived from it (spec/checking-levels.md).

The level (:class:`~kvledger.contracts.levels.CheckLevel`: ``release``, ``owners``, ``ledger``, ``full``)
is read once, when this module is imported, from ``KVLEDGER_CHECKS``; when that is unset,
``KVLEDGER_CONTRACTS`` (the switch of earlier releases) is its alias: ``1`` means ``full``, ``0`` means
``release``; when both are set, ``KVLEDGER_CHECKS`` wins. Neither set: ``full``
(:data:`~kvledger.contracts.levels.DEFAULT_LEVEL`). The CLI's ``--checks LEVEL`` sets the variable and
starts a new process.

* The icontract decorators (``require``/``ensure``/``invariant``/``snapshot`` below) are built with
  ``enabled=ENABLED`` (the level is ``full``); when off, icontract returns the undecorated function, so
  the cost is exactly zero. Because decorators are applied at import, they cannot be toggled inside a
  running process: to run at another level, start a new process.
* The ledgers are runtime objects, and the level that picks them is handed to each object when it is
  built (issue 36): a pool takes ``checks=`` (a :class:`~kvledger.contracts.levels.CheckLevel`) and gets
  no ledger (``release``: the no-op :class:`~kvledger.contracts.null_ledger.NullLedger`), an owner table
  (``owners``) or a ledger with its move history (``ledger``, ``full``); the engine builder hands
  ``EngineSpec.checks`` to every pool it builds. An object handed no level is built at the process's
  (:func:`building_level`). Nothing reads a mutable module global when an object is built, and nothing
  re-decorates anything: only ``full`` (icontract's conditions) needs a process started at it.

This module is torch-free and import-light on purpose: CrossHair imports it.
"""

from __future__ import annotations

import functools
import os

import icontract

from kvledger.contracts.errors import ContractViolation, InvalidArgument
from kvledger.contracts.levels import CONTRACTS_ENV_VAR, CheckLevel, read_level, read_switch
from kvledger.contracts.levels import LEVEL_ENV_VAR as LEVEL_ENV_VAR  # re-exported: callers know it from here

ENV_VAR = CONTRACTS_ENV_VAR

# The parsing lives in ``levels`` (no icontract, no torch), where the CLI checks the variables before
# anything imports this module; these names stay for the tests and for anyone who imported them here.
_read_env = read_switch
_read_level = read_level

LEVEL: CheckLevel = read_level(os.environ.get(LEVEL_ENV_VAR), os.environ.get(ENV_VAR))
"""The process's checking level, fixed at import."""

ENABLED: bool = LEVEL.contracts
"""icontract's conditions and the scheduler's per-step cross-checks run (the level is ``full``)."""

FAST_ENV_VAR = "KVLEDGER_FAST_CONTRACTS"
FAST_CONTRACTS: bool = False
"""Whether icontract's conditions run through :mod:`kvledger.contracts.icontract_fast` in this process
(on with contracts, unless ``KVLEDGER_FAST_CONTRACTS=0``). Same conditions, same messages, less overhead."""
if ENABLED and read_switch(os.environ.get(FAST_ENV_VAR), FAST_ENV_VAR):
    from kvledger.contracts import icontract_fast

    FAST_CONTRACTS = icontract_fast.install()

# Literal-decorator partials: icontract needs to find the decorator in the source to render messages,
# which works through functools.partial (see tooling-notes §3). Violations raise ContractViolation.
require = functools.partial(icontract.require, enabled=ENABLED, error=ContractViolation)
ensure = functools.partial(icontract.ensure, enabled=ENABLED, error=ContractViolation)
invariant = functools.partial(icontract.invariant, enabled=ENABLED, error=ContractViolation)
snapshot = functools.partial(icontract.snapshot, enabled=ENABLED)

def building_level(checks: CheckLevel | None, what: str = "checks") -> CheckLevel:
    """The level an object handed ``checks`` is built at: ``checks`` itself, or the process's level when it
    was handed none (an object built on its own, outside an engine). ``full`` needs a process started at
    ``full``: icontract's decorators were applied, or not, when this process imported kvledger. ``what``
    names the setting in the typed error (``EngineSpec.checks``)."""
    if checks is None:
        return LEVEL
    if not isinstance(checks, CheckLevel):
        raise InvalidArgument(f"{what}: expected a CheckLevel, got {type(checks).__name__}")
    if checks.contracts and not ENABLED:
        raise InvalidArgument(
            f"{what}: checking level full needs a process started at full ({LEVEL_ENV_VAR}=full): this one runs"
            f" at {LEVEL.label}, and icontract's decorators were applied when it imported kvledger"
        )
    return checks
