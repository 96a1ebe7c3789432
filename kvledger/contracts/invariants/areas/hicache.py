"""The host-memory tier (HiCache): host copies, their residency and data, load-back."""

from __future__ import annotations

from kvledger.contracts.invariants.model import Area, Invariant, Origin, Severity, contract, recount

COMP = "kvledger/reference/hicache/component.py"
CHECKS = "kvledger/reference/hicache/checks.py"
LOAD = "kvledger/reference/hicache/load_back.py"

AREA = Area(
    key="hicache",
    title="Host-memory tier (HiCache)",
    order=33,
    intro=(
        "A host pool (`kvledger/reference/hicache/host_pool.py`, pool kinds `host_kv` / `host_mamba`) is one"
        " more pool on the one pool base: one owner per host slot and no double free are the generic"
        " ledger invariants (I-EXCLUSIVE, I-NODUP-FREE), which cover it as any other pool. The host tree"
        " component keeps each cached node's host copy (residency device, both or host) under SGLang's"
        " write policies, and a load-back brings a host-only tail back to the device (spec/hicache.md)."
    ),
    invariants=(
        Invariant(
            id="I-HOST-RESIDENCY",
            title="host copies agree with the tree and the host ledger",
            statement=(
                "A copy that backs a node backs a live node of the tree and covers exactly that node's segment;"
                " a host-only copy backs no node; a copy sits in `cache.protected` while a load-back pins it"
                " and in `cache.evictable` otherwise; the component's evictable/protected counters equal a recount,"
                " and every copy's host slots are held by its owner in the host pool's ledger."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=("host-tier", "radix-cache"),
            checks=(recount(f"{CHECKS}:check_residency"),),
        ),
        Invariant(
            id="I-HOST-IDENTITY",
            title="the identity over the host tier",
            statement=(
                "The host pool's free + pending + evictable + protected slots equal its size (the tree's host"
                " copies are the host pool's only holder: a load-back holds device slots, never host ones); with"
                " the device pools' own identity this is the identity over both tiers."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=("host-tier", "ledger"),
            checks=(recount(f"{CHECKS}:check_identity"),),
        ),
        Invariant(
            id="I-HOST-DATA",
            title="a host copy holds its device copy's data",
            statement=(
                "Every copy with residency both holds, slot for slot, the raw bits of its device node's KV"
                " (the data tags written by the runner travel with every write-through, write-back and"
                " load-back): a transfer that wrote the wrong slot, in the wrong direction or not at all shows."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=("host-tier", "kernels"),
            upstream=("SGLang #39830: wrong output after a full-length host-tier hit",),
            checks=(recount(f"{CHECKS}:check_data", "fingerprints of host and device slots"),),
        ),
        Invariant(
            id="I-HOST-EVICT-PINNED",
            title="host eviction frees host-only, unpinned copies only",
            statement=(
                "Host eviction (SGLang's `evict_host`) never frees a copy that backs a device node or that a"
                " load-back is reading."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=("host-tier",),
            checks=(contract(f"{COMP}:HostKVComponent._evict_copy"),),
        ),
        Invariant(
            id="I-HOST-LOAD-PENDING",
            title="no read of a slot whose load is pending",
            statement=(
                "A device slot a load-back reserved is pending (poisoned) until its copy lands; a reader"
                " (a forward) of a pending slot is refused."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=("host-tier", "scheduler"),
            checks=(contract(f"{LOAD}:LoadBack.check_readable"),),
        ),
        Invariant(
            id="I-HOST-LOAD-ATOMIC",
            title="a load-back commits only once it landed",
            statement=(
                "A load-back enters the tree only after every part of it landed; a pending, failed or aborted"
                " load is refused at commit and leaves the tree and both tiers' counters as they were, and an"
                " abort or a failure unpins every host copy it read."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=("host-tier", "radix-cache"),
            checks=(contract(f"{LOAD}:LoadBack.commit"),),
        ),
    ),
)
