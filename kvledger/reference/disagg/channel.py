"""``TransferChannel``: the transfer engine between a prefill and a decode instance, with faults.

A discrete-event model of SGLang's KV sender/receiver pair (Mooncake, NIXL) for one process:

* **Rooms.** Every request has a ``bootstrap_room``; both sides open it at arrival. The handshake
  completes ``latency`` steps later (``Poll.WAITING_FOR_INPUT``).
* **Control messages** take ``latency`` steps: the decode side's pre-allocation info (``INIT``:
  destination KV slots, Mamba slot, metadata slot), aborts from either side (``ABORT``), and the prefill
  engine's drain acknowledgement (``ACK``, SGLang #35049). Each may be lost (``DROP``: the side that
  sent it sends it again ``control_retry`` steps later, as a retransmission timer would; a fault hits
  one transmission, the retransmission goes through), delayed (``DELAY``: so reordered against the
  room's later messages) or duplicated (``DUPLICATE``). Every handler is idempotent: a second ``INIT``
  changes nothing, a second abort or acknowledgement is a no-op.
* **Data messages**, per component: KV chunks (non-last chunks floored to a page by the sender), and
  with the last chunk the Mamba state and the metadata slot. A message is *dispatched* once the decode's
  destination info has reached the sender and *resolves* as its own event later: it lands (the data is
  copied through the kernels, :mod:`kvledger.reference.disagg.landing`), is lost, or fails. An abort, a
  timeout or a retraction can therefore happen while it is in flight, which is the whole point.
* **Faults** per component (``BOOTSTRAP``, ``KV``, ``MAMBA``, ``META``): ``DROP`` (lost silently: the
  sender believes it went out, the receiver waits until its transfer timeout), ``DELAY`` (lands
  ``delay_steps`` later), ``FAIL`` (both sides see the room fail) and ``TIMEOUT`` (hangs until
  ``message_timeout``, then fails). Injected one at a time (``inject``) or at random (``fault_rate``).

Status as SGLang's ``KVPoll``: the sender's (prefill's) and the receiver's (decode's) views differ, e.g.
a dropped message leaves the sender at ``SUCCESS`` and the receiver at ``TRANSFERRING`` until it times
out. ``missing_components`` is the ground truth the decode's commit checks (I-TRANSFER-ATOMIC).

Leases: ``reads_drained`` (prefill: no dispatched message of the room may still read its ids) and
``writes_drained`` (decode: the sender acknowledged the abort and no message may still write its ids).
An instance releases an ended request's ids only when these say so (I-WRITER-LEASE).

Bad calls are typed errors that change nothing: a room is an int in ``[1, MAX_ROOM]`` (``check_room``),
a side is ``"prefill"`` or ``"decode"``, a room the channel never opened is :class:`UnknownRoom`. A room
that was opened and has closed since is known: its late calls (an abort after the commit, a status poll)
are answered as for a closed room, and its id is never opened again (a late control message of the old
room would otherwise reach the new one).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterator
from enum import Enum
from typing import Any, TypeAlias, TypeVar

from kvledger.contracts.errors import ContractViolation, InvalidArgument, InvalidState, UnknownRoom
from kvledger.contracts.seams import seam
from kvledger.reference.config_fields import check_size
from kvledger.reference.disagg import landing
from kvledger.reference.disagg.messages import (
    CONTROL,
    FAULTS_OF,
    ChannelConfig,
    ChannelStats,
    Component,
    DstInfo,
    Fault,
    InstanceData,
    Message,
    Outcome,
    Poll,
    Room,
    Send,
)
from kvledger.reference.disagg.request import DECODE, PREFILL

__all__ = [
    "ChannelConfig",
    "ChannelStats",
    "Component",
    "DstInfo",
    "Fault",
    "InstanceData",
    "Message",
    "Outcome",
    "Poll",
    "Room",
    "Send",
    "TransferChannel",
]


MAX_ROOM = 2**63 - 1
"""Bootstrap rooms are stored as int64 (the metadata slots); room 0 marks an empty slot."""


def check_room(room_id: object, what: str = "bootstrap room") -> int:
    """A bootstrap room id: an int (not a bool) in ``[1, MAX_ROOM]``."""
    if isinstance(room_id, bool) or not isinstance(room_id, int) or not 1 <= room_id <= MAX_ROOM:
        raise InvalidArgument(
            f"{what} must be an int in [1, {MAX_ROOM}], got {type(room_id).__name__} {room_id!r}"
        )
    return room_id


def check_side(side: object, op: str) -> str:
    if not isinstance(side, str) or side not in (PREFILL, DECODE):
        raise InvalidArgument(f"{op}: side must be {PREFILL!r} or {DECODE!r}, got {side!r}")
    return side


E = TypeVar("E", bound=Enum)

Payload: TypeAlias = "bool | str | DstInfo | Message | tuple[str, Payload] | None"
"""What a scheduled event carries to its handler (``_on_<kind>``): a handshake's failure, an init's
destination, an abort's reason, a data message, or a retransmitted control message with its own payload."""


