"""A Hypothesis state machine over both PD instances and the channel, every fault and abort enabled.

Rules (the decode radix cache drawn on or off where it applies): arrivals from shared-prefix families,
one at a time or in bursts (load spikes fill the queues), system steps, client aborts at either side in
any state (the victim drawn by the pair of queues it is in, uniform over the occupied pairs; and at the
decode by the decode queue alone), a fault
(drop, delay, fail, timeout) on the next message of any component (bootstrap, KV, Mamba state,
metadata), injected allocation failures on either instance, forced retraction on the decode side; tiny
pools on both sides, overlap on either. After every rule: each instance's busy identity per pool
(metadata included) with every PD holder term, the ledger cross-check, I-HANDLE-OWNED, I-OWNER-RELEASE,
the audits of every pool and the prefill tree, the leases of every message in flight (I-WRITER-LEASE)
and I-DRAIN. At drain (faults cleared), the same checks after every step for a while, then: liveness
(every request ended on both sides, with a reason), the strong idle identities (I-QUIESCENT, leases
included), no room open, and every request that finished on the decode side produced what it produces
run alone (I-OUTPUT-ORACLE; with the tiny hybrid model in ``PDModelMachine``). ``hypothesis.target``
steers toward messages in flight and leases.
"""

from __future__ import annotations

import sys

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.identity import check_busy_identity
from kvledger.museum.machines.data_oracle import check_scheduler_data, with_data_tags_pd
from kvledger.museum.machines.notes import event, target
from kvledger.museum.machines.pd_setup import build, expected, pd_spec
from kvledger.museum.machines.scheduler import (
    CHECKED_DRAIN_STEPS,
    FAMILIES,
    FAULT_AFTER,
    FAULT_KINDS,
    chunk_sizes,
    drain_bound,
    pick_by_stage,
    v2_options,
)
from kvledger.reference.disagg import (
    DECODE,
    PREFILL,
    ChannelConfig,
    Component,
    Fault,
    PDReq,
    PDSpec,
    PDSystem,
)
from kvledger.reference.disagg.decode_cache import check_decode_prefixes
from kvledger.reference.disagg.instance import check_queues
from kvledger.reference.disagg.messages import CONTROL, FAULTS_OF
from kvledger.reference.engine import ModelKind, TreeKind
from kvledger.reference.scheduler import ReqState

PAGE_SIZES = (1, 1, 4)
"""The hunt machine's pages. Page 16 has its own machine (:class:`PDMachinePage16`): mixed in here it
thinned the congested small-page runs the museum's exhibits need (N6a went from 17 examples to none in
117)."""


