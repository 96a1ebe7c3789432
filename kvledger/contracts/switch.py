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
* The ledgers are runtime objects. :func:`ledger_level` tells which kind of ledger a pool built *now*
  gets: none (``release``: the no-op :class:`~kvledger.contracts.null_ledger.NullLedger`), an owner table
  (``owners``) or a ledger with its move history (``ledger``, ``full``). The engine builder sets it from
  ``EngineSpec.checks`` with :func:`building_at`; tests flip it with :func:`override_ledgers` (documented
  test API). It never re-decorates anything.

This module is torch-free and import-light on purpose: CrossHair imports it.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

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

_ledger_level: CheckLevel = LEVEL


def ledger_level() -> CheckLevel:
    """The level a pool or cache constructed now is built at (which ledger it gets)."""
    return _ledger_level


def ledgers_enabled() -> bool:
    """Whether a pool or cache constructed now records ownership in a real ledger (``owners`` or more)."""
    return _ledger_level.tracks_owners


@contextlib.contextmanager
def building_at(level: CheckLevel | None) -> Iterator[None]:
    """Construct pools at ``level`` (None: as now). ``full`` needs a process at ``full`` (import-time)."""
    global _ledger_level
    if level is None:
        yield
        return
    if level.contracts and not ENABLED:
        raise InvalidArgument(
            f"checking level full needs a process started at full ({LEVEL_ENV_VAR}=full): this one runs"
            f" at {LEVEL.label}, and icontract's decorators were applied when it imported kvledger"
        )
    previous = _ledger_level
    _ledger_level = level
    try:
        yield
    finally:
        _ledger_level = previous


@contextlib.contextmanager
def override_ledgers(enabled: bool) -> Iterator[None]:
    """Test API: construct pools with (or without) a ledger, whatever the level says.

    Only affects objects built inside the ``with`` block. The icontract decorators keep the state
    they got at import; ``enabled=True`` in a process below ``full`` therefore gives ledger checks
    (with history) without pre/postconditions.
    """
    global _ledger_level
    previous = _ledger_level
    _ledger_level = max(_ledger_level, CheckLevel.LEDGER) if enabled else CheckLevel.RELEASE
    try:
        yield
    finally:
        _ledger_level = previous
