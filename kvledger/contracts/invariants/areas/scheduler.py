"""The scheduler: requests' bookkeeping, admission, release, overlap, quiescence and liveness."""

from __future__ import annotations

from kvledger.contracts.invariants.model import (
    Area,
    Invariant,
    Origin,
    Severity,
    contract,
    input_check,
    oracle,
    recount,
)

SCHED = "kvledger/reference/scheduler/scheduler.py"
MEMORY = "kvledger/reference/scheduler/memory.py"
ACCOUNTING = "kvledger/reference/scheduler/accounting.py"
IDENTITY = "kvledger/contracts/identity.py"
MACHINE = "kvledger/museum/machines/scheduler.py:SchedulerMachine"
ORACLE_MACHINE = "tests/model/test_oracle.py:ModelOracleMachine"

ALL = ("scheduler", "kv-token-pool", "kv-page-pool", "req-rows", "mamba-pool")

AREA = Area(
    key="scheduler",
    title="Scheduler and requests",
    order=30,
    intro=(
        "After every scheduler step the busy identity (I-COUNT) holds for the KV, row and Mamba pools with"
        " every holder term, cross-checked account by account against the ledger; at quiescence the idle"
        " identity and the full recounts of pools and tree. The Hypothesis machine of"
        " `tests/scheduler/test_scheduler_machine.py` drives arrivals, steps, aborts in any state, injected"
        " allocation failures and forced retractions (overlap on and off, page 1 and 4, each cache or"
        " none) and checks all of these after every rule.\n\n"
        "Reproduced for comparison, not an invariant of kvledger: SGLang's late-2025 `check_memory` reports"
        " a waiting request's copy-on-write slot as leaked while the ledger's identity holds (the false"
        " positive of SGLang PR #16067); `kvledger/contracts/identity.py:legacy_check_memory` is that"
        " checker, and `tests/scheduler/test_seed_regressions.py` shows both verdicts on the same state."
    ),
    invariants=(
        Invariant(
            id="I-LEDGER-AGREES",
            title="every identity term equals its ledger account",
            statement=(
                "Each term of the busy identity equals the ledger's account of the same name; on a mismatch"
                " the request whose bookkeeping (row contents, slot, row) differs from its ledger holdings is"
                " named with the disputed ids' history."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=(*ALL, "ledger"),
            checks=(
                contract(f"{ACCOUNTING}:Accounting.cross_check_ledgers"),
                contract(f"{ACCOUNTING}:Accounting._explain", "names the request and the ids in dispute"),
            ),
            exercised_by=(MACHINE,),
        ),
        Invariant(
            id="I-IDLE-IDENTITY",
            title="at quiescence nothing is held or protected",
            statement=(
                "At quiescence nothing is held by a request or a batch, nothing is pending and nothing is"
                " protected; pools and tree pass their full audits."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=(*ALL, "radix-cache", "mamba-radix-cache"),
            checks=(
                contract(f"{IDENTITY}:check_idle_identity"),
                recount(f"{ACCOUNTING}:Accounting.check_quiescent", "plus every pool's and the tree's audit"),
            ),
            exercised_by=(MACHINE,),
        ),
        Invariant(
            id="I-QUIESCENT",
            title="strong checks only at quiescence",
            statement=(
                "Strong checks run only when no batch is in flight and no request is live (waiting, chunked,"
                ' running, just prefilled, parked on a batch); "no batch this step" is not quiescence. With PD,'
                " no PD queue entry and no lease either (an ended request whose ids a transfer may still touch"
                " is live state), and no transfer room open."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=("scheduler", "pd-prefill", "pd-decode", "pd-channel"),
            upstream=("the false positive of SGLang PR #16067", "N5: sglang-omni PR #2080"),
            checks=(
                contract(f"{SCHED}:Scheduler.is_quiescent", "the predicate"),
                contract(f"{ACCOUNTING}:Accounting.check_quiescent", "refuses outside quiescence"),
                contract("kvledger/reference/disagg/instance.py:PDScheduler.is_quiescent", "PD queues, leases"),
                contract("kvledger/reference/disagg/system.py:PDSystem.check_quiescent", "both sides, no room"),
            ),
            exercised_by=(MACHINE,),
        ),
        Invariant(
            id="I-REQ-LADDER",
            title="a request's lengths are ordered",
            statement=(
                "`0 <= cache_protected_len <= kv_committed_len <= kv_allocated_len <= max_context_len` and"
                " `cache_protected_len % page_size == 0`, for every live request."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=("scheduler",),
            checks=(
                contract("kvledger/reference/scheduler/request.py:ladder_holds"),
                contract(
                    f"{SCHED}:Scheduler",
                    "class invariant over every request whose lengths changed since they were last counted",
                ),
                contract(f"{ACCOUNTING}:Accounting._count_changed", "every changed request, after every step"),
            ),
            exercised_by=(MACHINE,),
        ),
        Invariant(
            id="I-ATOMIC-ADMISSION",
            title="admission takes everything or nothing",
            statement=(
                "Admission obtains row + Mamba working slot (+ the `k` tracking slots under Mamba V2) + KV"
                " for every admitted request or changes nothing: pools, ledger, tree locks and request"
                " accounts as before."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=ALL,
            upstream=("B17",),
            checks=(
                contract(
                    f"{MEMORY}:ReqMemory.prepare_extend",
                    "postcondition: a failed round leaves every request holding what it held",
                ),
                contract("kvledger/reference/scheduler/adder.py:PrefillAdder", "budget before appending"),
                contract(f"{SCHED}:Scheduler._rollback_admission"),
            ),
            exercised_by=(MACHINE,),
        ),
        Invariant(
            id="I-OWNER-RELEASE",
            title="every exit releases exactly what is held, once",
            statement=(
                "Every transition out of a holding state releases exactly what the request holds, once:"
                " finish, abort (waiting with or without a copy-on-write slot, chunked, running, in flight),"
                " retract. A second release is a bug. At every step boundary a request that has ended is"
                " released or parked in one of the scheduler's `parked_accounts` (`batch.inflight`; with PD"
                " the two lease accounts)."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=ALL,
            upstream=("B5, SGLang PR #12693", "B7, SGLang #20182", "B10, SGLang PR #9817"),
            checks=(
                contract(f"{MEMORY}:ReqMemory._guard_release", "a second release"),
                contract(f"{MEMORY}:ReqMemory._free_owned"),
                contract(f"{SCHED}:Scheduler.check_ended_requests_released", "every step"),
            ),
            exercised_by=(MACHINE,),
        ),
        Invariant(
            id="I-HANDLE-OWNED",
            title="a handle implies ownership",
            statement=(
                "Every id a request's handles name (`req_pool_idx`, `mamba_pool_idx`, the Mamba V2"
                " `mamba_ping_pong_track_buffer`, a PD `metadata_idx`) is owned by that request in the pool's"
                " ledger: checked after every step and for the requests of every batch when it is formed."
                " Incremental: verified for the requests whose handle fields were written or whose owner gave"
                " ids away in a ledger since their last verification, the only two ways a verified handle can"
                " go stale (`recount_every_step` verifies every live request). A release that leaves a handle"
                " set is caught at once, naming the slot, the holder and the slot's moves, while the counting"
                " identity is still balanced."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=(*ALL, "metadata-pool", "ledger"),
            upstream=("B4: SGLang #12432 (fix #12994)", "N1: SGLang PR #26941"),
            checks=(
                contract("kvledger/contracts/handles.py:check_handles_owned"),
                contract(f"{SCHED}:Scheduler.check_handles_owned", "claims from `Req.handles()`"),
                contract(f"{SCHED}:Scheduler.new_batch", "a forward never runs on an id its request does not own"),
            ),
            exercised_by=(MACHINE, "kvledger/museum/machines/pd.py:PDMachine"),
        ),
        Invariant(
            id="I-COW-STOPPER",
            title="the stopper's copy-on-write slot is freed only if not appended",
            statement=(
                "The copy-on-write slot of the request that stopped an admission round is freed only if that"
                " request was not appended; freeing it for an appended request is a bug naming the slot and"
                " the admitted owner."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=("scheduler", "mamba-pool"),
            upstream=("SGLang PR #21404 (the fix)", "SGLang PR #16067 (the reverted variant)"),
            checks=(
                contract(f"{MEMORY}:ReqMemory.release_cow_slot", "the account must still be `req.waiting`"),
                contract(f"{SCHED}:Scheduler._cleanup_stopper"),
            ),
            exercised_by=(MACHINE,),
        ),
        Invariant(
            id="I-ROW-EXCLUSIVE-WHILE-IN-FLIGHT",
            title="nothing a launched batch reads changes hands",
            statement=(
                "No row or Mamba slot referenced by a launched batch whose results are not processed is"
                " handed to another request while a request of that batch still names it; requests that end"
                " meanwhile are parked in `batch.inflight`, retraction drains first. A Mamba capture target"
                " its request gave away meanwhile (a V2 donation the tree declined) may be reused: its next"
                " owner zeroes or copies into it only in a later forward, after this one on the device"
                " stream, as a freed KV slot's next writer does."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=("scheduler", "req-rows", "mamba-pool"),
            upstream=("B2", "B8"),
            checks=(
                contract(f"{ACCOUNTING}:Accounting.check_not_in_flight", "on every new batch"),
                contract(f"{SCHED}:Scheduler._release_or_defer"),
            ),
            exercised_by=(MACHINE,),
        ),
        Invariant(
            id="I-LIVENESS",
            title="every request ends",
            statement=(
                "Every request eventually finishes, is aborted, or is rejected with a reason; a request that"
                " can never fit is rejected at arrival instead of blocking the queue."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=("scheduler",),
            checks=(
                contract(f"{SCHED}:Scheduler._never_fits", "rejection at arrival"),
                contract(
                    "kvledger/reference/scheduler/adder.py:PrefillAdder.room_to_match",
                    "a round stops before matching a request it cannot admit (its copy-on-write slot would"
                    " take one promised to an earlier request)",
                ),
                contract(f"{SCHED}:Scheduler.run_until_idle", "raises when not drained within `max_steps`"),
            ),
            exercised_by=(MACHINE,),
        ),
        Invariant(
            id="I-OUTPUT-ORACLE",
            title="outputs equal the request run alone",
            statement=(
                "A finished request's output equals the same request run alone with no cache, whatever the"
                " schedule (cache hits, chunking, retraction, overlap, other requests' aborts): with the hash"
                " runner, and with the tiny hybrid model reading KV and states through the pools."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=("scheduler", "model-runner", "mamba-radix-cache", "radix-cache"),
            checks=(
                oracle(
                    "kvledger/contracts/oracle.py:check_output_oracle",
                    "run by the machines' teardown and the fault runs",
                ),
            ),
            exercised_by=(MACHINE, ORACLE_MACHINE),
        ),
        Invariant(
            id="I-CALL-STATE",
            title="a call the scheduler's state does not allow is refused",
            statement=(
                "A well-formed call that the scheduler's current state does not allow (retracting a request"
                " that is not running, belongs to another scheduler or is referenced by a batch in flight;"
                " building a batch outside `step`) raises `InvalidState` and changes nothing."
            ),
            severity=Severity.OPERATING_ERROR,
            origin=Origin.KVLEDGER,
            parts=ALL,
            checks=(
                input_check(f"{SCHED}:Scheduler.retract", "only a running request of this scheduler"),
                input_check(f"{SCHED}:Scheduler.get_next_batch_to_run", "batches are built inside `step`"),
            ),
            exercised_by=(MACHINE, "tests/sweep/test_sweep.py:test_bad_call"),
        ),
        Invariant(
            id="I-RESULTS-ONCE",
            title="a batch's results are processed once, in launch order",
            statement=(
                "`process_batch_result` accepts only the oldest batch in flight; a batch already processed,"
                " launched by another scheduler or not yet due raises `BatchNotInFlight` and changes"
                " nothing (with overlap, an early processing is not repeated by the next `step`)."
            ),
            severity=Severity.OPERATING_ERROR,
            origin=Origin.KVLEDGER,
            parts=ALL,
            checks=(input_check(f"{SCHED}:Scheduler.process_batch_result", "the oldest batch in flight"),),
            exercised_by=(MACHINE, "tests/sweep/test_sweep.py:test_bad_call"),
        ),
    ),
)