def _member(enum: type[E], value: object, what: str) -> E:
    """An enum member, or the value of one (``"kv"``); anything else is refused."""
    if isinstance(value, enum):
        return value
    if isinstance(value, str):
        try:
            return enum(value)
        except ValueError:
            pass
    names = ", ".join(repr(m.value) for m in enum)
    raise InvalidArgument(
        f"inject: {what} must be a {enum.__name__} ({names}), got {type(value).__name__} {value!r}"
    )


def _check_ids(values: object, what: str) -> None:
    """A list of ints >= 0 (ids of a pool)."""
    if not isinstance(values, list):
        raise InvalidArgument(f"{what} must be a list of ints >= 0, got {type(values).__name__}")
    for v in values:
        _check_id(v, what)


def _check_id(value: object, what: str, *, allow_none: bool = False) -> None:
    """One id: an int >= 0 (or None where ``allow_none``)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(f"{what} must be an int >= 0, got {type(value).__name__} {value!r}")


class TransferChannel:
    """One prefill-decode pair's transfer engine. ``advance(now)`` runs every event due at ``now``."""

    def __init__(self, config: ChannelConfig | None = None) -> None:
        if config is not None and not isinstance(config, ChannelConfig):
            raise InvalidArgument(f"TransferChannel: config must be a ChannelConfig, got {type(config).__name__}")
        self.config = config or ChannelConfig()
        self.now = 0
        self.rooms: dict[int, Room] = {}
        self.stats = ChannelStats()
        self._events: list[tuple[int, int, str, int, Payload]] = []  # (step, seq, kind, room, payload)
        self._seq = 0
        self._rng = random.Random(self.config.seed)
        self._injected: list[list[Any]] = []  # [component, fault, room or None, times left], in order
        self._closed: set[int] = set()  # rooms opened and closed since: known, never opened again
        # Steps that lost or delayed aborts and acknowledgements added to a room's drain (I-DRAIN's bound
        # grows by them for that room only); the system forgets a room's entry once its request drained.
        self.drain_slack: dict[int, int] = {}
        self.prefill: InstanceData | None = None
        self.decode: InstanceData | None = None
        # Called before a message's data is written (the system's lease check: I-WRITER-LEASE).
        self.before_land: Callable[[Message], None] | None = None

    def attach(self, prefill: InstanceData, decode: InstanceData) -> None:
        for what, data in (("prefill", prefill), ("decode", decode)):
            if not isinstance(data, InstanceData):
                raise InvalidArgument(f"attach: {what} must be an InstanceData, got {type(data).__name__}")
        self.prefill, self.decode = prefill, decode

    def _known(self, room_id: object, op: str) -> Room | None:
        """The open room, None for a room that has closed; UnknownRoom for one never opened."""
        rid = check_room(room_id, f"{op}: bootstrap room")
        room = self.rooms.get(rid)
        if room is None and rid not in self._closed:
            raise UnknownRoom(f"{op}: bootstrap room {room_id} was never opened on this channel")
        return room

    def _open_room(self, room_id: object, op: str) -> Room:
        room = self._known(room_id, op)
        if room is None:
            raise InvalidState(f"{op}: bootstrap room {room_id} has closed")
        return room

    # ------------------------------------------------------------------ faults
    def inject(self, component: Component, fault: Fault, *, room: int | None = None, times: int = 1) -> None:
        """The next ``times`` messages of ``component`` (of ``room``, an open room, if given) get ``fault``.

        ``times`` is an int in ``[1, MAX_SIZE]``; a room that is not open is refused (its fault could
        never fire)."""
        c = _member(Component, component, "component")
        f = _member(Fault, fault, "fault")
        if f not in FAULTS_OF[c]:
            raise InvalidArgument(
                f"inject: a {c.value} message cannot suffer {f.value}: one of {[x.value for x in FAULTS_OF[c]]}"
            )
        if room is not None:
            self._open_room(room, "inject")
        check_size(times, "inject: times")
        self._injected.append([c, f, room, times])

    def clear_faults(self) -> None:
        self._injected.clear()

    def _draw_fault(self, component: Component, room: int) -> Fault | None:
        for i, (c, f, r, left) in enumerate(self._injected):
            if c is component and (r is None or r == room):
                if left == 1:
                    del self._injected[i]
                else:
                    self._injected[i][3] = left - 1
                self.stats.faults[(component.value, f.value)] += 1
                return f
        if self.config.fault_rate and self._rng.random() < self.config.fault_rate:
            f = self._rng.choice(FAULTS_OF[component])
            self.stats.faults[(component.value, f.value)] += 1
            return f
        return None

    # ------------------------------------------------------------------ events
    def _control(self, component: Component, kind: str, room_id: int, payload: Payload = None) -> None:
        """Send a control message (``kind`` is its handler): it draws a fault of ``CONTROL``'s."""
        assert component in CONTROL
        fault = self._draw_fault(component, room_id)
        c = self.config
        if component is not Component.INIT and fault in (Fault.DROP, Fault.DELAY):  # on an abort's path
            cost = c.control_retry if fault is Fault.DROP else c.delay_steps
            self.drain_slack[room_id] = self.drain_slack.get(room_id, 0) + cost
        if fault is Fault.DROP:
            self._schedule(self.now + c.control_retry, "retry", room_id, (kind, payload))
            return
        delay = c.latency + (c.delay_steps if fault is Fault.DELAY else 0)
        self._schedule(self.now + delay, kind, room_id, payload)
        if fault is Fault.DUPLICATE:
            self._schedule(self.now + delay + c.delay_steps + 1, kind, room_id, payload)

    def _on_retry(self, room: Room, sent: tuple[str, Payload]) -> None:
        """The sender's retransmission timer: the lost control message goes again (and arrives)."""
        kind, payload = sent
        self.stats.retransmissions += 1
        self._schedule(self.now + self.config.latency, kind, room.room, payload)

    def _schedule(self, step: int, kind: str, room: int, payload: Payload = None) -> None:
        self._seq += 1
        heapq.heappush(self._events, (step, self._seq, kind, room, payload))

    def advance(self, now: int) -> None:
        """Run every event due at or before ``now``, then the timeouts (time does not run backwards)."""
        if isinstance(now, bool) or not isinstance(now, int) or now < self.now:
            raise InvalidArgument(
                f"advance: now must be an int >= the channel's time {self.now}, got {now!r}"
            )
        self.now = now
        while self._events and self._events[0][0] <= now:
            _, _, kind, room_id, payload = heapq.heappop(self._events)
            room = self.rooms.get(room_id)
            if room is None:
                continue  # the room was closed: its late control messages go nowhere
            getattr(self, f"_on_{kind}")(room, payload)
        self._check_timeouts()

    def _check_timeouts(self) -> None:
        c = self.config
        for room in self.rooms.values():
            if not room.bootstrapped and room.sender_failure is None and self.now - room.created >= c.bootstrap_timeout:
                self._fail_both(room, "bootstrap timeout")
            elif (
                room.init_step is not None
                and room.receiver_failure is None
                and not room.receiver_closed
                and self.missing_components(room.room)
                and self.now - room.last_progress >= c.transfer_timeout
            ):
                room.receiver_failure = "transfer timeout"

    # ------------------------------------------------------------------ rooms
    def open(self, room_id: int, plan_len: int, *, expects_state: bool) -> None:
        """Both sides register ``room_id``; the handshake starts now."""
        check_room(room_id, "open: bootstrap room")
        if room_id in self.rooms:
            raise InvalidArgument(f"bootstrap room {room_id} is already open")
        if room_id in self._closed:
            raise InvalidArgument(f"bootstrap room {room_id} was used before (a room is opened once)")
        check_size(plan_len, "open: plan_len")
        if not isinstance(expects_state, bool):
            raise InvalidArgument(f"open: expects_state must be a bool, got {type(expects_state).__name__}")
        room = Room(room_id, plan_len, self.now, expects_state=expects_state)
        room.landed_positions = bytearray(plan_len)
        self.rooms[room_id] = room
        self.stats.rooms_opened += 1
        fault = self._draw_fault(Component.BOOTSTRAP, room_id)
        if fault in (Fault.DROP, Fault.TIMEOUT):
            return  # the handshake never completes: both sides time out
        delay = self.config.latency + (self.config.delay_steps if fault is Fault.DELAY else 0)
        self._schedule(self.now + delay, "handshake", room_id, fault is Fault.FAIL)

    def _on_handshake(self, room: Room, failed: bool) -> None:
        if failed:
            room.handshake_failed = True
            self._fail_both(room, "bootstrap failed")
        else:
            room.bootstrapped = True

    def close(self, room_id: int, side: str) -> None:
        """One side is done with the room (its request released); the room goes once both are."""
        check_side(side, "close")
        room = self._known(room_id, "close")
        if room is None:
            return
        if side == "prefill":
            room.sender_closed = True
            room.sender_aborted = True  # a closed sender dispatches nothing more
            room.pending.clear()
        else:
            room.receiver_closed = True
        self._maybe_delete(room)

    def _maybe_delete(self, room: Room) -> None:
        if room.closed:
            del self.rooms[room.room]
            self._closed.add(room.room)

    def _fail_both(self, room: Room, reason: str) -> None:
        room.sender_failure = room.sender_failure or reason
        room.receiver_failure = room.receiver_failure or reason

    # ------------------------------------------------------------------ status (SGLang KVPoll)
    def sender_status(self, room_id: int) -> Poll:
        room = self._known(room_id, "sender_status")
        if room is None or room.sender_failure is not None:
            return Poll.FAILED
        if not room.bootstrapped:
            return Poll.BOOTSTRAPPING
        if room.last_handed and not room.pending and not room.unresolved:
            return Poll.SUCCESS
        if room.last_handed or room.dispatched_kv or room.pending:
            return Poll.TRANSFERRING
        return Poll.WAITING_FOR_INPUT

    def receiver_status(self, room_id: int) -> Poll:
        room = self._known(room_id, "receiver_status")
        if room is None or room.receiver_failure is not None:
            return Poll.FAILED
        if not room.bootstrapped:
            return Poll.BOOTSTRAPPING
        if room.init_step is None:
            return Poll.WAITING_FOR_INPUT
        if self._receiver_done(room):
            return Poll.SUCCESS
        return Poll.TRANSFERRING

    @seam
    def _receiver_done(self, room: Room) -> bool:
        """Success for the receiver: every component landed and nothing of the room is in flight."""
        return not self.missing_components(room.room)

    def failure_reason(self, room_id: int, side: str) -> str:
        check_side(side, "failure_reason")
        room = self._known(room_id, "failure_reason")
        if room is None:
            return "room closed"
        reason = room.sender_failure if side == "prefill" else room.receiver_failure
        return reason or "no failure"

    def missing_components(self, room_id: int) -> list[str]:
        """What the receiver still lacks (I-TRANSFER-ATOMIC: commit only when this is empty); open rooms."""
        room = self._open_room(room_id, "missing_components")
        missing = []
        delta = room.plan_len - room.prefix_len  # the positions the receiver's cache did not have
        if room.kv_landed < delta:
            missing.append(f"kv {delta - room.kv_landed}/{delta} positions")
        if room.expects_state and not room.state_landed:
            missing.append("mamba state")
        if not room.meta_landed:
            missing.append("metadata")
        if room.unresolved:
            missing.append(f"{len(room.unresolved)} message(s) in flight")
        return missing

    # ------------------------------------------------------------------ decode side
    def init_receiver(self, room_id: int, dst: DstInfo) -> None:
        """The decode pre-allocated: tell the sender where to write (lands ``latency`` steps later)."""
        room = self._open_room(room_id, "init_receiver")
        if not isinstance(dst, DstInfo):
            raise InvalidArgument(f"init_receiver: dst must be a DstInfo, got {type(dst).__name__}")
        if room.init_step is not None:
            raise InvalidState(f"room {room_id}: the receiver was already initialised")
        self._check_dst(dst)
        if not 0 <= dst.prefix_len <= room.plan_len:
            raise InvalidArgument(
                f"room {room_id}: dst.prefix_len {dst.prefix_len} outside the plan of {room.plan_len} positions"
            )
        if len(dst.kv_slots) != room.plan_len - dst.prefix_len:
            raise InvalidArgument(
                f"room {room_id}: the decode pre-allocated {len(dst.kv_slots)} KV slots for a plan of"
                f" {room.plan_len} positions with {dst.prefix_len} already cached"
            )
        room.init_step = room.last_progress = self.now
        room.prefix_len = dst.prefix_len
        self._control(Component.INIT, "init", room_id, dst)

    def _check_dst(self, dst: DstInfo) -> None:
        """Ids of the decode's pools: ints >= 0, inside the pools when the instances are attached."""
        _check_ids(dst.kv_slots, "init_receiver: dst.kv_slots")
        _check_id(dst.mamba_slot, "init_receiver: dst.mamba_slot", allow_none=True)
        _check_id(dst.meta_idx, "init_receiver: dst.meta_idx")
        _check_id(dst.row, "init_receiver: dst.row")
        _check_id(dst.prefix_len, "init_receiver: dst.prefix_len")
        d = self.decode
        if d is None:
            return
        # (what, ids, the pool's size; None: no such pool): a Mamba pool's slot 0 is reserved, so its
        # slots run to ``size`` inclusive; the KV buffer has a row for every slot, padding included.
        limits: list[tuple[str, list[int], int | None]] = [("meta_idx", [dst.meta_idx], d.metadata_pool.size)]
        if dst.mamba_slot is not None:
            limits.append(("mamba_slot", [dst.mamba_slot], None if d.mamba_pool is None else d.mamba_pool.size))
        if d.kv_buffer is not None:
            limits.append(("kv_slots", dst.kv_slots, d.kv_buffer.num_slots))
        for what, ids, size in limits:
            if ids and (size is None or max(ids) >= size + (what == "mamba_slot")):
                raise InvalidArgument(f"init_receiver: dst.{what} {max(ids)} outside the decode's pool")

    def _on_init(self, room: Room, dst: DstInfo) -> None:
        if room.sender_aborted or room.dst is not None:  # aborted, or a duplicate
            return
        room.dst = dst
        self._dispatch_pending(room)

    def request_drain(self, room_id: int) -> None:
        """The decode ended the request (its abort is on its way to the sender) while writes may come:
        the sender acknowledges once it dispatches nothing more and nothing of the room is in flight."""
        room = self._known(room_id, "request_drain")
        if room is None or room.drain_requested:
            return
        room.drain_requested = True
        self._maybe_ack(room)

    def writes_may_land(self, room_id: int) -> bool:
        """The receiver told the sender where to write, has not committed, and has no acknowledgement."""
        room = self._known(room_id, "writes_may_land")
        return room is not None and room.init_step is not None and not room.receiver_closed and not room.ack_received

    def writes_drained(self, room_id: int) -> bool:
        """The sender acknowledged: no message of the room is in flight or will be dispatched."""
        room = self._known(room_id, "writes_drained")
        return room is None or room.ack_received

    # ------------------------------------------------------------------ prefill side
    def send_chunk(self, room_id: int, send: Send, *, last: bool) -> bool:
        """Hand a chunk to the engine; False when the room has failed, was aborted or has closed (nothing
        queued). The chunk must continue the positions already handed over and stay within the plan."""
        if not isinstance(send, Send):
            raise InvalidArgument(f"send_chunk: send must be a Send, got {type(send).__name__}")
        if not isinstance(last, bool):
            raise InvalidArgument(f"send_chunk: last must be a bool, got {type(last).__name__}")
        room = self._known(room_id, "send_chunk")
        if room is None or room.sender_failure is not None or room.sender_aborted or room.last_handed:
            return False
        _check_send(send)
        if send.start != room.dispatched_kv + sum(s.end - s.start for s in room.pending):
            raise InvalidArgument(
                f"room {room_id}: chunk [{send.start}, {send.end}) does not continue the positions already sent"
            )
        if send.end > room.plan_len or (last and send.end != room.plan_len):
            raise InvalidArgument(
                f"room {room_id}: chunk [{send.start}, {send.end}) (last={last}) disagrees with the"
                f" receiver's plan of {room.plan_len} positions"
            )
        room.pending.append(send)
        room.last_handed = last
        self._dispatch_pending(room)
        return True

    def abort(self, room_id: int, side: str, reason: str) -> None:
        """One side aborted the request: tell the other side (a control message, ``latency`` steps)."""
        check_side(side, "abort")
        if not isinstance(reason, str):
            raise InvalidArgument(f"abort: reason must be a str, got {type(reason).__name__}")
        room = self._known(room_id, "abort")
        if room is None:
            return
        if side == "prefill":
            room.sender_aborted = True
            room.pending.clear()
            room.sender_failure = room.sender_failure or reason
            self._control(Component.ABORT, "abort_at_receiver", room_id, "aborted by prefill")
            self._maybe_ack(room)
        else:
            room.receiver_failure = room.receiver_failure or reason
            self._control(Component.ABORT, "abort_at_sender", room_id, "aborted by decode")

    def _on_abort_at_receiver(self, room: Room, reason: str) -> None:
        room.receiver_failure = room.receiver_failure or reason

    def _on_abort_at_sender(self, room: Room, reason: str) -> None:
        room.sender_aborted = True
        room.pending.clear()
        room.sender_failure = room.sender_failure or reason
        self._maybe_ack(room)

    def _maybe_ack(self, room: Room) -> None:
        """ABORT_ACK once the sender will dispatch nothing more and nothing of the room is in flight."""
        if room.drain_requested and room.sender_aborted and not room.unresolved and not room.ack_sent:
            room.ack_sent = True
            self._control(Component.ACK, "ack", room.room)

    def _on_ack(self, room: Room, _: None) -> None:
        if room.ack_received:  # a duplicate
            return
        room.ack_received = True
        self.stats.acks += 1
        self._maybe_delete(room)

    def reads_drained(self, room_id: int) -> bool:
        """No dispatched message of the room may still read the prefill's ids, and none will be dispatched."""
        room = self._known(room_id, "reads_drained")
        return room is None or (room.sender_aborted and not room.unresolved)

    # ------------------------------------------------------------------ data messages
    def _dispatch_pending(self, room: Room) -> None:
        if room.dst is None or room.sender_aborted:
            return
        dst = room.dst
        skip = dst.prefix_len  # the sender learns the decode's cached prefix with its destination info
        for send in room.pending:
            lo = max(send.start, skip)  # positions below the prefix are never sent (only the delta)
            if send.end > lo:
                cut = lo - send.start
                self._dispatch(
                    room,
                    Component.KV,
                    send.src_slots[cut:],
                    dst.kv_slots[lo - skip : send.end - skip],
                    start=lo,
                    end=send.end,
                    tokens=send.tokens[cut:],
                )
            room.dispatched_kv = send.end
            if send.state_src is not None and dst.mamba_slot is not None:
                self._dispatch(room, Component.MAMBA, [send.state_src], [dst.mamba_slot])
            if send.meta_src is not None:
                self._dispatch(room, Component.META, [send.meta_src], [dst.meta_idx])
        room.pending.clear()

    def _dispatch(
        self,
        room: Room,
        component: Component,
        src: list[int],
        dst: list[int],
        *,
        start: int = 0,
        end: int = 0,
        tokens: list[int] | None = None,
    ) -> None:
        """Send one data message (a KV message names its positions ``[start, end)`` and their tokens)."""
        c = self.config
        fault = self._draw_fault(component, room.room)
        outcome, reason, life = Outcome.LAND, "", c.latency
        if fault is Fault.DELAY:
            life += c.delay_steps
        elif fault is Fault.DROP:
            outcome, reason = Outcome.LOSE, "dropped"
        elif fault is Fault.FAIL:
            outcome, reason = Outcome.FAIL, f"{component.value} transfer failed"
        elif fault is Fault.TIMEOUT:
            outcome, reason, life = Outcome.FAIL, f"{component.value} transfer timed out", c.message_timeout
        self._seq += 1
        span = [] if tokens is None else tokens
        msg = Message(
            self._seq, room.room, component, self.now, self.now + life, outcome, reason, src, dst, start, end, span
        )
        _check_delta(room, msg)  # I-PD-PREFIX-DELTA at dispatch (and again at landing)
        room.unresolved[msg.seq] = msg
        self._schedule(msg.resolve_step, "resolve", room.room, msg)

    def _on_resolve(self, room: Room, msg: Message) -> None:
        del room.unresolved[msg.seq]
        self.stats.messages[(msg.component.value, msg.outcome.value)] += 1
        if msg.outcome is Outcome.LAND:
            _check_delta(room, msg)
            if self.before_land is not None:
                self.before_land(msg)
            self._write(msg)
            if not room.receiver_closed:
                self._record_landing(room, msg)
        elif msg.outcome is Outcome.FAIL:
            self._fail_both(room, msg.reason)
        self._maybe_ack(room)
        self._maybe_delete(room)

    def _write(self, msg: Message) -> None:
        """The one-sided write: it happens whatever the receiver now thinks of the room."""
        assert self.prefill is not None and self.decode is not None, "attach() both instances first"
        p, d = self.prefill, self.decode
        if msg.component is Component.KV:
            if p.kv_buffer is not None and d.kv_buffer is not None:
                landing.copy_kv(p.kv_buffer, msg.src, d.kv_buffer, msg.dst)
            if d.note_kv_written is not None:
                d.note_kv_written(msg.dst, msg.tokens, list(range(msg.start, msg.end)))
        elif msg.component is Component.MAMBA:
            assert p.mamba_pool is not None and d.mamba_pool is not None, "a state message needs both pools"
            landing.copy_state(p.mamba_pool, msg.src[0], d.mamba_pool, msg.dst[0])
        else:
            landing.copy_metadata(p.metadata_pool, msg.src[0], d.metadata_pool, msg.dst[0])

    def _record_landing(self, room: Room, msg: Message) -> None:
        room.last_progress = self.now
        if msg.component is Component.KV:
            for pos in range(msg.start, msg.end):
                if room.landed_positions[pos]:
                    raise ContractViolation(f"room {room.room}: position {pos} landed twice ({msg!r})")
                room.landed_positions[pos] = 1
            room.kv_landed += msg.end - msg.start
        elif msg.component is Component.MAMBA:
            room.state_landed = True
        else:
            room.meta_landed = True

    # ------------------------------------------------------------------ queries
    def audit(self) -> None:
        """The channel's own consistency, O(rooms + messages in flight): what a landing may rely on."""
        for room in self.rooms.values():
            landed = sum(room.landed_positions)
            overdue = any(m.resolve_step <= self.now for m in room.unresolved.values())
            checks = [
                (room.kv_landed != landed, f"kv_landed {room.kv_landed} != positions marked {landed}"),
                (room.dispatched_kv > room.plan_len, f"dispatched {room.dispatched_kv} > plan {room.plan_len}"),
                (bool(room.unresolved) and room.dst is None, "messages in flight for a room with no destination"),
                (overdue, "a message is past its resolve step"),
                (room.closed, "a closed room was kept"),
                (bool(room.pending) and room.sender_aborted, "pending sends on an aborted sender"),
            ]
            problems = [what for bad, what in checks if bad]
            if problems:
                raise ContractViolation(f"channel: {problems}: {self.describe_room(room.room)}")

    def drain_bound(self, room_id: int) -> int:
        """I-DRAIN's bound for ``room_id``: the config's, plus what control faults on its abort path cost."""
        if type(room_id) is not int:
            raise InvalidArgument(f"drain_bound: room_id must be an int, got {type(room_id).__name__}")
        return self.config.drain_bound + self.drain_slack.get(room_id, 0)

    def in_flight(self) -> Iterator[Message]:
        """Every dispatched, unresolved message (what the lease check walks each step)."""
        for room in self.rooms.values():
            yield from room.unresolved.values()

    def is_idle(self) -> bool:
        return not self.rooms

    def describe_room(self, room_id: int) -> str:
        room = self._known(room_id, "describe_room")
        if room is None:
            return f"room {room_id}: closed"
        return (
            f"room {room_id}: bootstrapped={room.bootstrapped} sender(failure={room.sender_failure},"
            f" aborted={room.sender_aborted}, closed={room.sender_closed}, last_handed={room.last_handed},"
            f" pending={len(room.pending)}) receiver(failure={room.receiver_failure},"
            f" closed={room.receiver_closed}, init={room.init_step},"
            f" kv={room.kv_landed}/{room.plan_len - room.prefix_len}"
            f"{f' (prefix {room.prefix_len} cached)' if room.prefix_len else ''},"
            f" state={room.state_landed}, meta={room.meta_landed}, drain={room.drain_requested},"
            f" ack={room.ack_received}) in flight={list(room.unresolved.values())}"
        )


