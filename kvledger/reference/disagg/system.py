"""``PDSystem``: a prefill instance, a decode instance and their transfer channel, stepped together.

One system step: the channel runs every event due (landings, control messages, timeouts), then the
prefill instance steps, then the decode instance; each instance checks its own identities, handles and
releases (the scheduler's per-step checks with the PD terms). Then the system checks what spans both:

* I-WRITER-LEASE (and the reader lease): every id a message in flight may write on the decode side or
  read on the prefill side is still owned by that room's request (a live queue or a lease), or, for the
  prefill's cached pages, protected by a lock; also checked at the moment each message lands;
* I-DRAIN: a request aborted on either side (or rejected at arrival) has left every queue of that side,
  released everything and closed its room within ``ChannelConfig.drain_bound`` steps; so has the other
  side's copy, unless that copy passed its hand-off before the abort reached it (``serves_alone``: a
  decode that committed the transfer stopped polling the room, as SGLang's does, and serves the request
  on its own; the abort message, ``latency`` steps on the way, can arrive after the commit). Only an
  abort of its own ends such a copy.

Quiescence (I-QUIESCENT) needs both instances quiescent (leases included) and no room open.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kvledger.contracts.errors import ContractViolation, InvalidArgument, InvalidState
from kvledger.contracts.leases import check_lease
from kvledger.contracts.owners import CACHE_PROTECTED, Owner
from kvledger.contracts.protocols import KVAllocator
from kvledger.reference.disagg.channel import Component, Message, TransferChannel
from kvledger.reference.disagg.decode import DecodeScheduler
from kvledger.reference.disagg.prefill import PrefillScheduler
from kvledger.reference.disagg.request import DECODE, PREFILL, PDReq
from kvledger.reference.pools.validate import check_positive
from kvledger.reference.scheduler.batch import ScheduleBatch
from kvledger.reference.scheduler.request import ReqState
from kvledger.reference.scheduler.validate import check_rid


def kv_ledger_ids(allocator: KVAllocator, token_slots: Sequence[int]) -> list[int]:
    """The KV ledger's ids for token slots: the slots themselves, or their distinct pages."""
    page = allocator.page_size
    if page == 1:
        return list(token_slots)
    return sorted({s // page for s in token_slots})


@dataclass
class DrainRecord:
    """I-DRAIN bookkeeping for one aborted request."""

    since: int
    longest: int = 0


class PDSystem:
    def __init__(self, prefill: PrefillScheduler, decode: DecodeScheduler, channel: TransferChannel) -> None:
        check_wiring(prefill, decode, channel)
        self.prefill = prefill
        self.decode = decode
        self.channel = channel
        self.step_no = 0
        self.pairs: dict[int, tuple[PDReq, PDReq]] = {}
        self.undrained: dict[int, int] = {}  # rid -> step of its first abort (I-DRAIN)
        self.drain_sides: dict[int, tuple[str, ...]] = {}  # rid -> the sides that aborted it (I-DRAIN)
        self.drained_aborts = 0
        self.longest_drain = 0
        self.last_prefill_batch: ScheduleBatch | None = None
        channel.before_land = self._check_landing

    @property
    def checking(self) -> bool:
        return bool(self.prefill.accounting.enabled and self.decode.accounting.enabled)

    def instances(self) -> tuple[PrefillScheduler, DecodeScheduler]:
        return self.prefill, self.decode

    # ------------------------------------------------------------------ requests
    def add_request(self, rid: int, prompt: Sequence[int], max_new_tokens: int) -> tuple[PDReq, PDReq]:
        """Send a request to both instances (the router's job); its bootstrap room is ``rid + 1``."""
        check_rid(rid)  # the one rule for request ids (0 <= rid <= MAX_RID); a system never reuses one
        if rid in self.pairs:
            raise InvalidArgument(f"request id {rid} was already used in this system")
        room = rid + 1
        # Validate on both sides before the room opens, so a bad request changes nothing anywhere.
        for inst in self.instances():
            inst.validate_arrival(rid, prompt, max_new_tokens)
        self.channel.open(room, len(prompt), expects_state=self.decode.mamba_pool is not None)
        p = self.prefill.add_request(rid, prompt, max_new_tokens, bootstrap_room=room)
        d = self.decode.add_request(rid, prompt, max_new_tokens, bootstrap_room=room)
        self.pairs[rid] = (p, d)
        self._note_aborts()
        return p, d

    def abort(self, rid: int, side: str = DECODE) -> bool:
        """A client abort arriving at ``side``; False if that side's request had already ended."""
        if not isinstance(side, str) or side not in (PREFILL, DECODE):
            raise InvalidArgument(f"side must be 'prefill' or 'decode', got {side!r}")
        inst = self.prefill if side == PREFILL else self.decode
        with self._side(side):
            done = inst.abort(rid)
        self._note_aborts()
        return done

    # ------------------------------------------------------------------ the loop
    def step(self) -> None:
        self.step_no += 1
        self.channel.advance(self.step_no)
        with self._side(PREFILL):
            self.last_prefill_batch = self.prefill.step()
        with self._side(DECODE):
            self.decode.step()
        self._note_aborts()
        if self.checking:
            self.channel.audit()
            self.check_leases()
            self.check_drain()

    def has_work(self) -> bool:
        return not self.is_quiescent()

    def is_quiescent(self) -> bool:
        """I-QUIESCENT: both instances quiescent (PD queues and leases included) and no room open."""
        return self.prefill.is_quiescent() and self.decode.is_quiescent() and self.channel.is_idle()

    def run_until_idle(self, max_steps: int = 100_000) -> int:
        check_positive(max_steps, "max_steps")
        taken = 0
        while self.has_work():
            if taken >= max_steps:
                raise ContractViolation(f"I-LIVENESS: not drained after {max_steps} steps: {self.describe()}")
            self.step()
            taken += 1
        return taken

    def check_quiescent(self) -> None:
        """The strong identities and full audits of both instances, at quiescence.

        Calling it while the system is busy is the caller's error (:class:`InvalidState`, nothing checked
        or changed: run it after ``run_until_idle``); a check that fails at quiescence is a bug
        (:class:`ContractViolation`)."""
        if not self.is_quiescent():
            raise InvalidState(f"check_quiescent while the system is busy (I-QUIESCENT): {self.describe()}")
        for side, inst in ((PREFILL, self.prefill), (DECODE, self.decode)):
            with self._side(side):
                inst.accounting.check_quiescent()
        self.channel.audit()
        self.check_drain()
        if self.undrained:
            raise ContractViolation(f"I-DRAIN: quiescent with aborted requests not drained: {self.undrained}")

    def describe(self) -> str:
        rooms = "; ".join(self.channel.describe_room(r) for r in list(self.channel.rooms)[:4])
        return f"{self.prefill.describe_queues()} | {self.decode.describe_queues()} | rooms: {rooms or 'none'}"

    @contextlib.contextmanager
    def _side(self, side: str) -> Iterator[None]:
        """Name the instance in a violation raised while it runs."""
        try:
            yield
        except ContractViolation as exc:
            raise ContractViolation(f"[{side} instance, step {self.step_no}] {exc}") from exc

    # ------------------------------------------------------------------ I-WRITER-LEASE
    def check_leases(self) -> int:
        """Every message in flight against the current owners; returns how many were checked."""
        n = 0
        for msg in self.channel.in_flight():
            self._check_message(msg, "in flight")
            n += 1
        return n

    def _check_landing(self, msg: Message) -> None:
        if self.checking:
            self._check_message(msg, "landing")

    def _check_message(self, msg: Message, when: str) -> None:
        d_req = self.decode.rooms.get(msg.room)
        p_req = self.prefill.rooms.get(msg.room)
        d_holder = None if d_req is None else d_req.owner
        p_holder = None if p_req is None else p_req.owner
        d_pool, p_pool = self._pool_and_ids(self.decode, msg.component, msg.dst), self._pool_and_ids(
            self.prefill, msg.component, msg.src
        )
        check_lease(d_pool[0].ledger, d_pool[1], d_holder, f"{msg!r} ({when}) may still write decode {d_pool[0].name}")
        room = self.channel.rooms.get(msg.room)
        if room is not None and room.dst is not None:
            rows = self.decode.req_to_token_pool
            check_lease(rows.ledger, [room.dst.row], d_holder, f"{msg!r} ({when}) targets decode row")
        check_lease(
            p_pool[0].ledger,
            p_pool[1],
            p_holder,
            f"{msg!r} ({when}) may still read prefill {p_pool[0].name}",
            also_allowed=_locked_in_tree if msg.component is Component.KV else None,
        )

    @staticmethod
    def _pool_and_ids(inst: Any, component: Component, ids: list[int]) -> tuple[Any, list[int]]:
        if component is Component.KV:
            return inst.kv_allocator, kv_ledger_ids(inst.kv_allocator, ids)
        if component is Component.MAMBA:
            return inst.mamba_pool, ids
        return inst.metadata_pool, ids

    # ------------------------------------------------------------------ I-DRAIN
    def _note_aborts(self) -> None:
        for inst in self.instances():
            for rid, step in inst.abort_log:
                self.undrained.setdefault(rid, step)
                if inst.side not in self.drain_sides.get(rid, ()):
                    self.drain_sides[rid] = (*self.drain_sides.get(rid, ()), inst.side)
            inst.abort_log.clear()

    def check_drain(self) -> None:
        for rid, since in list(self.undrained.items()):
            bound = self.channel.drain_bound(rid + 1)  # the room's: lost or delayed aborts and acks add
            left = self._still_held(rid)
            if not left:
                del self.undrained[rid]
                del self.drain_sides[rid]
                self.channel.drain_slack.pop(rid + 1, None)
                self.drained_aborts += 1
                self.longest_drain = max(self.longest_drain, self.step_no - since)
            elif self.step_no - since > bound:
                raise ContractViolation(
                    f"I-DRAIN: request {rid} was aborted at step {since} and after {self.step_no - since} steps"
                    f" (bound {bound}) has not left: " + "; ".join(left)
                )

    def _still_held(self, rid: int) -> list[str]:
        """Where an aborted request still is: a queue, a lease, held ids, an open room."""
        out = []
        aborted_on = self.drain_sides.get(rid, ())
        for inst, req in zip(self.instances(), self.pairs[rid], strict=True):
            if inst.side not in aborted_on and req.state is not ReqState.ABORTED and inst.serves_alone(req):
                continue  # past its hand-off before the abort reached it: the request goes on there
            if not req.released and req.state is not ReqState.REJECTED:
                out.append(f"{req.owner!r} in the {inst.where_is(req)} holding {inst.holdings(req)}")
        room = rid + 1
        if room in self.channel.rooms:
            out.append(self.channel.describe_room(room))
        return out


def _locked_in_tree(owner: Owner | None) -> bool:
    """A prefill source page may also be a cache node's, as long as a lock protects it."""
    return owner is not None and owner.kind.startswith("node") and owner.account is CACHE_PROTECTED


T = TypeVar("T")


def _wired(what: str, value: object, cls: type[T]) -> T:
    if not isinstance(value, cls):
        raise InvalidArgument(f"PDSystem: {what} must be a {cls.__name__}, got {type(value).__name__}")
    return value


def check_wiring(prefill: object, decode: object, channel: object) -> None:
    """The system's collaborators: a prefill and a decode instance sharing ``channel`` (bad wiring is an
    operating error, refused before the channel's landing hook is installed)."""
    p = _wired("prefill", prefill, PrefillScheduler)
    d = _wired("decode", decode, DecodeScheduler)
    _wired("channel", channel, TransferChannel)
    if p.channel is not channel or d.channel is not channel:
        raise InvalidArgument("PDSystem: both instances must use the system's channel")
