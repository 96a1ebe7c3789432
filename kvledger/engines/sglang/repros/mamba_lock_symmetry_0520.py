"""SGLang 0.5.20 ``MambaRadixCache``: an unlock releases a Mamba state lock its lock never took.

``dec_lock_ref`` decides whether to release the node's state lock by re-reading ``node.mamba_value``
(the catalogue's B14 pattern; ``UnifiedRadixCache`` records the skipped components at lock time, the
V1 tree does not). A holder that locked a node while it was a tombstone took no state lock; once the
node is revived by an insert and a second holder locks it (taking the state lock), the first holder's
unlock releases the second holder's state lock. The node's state is then on offer to ``evict_mamba``
although the second holder still has the node locked; once the node is a leaf, the eviction takes it
and SGLang's own assertion stops the process (``evict leaf node invalid ... full_lock_ref=1
mamba_lock_ref=0``, the symptom B14 reports). (Which SGLang 0.5.20 path locks a tombstone:
HiCache load-back and PD paths do; the V1 scheduler without them normally locks nodes with a state.)

Run with SGLang 0.5.20 importable (``python mamba_lock_symmetry_0520.py``); prints what happened and
exits 1 when the state lock was released by the wrong holder.
"""

from __future__ import annotations

import sys
from array import array

import torch


def main() -> int:
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.mamba_radix_cache import MambaRadixCache
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool, MHATokenToKVPool
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    args = ServerArgs(model_path="dummy", device="cpu")
    args._mamba_cache_chunk_size = 64
    set_global_server_args_for_scheduler(args)
    kv = MHATokenToKVPool(32, 1, torch.float32, 1, 1, 1, "cpu", False)
    alloc = TokenToKVPoolAllocator(32, torch.float32, "cpu", kv, False)
    shape = Mamba2StateShape.create(
        tp_world_size=1, intermediate_size=4, n_groups=1, num_heads=1, head_dim=2, state_size=2, conv_kernel=2
    )
    rows = HybridReqToTokenPool(
        size=4, mamba_size=4, mamba_spec_state_size=4, max_context_len=64, device="cpu",
        enable_memory_saver=False, cache_params=Mamba2CacheParams(shape=shape, layers=[0]),
        mamba_layer_ids=[0], enable_mamba_extra_buffer=False,
    )  # fmt: skip
    tree = MambaRadixCache(
        CacheInitParams(disable=False, req_to_token_pool=rows, token_to_kv_pool_allocator=alloc, page_size=1)
    )

    def key(tokens: list[int]) -> RadixKey:
        return RadixKey(array("q", tokens), None)

    # A cached prefix [1, 2, 3, 4] with a state; a match of [1, 2] splits it: the upper node [1, 2] is a
    # tombstone (a split cannot share the state).
    tree.insert(
        InsertParams(key=key([1, 2, 3, 4]), value=alloc.alloc(4), mamba_value=rows.mamba_allocator.alloc(1))
    )
    tree.match_prefix(MatchPrefixParams(key=key([1, 2])))
    upper = next(iter(tree.root_node.children.values()))
    assert upper.mamba_value is None, "the upper half of a split is a tombstone"
    tree.inc_lock_ref(upper)  # holder A: locks the tombstone, so no state lock is taken
    print(f"A locked the tombstone: mamba_lock_ref={upper.mamba_lock_ref}")
    # A request ending exactly at [1, 2] caches its state there: the tombstone is revived.
    # (0.5.20's insert frees the caller's duplicate KV ids above prev_prefix_len itself.)
    tree.insert(
        InsertParams(key=key([1, 2]), value=alloc.alloc(2), mamba_value=rows.mamba_allocator.alloc(1))
    )
    assert upper.mamba_value is not None, "the insert revived the tombstone"
    tree.inc_lock_ref(upper)  # holder B: locks the revived node, taking its state lock
    print(f"B locked the revived node: mamba_lock_ref={upper.mamba_lock_ref}")
    tree.dec_lock_ref(upper)  # holder A unlocks: it re-reads mamba_value and releases a state lock
    print(f"A unlocked: mamba_lock_ref={upper.mamba_lock_ref} while B still holds its lock")
    wrong = upper.mamba_lock_ref == 0
    try:
        # The lower leaf [3, 4] goes first; then the revived node, a leaf now, is taken from the state
        # list although B holds its full lock: SGLang's eviction asserts (the scheduler would die).
        freed = tree.evict(EvictParams(mamba_num=2)).mamba_num_evicted
        print(f"evict_mamba(2) freed {freed} state(s)")
    except AssertionError as exc:
        print(f"evict_mamba(2): AssertionError: {exc}")
        wrong = True
    print("BUG: an unlock released a state lock its lock never took" if wrong else "ok")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