def _check_delta(room: Room, msg: Message) -> None:
    """I-PD-PREFIX-DELTA, when a KV message is dispatched and before it writes: nothing below the prefix the
    decode matched in its cache (those positions' KV is the cache's, shared, maybe locked by others)."""
    if msg.component is Component.KV and msg.start < room.prefix_len:
        raise ContractViolation(
            f"I-PD-PREFIX-DELTA: room {room.room}: {msg!r} would write position {msg.start}, below the"
            f" {room.prefix_len} positions the decode matched in its cache"
        )


def _check_send(send: Send) -> None:
    """A chunk's fields: ``0 <= start <= end``, one source slot and one token per position, ids >= 0."""
    _check_id(send.start, "send_chunk: send.start")
    _check_id(send.end, "send_chunk: send.end")
    if send.start > send.end:
        raise InvalidArgument(f"send_chunk: chunk [{send.start}, {send.end}) runs backwards")
    _check_ids(send.src_slots, "send_chunk: send.src_slots")
    _check_ids(send.tokens, "send_chunk: send.tokens")
    n = send.end - send.start
    if len(send.src_slots) != n or len(send.tokens) != n:
        raise InvalidArgument(
            f"send_chunk: chunk [{send.start}, {send.end}) with {len(send.src_slots)} source slots and"
            f" {len(send.tokens)} tokens"
        )
    _check_id(send.state_src, "send_chunk: send.state_src", allow_none=True)
    _check_id(send.meta_src, "send_chunk: send.meta_src", allow_none=True)
