"""The scheduler: admission (PrefillAdder), chunked prefill, decode, retraction, finish, abort, overlap."""

from kvledger.reference.scheduler.adder import AddReqResult, PrefillAdder
from kvledger.reference.scheduler.batch import ScheduleBatch
from kvledger.reference.scheduler.config import SchedulerConfig
from kvledger.reference.scheduler.request import Req, ReqState
from kvledger.reference.scheduler.runner import HashTokenRunner, ModelRunner, hash_next_token
from kvledger.reference.scheduler.scheduler import FaultInjector, Scheduler, SchedulerStats
from kvledger.reference.scheduler.spec_config import RowTooNarrow, SpeculativeConfig
from kvledger.reference.scheduler.validate import UnknownRequest

__all__ = [
    "AddReqResult",
    "FaultInjector",
    "HashTokenRunner",
    "ModelRunner",
    "PrefillAdder",
    "Req",
    "ReqState",
    "RowTooNarrow",
    "ScheduleBatch",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerStats",
    "SpeculativeConfig",
    "UnknownRequest",
    "hash_next_token",
]
