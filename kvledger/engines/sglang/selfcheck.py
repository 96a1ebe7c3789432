"""Build and exercise the components of whichever SGLang release this process loads; print one JSON line.

Run as ``python -m kvledger.engines.sglang.selfcheck`` with ``KVLEDGER_SGLANG_RELEASE_DIR`` naming a
side-by-side release (0.5.20: the last with ``MambaRadixCache``); the tests run it in a subprocess,
since one process holds one SGLang release.
"""

from __future__ import annotations

import json
import types
from typing import Any

import torch

from kvledger.engines.sglang import build, load


def request_stub() -> Any:
    """What ``match_prefix(cow_mamba=True)`` reads and writes on a request: its ``kv`` fields only."""
    kv = types.SimpleNamespace(holds_mamba=False, mamba_pool_idx=None, mamba_cow_src_index=None)
    return types.SimpleNamespace(kv=kv)


def mamba_radix_cache_round() -> dict[str, Any]:
    """Insert a prefix with a state, match it with copy-on-write, copy the state, evict everything."""
    sgl = load()
    alloc = build.token_allocator(32)
    rows = build.hybrid_req_pool(8, 6)
    tree = build.mamba_radix_cache(alloc, rows)
    pool = rows.mamba_pool
    ids = alloc.alloc(4)
    slot = rows.mamba_allocator.alloc(1)
    pool.mamba_cache.temporal[:, slot] = 7.0
    tree.insert(sgl.InsertParams(key=build.radix_key([1, 2, 3, 4]), value=ids, mamba_value=slot))
    req = request_stub()
    m = tree.match_prefix(
        sgl.MatchPrefixParams(key=build.radix_key([1, 2, 3, 4, 5]), cow_mamba=True, req=req)
    )
    dst = req.kv.mamba_pool_idx
    pool.copy_from(req.kv.mamba_cow_src_index.reshape(-1), dst.reshape(-1))  # SGLang defers it to the forward
    copied = bool(torch.all(pool.mamba_cache.temporal[:, int(dst)] == 7.0))
    rows.mamba_allocator.free(dst.reshape(-1))
    evicted = tree.evict(sgl.EvictParams(num_tokens=4)).num_tokens_evicted
    return {
        "matched": int(m.device_indices.numel()),
        "cow_copied": copied,
        "evicted_tokens": int(evicted),
        "free_after": int(alloc.available_size()),
    }


def lock_symmetry_round() -> dict[str, Any]:
    """The steps of :mod:`.repros.mamba_lock_symmetry_0520`, watched: the attach stops at the unlock that
    releases a state lock its lock never took (I-LOCK-SYMMETRY), before SGLang's eviction asserts."""
    from kvledger.contracts.errors import ContractViolation
    from kvledger.engines.sglang.attach import watch

    sgl = load()
    alloc = build.token_allocator(32)
    rows = build.hybrid_req_pool(4, 4)
    tree = build.mamba_radix_cache(alloc, rows)
    w = watch(allocator=alloc, req_pool=rows, mamba_pool=rows, tree=tree, audit_each=True)
    with w.holder("writer"):
        ids, slot = alloc.alloc(4), rows.mamba_allocator.alloc(1)
        tree.insert(sgl.InsertParams(key=build.radix_key([1, 2, 3, 4]), value=ids, mamba_value=slot))
    tree.match_prefix(sgl.MatchPrefixParams(key=build.radix_key([1, 2])))
    upper = next(iter(tree.root_node.children.values()))
    with w.holder("A"):
        tree.inc_lock_ref(upper)
    with w.holder("reviver"):
        ids, slot = alloc.alloc(2), rows.mamba_allocator.alloc(1)
        tree.insert(sgl.InsertParams(key=build.radix_key([1, 2]), value=ids, mamba_value=slot))
    with w.holder("B"):
        tree.inc_lock_ref(upper)
    try:
        with w.holder("A"):
            tree.dec_lock_ref(upper)
    except ContractViolation as exc:
        return {"fired": str(exc).splitlines()[0], "mamba_lock_ref_after": int(upper.mamba_lock_ref)}
    return {"fired": None}


def main() -> None:
    sgl = load()
    report: dict[str, Any] = {"version": sgl.version, "import_seconds": round(sgl.import_seconds, 2)}
    if sgl.has_mamba_radix_cache:
        report["mamba_radix_cache"] = mamba_radix_cache_round()
        report["lock_symmetry"] = lock_symmetry_round()
        from kvledger.engines.sglang.drive_run import replay

        report["machine_found"] = replay()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
