"""PD under Mamba V2 (``extra_buffer``) at pages 1, 4 and 16, and the decode pool's pre-allocation limit.

Under V2 the prefill's Mamba radix cache tracks with ping-pong slots and every decode request holds its
working slot plus ``k`` tracking slots (SGLang's ``HybridMambaDecodeReqToTokenPool`` with the extra
buffer: 2 with the overlap scheduler, 1 without) from pre-allocation to release, leases included; a
retracted request holds none and takes them again when it resumes.
"""

from __future__ import annotations

import pytest

from kvledger.contracts import switch
from kvledger.contracts.arith import ceil_to_page
from kvledger.contracts.errors import ContractViolation
from kvledger.museum.exhibit import patched
from kvledger.museum.machines.pd import prealloc_limit
from kvledger.reference.disagg import DECODE, Component, Fault, PDSystem
from kvledger.reference.disagg.decode import DecodeScheduler
from kvledger.reference.scheduler import ReqState, Scheduler
from tests.disagg.harness import build, expected, pd_spec

needs_contracts = pytest.mark.skipif(not switch.ENABLED, reason="contracts are off (KVLEDGER_CONTRACTS=0)")
PREFIX = list(range(10, 30))


def v2_spec(page_size: int, overlap: bool = False, **kw: object) -> object:
    return pd_spec(
        page_size=page_size,
        mamba_strategy="extra_buffer",
        mamba_chunk_size=4,
        mamba_track_interval=2 * max(page_size, 2),
        overlap=overlap,
        chunk=16,
        prefill_kv=kw.pop("prefill_kv", 320),  # type: ignore[arg-type]
        decode_kv=kw.pop("decode_kv", 320),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def _drain(system: PDSystem) -> None:
    system.run_until_idle(2000)
    system.check_quiescent()
    for p, d in system.pairs.values():
        assert p.state.is_done and d.state.is_done and p.finish_reason and d.finish_reason, (p, d)
        if d.state is ReqState.FINISHED:
            assert d.output_ids == expected(system, d.origin_input_ids, d.max_new_tokens)


def _mamba_held(system: PDSystem, req: object) -> int:
    return system.decode.mamba_pool.ledger.held_count(req.owner)  # type: ignore[attr-defined]


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("overlap", [False, True])
def test_v2_pairs_hold_tracking_slots_on_both_sides_and_finish_with_their_alone_outputs(
    page_size: int, overlap: bool
) -> None:
    system = build(v2_spec(page_size, overlap))
    k = 2 if overlap else 1
    assert system.decode.tracking_slots == k and system.prefill.memory.tracking is not None
    assert system.decode.mamba_pool.size >= system.decode.req_to_token_pool.size * (1 + k)  # I-SIZING
    for rid in range(6):
        system.add_request(rid, [*PREFIX, rid, *range(rid)], 6)
    seen_decode = seen_prefill = False
    for _ in range(400):
        if not system.has_work():
            break
        system.step()
        for _, d in system.pairs.values():
            if d.state in (ReqState.TRANSFER, ReqState.PREBUILT, ReqState.RUNNING):
                assert d.mamba_ping_pong_track_buffer is not None and len(d.mamba_slots()) == 1 + k
                if switch.ENABLED:
                    assert _mamba_held(system, d) == 1 + k
                seen_decode = True
        for p, _ in system.pairs.values():
            if p.state is ReqState.INFLIGHT:
                assert p.mamba_ping_pong_track_buffer is not None  # held while the channel reads the row
                seen_prefill = True
    assert seen_decode and seen_prefill
    _drain(system)
    assert all(d.state is ReqState.FINISHED for _, d in system.pairs.values())
    assert all(d.mamba_ping_pong_track_buffer is None for _, d in system.pairs.values())
    assert system.prefill.memory.tracking.stats["captures"] > 0


@needs_contracts
@pytest.mark.parametrize("page_size", [1, 16])
def test_v2_decode_lease_keeps_the_tracking_slots_until_the_sender_acknowledges(page_size: int) -> None:
    system = build(v2_spec(page_size))
    system.channel.inject(Component.KV, Fault.TIMEOUT)
    system.add_request(0, PREFIX, 3)
    for _ in range(100):
        if any(True for _ in system.channel.in_flight()):
            break
        system.step()
    d = system.pairs[0][1]
    track = d.mamba_ping_pong_track_buffer
    assert track is not None
    system.abort(0, DECODE)
    assert d.owner.account.name == "pd.decode.lease"
    assert set(track.tolist()) <= set(system.decode.mamba_pool.ledger.holdings(d.owner))
    _drain(system)
    assert d.mamba_ping_pong_track_buffer is None and system.decode.pd_stats.leases == 1


@pytest.mark.parametrize("page_size", [1, 4])
def test_v2_retracted_decode_request_gives_back_its_tracking_slots_and_takes_new_ones_on_resume(
    page_size: int,
) -> None:
    system = build(v2_spec(page_size, decode_running=2))
    for rid in range(2):
        system.add_request(rid, [*PREFIX, rid], 10)
    for _ in range(200):
        if len(system.decode.running) == 2:
            break
        system.step()
    assert system.decode.force_retract(1) == 1
    retracted = system.decode.retracted_queue[0]
    assert retracted.mamba_ping_pong_track_buffer is None and not retracted.handles()
    for _ in range(200):
        if retracted.state is not ReqState.RETRACTED:
            break
        system.step()
    assert retracted.mamba_ping_pong_track_buffer is not None
    _drain(system)
    assert system.decode.pd_stats.resumes == 1


@needs_contracts
@pytest.mark.fires("I-COUNT")
def test_v2_decode_release_that_keeps_the_tracking_slots_is_caught() -> None:
    """A planted bug: the decode release path forgets the tracking slots (handle cleared, slots kept): the
    decode instance's Mamba identity misses them at the step of the release."""

    def forgetting(original: object) -> object:
        def _free_tracking(self: DecodeScheduler, req: object) -> None:
            req.mamba_ping_pong_track_buffer = None  # type: ignore[attr-defined]

        return _free_tracking

    system = build(v2_spec(1))
    with patched(DecodeScheduler, "_free_tracking", forgetting), pytest.raises(ContractViolation) as exc:
        system.add_request(0, PREFIX, 2)
        system.run_until_idle(300)
    assert "decode instance" in str(exc.value) and "[mamba]" in str(exc.value)


@needs_contracts
@pytest.mark.fires("I-HANDLE-OWNED")
def test_v2_decode_release_that_leaves_the_tracking_handle_set_is_caught() -> None:
    """SGLang #26941 on the decode side: the slots are freed, the handle stays set."""

    def leaving_handle(original: object) -> object:
        def _free_tracking(self: DecodeScheduler, req: object) -> None:
            track = req.mamba_ping_pong_track_buffer  # type: ignore[attr-defined]
            if track is not None:
                self.mamba_pool.free(track, req.owner)  # type: ignore[attr-defined]

        return _free_tracking

    system = build(v2_spec(1, decode_running=2))
    with patched(DecodeScheduler, "_free_tracking", leaving_handle), pytest.raises(ContractViolation) as exc:
        for rid in range(2):
            system.add_request(rid, [*PREFIX, rid], 10)
        for _ in range(200):
            system.step()
            if system.decode.running:
                system.decode.force_retract(1)
    assert "I-HANDLE-OWNED" in str(exc.value) or "mamba_ping_pong_track_buffer" in str(exc.value)


# ------------------------------------------------------------------ the pre-allocation limit (issue 27, item 5)
@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("strategy", ["no_buffer", "extra_buffer"])
def test_prompts_at_one_below_and_one_above_the_decode_preallocation_limit(page_size: int, strategy: str) -> None:
    """At and below the limit a prompt is pre-allocated and finishes; one above, it is refused at arrival
    (else it would wait in the pre-allocation queue forever)."""
    decode_kv = 4 * max(page_size, 8)
    kw: dict[str, object] = {
        "tree": "none",
        "prefill_kv": 320,  # whole pages at every page size (EngineSpec refuses a partial page)
        "decode_kv": decode_kv,
        "max_context_len": decode_kv + 40,
        "reserved_decode_tokens": page_size + 3,  # the pre-allocation limit, not the spare page, binds
    }
    spec = v2_spec(page_size, **kw) if strategy == "extra_buffer" else pd_spec(page_size=page_size, chunk=None, **kw)
    system = build(spec)
    limit = prealloc_limit(system, 2)
    reserved = system.decode.reserved_decode_tokens
    assert ceil_to_page(limit, page_size) + reserved <= decode_kv
    assert ceil_to_page(limit + 2, page_size) + page_size <= decode_kv
    assert (
        ceil_to_page(limit + 1, page_size) + reserved > decode_kv
        or ceil_to_page(limit + 3, page_size) + page_size > decode_kv
    )
    for rid, length in enumerate((limit - 1, limit, limit + 1)):
        system.add_request(rid, [(rid + i) % 90 + 5 for i in range(length)], 2)
    _drain(system)
    states = [system.pairs[rid][1].state for rid in range(3)]
    assert states == [ReqState.FINISHED, ReqState.FINISHED, ReqState.REJECTED]


@pytest.mark.fires("I-LIVENESS")
@pytest.mark.parametrize("page_size", [4, 16])
def test_a_preallocation_sizing_error_of_less_than_a_page_is_caught_one_above_the_limit(page_size: int) -> None:
    """A planted bug: the arrival check counts the prompt without rounding it up to whole pages, while
    pre-allocation does. Only a prompt just past the limit tells: it is admitted and never fits."""

    def unpaged(original: object) -> object:
        def _never_fits(self: DecodeScheduler, req: object) -> str | None:
            reason = Scheduler._never_fits(self, req)  # type: ignore[arg-type]
            too_long = len(req.origin_input_ids) + self.reserved_decode_tokens > self.kv_allocator.size  # type: ignore[attr-defined]
            return reason or ("prompt + reserved decode tokens exceeds the KV pool" if too_long else None)

        return _never_fits

    decode_kv = 4 * page_size
    spec = pd_spec(
        tree="none",
        page_size=page_size,
        chunk=None,
        prefill_kv=320,  # whole pages at every page size (EngineSpec refuses a partial page)
        decode_kv=decode_kv,
        max_context_len=decode_kv + 40,
        reserved_decode_tokens=page_size + 1,
    )
    system = build(spec)
    limit = prealloc_limit(system, 2)
    with patched(DecodeScheduler, "_never_fits", unpaged):
        system.add_request(0, list(range(5, 5 + limit - 1)), 2)  # below and at: the bug is invisible
        system.add_request(1, list(range(5, 5 + limit)), 2)
        system.run_until_idle(500)
        system.add_request(2, list(range(5, 5 + limit + 1)), 2)  # one above: admitted by the bug
        assert system.pairs[2][1].state is not ReqState.REJECTED
        with pytest.raises(ContractViolation, match="I-LIVENESS"):
            system.run_until_idle(500)


@pytest.mark.parametrize("strategy", ["no_buffer", "extra_buffer"])
def test_a_request_retracted_near_the_decode_limit_resumes(strategy: str) -> None:
    """Found by the PD machine's draws at the decode limit: a prompt at the limit, retracted after a
    few tokens, needed its length plus the full decode reservation to come back, more than the pool; it
    never resumed and, first in line, blocked every pre-allocation (I-LIVENESS). It reserves only what it
    can still generate."""
    kw: dict[str, object] = {
        "tree": "none",
        "decode_kv": 40,
        "decode_running": 1,
        "pre_alloc_size": 0,
        "reserved_decode_tokens": 7,
        "max_context_len": 96,
    }
    spec = v2_spec(4, **kw) if strategy == "extra_buffer" else pd_spec(page_size=4, chunk=None, **kw)
    system = build(spec)
    limit = prealloc_limit(system, 4)
    system.add_request(0, [(i % 90) + 5 for i in range(limit)], 4)
    d = system.pairs[0][1]
    for _ in range(100):
        if d.state is ReqState.RUNNING and len(d.output_ids) >= 3:
            break
        system.step()
    assert system.decode.force_retract(1) == 1
    assert ceil_to_page(d.host_copy.length, 4) + 7 > 40  # the full reservation would never fit
    system.add_request(1, [5, 6, 7], 2)  # waits behind the retracted request
    _drain(system)
    assert d.state is ReqState.FINISHED and system.pairs[1][1].state is ReqState.FINISHED
    assert system.decode.pd_stats.resumes == 1
