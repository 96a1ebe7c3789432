"""The event logs of a PD pair: one log per instance (``kvledger simulate --pd --record FILE``).

Each instance of a :class:`~kvledger.reference.disagg.PDSystem` is a scheduler with its own pools, tree
and requests, so each gets its own :class:`~kvledger.audit.record.Recorder` and its own log, audited on
its own by ``kvledger audit``. What a PD instance adds is already in the format:

* the metadata-slot pool is a fourth ``pool`` (``metadata``, slots), since the instance lists it among its
  pool kinds (:data:`kvledger.contracts.pool_kinds.METADATA`): its ``alloc``/``free`` moves and its terms;
* the PD queues and leases are request states named by their accounts (``pd.prefill.bootstrap``,
  ``pd.prefill.inflight``, ``pd.prefill.lease``, ``pd.decode.prealloc``, ``pd.decode.transfer``,
  ``pd.decode.waiting``, ``pd.decode.retracted``, ``pd.decode.lease``): a leased request ends holding
  its ids and is ``released`` when its room drained.

What spans both instances (the channel, a transfer's source and destination ids, I-WRITER-LEASE across
them) is not in either log: the audit checks each instance's ownership, not the transfer between them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

from kvledger.audit.record import Recorder
from kvledger.contracts.errors import ContractViolation, InvalidArgument

SIDES = ("prefill", "decode")


class PDRecorder:
    """Writes ``system``'s prefill instance's log to ``outs["prefill"]`` and its decode instance's to
    ``outs["decode"]``. Closes, detaches and works as a context manager as :class:`Recorder` does."""

    def __init__(self, system: Any, outs: Mapping[str, IO[str]], *, source: str = "kvledger") -> None:
        if not all(hasattr(system, side) for side in SIDES):
            raise InvalidArgument(f"PDRecorder: expected a PDSystem, got {type(system).__name__}")
        if not isinstance(outs, Mapping) or sorted(outs) != sorted(SIDES):
            raise InvalidArgument(f"PDRecorder: outs must map each of {SIDES} to a writable text stream")
        if not isinstance(source, str):
            raise InvalidArgument(f"PDRecorder: source must be a str, got {type(source).__name__}")
        self.recorders: dict[str, Recorder] = {}
        try:
            for side in SIDES:
                self.recorders[side] = Recorder(
                    getattr(system, side), outs[side], source=f"{source} [{side} instance]"
                )
        except BaseException:
            self.detach()  # the first instance's hooks must not stay behind a refused second one
            raise

    @property
    def events(self) -> dict[str, int]:
        return {side: rec.events for side, rec in self.recorders.items()}

    def close(self, outcome: str | None = None) -> None:
        """Each instance's ``end`` marker (by default ``completed`` when that instance is quiescent)."""
        for rec in self.recorders.values():
            rec.close(outcome)

    def detach(self) -> None:
        for rec in self.recorders.values():
            rec.detach()

    def __enter__(self) -> PDRecorder:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is None:
            self.close()
        elif issubclass(exc_type, ContractViolation):
            self.close("violation")
        else:
            self.detach()