@st.composite
def pd_setups(draw: st.DrawFn, model: ModelKind = "hash", page_sizes: tuple[int, ...] = PAGE_SIZES) -> PDSpec:
    """Both instances at one page size (``page_sizes``: 1 or 4 here, 16 in ``PDMachinePage16``), Mamba V1
    or V2 (the pair's strategy: V2 tracks with ping-pong slots on the prefill's Mamba radix cache and
    holds them on every decode request), any cache on the prefill, a channel with short timeouts. The
    Mamba radix cache above page 1 is V2 only."""
    page_size = draw(st.sampled_from(page_sizes)) if model == "hash" else 1
    tree: TreeKind = draw(st.sampled_from(["mamba_radix", "radix", "none"]))
    hybrid = tree == "mamba_radix" or model != "hash" or draw(st.booleans())
    if tree == "radix" and hybrid:
        tree = "none"  # the plain radix cache caches no Mamba state: a hybrid model uses the Mamba cache
    overlap = draw(st.booleans())
    v2: dict[str, object] = {}
    if hybrid and ((tree == "mamba_radix" and page_size > 1) or draw(st.booleans())):
        v2 = v2_options(draw, page_size, overlap)
    grid = max(page_size, int(v2.get("mamba_chunk_size", 1)))  # type: ignore[call-overload]
    channel = ChannelConfig(
        latency=draw(st.integers(1, 2)),
        delay_steps=draw(st.integers(0, 3)),
        bootstrap_timeout=draw(st.integers(6, 12)),
        transfer_timeout=draw(st.integers(10, 24)),
        message_timeout=draw(st.integers(3, 6)),
    )
    low, high = (64, 256) if page_size == 16 else (32, 160)
    decode_kv = draw(st.integers(low, high)) // page_size * page_size
    return pd_spec(
        tree=tree,
        model=model,
        page_size=page_size,
        hybrid=hybrid,
        prefill_kv=draw(st.integers(low, high)) // page_size * page_size,
        prefill_rows=draw(st.integers(1, 4)),
        prefill_mamba=draw(st.integers(3, 8)),
        chunk=draw(st.sampled_from(chunk_sizes(page_size, grid))),
        decode_kv=decode_kv,
        decode_running=draw(st.integers(1, 4)),
        decode_mamba=draw(st.integers(1, 6)),
        overlap=overlap,
        decode_overlap=draw(st.booleans()),
        eos=draw(st.sampled_from([None, 7])),
        channel=channel,
        # Long enough that a prompt can reach the decode pool's pre-allocation limit (the sizing edge).
        max_context_len=max(96, decode_kv + 2 * page_size),
        pre_alloc_size=draw(st.sampled_from([None, 0, 1])),
        prefill_metadata_slots=draw(st.sampled_from([None, 1, 2, 8])),
        decode_metadata_slots=draw(st.sampled_from([None, 1, 3])),
        reserved_decode_tokens=draw(st.sampled_from([4, 4, 1, 7])),
        # The decode radix cache (issue 27 item 4): any page size without a Mamba pool, page 1 with one.
        decode_radix_cache=(not hybrid or page_size == 1) and draw(st.booleans()),
        **v2,  # type: ignore[arg-type]
    )


def prealloc_limit(system: PDSystem, max_new_tokens: int) -> int:
    """The longest prompt (with ``max_new_tokens``) the decode instance can ever take, re-derived here from
    its pool sizes rather than read from the code's own formulas (an error of less than a page in either
    shows only at this edge): pre-allocation takes the prompt's whole pages plus the reserved decode tokens
    at once; alone, the request must fit its whole pages with one spare page; and the context limit."""
    d = system.decode
    page, size, reserved = d.config.page_size, d.kv_allocator.size, d.reserved_decode_tokens
    prealloc = (size - reserved) // page * page
    alone = (size - page) // page * page - max_new_tokens
    context = d.config.max_context_len - max_new_tokens
    return max(0, min(prealloc, alone, context))


