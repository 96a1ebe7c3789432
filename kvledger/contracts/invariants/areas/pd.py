"""Prefill/decode disaggregation: two instances, their queues, leases and the transfer channel."""

from __future__ import annotations

from kvledger.contracts.invariants.model import Area, Invariant, Origin, Severity, contract, proof

DISAGG = "kvledger/reference/disagg"
SYSTEM = f"{DISAGG}/system.py"
INSTANCE = f"{DISAGG}/instance.py"
CHANNEL = f"{DISAGG}/channel.py"
DECODE = f"{DISAGG}/decode.py"
PREFILL = f"{DISAGG}/prefill.py"
SIZING = "kvledger/contracts/sizing.py"
MACHINE = "kvledger/museum/machines/pd.py:PDMachine"
MODEL_MACHINE = "kvledger/museum/machines/pd.py:PDModelMachine"

PD = ("pd-prefill", "pd-decode", "pd-channel")

AREA = Area(
    key="pd",
    title="Prefill/decode disaggregation",
    order=35,
    intro=(
        "A prefill instance and a decode instance (each a scheduler with its own pools, cache and model),"
        " their queues as accounts (`pd.prefill.*`, `pd.decode.*`), the metadata-slot pool and a transfer"
        " channel whose messages land as their own events, with drop, delay, fail and timeout per"
        " component. Each instance checks the scheduler's identities with every PD holder term after every"
        " step (the PD busy check: I-COUNT, I-LEDGER-AGREES, I-HANDLE-OWNED, I-OWNER-RELEASE); the pair"
        " checks what spans both. The model, the queues and the transitions: [pd.md](pd.md). The machine of"
        " `tests/disagg/test_pd_machine.py` drives arrivals, steps, aborts at either side in any state,"
        " every fault of every component, allocation failures and decode retraction, and checks all of"
        " these after every rule; its teardown checks liveness, quiescence and the output oracle."
    ),
    invariants=(
        Invariant(
            id="I-WRITER-LEASE",
            title="no id is reallocated while a transfer may still write or read it",
            statement=(
                "Every id a dispatched, unresolved transfer message may write on the decode side (KV pages,"
                " the Mamba slot, the metadata slot, and the row that maps them) or read on the prefill side"
                " is owned by that room's request, in a live queue or a lease account; a prefill page may"
                " also be a cache node's, kept protected by the request's lock. A request that ends while"
                " its room may still be touched keeps everything under a lease until the room drained."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=(*PD, "kv-token-pool", "kv-page-pool", "req-rows", "mamba-pool", "metadata-pool"),
            upstream=(
                "N4: SGLang #24527 (fixes #27372, #35049 deferred release, #38961)",
                "N8: SGLang #30899",
            ),
            checks=(
                contract("kvledger/contracts/leases.py:check_lease"),
                contract(f"{SYSTEM}:PDSystem.check_leases", "every message in flight, after every step"),
                contract(f"{SYSTEM}:PDSystem._check_landing", "at the moment a message lands"),
                contract(f"{INSTANCE}:PDScheduler._release_finished_or_aborted", "lease instead of release"),
            ),
            exercised_by=(MACHINE, MODEL_MACHINE),
        ),
        Invariant(
            id="I-TRANSFER-ATOMIC",
            title="a transfer counts only when every component landed",
            statement=(
                "A decode request is committed as transferred only when all KV positions of its plan, its"
                " Mamba state and its metadata landed and nothing of its room is in flight, and the metadata"
                " names its own room; otherwise the room fails and the request is released (fails closed)."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=("pd-decode", "pd-channel"),
            upstream=("N9: SGLang PR #30890", "vLLM #52234"),
            checks=(
                contract(f"{DECODE}:DecodeScheduler.commit_transfer"),
                contract(f"{CHANNEL}:TransferChannel.missing_components", "the receiver's ground truth"),
            ),
            exercised_by=(MACHINE, MODEL_MACHINE),
        ),
        Invariant(
            id="I-DRAIN",
            title="an aborted request leaves every queue within a bound",
            statement=(
                "A request aborted on either side (client, remote abort, room failure, rejection at arrival)"
                " has left every queue of that side, released everything and closed its room within"
                " `ChannelConfig.drain_bound` steps (2 x latency + the longest message life + 4, plus what lost"
                " or delayed aborts and acknowledgements of its room cost: `TransferChannel.drain_bound`); so has the"
                " other side's copy, unless it passed its hand-off before the abort reached it: a decode that"
                " committed the transfer serves the request on its own (the abort travels `latency` steps and"
                " may arrive after the commit), and only an abort on the decode ends it."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=PD,
            upstream=("N6a: SGLang PR #28236", "N6c: SGLang PR #30053", "N6d: SGLang #18701"),
            checks=(
                contract(f"{SYSTEM}:PDSystem.check_drain", "after every step and at quiescence"),
                contract(f"{PREFILL}:PrefillScheduler.poll_waiting_failures"),
                contract(f"{DECODE}:DecodeScheduler.pop_preallocated", "failed entries first, all of them"),
            ),
            exercised_by=(MACHINE,),
            notes="The machine found the FIFO stop of the prealloc queue keeping failed entries queued.",
        ),
        Invariant(
            id="I-PD-PREFIX-LOCK",
            title="a decode request locks its cached prefix exactly while it may use it",
            statement=(
                "With the decode radix cache, a decode request that matched a prefix at pre-allocation holds"
                " exactly one live lock, on the node its prefix ends at, from pre-allocation through the"
                " transfer, prebuilt and running queues and a lease after an abort until its release; the"
                " prefix's KV is owned by tree nodes in `cache.protected`, never by the request. A request in"
                " the prealloc or retracted queue holds no lock and no cached prefix. Every live lock of the"
                " decode tree belongs to one such request, so each is released exactly once and the prefix is"
                " never freed while locked."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=("pd-decode", "radix-cache", "kv-token-pool", "kv-page-pool"),
            upstream=(
                "SGLang PR #19746 (decode radix cache: lock the matched prefix for the request's life)",
                "SGLang PR #32732 (hybrids: skip the Mamba match, no copy-on-write)",
                "SGLang PR #35049 (deferred release of an aborted request until the ack)",
                "SGLang PR #26218 review (the decode's lock not recorded on the request, so never released)",
            ),
            checks=(
                contract("kvledger/reference/disagg/decode_cache.py:check_decode_prefixes", "after every step"),
                contract(f"{DECODE}:DecodeScheduler.match_and_lock"),
                contract(f"{DECODE}:DecodeScheduler.unlock_prefix", "pre-allocation gave up"),
            ),
            exercised_by=(MACHINE, MODEL_MACHINE),
        ),
        Invariant(
            id="I-PD-PREFIX-DELTA",
            title="a transfer writes only what the decode's cache did not have",
            statement=(
                "The decode's pre-allocation tells the sender how many leading positions its radix cache"
                " matched (`DstInfo.prefix_len`, SGLang's `decode_prefix_len`, whole pages); no KV message"
                " writes a position below it (that KV is the tree's, shared with other requests), and the"
                " commit waits for exactly the positions above it."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=("pd-decode", "pd-channel", "radix-cache"),
            upstream=("SGLang PR #19746", "SGLang PR #24230 (out_cache_loc slicing when pre_len > 0)"),
            checks=(
                contract(f"{CHANNEL}:_check_delta", "at every KV dispatch and before every KV landing"),
                contract(f"{CHANNEL}:TransferChannel.missing_components", "the delta's positions only"),
            ),
            exercised_by=(MACHINE, MODEL_MACHINE),
        ),
        Invariant(
            id="I-SIZING",
            title="the decode pools cover every row",
            statement=(
                "A decode instance has `max_running + pre_alloc` usable rows after the reserved row 0"
                " (`pre_alloc = 2 x max_running` up to 32) and at least `rows x slots_per_req` Mamba slots,"
                " never `pre_alloc` added on top of an explicit size."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=("pd-decode", "req-rows", "mamba-pool"),
            upstream=("B11: SGLang #19002, #20858, #22462, #23267, #23570",),
            checks=(
                contract(f"{SIZING}:check_decode_sizing", "run when a decode instance is built"),
                proof(f"{SIZING}:default_pre_alloc_size"),
                proof(f"{SIZING}:decode_rows"),
                proof(f"{SIZING}:decode_mamba_slots"),
            ),
        ),
    ),
)
