"""The one switch that turns kvledger's contracts and ledger on or off.

``KVLEDGER_CONTRACTS=1`` (the default) or ``0``, read once when this module is imported.

* The icontract decorators (``require``/``ensure``/``invariant``/``snapshot`` below) are built with
  ``enabled=ENABLED``; when off, icontract returns the undecorated function, so the cost is exactly zero.
  Because decorators are applied at import, they cannot be toggled inside a running process: to run
  with contracts off, start a new process with ``KVLEDGER_CONTRACTS=0``.
* The ledger and the explicit ``check_*`` calls are runtime objects. :func:`ledgers_enabled` tells
  whether a pool built *now* gets a real :class:`~kvledger.contracts.ledger.Ledger` or the no-op
  :class:`~kvledger.contracts.ledger.NullLedger`; tests flip it for objects they construct with
  :func:`override_ledgers` (documented test API). It never re-decorates anything.

This module is torch-free and import-light on purpose: CrossHair imports it.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

import icontract

from kvledger.contracts.errors import ContractViolation

ENV_VAR = "KVLEDGER_CONTRACTS"


def _read_env(value: str | None) -> bool:
    """Parse the switch: unset, ``1``, ``true``, ``on`` mean on; ``0``, ``false``, ``off`` mean off."""
    if value is None:
        return True
    normalised = value.strip().lower()
    if normalised in ("1", "true", "on", "yes"):
        return True
    if normalised in ("0", "false", "off", "no"):
        return False
    raise ValueError(f"{ENV_VAR} must be 0 or 1, got {value!r}")


ENABLED: bool = _read_env(os.environ.get(ENV_VAR))

FAST_ENV_VAR = "KVLEDGER_FAST_CONTRACTS"
FAST_CONTRACTS: bool = False
"""Whether icontract's conditions run through :mod:`kvledger.contracts.icontract_fast` in this process
(on with contracts, unless ``KVLEDGER_FAST_CONTRACTS=0``). Same conditions, same messages, less overhead."""
if ENABLED and _read_env(os.environ.get(FAST_ENV_VAR)):
    from kvledger.contracts import icontract_fast

    FAST_CONTRACTS = icontract_fast.install()

# Literal-decorator partials: icontract needs to find the decorator in the source to render messages,
# which works through functools.partial (see tooling-notes §3). Violations raise ContractViolation.
require = functools.partial(icontract.require, enabled=ENABLED, error=ContractViolation)
ensure = functools.partial(icontract.ensure, enabled=ENABLED, error=ContractViolation)
invariant = functools.partial(icontract.invariant, enabled=ENABLED, error=ContractViolation)
snapshot = functools.partial(icontract.snapshot, enabled=ENABLED)

_ledgers_on: bool = ENABLED


def ledgers_enabled() -> bool:
    """Whether a pool or cache constructed now records ownership in a real ledger."""
    return _ledgers_on


@contextlib.contextmanager
def override_ledgers(enabled: bool) -> Iterator[None]:
    """Test API: construct pools with (or without) a ledger, whatever the env var says.

    Only affects objects built inside the ``with`` block. The icontract decorators keep the state
    they got at import; ``enabled=True`` under ``KVLEDGER_CONTRACTS=0`` therefore gives ledger checks
    without pre/postconditions.
    """
    global _ledgers_on
    previous = _ledgers_on
    _ledgers_on = enabled
    try:
        yield
    finally:
        _ledgers_on = previous