class PDMachine(RuleBasedStateMachine):
    model = "hash"
    steps_run = 0  # system steps across all runs (the steps/s report of the deep profile)

    @initialize(spec=pd_setups())
    def init(self, spec: PDSpec) -> None:
        self.spec = with_data_tags_pd(spec)  # the hash tokens, with data tags in every state and KV slot
        self.system = build(self.spec)
        self.next_rid = 0
        event(
            f"tree={spec.prefill.tree} page={spec.prefill.page_size} overlap={spec.prefill.overlap}"
            + (" extra_buffer" if spec.prefill.mamba_strategy == "extra_buffer" and spec.prefill.hybrid else "")
            + (" decode_radix_cache" if spec.decode_radix_cache else "")
        )

    @rule(
        family=st.sampled_from(range(len(FAMILIES))),
        suffix=st.lists(st.integers(0, 99), min_size=1, max_size=20),
        max_new=st.integers(1, 16),
    )
    def arrive(self, family: int, suffix: list[int], max_new: int) -> None:
        p, d = self.system.add_request(self.next_rid, FAMILIES[family] + suffix, max_new)
        self.next_rid += 1
        if ReqState.REJECTED in (p.state, d.state):
            event("rejected at arrival")

    @rule(
        family=st.sampled_from(range(len(FAMILIES))),
        count=st.integers(2, 3),
        prompt_len=st.integers(1, 20),
        max_new=st.integers(1, 16),
    )
    def arrive_burst(self, family: int, count: int, prompt_len: int, max_new: int) -> None:
        """A load spike: ``count`` requests of one family at once (distinct suffixes), so queues fill up and
        requests stay a while in each stage (the waiting queue with a metadata slot, pre-allocation)."""
        for i in range(count):
            suffix = [(self.next_rid + i + k) % 100 for k in range(prompt_len)]
            self.arrive(family=family, suffix=suffix, max_new=max_new)

    @rule(
        family=st.sampled_from(range(len(FAMILIES))),
        offset=st.sampled_from([-1, 0, 1]),
        max_new=st.integers(1, 4),
    )
    def arrive_at_prealloc_limit(self, family: int, offset: int, max_new: int) -> None:
        """A prompt one below, at or one above the decode instance's limit (issue 27 item 5): a sizing error
        of less than a page shows only there (admitted and never pre-allocated: I-LIVENESS; or refused
        though it fits: I-SIZING)."""
        limit = prealloc_limit(self.system, max_new)
        length = limit + offset
        if length < 1:
            return
        prompt = (FAMILIES[family] + [(self.next_rid + k) % 100 for k in range(length)])[:length]
        _, d = self.system.add_request(self.next_rid, prompt, max_new)
        self.next_rid += 1
        if offset <= 0 and d.state is ReqState.REJECTED:
            raise ContractViolation(
                f"I-SIZING: a {length}-token prompt (+{max_new} new; the decode limit is {limit}) fits the decode"
                f" pool but was rejected: {d.finish_reason}"
            )
        if offset > 0 and d.state is not ReqState.REJECTED:
            raise ContractViolation(
                f"I-LIVENESS: a {length}-token prompt (+{max_new} new), past the decode limit {limit}, was"
                " admitted: it can never be pre-allocated or run"
            )
        event(f"prompt at the decode limit {offset:+d}")

    @rule(n=st.integers(1, 6))
    def step(self, n: int) -> None:
        for _ in range(n):
            self.system.step()
        type(self).steps_run += n

    @precondition(lambda self: any(not (p.state.is_done and d.state.is_done) for p, d in self.system.pairs.values()))
    @rule(stage=st.integers(0, 31), pick=st.integers(0, 63), side=st.sampled_from([PREFILL, DECODE]))
    def abort(self, stage: int, pick: int, side: str) -> None:
        """A client abort at ``side`` of a live pair, drawn by stage first: uniform over the pairs of
        (prefill queue, decode queue) some live pair is in now, then within it. A short-lived stage (the
        prefill waiting queue after the bootstrap, a decode transfer) is as likely as the crowded ones."""
        system = self.system
        live = [rid for rid, (p, d) in sorted(system.pairs.items()) if not (p.state.is_done and d.state.is_done)]

        def where(rid: int) -> tuple[str, str]:
            p, d = system.pairs[rid]
            return system.prefill.where_is(p), system.decode.where_is(d)

        where_now, rid = pick_by_stage(live, where, stage, pick)
        event(f"abort at {side} from {' / '.join(where_now)}")
        self.system.abort(rid, side)

    @precondition(lambda self: bool(self.system.decode.live_requests()))
    @rule(stage=st.integers(0, 7), pick=st.integers(0, 63))
    def abort_on_decode(self, stage: int, pick: int) -> None:
        """A client abort at the decode side, drawn by the decode queue the victim is in: uniform over the
        occupied decode queues (prealloc, transfer, prebuilt, running, retracted), then within one. Each
        has its own release path (nothing held, a lease while writes may land, a pre-allocation that
        never ran, a running request, a host copy; with the decode radix cache, a prefix lock); the
        pair-wise draw of ``abort`` spreads over prefill stages too and reaches the short-lived decode
        queues (prebuilt: only while the running batch is full) less often."""
        decode = self.system.decode
        live = [r for r in decode.live_requests() if isinstance(r, PDReq) and not r.state.is_done]
        if not live:
            return
        where, req = pick_by_stage(live, decode.where_is, stage, pick)
        event(f"abort at decode from {where}")
        self.system.abort(req.rid, DECODE)

    @rule(pair=st.sampled_from([(c, f) for c in Component for f in FAULTS_OF[c]]))
    def inject_fault(self, pair: tuple[Component, Fault]) -> None:
        """A fault on the next message of a component: data (drop, delay, fail, timeout), the handshake,
        or a control message (the pre-allocation info, an abort notice, the drain acknowledgement: lost,
        delayed so reordered, duplicated)."""
        component, fault = pair
        if component in CONTROL:
            event(f"control fault: {component.value} {fault.value}")
        self.system.channel.inject(component, fault)

    @rule(side=st.sampled_from([PREFILL, DECODE]), kind=st.sampled_from(FAULT_KINDS), after=FAULT_AFTER)
    def inject_allocation_failure(self, side: str, kind: str, after: int = 0) -> None:
        inst = self.system.prefill if side == PREFILL else self.system.decode
        inst.faults.fail_next(kind, after=after)

    @precondition(lambda self: bool(self.system.decode.running))
    @rule()
    def retract_on_decode(self) -> None:
        event("decode retraction")
        self.system.decode.force_retract(1)

    @invariant()
    def identities_hold(self) -> None:
        for inst in self.system.instances():
            terms = inst.accounting.pool_terms()
            for t in terms:
                check_busy_identity(t)
            inst.accounting.cross_check_ledgers(terms)
            inst.check_handles_owned()
            inst.check_ended_requests_released()
            check_queues(inst)
            for pool in inst.accounting.pools_by_name().values():
                pool.audit()
            if inst.tree is not None:
                inst.tree.audit()
            check_scheduler_data(inst)  # I-DATA-STATE, I-DATA-KV (the tagged hash runner)
        check_decode_prefixes(self.system.decode)  # I-PD-PREFIX-LOCK
        self.system.channel.audit()
        self.system.check_leases()
        self.system.check_drain()
        leased = sum(inst.pd_stats.leases for inst in self.system.instances())
        self.max_leases = max(getattr(self, "max_leases", 0), leased)

    def teardown(self) -> None:
        system = getattr(self, "system", None)
        if system is None or sys.exc_info()[1] is not None:
            return  # a check already fired: draining would only report a later, secondary violation
        target(float(getattr(self, "max_leases", 0)), label="leases taken")
        target(float(len(system.pairs)), label="requests")
        system.channel.clear_faults()
        for inst in system.instances():
            inst.faults.pending.clear()
        for _ in range(CHECKED_DRAIN_STEPS):  # drain with the checks after every step (I-DRAIN too), then plainly
            if not system.has_work():
                break
            system.step()
            self.identities_hold()
        system.run_until_idle(max_steps=drain_bound([r for pair in system.pairs.values() for r in pair]))
        system.check_quiescent()
        finished = 0
        for rid, (p, d) in system.pairs.items():
            for req in (p, d):
                if not (req.state.is_done and req.finish_reason):
                    raise ContractViolation(f"I-LIVENESS: {req!r} never ended, or ended without a reason")
            if d.state is ReqState.FINISHED:
                finished += 1
                want = expected(system, d.origin_input_ids, d.max_new_tokens)
                if d.output_ids != want:
                    raise ContractViolation(
                        f"I-OUTPUT-ORACLE: request {rid}: decode output {d.output_ids} differs from the request"
                        f" run alone {want}"
                    )
        if finished:
            event("some requests finished")
        for inst in system.instances():
            st_ = inst.pd_stats
            if st_.leases:
                event(f"{inst.side} lease taken")
            if st_.resumes:
                event("decode resumed a retracted request")
            if st_.prefix_hits:
                event("decode radix cache hit")
            for reason in st_.failures:
                event(f"{inst.side} room failure: {reason}")




class PDModelMachine(PDMachine):
    """The same machine with the tiny hybrid model on both sides (fewer runs: the model costs more)."""

    @initialize(spec=pd_setups(model="tiny-hybrid"))
    def init(self, spec: PDSpec) -> None:
        self.spec = spec
        self.system = build(spec)
        self.next_rid = 0


class PDMachinePage16(PDMachine):
    """The same machine at page size 16 only (Mamba V2 wherever the Mamba radix cache is drawn), with the
    prompts at the decode limit ± 1 of a 16-token page."""

    @initialize(spec=pd_setups(page_sizes=(16,)))
    def init(self, spec: PDSpec) -> None:
        self.spec = spec
        self.system = build(spec)
        self.next_rid = 0
