"""The decode-side radix cache (issue 27 item 4; SGLang #19746, for hybrids #32732, aborts #35049).

With ``PDSpec.decode_radix_cache`` a decode request's pre-allocation matches its prompt's KV in the decode's
tree (KV only for a hybrid: the state arrives by transfer, no copy-on-write), locks the matched node for
the request's life and takes KV for the rest only, which is all the sender transmits. The shared prefix
stays the tree's (``cache.protected`` while locked) in every queue; the lock goes with the request's
release, after the sender's acknowledgement when the request ended under a lease (I-PD-PREFIX-LOCK).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest

from kvledger.contracts import switch
from kvledger.contracts.errors import ContractViolation, InvalidArgument
from kvledger.contracts.owners import CACHE_PROTECTED
from kvledger.museum.exhibit import patched
from kvledger.reference.disagg import DECODE, Component, Fault, PDSpec, PDSystem, TransferChannel
from kvledger.reference.disagg.decode import DecodeScheduler
from kvledger.reference.disagg.decode_cache import check_decode_prefixes
from kvledger.reference.disagg.messages import DstInfo
from kvledger.reference.scheduler import ReqState
from tests.disagg.harness import build, expected, pd_spec

needs_contracts = pytest.mark.skipif(not switch.ENABLED, reason="contracts are off (KVLEDGER_CONTRACTS=0)")
PREFIX = list(range(10, 42))  # 32 tokens: two pages of 16

# (page size, Mamba strategy, prefill tree, hybrid): the decode tree is the Mamba one for a hybrid (page 1)
SETUPS = [
    pytest.param(1, "no_buffer", "mamba_radix", True, id="hybrid-v1"),
    pytest.param(1, "extra_buffer", "mamba_radix", True, id="hybrid-v2"),
    pytest.param(1, "no_buffer", "radix", False, id="plain-p1"),
    pytest.param(4, "no_buffer", "radix", False, id="plain-p4"),
    pytest.param(16, "no_buffer", "none", False, id="plain-p16"),
]


def cache_spec(page_size: int = 1, strategy: str = "no_buffer", tree: str = "mamba_radix", hybrid: bool = True,
               **kw: Any) -> PDSpec:
    v2 = dict(mamba_chunk_size=4, mamba_track_interval=4) if strategy == "extra_buffer" else {}
    return pd_spec(
        page_size=page_size,
        mamba_strategy=strategy,  # type: ignore[arg-type]
        tree=tree,  # type: ignore[arg-type]
        hybrid=hybrid,
        chunk=16,
        prefill_kv=kw.pop("prefill_kv", 320),
        decode_kv=kw.pop("decode_kv", 320),
        decode_radix_cache=True,
        **v2,  # type: ignore[arg-type]
        **kw,
    )


def _drain(system: PDSystem) -> None:
    system.run_until_idle(3000)
    system.check_quiescent()
    for p, d in system.pairs.values():
        assert p.state.is_done and d.state.is_done and d.finish_reason, (p, d)
        if d.state is ReqState.FINISHED:
            assert d.output_ids == expected(system, d.origin_input_ids, d.max_new_tokens)



def _run_until(system: PDSystem, cond: Any, steps: int = 400) -> None:
    for _ in range(steps):
        if cond():
            return
        system.step()
    raise AssertionError(f"not reached in {steps} steps: {system.describe()}")


# ------------------------------------------------------------------ the option
def test_the_decode_radix_cache_is_off_by_default_as_in_sglang() -> None:
    assert PDSpec().decode_radix_cache is False
    system = build(pd_spec())
    assert system.decode.tree is None


def test_a_hybrid_decode_cache_above_page_1_is_refused_and_the_engine_spec_takes_no_tree() -> None:
    with pytest.raises(InvalidArgument, match="page_size 1"):
        cache_spec(page_size=4, strategy="extra_buffer")
    spec = cache_spec()
    with pytest.raises(InvalidArgument, match="decode_radix_cache"):
        replace(spec, decode=replace(spec.decode, tree="radix"))


@pytest.mark.parametrize(("page_size", "strategy", "tree", "hybrid"), SETUPS)
def test_the_decode_tree_shares_prefixes_and_the_sender_transmits_only_the_delta(
    page_size: int, strategy: str, tree: str, hybrid: bool
) -> None:
    system = build(cache_spec(page_size, strategy, tree, hybrid))
    assert system.decode.tree is not None and ("mamba" in system.decode.tree.cached_kinds()) == hybrid
    system.add_request(0, [*PREFIX, 1, 2, 3], 6)
    _drain(system)
    first = system.decode.pd_stats.transfers_started
    assert system.decode.pd_stats.prefix_hits == 0 and first == 1
    # The first request's prompt and output are in the decode tree now: a second one on the same prefix
    # matches at least the prefix's whole pages there and gets only the rest over the channel.
    sent_before = system.channel.stats.messages.copy()
    system.add_request(1, [*PREFIX, 9, 9], 4)
    _drain(system)
    hit = system.decode.pd_stats.prefix_tokens
    assert system.decode.pd_stats.prefix_hits == 1 and hit >= len(PREFIX) // page_size * page_size
    assert system.decode.tree.evictable_size() > 0 and system.decode.tree.protected_size() == 0
    kv_msgs = system.channel.stats.messages[("kv", "landed")] - sent_before[("kv", "landed")]
    assert kv_msgs >= 1 and hit < len(PREFIX) + 2  # the last two positions were never cached: sent


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_full_prompt_hit_transfers_no_kv_only_the_state_and_the_metadata(page_size: int) -> None:
    system = build(cache_spec(1) if page_size == 1 else cache_spec(page_size, tree="radix", hybrid=False))
    prompt = PREFIX[:16]
    system.add_request(0, prompt, 3)
    _drain(system)
    kv_before = system.channel.stats.messages[("kv", "landed")]
    system.add_request(1, prompt, 3)
    _drain(system)
    assert system.decode.pd_stats.prefix_tokens == len(prompt)  # the whole prompt was cached
    assert system.channel.stats.messages[("kv", "landed")] == kv_before  # nothing of it travelled
    if page_size == 1:
        assert system.channel.stats.messages[("mamba", "landed")] == 2  # the state arrives by transfer


# ------------------------------------------------------------------ locks and ownership, queue by queue
def _prime(system: PDSystem) -> None:
    system.add_request(0, [*PREFIX, 0], 2)
    _drain(system)


@needs_contracts
@pytest.mark.parametrize(("page_size", "strategy", "tree", "hybrid"), SETUPS)
def test_a_decode_request_locks_its_prefix_in_every_queue_and_the_tree_owns_it(
    page_size: int, strategy: str, tree: str, hybrid: bool
) -> None:
    system = build(cache_spec(page_size, strategy, tree, hybrid, decode_running=1))
    _prime(system)
    for rid in (1, 2, 3):  # one decode row for running: the others wait prebuilt, or in pre-allocation
        system.add_request(rid, [*PREFIX, rid, rid], 5)
    seen: set[ReqState] = set()
    tree_ = system.decode.tree
    while system.has_work():
        system.step()
        assert check_decode_prefixes(system.decode) == sum(
            1 for _, d in system.pairs.values() if d.lock is not None
        )
        for _, d in system.pairs.values():
            if d.state in (ReqState.TRANSFER, ReqState.PREBUILT, ReqState.RUNNING):
                assert d.lock is not None and d.cache_protected_len >= len(PREFIX) // page_size * page_size
                prefix = system.decode.req_to_token_pool.read(d.req_pool_idx, 0, d.cache_protected_len)
                ledger = system.decode.kv_allocator.ledger
                ids = {int(s) // page_size for s in prefix} if page_size > 1 else {int(s) for s in prefix}
                assert not ids & set(ledger.holdings(d.owner))  # the request owns none of its prefix
                assert all(ledger.owner_of(i).account is CACHE_PROTECTED for i in ids)
                seen.add(d.state)
            elif d.state in (ReqState.PREALLOC, ReqState.FINISHED):
                assert d.lock is None
    assert seen == {ReqState.TRANSFER, ReqState.PREBUILT, ReqState.RUNNING}
    system.check_quiescent()
    assert tree_.protected_size() == 0 and not tree_.live_locks()


@needs_contracts
@pytest.mark.parametrize("stage", [ReqState.PREALLOC, ReqState.TRANSFER, ReqState.PREBUILT, ReqState.RUNNING,
                                   ReqState.RETRACTED])
@pytest.mark.parametrize("hybrid", [True, False])
def test_an_abort_in_every_decode_queue_releases_the_lock_once_and_keeps_the_prefix_cached(
    stage: ReqState, hybrid: bool
) -> None:
    spec = cache_spec(tree="mamba_radix" if hybrid else "radix", hybrid=hybrid, decode_running=1,
                      decode_metadata_slots=3)
    system = build(spec)
    _prime(system)
    cached = system.decode.tree.evictable_size()
    for rid in (1, 2, 3):
        system.add_request(rid, [*PREFIX, rid, rid], 12)
    victim = None

    def found() -> bool:
        nonlocal victim
        if stage is ReqState.RETRACTED and system.decode.running:
            system.decode.force_retract(1)
        victim = next((d for _, d in system.pairs.values() if d.state is stage), None)
        return victim is not None

    _run_until(system, found)
    assert victim is not None
    had_lock = victim.lock
    assert (had_lock is None) == (stage in (ReqState.PREALLOC, ReqState.RETRACTED))
    system.abort(victim.rid, DECODE)
    if victim in system.decode.lease_queue:  # writes may still land: everything stays, the lock too
        assert victim.lock is had_lock and not had_lock.released
    _drain(system)
    assert victim.state is ReqState.ABORTED and victim.lock is None
    assert had_lock is None or had_lock.released
    assert system.decode.tree.protected_size() == 0 and system.decode.tree.evictable_size() >= cached


@needs_contracts
@pytest.mark.parametrize("hybrid", [True, False])
def test_an_abort_mid_transfer_keeps_row_delta_metadata_and_the_lock_until_the_ack(hybrid: bool) -> None:
    """#35049 with a cached prefix: the row, the delta KV and the metadata slot stay leased until the sender
    acknowledges; the lock on the shared prefix stays too and is released once, with them."""
    system = build(cache_spec(tree="mamba_radix" if hybrid else "radix", hybrid=hybrid))
    _prime(system)
    system.channel.inject(Component.KV, Fault.TIMEOUT)
    system.add_request(1, [*PREFIX, 5, 6, 7, 8], 3)
    _run_until(system, lambda: any(True for _ in system.channel.in_flight()))
    d = system.pairs[1][1]
    assert d.state is ReqState.TRANSFER and d.lock is not None and d.cache_protected_len > 0
    lock, row, meta = d.lock, d.req_pool_idx, d.metadata_idx
    system.abort(1, DECODE)
    assert d.owner.account.name == "pd.decode.lease"
    leased_steps = 0
    while d in system.decode.lease_queue:
        assert d.lock is lock and not lock.released and d.req_pool_idx == row and d.metadata_idx == meta
        assert system.decode.tree.protected_size() >= d.cache_protected_len
        system.step()
        leased_steps += 1
    assert leased_steps > 0 and lock.released and d.lock is None
    _drain(system)
    assert system.decode.pd_stats.leases == 1 and not system.decode.tree.live_locks()


@needs_contracts
def test_a_decode_request_retracted_and_resumed_comes_back_without_a_lock_and_finishes() -> None:
    system = build(cache_spec(decode_running=1))
    _prime(system)
    system.add_request(1, [*PREFIX, 3], 10)
    _run_until(system, lambda: bool(system.decode.running))
    d = system.decode.running[0]
    assert d.lock is not None
    system.decode.force_retract(1)
    assert d.state is ReqState.RETRACTED and d.lock is None and d.cache_protected_len == 0
    _drain(system)
    assert d.state is ReqState.FINISHED and system.decode.pd_stats.resumes == 1


# ------------------------------------------------------------------ planted bugs
@needs_contracts
@pytest.mark.fires("I-PD-PREFIX-LOCK")
def test_a_lock_taken_but_not_recorded_on_the_request_is_caught() -> None:
    """The shape the review of SGLang PR #26218 flagged: the decode locks the matched node but does not
    record it on the request, so the request's release never gives it back (the prefix stays protected)."""

    def unrecorded(original: Any) -> Any:
        def match_and_lock(self: DecodeScheduler, req: Any) -> int:
            cached = original(self, req)
            req.lock = None  # taken on the tree, forgotten by the request
            return cached

        return match_and_lock

    system = build(cache_spec())
    _prime(system)
    with patched(DecodeScheduler, "match_and_lock", unrecorded), pytest.raises(ContractViolation) as exc:
        system.add_request(1, [*PREFIX, 1], 2)
        system.run_until_idle(300)
    assert "I-PD-PREFIX-LOCK" in str(exc.value)


