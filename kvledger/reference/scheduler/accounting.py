"""The scheduler's identities: busy after every step, idle at quiescence, and the ledger's cross-check.

Terms come from the implementation's own counters: allocator free lists, tree counters and each
request's bookkeeping (``memory.kv_held_tokens``), grouped by the request's account. When the pools carry
a real ledger the same terms are compared account by account with it, and on a mismatch every
request's bookkeeping is compared with what the ledger says it holds, so the report names the request
and the slots (with their history) rather than a count.

Incremental (issue 12): after a step only the requests whose bookkeeping changed are recounted. Every
write of a field the identity reads (``request.MEMORY_FIELDS`` and the kinds' ``fields``, marked by
:mod:`~kvledger.reference.scheduler.write_marks`) and every account change of a request's owner
marks the request (contracts on); :meth:`Accounting.after_step` recomputes those requests' terms from
their fields, so the per-request sums stay a recount of the bookkeeping, independent of the ledger
they are checked against. The full recount (:meth:`Accounting.pool_terms`, every live request) runs at
quiescence, where it must equal the incremental sums, and after every step when
``recount_every_step`` is set (``KVLEDGER_RECOUNT_EVERY_STEP=1``; the ``deep`` test profile sets it).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Mapping
from operator import attrgetter
from typing import TYPE_CHECKING

from kvledger.contracts.diagnosis import diagnose
from kvledger.contracts.errors import ContractViolation, IdentityFailure
from kvledger.contracts.identity import PoolTerms, check_busy_identity, check_idle_identity
from kvledger.contracts.ledger_by_level import AnyLedger
from kvledger.contracts.owners import (
    CACHE_EVICTABLE,
    CACHE_PROTECTED,
    FREE,
    PENDING_FREE,
    Owner,
)
from kvledger.contracts.pool_kinds import UNITS, PoolKind
from kvledger.contracts.protocols import IdPool
from kvledger.contracts.switch import ENABLED
from kvledger.reference.scheduler import census
from kvledger.reference.scheduler.counters import free_reader
from kvledger.reference.scheduler.request import (
    MEMORY_FIELDS,
    ReqState,
    ladder_holds,
    track_point_holds,
)
from kvledger.reference.scheduler.write_marks import mark_writes

if TYPE_CHECKING:  # pragma: no cover
    from kvledger.reference.scheduler.batch import ScheduleBatch
    from kvledger.reference.scheduler.request import Req
    from kvledger.reference.scheduler.state import SchedulerState
    from kvledger.reference.scheduler.tracking import MambaTracking

RECOUNT_ENV_VAR = "KVLEDGER_RECOUNT_EVERY_STEP"


def _recount_setting() -> bool:
    return os.environ.get(RECOUNT_ENV_VAR, "0").strip().lower() in ("1", "true", "on", "yes")


__all__ = ["UNITS", "Accounting"]  # UNITS: what each pool kind's terms count (kvledger.contracts.pool_kinds)

_DONE = frozenset(s for s in ReqState if s.is_done)
_COUNT_FIELDS = frozenset({"state", "released"})  # contracts off: whether the recount counts a request at all

_Parts = tuple[str, tuple[int, ...]]  # account, units held by one request per pool kind (``Accounting.kinds``)


def kinds_of(scheduler: SchedulerState) -> tuple[PoolKind, ...]:
    """The pool kinds ``scheduler`` lists and has a pool of (``pool_kinds`` entries whose pool is None drop)."""
    return tuple(k for k in scheduler.pool_kinds if getattr(scheduler, k.attr, None) is not None)


class Accounting:
    """Checks and the per-step snapshot the CLI plots."""

    recount_every_step: bool = _recount_setting()
    """Also run the full recount after every step and compare (slow; the ``deep`` profile's setting)."""

    def __init__(self, scheduler: SchedulerState) -> None:
        self.s = scheduler
        self.enabled = ENABLED and scheduler.config.check_every_step
        # Contracts off: the count identities alone, still after every step (issue 10), so a leak is
        # reported by every build; ``check_every_step=False`` turns them off too (the benchmark's baseline).
        self.counting = not ENABLED and scheduler.config.check_every_step
        self.checks_run = 0
        self.kinds = kinds_of(scheduler)
        """The pool kinds the identity covers, in the order of its terms (kvledger.contracts.pool_kinds)."""
        # The fields whose writes mark a request (per accounting: no global set a kind adds to).
        self._tracked = MEMORY_FIELDS | frozenset(f for k in self.kinds for f in k.fields)
        self._handles = tuple(dict.fromkeys(h for k in self.kinds for h in k.handles))
        # Per tracked request, the terms it contributed at the last count, and their sums per pool.
        self._parts: dict[Req, _Parts] = {}
        self._sums: dict[str, Counter[str]] = {k.name: Counter() for k in self.kinds}
        # Changed since the last count (an ordered set); their ladders are verified when counted, so a
        # request outside it has a ladder that held when it last changed.
        self._dirty: dict[Req, None] = {}
        # I-HANDLE-OWNED's marks, narrower than ``_dirty``: the requests whose handle fields were written
        # or whose owner gave ids away since their handles were last verified. Nothing else can make a
        # verified handle name an id its request does not own (every change of an id's owner is a ledger
        # move out of its holder, which calls the holder's ``giver``), so verifying these is the
        # invariant for every live request; a decode step, which writes only lengths, marks none.
        self._handles_unverified: dict[Req, None] = {}
        self._handle_fields = frozenset(self._handles)
        self._by_owner: dict[Owner, Req] = {}
        # The terms of the last after-step check, reused by the timeline snapshot taken right after it;
        # any tracked change in between drops them.
        self._last_terms: tuple[int, list[PoolTerms]] | None = None
        # The pools' ledgers and sizes, by kind name (their counters are read through ``memory.counters``).
        pools = {k.name: getattr(scheduler, k.attr) for k in self.kinds}
        self._ledgers: dict[str, AnyLedger] = {name: pool.ledger for name, pool in pools.items()}
        self._sizes: dict[str, int] = {name: pool.size for name, pool in pools.items()}
        self._free = {name: free_reader(pool) for name, pool in pools.items()}  # (free, pending) readers

    # ------------------------------------------------------------------ tracking
    def track(self, req: Req) -> None:
        """Follow ``req`` from its arrival until it is released (contracts on; contracts off, for the count
        identities' sums only)."""
        if not ENABLED:
            if self.counting:
                self._follow_for_counts(req)
            return
        mark_writes(type(req), self._tracked)
        req.watch = self
        req.owner.watcher = self._owner_changed
        req.owner.giver = self._owner_gave  # ids left it: its handles are looked at again
        self._by_owner[req.owner] = req
        self._dirty[req] = None
        self._handles_unverified[req] = None

    def _follow_for_counts(self, req: Req) -> None:
        """Contracts off: keep the count identities' per-account sums incrementally (issue 38), as contracts
        on does. Writes of the fields the terms read, and of the two that decide whether the recount would
        count the request at all (``state``, ``released``), mark it (:mod:`write_marks`); so does an
        account change of its owner. No handle marks, no ladder: what contracts off checks stays the same."""
        mark_writes(type(req), _COUNT_FIELDS | self._tracked)
        req.watch = self
        req.owner.watcher = self._owner_changed
        self._by_owner[req.owner] = req
        self._dirty[req] = None

    def touch(self, req: Req, field: str) -> None:
        """``req`` wrote the tracked ``field`` (called by :mod:`write_marks`' descriptors)."""
        self._dirty[req] = None
        self._last_terms = None
        if field in self._handle_fields and ENABLED:  # consumed by contracts on's I-HANDLE-OWNED only
            self._handles_unverified[req] = None

    def _owner_changed(self, owner: Owner) -> None:
        """``owner`` changed account (a retag): its request's terms move; its handles stay verified."""
        req = self._by_owner.get(owner)
        if req is not None:
            self._dirty[req] = None
            self._last_terms = None

    def _owner_gave(self, owner: Owner) -> None:
        """Ids left ``owner`` in a ledger: its request's terms and its handles are looked at again."""
        req = self._by_owner.get(owner)
        if req is not None:
            self._dirty[req] = None
            self._last_terms = None
            self._handles_unverified[req] = None

    def released(self, req: Req) -> None:
        """``req`` gave everything back: recount it once more, then forget it."""
        if req.watch is self:
            self._dirty[req] = None

    def take_unverified_handles(self, among: Iterable[Req] | None = None) -> list[Req] | None:
        """The requests (of ``among``, default every marked one) whose handles must be verified now, unmarked
        as they are handed out: the caller verifies them (I-HANDLE-OWNED). None under
        ``recount_every_step``: verify every request, marked or not."""
        if self.recount_every_step:
            return None
        marked = self._handles_unverified
        if among is None:
            self._handles_unverified = {}
            return list(marked)
        out = [r for r in among if r in marked]
        for r in out:
            del marked[r]
        return out

    def tracked_requests(self) -> int:
        """Requests the accounting still follows (what a long run must keep bounded)."""
        return len(self._by_owner)

    def _untrack(self, req: Req) -> None:
        req.watch = None
        req.owner.watcher = None
        req.owner.giver = None
        self._by_owner.pop(req.owner, None)

    def _parts_of(self, req: Req) -> _Parts:
        s = self.s
        return req.owner.account.name, tuple(k.held_units(s, req) for k in self.kinds)

    def _counted_parts(self, req: Req) -> _Parts:
        """Contracts off: what :meth:`_request_held_recount` would count for ``req`` (nothing once released,
        nor once ended unless parked), so the incremental sums are that recount's, term for term."""
        if req.released or (req.state in _DONE and req.owner.account not in self.s.parked_accounts):
            return "", tuple(0 for _ in self.kinds)
        return self._parts_of(req)

    def _check_changed(
        self, req: Req, dirty: dict[Req, None], ps: int, ctx: int, tracking: MambaTracking | None
    ) -> None:
        """Contracts on: I-REQ-LADDER, and Mamba V2's I-REQ-MAMBA / I-STATE-BOUND, for one changed request.
        A failure keeps every marked request for the report and the next check."""
        if not ladder_holds(req, ps, ctx):
            self._dirty.update(dirty)
            raise ContractViolation(f"I-REQ-LADDER for every live request: {req!r}")
        if tracking is not None and not req.released:
            try:
                tracking.check_requests((req,))
            except ContractViolation:
                self._dirty.update(dirty)
                raise

    def _count_changed(self) -> None:
        """Recount the requests marked since the last count: O(changed)."""
        if not self._dirty:
            return
        dirty, self._dirty = self._dirty, {}
        sums = [self._sums[k.name] for k in self.kinds]
        ps, ctx = self.s.config.page_size, self.s.config.max_allocated_len
        tracking = self.s.memory.tracking
        parts_of = self._parts_of if ENABLED else self._counted_parts
        checking = ENABLED  # contracts off checks no ladder and no tracking slots (spec/checking-levels.md)
        for req in dirty:
            if checking:
                self._check_changed(req, dirty, ps, ctx, tracking)
            old = self._parts.pop(req, None)
            if old is not None:
                for counter, n in zip(sums, old[1], strict=True):
                    counter[old[0]] -= n
            new = parts_of(req)
            if any(new[1]):
                self._parts[req] = new
                for counter, n in zip(sums, new[1], strict=True):
                    counter[new[0]] += n
            elif req.released:
                self._untrack(req)

    def tracks_hold(self) -> bool:
        """I-TRACK-POINT for every request whose tracked fields changed since the last count (every live
        request under ``recount_every_step`` or with contracts off)."""
        s = self.s
        ps = s.config.page_size
        reqs = s.live_requests() if self.recount_every_step or not ENABLED else list(self._dirty)
        return all(track_point_holds(r, ps) for r in reqs)

    def ladders_hold(self) -> bool:
        """I-REQ-LADDER for every request whose ladder fields changed since the last count (the count
        verifies them too); for every live request under ``recount_every_step``."""
        s = self.s
        ps, ctx = s.config.page_size, s.config.max_allocated_len
        if self.recount_every_step or not ENABLED:
            return all(ladder_holds(r, ps, ctx) for r in s.live_requests())
        for r in self._dirty:
            if not ladder_holds(r, ps, ctx):
                return False
        if not self.enabled:  # nothing else consumes the marks: forget the verified ones
            self._dirty.clear()
        return True

    # ------------------------------------------------------------------ terms
    def _request_held_recount(self) -> dict[str, dict[str, int]]:
        """Per pool and account, what live requests hold by their bookkeeping: O(live).

        The reference the incremental sums are compared with (quiescence, ``recount_every_step``, reports).
        The loop is lean: most live requests wait and hold nothing (one read of the kinds' handle fields
        each, all None); only holders are looked at further.
        """
        s = self.s
        kinds = self.kinds
        held: dict[str, dict[str, int]] = {k.name: {} for k in kinds}
        per_kind = [(k.held_units, held[k.name]) for k in kinds]
        handles = attrgetter(*self._handles, self._handles[0])  # a tuple, even for one handle field
        parked = s.parked_accounts
        for r in s.queued_requests():
            for h in handles(r):
                if h is not None:
                    break
            else:
                continue  # no handle set: holds nothing of any kind
            account = r.owner.account
            if r.state in _DONE and account not in parked:
                continue  # ended, not parked (a launched batch, a PD lease): not live (Scheduler.live_requests)
            acct = account.name
            for units_of, sums in per_kind:
                n = units_of(s, r)
                if n:
                    sums[acct] = sums.get(acct, 0) + n
        return held

    def _request_held(self) -> Mapping[str, Mapping[str, int]]:
        """The same sums, kept incrementally: O(requests changed since the last count), not O(queue). With
        no per-step checks at all (``check_every_step=False``: nothing is followed) a recount."""
        if not ENABLED and not self.counting:
            return self._request_held_recount()
        self._count_changed()
        return self._sums

    def pool_terms(self) -> list[PoolTerms]:
        """The identity's terms with a full recount of the requests (quiescence, tests, reports)."""
        return self._build_terms(self._request_held_recount())

    def terms(self) -> list[PoolTerms]:
        """The identity's terms as of now: incremental with contracts on."""
        return self._build_terms(self._request_held())

    def _build_terms(self, held: Mapping[str, Mapping[str, int]]) -> list[PoolTerms]:
        cache = self.s.memory.counters.cache_terms()
        terms = []
        for k in self.kinds:
            evictable, protected = (0, 0) if k.cached is None else cache[k.cached]
            free, pending = self._free[k.name]
            terms.append(
                PoolTerms(
                    k.name,
                    k.unit,
                    self._sizes[k.name],
                    free(),
                    evictable=evictable,
                    protected=protected,
                    pending=pending(),
                    held={a: v for a, v in held[k.name].items() if v},
                )
            )
        return terms

    # ------------------------------------------------------------------ checks
    def after_step(self) -> None:
        if not self.enabled:
            if self.counting:
                self._count_identities()
            return
        terms = self.terms()
        self._last_terms = (self.s.step_no, terms)
        for t in terms:
            check_busy_identity(t, self.culprits)
        self.cross_check_ledgers(terms)
        if self.recount_every_step:
            self.check_incremental(terms, self.pool_terms())
            if self.s.memory.tracking is not None:  # Mamba V2: every live request, not only the changed
                self.s.memory.tracking.check_requests(self.s.live_requests())
        self.checks_run += 1
        self.s.stats.busy_checks += 1
        if self.s.is_quiescent():
            self.check_quiescent(terms)

    def _count_identities(self) -> None:
        """Contracts off: I-COUNT and I-CAP per pool after every step, I-IDLE-IDENTITY at quiescence.

        O(1) per term from the counters plus the requests whose bookkeeping changed since the last count
        (the sums are kept incrementally, issue 38; the terms a simulate run computes for its timeline
        anyway: the snapshot reuses them); at quiescence (and after every step under
        ``recount_every_step``) the sums are compared with a full recount. A failure is an
        :class:`IdentityFailure` naming the ids nobody's bookkeeping holds (no ledger, so no owner).
        """
        s = self.s
        terms = self.terms()
        self._last_terms = (s.step_no, terms)
        try:
            for t in terms:
                check_busy_identity(t, self.culprits)
            if self.recount_every_step:
                self.check_incremental(terms, self.pool_terms())
            if s.is_quiescent():
                self.check_incremental(terms, self.pool_terms())  # O(live) once, where little is live
                for t in terms:
                    check_idle_identity(t, self.culprits)
        except IdentityFailure:
            raise
        except ContractViolation as exc:
            raise IdentityFailure(f"{exc}\n(found by the count identities of a build with contracts off)") from None
        s.stats.count_checks += 1

    def culprits(self, pool: str) -> str:
        """The ids of ``pool`` in dispute between the bookkeeping and the ledger, with their owners, the
        holders the bookkeeping names, their last moves and the requests involved (only on a failure)."""
        s = self.s
        obj = self.pools_by_name()[pool]
        cached = next((k.cached for k in self.kinds if k.name == pool), None)
        return diagnose(
            census.census(s, pool, obj, lambda r: self._expected_ids(pool, r), cached=cached),
            obj.ledger.domain,
            obj.ledger,
            describe_owner=lambda owner: census.describe_owner(s, owner),
        )

    def check_quiescent(self, terms: list[PoolTerms] | None = None) -> None:
        """The strong identity and the full recounts; only meaningful at quiescence (I-QUIESCENT)."""
        if not self.s.is_quiescent():
            raise ContractViolation(f"I-QUIESCENT: check_quiescent outside quiescence: {self.s.describe_queues()}")
        recount = self.pool_terms()
        if ENABLED:
            self.check_incremental(terms if terms is not None else self.terms(), recount)
        for t in recount:
            check_idle_identity(t, self.culprits)
        for pool in self.pools():
            pool.audit()
        if self.s.tree is not None:
            self.s.tree.audit()
        self.s.stats.idle_checks += 1

    def check_incremental(self, incremental: list[PoolTerms], recount: list[PoolTerms]) -> None:
        """I-COUNT: the incremental sums must equal a full recount of the requests' bookkeeping (a test
        machine checks this after every rule, not only at quiescence)."""
        for inc, full in zip(incremental, recount, strict=True):
            if inc != full:
                raise ContractViolation(
                    f"[{inc.pool}] I-COUNT: the incremental identity drifted from the recount (a write that"
                    f" bypassed tracking?):\n  incremental {inc.table()}\n  recount     {full.table()}"
                )

    def check_not_in_flight(self, batch: ScheduleBatch) -> None:
        """I-ROW-EXCLUSIVE-WHILE-IN-FLIGHT: what a launched batch references is not handed to another request.

        Rows are written by the host while the batch's forward reads them (B8), and a request's Mamba
        working slot is advanced by that forward, so neither may change hands until the results are
        processed. A KV slot freed meanwhile (a duplicate the tree already holds) may be reused: every
        write to it by a later batch is ordered after the in-flight batch on the device stream. So may a
        Mamba capture target its request gave away meanwhile (a V2 donation the tree declined), for the
        same reason (``ScheduleBatch.mamba_still_held``).
        """
        if not self.enabled:
            return
        for b in self.s.inflight:
            mamba = b.mamba_still_held() if b.ref_mamba else b.ref_mamba
            for r in batch.reqs:
                if r in b.reqs:
                    continue
                if r.req_pool_idx in b.ref_rows:
                    raise ContractViolation(
                        f"I-ROW-EXCLUSIVE-WHILE-IN-FLIGHT: {r.owner!r} got row {r.req_pool_idx}"
                        f" that in-flight {b!r} reads"
                    )
                shared = mamba.intersection(r.mamba_slots())
                if shared:
                    raise ContractViolation(
                        f"I-ROW-EXCLUSIVE-WHILE-IN-FLIGHT: {r.owner!r} got Mamba slot(s) {sorted(shared)}"
                        f" that in-flight {b!r} advances or captures into"
                    )

    def pools(self) -> list[IdPool]:
        """The pools the identity covers (:meth:`pools_by_name` in order)."""
        return list(self.pools_by_name().values())

    def pools_by_name(self) -> dict[str, IdPool]:
        """The pools the identity covers, keyed by the ``PoolTerms.pool`` name of their terms."""
        return {k.name: getattr(self.s, k.attr) for k in self.kinds}

    def cross_check_ledgers(self, terms: list[PoolTerms]) -> None:
        """I-LEDGER-AGREES: every identity term equals the ledger account of the same name."""
        for t in terms:
            ledger = self._ledgers[t.pool]
            if not ledger.enabled:
                continue
            unit = ledger.unit
            expected: dict[str, int] = {
                FREE.name: t.free,
                PENDING_FREE.name: t.pending,
                CACHE_EVICTABLE.name: t.evictable,
                CACHE_PROTECTED.name: t.protected,
            }
            expected.update(t.held)
            actual = {name: n * unit for name, n in ledger.account_sizes().items()}
            if actual == {k: v for k, v in expected.items() if v}:
                continue
            keys = set(expected) | set(actual)
            diff = {
                k: (expected.get(k, 0), actual.get(k, 0))
                for k in keys
                if expected.get(k, 0) != actual.get(k, 0)
            }
            if diff:
                raise ContractViolation(self._explain(t, ledger, diff))

    def _explain(self, terms: PoolTerms, ledger: AnyLedger, diff: dict[str, tuple[int, int]]) -> str:
        """Name the request(s) whose bookkeeping disagrees with the ledger, and the ids in question."""
        return "\n".join(
            [
                f"I-LEDGER-AGREES: [{terms.pool}] counters and ledger disagree (counted, ledger): {diff}",
                terms.table(),
                self.culprits(terms.pool),
            ]
        )

    # ------------------------------------------------------------------ reporting
    def free_terms(self) -> dict[str, tuple[int, int]]:
        """Per pool, (size, free + pending) from the counters: O(1), for a per-step peak-use figure."""
        return {
            k.name: (self._sizes[k.name], self._free[k.name][0]() + self._free[k.name][1]()) for k in self.kinds
        }

    def _expected_ids(self, pool: str, r: Req) -> set[int]:
        """The ids of ``pool`` that ``r`` holds by its own bookkeeping (a subclass with more pools adds)."""
        return self.kind(pool).held_ids(self.s, r)

    def kind(self, pool: str) -> PoolKind:
        """The description of the pool kind called ``pool``."""
        for k in self.kinds:
            if k.name == pool:
                return k
        raise KeyError(pool)

    def units(self) -> dict[str, str]:
        """Per pool of this scheduler, what its terms count (the plot's axis labels)."""
        units = {k.name: k.unit for k in self.kinds}
        return {pool: units.get(pool) or UNITS[pool] for pool in self._ledgers}

    def snapshot(self) -> dict[str, dict[str, int]]:
        """Per pool, the identity's terms (in the pool's unit) — what the timeline plot stacks."""
        out: dict[str, dict[str, int]] = {}
        last = self._last_terms
        terms = last[1] if last is not None and last[0] == self.s.step_no else self.terms()
        for t in terms:
            row = {
                "size": t.size,
                "free": t.free,
                PENDING_FREE.name: t.pending,
                "cache.evictable": t.evictable,
                "cache.protected": t.protected,
            }
            row.update(t.held)
            out[t.pool] = row
        return out
