"""What travels between the instances and what the channel records per room: components, faults,
statuses (SGLang's ``KVPoll``), the channel's configuration, messages and rooms.

Plain data; the behaviour lives in :mod:`kvledger.reference.disagg.channel`.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from kvledger.contracts.errors import InvalidArgument
from kvledger.reference.config_fields import Count, Size, check_fields
from kvledger.reference.pools.kv_buffer import KVBufferPool
from kvledger.reference.pools.mamba_pool import MambaPool
from kvledger.reference.pools.metadata_pool import MetadataBufferPool


class Component(str, enum.Enum):
    BOOTSTRAP = "bootstrap"
    KV = "kv"
    MAMBA = "mamba"
    META = "meta"
    # control messages (issue 27 item 3): the decode's pre-allocation info, an abort notice from either
    # side, the sender's drain acknowledgement
    INIT = "init"
    ABORT = "abort"
    ACK = "ack"


class Fault(str, enum.Enum):
    DROP = "drop"
    DELAY = "delay"
    FAIL = "fail"
    TIMEOUT = "timeout"
    DUPLICATE = "duplicate"  # control messages only: delivered twice, the copy ``delay_steps + 1`` later


CONTROL = frozenset({Component.INIT, Component.ABORT, Component.ACK})
"""The control messages: lost (retransmitted after ``control_retry``), delayed (so reordered against the
room's other messages), duplicated; never failed (a control message carries no data to corrupt)."""

FAULTS_OF: dict[Component, tuple[Fault, ...]] = {
    c: (Fault.DROP, Fault.DELAY, Fault.DUPLICATE)
    if c in CONTROL
    else (Fault.DROP, Fault.DELAY, Fault.FAIL, Fault.TIMEOUT)
    for c in Component
}
"""The faults each component can suffer (``inject`` refuses any other pair; random faults draw from it)."""


class Poll(enum.IntEnum):
    """SGLang's ``KVPoll`` values."""

    FAILED = 0
    BOOTSTRAPPING = 1
    WAITING_FOR_INPUT = 2
    TRANSFERRING = 3
    SUCCESS = 4


class Outcome(str, enum.Enum):
    LAND = "landed"
    LOSE = "lost"
    FAIL = "failed"


@dataclass(frozen=True)
class ChannelConfig:
    """Latencies and timeouts in scheduler steps; random faults for ``kvledger simulate --pd``."""

    latency: Size = 1
    delay_steps: Count = 3
    bootstrap_timeout: Size = 24
    transfer_timeout: Size = 48  # decode: steps without progress on a pre-allocated room before it fails
    message_timeout: Size = 8  # a hung (TIMEOUT) message fails this many steps after dispatch
    control_retry: Size = 4  # a control message not delivered is sent again this many steps later
    fault_rate: float = 0.0  # probability that a message (or handshake) draws a random fault
    seed: int = 0

    def __post_init__(self) -> None:
        check_fields(self)  # ints are not bools or floats, steps within [1 or 0, MAX_SIZE]; the rate finite
        if not 0.0 <= self.fault_rate <= 1.0:
            raise InvalidArgument(f"ChannelConfig.fault_rate must be in [0, 1], got {self.fault_rate}")

    @property
    def max_message_life(self) -> int:
        """The longest a dispatched message stays unresolved."""
        return max(self.latency + self.delay_steps, self.message_timeout)

    @property
    def drain_bound(self) -> int:
        """I-DRAIN: steps within which an aborted request has left every queue of both instances.

        The abort reaches the other side (``latency``); that side notices at its next step (+1) and, if a
        message of the room is in flight, waits for it to resolve (``max_message_life``); the sender's
        acknowledgement travels back (``latency``) and the decode releases at its next step (+1). A
        chunked prefill notices within one batch (+2 with the overlap scheduler). Nothing else waits,
        unless a control message on that path (the abort, the acknowledgement) was lost or delayed: the
        channel adds what each such fault cost to that room's bound (``TransferChannel.drain_bound``), so
        a fault-free abort is held to this bound exactly.
        """
        return 2 * self.latency + self.max_message_life + 4


@dataclass
class DstInfo:
    """The decode's pre-allocation, as sent to the prefill (SGLang ``kv_receiver.init``)."""

    kv_slots: list[int]  # token slots for positions [prefix_len, plan_len)
    mamba_slot: int | None
    meta_idx: int
    row: int
    # Positions [0, prefix_len) the decode already holds (its radix cache matched them, SGLang's
    # ``decode_prefix_len``): the sender transmits only the rest. Whole pages; 0 without a decode cache.
    prefix_len: int = 0


@dataclass
class Send:
    """A chunk the prefill handed to the engine: KV positions ``[start, end)``, plus state and metadata."""

    start: int
    end: int
    src_slots: list[int]
    tokens: list[int]
    state_src: int | None = None
    meta_src: int | None = None


@dataclass(eq=False)
class Message:
    """One dispatched data message of one component; ``src`` are prefill ids, ``dst`` decode ids."""

    seq: int
    room: int
    component: Component
    sent_step: int
    resolve_step: int
    outcome: Outcome
    reason: str
    src: list[int]
    dst: list[int]
    start: int = 0
    end: int = 0
    tokens: list[int] = field(default_factory=list)

    def __repr__(self) -> str:
        span = f" [{self.start}, {self.end})" if self.component is Component.KV else ""
        return (
            f"Message#{self.seq}(room {self.room}, {self.component.value}{span}, sent {self.sent_step},"
            f" resolves {self.resolve_step} as {self.outcome.value})"
        )


@dataclass(eq=False)
class Room:
    room: int
    plan_len: int
    created: int
    bootstrapped: bool = False
    handshake_failed: bool = False
    # sender (prefill) side
    sender_failure: str | None = None
    sender_aborted: bool = False  # the sender will dispatch nothing more for this room
    sender_closed: bool = False
    dst: DstInfo | None = None
    pending: list[Send] = field(default_factory=list)
    last_handed: bool = False
    dispatched_kv: int = 0  # positions dispatched so far (sends come in order)
    unresolved: dict[int, Message] = field(default_factory=dict)
    # receiver (decode) side
    receiver_failure: str | None = None
    receiver_closed: bool = False
    expects_state: bool = False
    init_step: int | None = None
    prefix_len: int = 0  # positions the receiver matched in its cache: never written, never awaited
    last_progress: int = 0
    kv_landed: int = 0
    landed_positions: bytearray = field(default_factory=bytearray)
    state_landed: bool = False
    meta_landed: bool = False
    drain_requested: bool = False
    ack_sent: bool = False
    ack_received: bool = False

    @property
    def closed(self) -> bool:
        return self.sender_closed and self.receiver_closed and not self.unresolved


NoteKVWritten = Callable[[list[int], list[int], list[int]], None]
"""Told before KV lands in a decode's slots: the slots, the tokens they hold, their positions."""


@dataclass
class InstanceData:
    """What the channel reads or writes on one instance: its buffers and pools (by reference)."""

    kv_buffer: KVBufferPool | None  # None: the hash runner has no KV data
    mamba_pool: MambaPool | None  # None: an attention-only model
    metadata_pool: MetadataBufferPool
    note_kv_written: NoteKVWritten | None = None


@dataclass
class ChannelStats:
    rooms_opened: int = 0
    messages: Counter[tuple[str, str]] = field(default_factory=Counter)  # (component, outcome)
    faults: Counter[tuple[str, str]] = field(default_factory=Counter)  # (component, fault)
    acks: int = 0
    retransmissions: int = 0  # control messages sent again after a loss
