"""The checking level a test hands to what it builds (``checks=``), by what the test needs of it."""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from kvledger.contracts import switch
from kvledger.contracts.levels import CheckLevel
from kvledger.reference.disagg import PDSpec
from kvledger.reference.engine import EngineSpec

Spec = TypeVar("Spec", EngineSpec, PDSpec)


def debug_level(ledgers: bool = True) -> CheckLevel:
    """With ``ledgers``: real ledgers whatever ``KVLEDGER_CHECKS`` says (the process's level, at least
    ``ledger``; at ``full`` the debug build's data checks too). Without: none (``release``)."""
    return max(switch.LEVEL, CheckLevel.LEDGER) if ledgers else CheckLevel.RELEASE


def ledgers(spec: Spec, on: bool = True) -> Spec:
    """``spec`` (an engine's, or both PD instances') built at :func:`debug_level`: the level is handed to
    the pools by the builder, not set around their construction."""
    if isinstance(spec, PDSpec):
        return dataclasses.replace(spec, prefill=ledgers(spec.prefill, on), decode=ledgers(spec.decode, on))
    return dataclasses.replace(spec, checks=debug_level(on))