@needs_contracts
@pytest.mark.fires("I-PD-PREFIX-LOCK")
def test_a_lease_that_releases_the_prefix_lock_at_the_abort_is_caught() -> None:
    """Releasing the shared prefix's lock at the abort while the rest waits for the ack leaves a leased
    request with a cached prefix and no lock: the prefix may be evicted and reused under its row."""

    def early(original: Any) -> Any:
        def start_lease(self: DecodeScheduler, req: Any) -> None:
            if req.lock is not None:
                self.tree.dec_lock_ref(req.lock)  # type: ignore[union-attr]
                req.lock = None
            original(self, req)

        return start_lease

    system = build(cache_spec(tree="radix", hybrid=False))
    _prime(system)
    system.channel.inject(Component.KV, Fault.TIMEOUT)
    with patched(DecodeScheduler, "start_lease", early), pytest.raises(ContractViolation) as exc:
        system.add_request(1, [*PREFIX, 5, 6], 3)
        _run_until(system, lambda: any(True for _ in system.channel.in_flight()))
        system.abort(1, DECODE)
        system.run_until_idle(300)
    assert "I-PD-PREFIX-LOCK" in str(exc.value)


@needs_contracts
@pytest.mark.fires("I-PD-PREFIX-DELTA")
def test_a_sender_that_ignores_the_decode_prefix_len_is_caught_before_it_writes() -> None:
    """A transfer backend that does not honour ``decode_prefix_len`` (SGLang #19746 shipped the decode
    radix cache for NIXL only; Mooncake's incremental transfer came later, #24257): it sends the whole
    prompt, writing the tree's shared prefix."""

    def whole_prompt(original: Any) -> Any:
        def _on_init(self: TransferChannel, room: Any, dst: DstInfo) -> None:
            if dst.prefix_len:
                rows = self.decode_rows  # type: ignore[attr-defined]
                prefix = rows.read(dst.row, 0, dst.prefix_len).tolist()
                dst = replace(dst, kv_slots=prefix + dst.kv_slots, prefix_len=0)
            original(self, room, dst)

        return _on_init

    system = build(cache_spec(tree="radix", hybrid=False))
    _prime(system)
    system.channel.decode_rows = system.decode.req_to_token_pool  # type: ignore[attr-defined]
    with patched(TransferChannel, "_on_init", whole_prompt), pytest.raises(ContractViolation) as exc:
        system.add_request(1, [*PREFIX, 7], 2)
        system.run_until_idle(300)
    assert "I-PD-PREFIX-DELTA" in str(exc.value)


