"""``PDScheduler``: what the prefill and the decode instance share on top of the scheduler.

Both are :class:`~kvledger.reference.scheduler.Scheduler` subclasses (same pools, cache, adder, memory
paths and checks) that add PD queues through the scheduler's hooks. Shared here:

* arrivals carry a ``bootstrap_room``; a rejected arrival tells the other side at once;
* every abort records the state it came from (aborts by stage), tells the other side through the
  channel, and goes through one release path;
* **leases**: an aborted request whose ids a transfer may still read (prefill) or write (decode) is not
  released; it moves to the lease account with everything it holds and is released when the channel
  says the room drained (I-WRITER-LEASE; SGLang #24527, #35049, #38961). Its metadata slot is
  released with the rest (#28236);
* quiescence counts the PD queues and the leases (I-QUIESCENT; sglang-omni #2080).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvledger.contracts.errors import ContractViolation, InvalidArgument, UnknownRoom
from kvledger.contracts.ledger import Ledger
from kvledger.contracts.owners import LEASE_ACCOUNTS, Account
from kvledger.contracts.pool_kinds import METADATA
from kvledger.contracts.seams import seam
from kvledger.reference.disagg.accounting import PDAccounting
from kvledger.reference.disagg.channel import TransferChannel, check_room
from kvledger.reference.disagg.request import PDReq
from kvledger.reference.pools.kv_buffer import KVBufferPool
from kvledger.reference.pools.metadata_pool import MetadataBufferPool
from kvledger.reference.scheduler import Scheduler, SchedulerConfig
from kvledger.reference.scheduler.request import Req, ReqState


@dataclass
class PDStats:
    """Per instance: what ``kvledger simulate --pd`` reports."""

    transfers_started: int = 0
    transfers_succeeded: int = 0
    failures: Counter[str] = field(default_factory=Counter)  # room failures seen here (remote aborts too), by reason
    retries: int = 0  # a ready queue entry had to wait a step for a row, a slot or memory
    prefix_hits: int = 0  # decode radix cache: pre-allocations that matched a cached prefix
    prefix_tokens: int = 0  # ... and the positions they did not need transferred
    resumes: int = 0  # decode: retracted requests brought back from their host copy
    aborts_by_stage: Counter[str] = field(default_factory=Counter)  # state at abort -> count
    leases: int = 0
    longest_lease: int = 0  # steps


# The state each PD queue's entries are in, and the queues whose entries hold no pool id at all.
QUEUE_STATES: dict[str, ReqState] = {
    "bootstrap": ReqState.BOOTSTRAP,
    "inflight": ReqState.INFLIGHT,
    "prealloc": ReqState.PREALLOC,
    "transfer": ReqState.TRANSFER,
    "prebuilt": ReqState.PREBUILT,
    "retracted": ReqState.RETRACTED,
    "lease": ReqState.ABORTED,
}
HOLDS_NOTHING = frozenset({"bootstrap", "prealloc", "retracted"})


def check_queues(sched: PDScheduler) -> None:
    """Each PD queue holds live requests in its own state; bootstrap, prealloc and retracted entries hold no
    pool id (no handle, no KV); a leased request keeps its room. O(queued requests).

    Checked with the scheduler's per-step checks rather than as an icontract class invariant: icontract
    2.7.3 adds a subclass's invariants to the wrappers of the base class's methods, so a plain
    ``Scheduler`` would then evaluate this one.
    """
    for name, queue in sched.pd_queues().items():
        for req in queue:
            if req.state is not QUEUE_STATES[name] or sched.queued_request(req.rid) is not req:
                raise ContractViolation(f"PD queue {sched.side}.{name} holds {req!r} (state or liveness wrong)")
            if name in HOLDS_NOTHING and (req.handles() or req.kv_allocated_len):
                # A handle set in a queue whose entries own nothing names ids the request does not own
                # (freed at retraction and left set: #26941's shape on the decode side).
                raise ContractViolation(
                    f"I-HANDLE-OWNED: {req!r} in the {sched.side} {name} queue holds ids: {req.handles()}"
                )
            if name == "lease" and sched.rooms.get(req.bootstrap_room) is not req:
                raise ContractViolation(f"leased {req!r} lost its room {req.bootstrap_room}")


class PDScheduler(Scheduler):
    """A scheduler with PD queues. Subclasses set ``side``, ``lease_account`` and the queue hooks."""

    side: str = ""
    lease_account: Account

    def __init__(
        self,
        config: SchedulerConfig,
        *,
        metadata_pool: MetadataBufferPool,
        channel: TransferChannel,
        kv_buffer: KVBufferPool | None = None,
        **parts: Any,
    ) -> None:
        self.lease_queue: list[PDReq] = []
        self.rooms: dict[int, PDReq] = {}  # bootstrap room -> this side's live request
        super().__init__(config, **parts)
        self.metadata_pool = metadata_pool
        if isinstance(metadata_pool.ledger, Ledger):  # its moves are dated by this instance's step too
            self._dated_ledgers.append(metadata_pool.ledger)
            metadata_pool.ledger.clock, metadata_pool.ledger.epoch = "scheduler step", 0
        self.channel = channel
        self.kv_buffer = kv_buffer
        self.accounting = PDAccounting(self)
        self.pd_stats = PDStats()
        self.abort_log: list[tuple[int, int]] = []  # (rid, step): read by the system's I-DRAIN check

    parked_accounts = Scheduler.parked_accounts | LEASE_ACCOUNTS
    pool_kinds = (*Scheduler.pool_kinds, METADATA)  # the metadata slots are one more pool of the identity

    # ------------------------------------------------------------------ arrivals
    def add_request(
        self, rid: int, prompt: Sequence[int], max_new_tokens: int, *, bootstrap_room: int | None = None
    ) -> PDReq:
        if bootstrap_room is None:  # a typed error, not Python's TypeError for a missing keyword
            raise InvalidArgument(
                f"{self.side} instance add_request: bootstrap_room is required (PDSystem.add_request opens the"
                " room on the channel and adds the request to both instances)"
            )
        check_room(bootstrap_room)
        if bootstrap_room not in self.channel.rooms:  # PDSystem.add_request opens it first
            raise UnknownRoom(f"bootstrap room {bootstrap_room} is not open on the channel")
        if bootstrap_room in self.rooms:
            raise InvalidArgument(f"bootstrap room {bootstrap_room} is in use on the {self.side} instance")
        req = super().add_request(rid, prompt, max_new_tokens)
        assert isinstance(req, PDReq)
        req.bootstrap_room = bootstrap_room
        req.stage_since = self.step_no
        if req.state is ReqState.REJECTED:
            self.pd_stats.aborts_by_stage["arrival"] += 1
            self.abort_log.append((rid, self.step_no))
            self.channel.abort(bootstrap_room, self.side, f"rejected by {self.side}: {req.finish_reason}")
            self.channel.close(bootstrap_room, self.side)
        else:
            self.rooms[bootstrap_room] = req
        return req

    def new_request(self, rid: int, prompt: list[int], max_new_tokens: int) -> Req:
        return PDReq(rid, prompt, max_new_tokens, arrival_step=self.step_no, side=self.side)

    def _enter(self, req: PDReq, state: ReqState, account: Account, op: str) -> None:
        """Move ``req`` to another PD queue state (and its ids to the queue's account)."""
        req.state = state
        req.stage_since = self.step_no
        req.owner.set_account(account, op=op)

    # ------------------------------------------------------------------ aborts
    def abort_for(self, req: PDReq, reason: str) -> None:
        """Abort ``req`` for ``reason`` (a room failure, a remote abort): now, or with its launched batch."""
        if req.state.is_done or req.abort_requested:
            return
        self.pd_stats.failures[reason] += 1
        req.finish_reason = reason
        if any(req in b.reqs for b in self.inflight):
            req.abort_requested = True
            return
        self._abort_now(req, reason)

    def _abort_now(self, req: Req, reason: str) -> None:
        assert isinstance(req, PDReq)
        if req.abort_requested and req.finish_reason:
            reason = req.finish_reason  # the reason recorded when the abort was requested
        req.ended_from = req.state
        self.pd_stats.aborts_by_stage[req.state.value] += 1
        self.abort_log.append((req.rid, self.step_no))
        self.channel.abort(req.bootstrap_room, self.side, reason)
        super()._abort_now(req, reason)

    @seam
    def _release_finished_or_aborted(self, req: Req) -> None:
        """Release now, or, when a transfer may still touch the ids, hold them under a lease."""
        assert isinstance(req, PDReq)
        if req.state is ReqState.ABORTED and self.transfer_may_touch(req):
            req.stage_since = self.step_no
            req.owner.set_account(self.lease_account, op="lease")
            self.lease_queue.append(req)
            self.pd_stats.leases += 1
            self.start_lease(req)
            return
        self.release_now(req)

    def release_now(self, req: PDReq) -> None:
        """Give back everything: the scheduler's release path, the metadata slot, the room."""
        if req.metadata_idx is not None:
            self.metadata_pool.free(req.metadata_idx, req.owner)
            req.metadata_idx = None
        req.host_copy = None
        super()._release_finished_or_aborted(req)
        self.rooms.pop(req.bootstrap_room, None)
        self.channel.close(req.bootstrap_room, self.side)

    def process_leases(self) -> None:
        """Release every leased request whose room has drained."""
        for req in list(self.lease_queue):
            if self.lease_drained(req):
                self.lease_queue.remove(req)
                self.pd_stats.longest_lease = max(self.pd_stats.longest_lease, self.step_no - req.stage_since)
                self.release_now(req)

    def transfer_may_touch(self, req: PDReq) -> bool:
        """Hook: may a transfer of ``req``'s room still read (prefill) or write (decode) its ids?"""
        raise NotImplementedError

    def start_lease(self, req: PDReq) -> None:
        """Hook: what a side does when it leases (decode: ask the sender to drain and acknowledge)."""

    def lease_drained(self, req: PDReq) -> bool:
        raise NotImplementedError

    def _check_step(self) -> None:
        if self.accounting.enabled:
            check_queues(self)
        super()._check_step()

    # ------------------------------------------------------------------ queues
    def pd_queues(self) -> dict[str, list[PDReq]]:
        """This side's PD queues by name (for quiescence, reports and the drain check)."""
        return {"lease": self.lease_queue}

    def _leave_queues(self, req: Req) -> None:
        super()._leave_queues(req)
        for name, queue in self.pd_queues().items():
            if name != "lease" and req in queue:
                queue.remove(req)

    @seam
    def is_quiescent(self) -> bool:
        """I-QUIESCENT with PD holders: no PD queue entry and no lease, besides the scheduler's own."""
        return super().is_quiescent() and not any(self.pd_queues().values())

    def describe_queues(self) -> str:
        pd = " ".join(f"{name}={[r.rid for r in q]}" for name, q in self.pd_queues().items())
        return f"[{self.side}] {super().describe_queues()} {pd}"

    def serves_alone(self, req: PDReq) -> bool:
        """Whether ``req`` is past its hand-off: the room no longer reaches it (I-DRAIN's scope).

        A prefill copy listens to its room until it is released, so the prefill never serves alone.
        """
        return False

    def where_is(self, req: PDReq) -> str:
        """The queue holding ``req`` (I-DRAIN's report)."""
        for name, queue in self.pd_queues().items():
            if req in queue:
                return f"{self.side} {name} queue"
        if req in self.waiting:
            return f"{self.side} waiting queue"
        if req is self.chunked_req:
            return f"{self.side} chunked request"
        if req in self.running:
            return f"{self.side} running batch"
        if any(req in b.reqs for b in self.inflight):
            return f"{self.side} launched batch"
        return f"{self.side} ({req.state.value})"

    def holdings(self, req: PDReq) -> dict[str, list[int]]:
        """What the ledgers say ``req`` holds, per pool (empty with contracts off)."""
        return {
            name: sorted(pool.ledger.holdings(req.owner))[:8]
            for name, pool in self.accounting.pools_by_name().items()
            if pool.ledger.enabled and pool.ledger.held_count(req.owner)
        }
