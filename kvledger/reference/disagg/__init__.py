"""Prefill/decode disaggregation: two scheduler instances and a faulty transfer channel, in the ledger.

``build_pd(PDSpec(...))`` gives a :class:`PDSystem`: a :class:`PrefillScheduler` and a
:class:`DecodeScheduler` (subclasses of the scheduler, each with its own pools, cache and model runner)
joined by a :class:`TransferChannel`. The model, the queues, the accounts and the invariants:
``spec/pd.md``.
"""

from kvledger.reference.disagg.builder import PDSpec, build_pd
from kvledger.reference.disagg.channel import ChannelConfig, Component, Fault, Poll, TransferChannel
from kvledger.reference.disagg.decode import DecodeScheduler
from kvledger.reference.disagg.instance import PDScheduler, PDStats
from kvledger.reference.disagg.prefill import PrefillScheduler
from kvledger.reference.disagg.request import DECODE, PREFILL, PDReq
from kvledger.reference.disagg.system import PDSystem

__all__ = [
    "DECODE",
    "PREFILL",
    "ChannelConfig",
    "Component",
    "DecodeScheduler",
    "Fault",
    "PDReq",
    "PDScheduler",
    "PDSpec",
    "PDStats",
    "PDSystem",
    "Poll",
    "PrefillScheduler",
    "TransferChannel",
    "build_pd",
]