# ------------------------------------------------------------------ kvledger simulate --pd --pd-decode-cache
def _simulate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvledger", "simulate", "--pd", "--no-plot", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_simulate_pd_decode_cache_reports_the_prefixes_it_did_not_transfer() -> None:
    small = ("--gsp-num-groups", "2", "--gsp-prompts-per-group", "6", "--gsp-output-len", "8")
    run = _simulate("--pd-decode-cache", "--json", *small)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["violations"] == 0 and out["finished"] == out["requests"] == 12
    decode = out["instances"]["decode"]
    assert decode["prefix_hits"] > 0 and decode["prefix_tokens"] >= decode["prefix_hits"]
    assert out["instances"]["prefill"]["prefix_hits"] == 0  # the prefill's own cache is another count
    off = json.loads(_simulate("--json", *small).stdout)
    assert off["instances"]["decode"]["prefix_hits"] == 0


def test_simulate_refuses_a_hybrid_decode_cache_above_page_1_in_one_line() -> None:
    run = _simulate("--pd-decode-cache", "--page-size", "16")
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip().count("\n") == 0 and "--page-size 1" in run.stderr and "--pd-decode-cache" in run.stderr


@needs_contracts
@pytest.mark.fires("I-WRITER-LEASE")
@pytest.mark.parametrize("page_size", [1, 4])
def test_sglang_24230_destination_sliced_from_the_row_start_is_caught_before_the_write(page_size: int) -> None:
    """SGLang #24230 (fixed; a bug of #19746's decode radix cache): with a prefix hit the row is
    ``[prefix | delta]``, and the delta's locations were sliced from index 0, i.e. the prefix's. Re-enacted
    where the reference reads them (the destination sent to the prefill): the delta's data would land in the
    tree's shared prefix. The first in-flight check names the message and the tree node owning the id."""

    def from_row_start(original: Any) -> Any:
        def _allocate(self: DecodeScheduler, req: Any, length: int, account: Any, cached: int = 0) -> Any:
            out = original(self, req, length, account, cached)
            if out is None or not cached:
                return out
            return self.req_to_token_pool.read(req.req_pool_idx, 0, length - cached)

        return _allocate

    spec = cache_spec() if page_size == 1 else cache_spec(page_size, tree="radix", hybrid=False)
    system = build(spec)
    _prime(system)
    with patched(DecodeScheduler, "_allocate", from_row_start), pytest.raises(ContractViolation) as exc:
        system.add_request(1, [*PREFIX, 7, 8, 9, 10], 2)
        system.run_until_idle(300)
    assert "I-WRITER-LEASE" in str(exc.value) and "node" in str(exc.value)


