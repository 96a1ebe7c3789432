"""The ledger a pool gets at the checking level it is built at.

``release``: :class:`~kvledger.contracts.null_ledger.NullLedger` (nothing recorded); ``owners``:
:class:`~kvledger.contracts.owner_table.OwnerTable` (the owner of every id, no history); ``ledger`` and
``full``: :class:`~kvledger.contracts.ledger.Ledger` (owners, accounts, the move log).
"""

from __future__ import annotations

from kvledger.contracts.ledger import Ledger
from kvledger.contracts.levels import CheckLevel
from kvledger.contracts.null_ledger import NullLedger
from kvledger.contracts.owner_table import OwnerTable

AnyLedger = Ledger | NullLedger


def make_ledger(pool: str, domain: range, *, level: CheckLevel, unit: int = 1) -> AnyLedger:
    """The ledger of a pool built at ``level`` (handed down by whoever builds the pool): a :class:`Ledger`
    (``ledger``, ``full``), an :class:`OwnerTable` (``owners``) or the no-op one (``release``)."""
    if level >= CheckLevel.LEDGER:
        return Ledger(pool, domain, unit=unit, debug=level.contracts)
    if level is CheckLevel.OWNERS:
        return OwnerTable(pool, domain, unit=unit)
    return NullLedger(pool, domain, unit=unit)