# ------------------------------------------------------------------ the census, and bad input
def test_the_decode_census_counts_the_locked_prefix_as_protected_and_only_the_delta_as_the_requests() -> None:
    system = build(cache_spec())
    _prime(system)
    system.add_request(1, [*PREFIX, 1, 1], 30)
    _run_until(system, lambda: bool(system.decode.running))
    d = system.decode.running[0]
    kv = next(t for t in system.decode.accounting.pool_terms() if t.pool == "kv")
    assert d.cache_protected_len == len(PREFIX) and kv.protected == d.cache_protected_len
    assert kv.held == {"req.running": system.decode.memory.kv_held_tokens(d)}
    assert kv.held["req.running"] == d.kv_allocated_len - len(PREFIX)  # the delta and the decode tokens
    mamba = next(t for t in system.decode.accounting.pool_terms() if t.pool == "mamba")
    assert mamba.evictable == 1 and mamba.protected == 0  # the primer's state: KV-only lock (no state lock)
    _drain(system)


@pytest.mark.parametrize(
    ("prefix_len", "kv_slots", "why"),
    [
        (-1, [0, 1, 2], "prefix_len"),
        (True, [0, 1], "prefix_len"),
        (4, [], "outside the plan"),
        (1, [0, 1, 2], "already cached"),
    ],
)
def test_init_receiver_refuses_a_bad_prefix_len_and_changes_nothing(
    prefix_len: Any, kv_slots: list[int], why: str
) -> None:
    system = build(cache_spec())
    channel = system.channel
    channel.open(99, 3, expects_state=True)
    before = channel.describe_room(99)
    with pytest.raises(InvalidArgument, match=why):
        channel.init_receiver(
            99, DstInfo(kv_slots=kv_slots, mamba_slot=1, meta_idx=1, row=1, prefix_len=prefix_len)
        )
    assert channel.describe_room(99) == before and channel.rooms[99].init_step is None
