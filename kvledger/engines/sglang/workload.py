"""One request through SGLang's real caches the way its scheduler runs it, and a shared-prefix workload.

``serve`` plays match -> lock -> evict the shortfall -> alloc -> insert -> free the duplicates (the
``RadixCache`` caller's job; ``UnifiedRadixCache`` frees them itself above ``prev_prefix_len``) -> free
the unaligned tail -> unlock, with a Mamba slot donated to the tree when the cache has a Mamba component.
Used by the attach tests and ``benchmarks/sglang_attach.py`` (bare and watched runs of the same calls).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import torch

from kvledger.engines.sglang import build
from kvledger.engines.sglang.attach import Watch


def serve(sgl: Any, alloc: Any, rows: Any, tree: Any, w: Watch | None, rid: int, tokens: list[int]) -> None:
    """Serve one request whose whole sequence is ``tokens`` and cache it (``cache_finished_req``)."""
    ps = alloc.page_size
    mamba = hasattr(rows, "mamba_allocator")
    unified = type(tree).__name__ == "UnifiedRadixCache"
    with w.holder(rid) if w is not None else contextlib.nullcontext():
        m = tree.match_prefix(sgl.MatchPrefixParams(key=build.radix_key(tokens)))
        node = m.last_device_node
        lock = tree.inc_lock_ref(node)
        need = len(tokens) - m.device_prefix_len
        if alloc.available_size() < need:
            tree.evict(sgl.EvictParams(num_tokens=need - alloc.available_size()))
        own = alloc.alloc(need)
        slot = rows.mamba_allocator.alloc(1) if mamba else None
        if mamba and slot is None:
            tree.evict(sgl.EvictParams(mamba_num=1))
            slot = rows.mamba_allocator.alloc(1)
        if own is not None and (slot is not None or not mamba):
            prefix = tree.path_device_indices(node)
            value = torch.cat((prefix.to(torch.int64), own))
            aligned = len(tokens) - len(tokens) % ps
            params = sgl.InsertParams(
                key=build.radix_key(tokens), value=value, prev_prefix_len=m.device_prefix_len
            )
            if mamba:
                params.mamba_value = slot
            res = tree.insert(params)
            dups = own[: max(0, res.prefix_len - m.device_prefix_len)]
            if dups.numel() and not unified:
                alloc.free(dups)
            if own[aligned - m.device_prefix_len :].numel():
                alloc.free(own[aligned - m.device_prefix_len :])
            if mamba and res.mamba_exist:
                rows.mamba_allocator.free(slot)
        else:
            if own is not None:
                alloc.free(own)
            if slot is not None:
                rows.mamba_allocator.free(slot)
        tree.dec_lock_ref(node, lock.to_dec_params())
    if w is not None:
        w.retire(rid)  # it left the engine: it holds nothing (I-OWNER-RELEASE)


def shared_prefix_requests(
    n: int, *, groups: int = 20, prefix_len: int = 512, unique_len: int = 64, seed: int = 0
) -> Iterator[list[int]]:
    """``n`` requests: one of ``groups`` shared prefixes followed by ``unique_len`` fresh tokens."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1, 32000) for _ in range(prefix_len)] for _ in range(groups)]
    for _ in range(n):
        yield rng.choice(prefixes) + [rng.randrange(1, 32000) for _ in range(unique_len)]


def serve_decoding(
    sgl: Any, alloc: Any, rows: Any, tree: Any, w: Watch | None, rid: int, prompt: list[int], decode: int
) -> None:
    """Serve one request that decodes ``decode`` tokens after ``prompt``, one KV allocation per token
    (``alloc(1)`` at page 1, ``alloc_decode`` on a paged allocator, as the scheduler's decode batch does),
    then cache it. The prompt is allocated whole from its matched prefix (``alloc_extend`` when paged)."""
    ps = alloc.page_size
    with w.holder(rid) if w is not None else contextlib.nullcontext():
        m = tree.match_prefix(sgl.MatchPrefixParams(key=build.radix_key(prompt)))
        node = m.last_device_node
        lock = tree.inc_lock_ref(node)
        matched = m.device_prefix_len
        prefix = tree.path_device_indices(node)[:matched].to(torch.int64)
        _room(sgl, alloc, tree, len(prompt) + decode - matched + ps)
        own = _extend(alloc, prefix, len(prompt))
        seq = [prefix, own]
        last = own[-1:]
        for pos in range(len(prompt), len(prompt) + decode):
            if ps == 1:
                one = alloc.alloc(1)
            else:
                lens = torch.tensor([pos + 1], dtype=torch.int64)
                one = alloc.alloc_decode(lens, lens.clone(), last)
            seq.append(one)
            last = one
        value = torch.cat(seq)
        tokens = list(prompt) + [1 + (rid + i) % 7 for i in range(decode)]
        aligned = len(tokens) - len(tokens) % ps
        res = tree.insert(sgl.InsertParams(key=build.radix_key(tokens), value=value, prev_prefix_len=matched))
        if type(tree).__name__ != "UnifiedRadixCache" and res.prefix_len > matched:
            alloc.free(value[matched : res.prefix_len])  # the duplicates: the RadixCache caller's job
        if value[aligned:].numel():
            alloc.free(value[aligned:])  # the unaligned tail
        tree.dec_lock_ref(node, lock.to_dec_params())
    if w is not None:
        w.retire(rid)


def _room(sgl: Any, alloc: Any, tree: Any, tokens: int) -> None:
    if alloc.available_size() < tokens:
        tree.evict(sgl.EvictParams(num_tokens=tokens - alloc.available_size()))


def _extend(alloc: Any, prefix: torch.Tensor, end: int) -> torch.Tensor:
    start = prefix.numel()
    if alloc.page_size == 1:
        return alloc.alloc(end - start)
    p, s = torch.tensor([start], dtype=torch.int64), torch.tensor([end], dtype=torch.int64)
    last = prefix[-1:] if start else torch.tensor([-1], dtype=torch.int64)
    return alloc.alloc_extend(p, p.clone(), s, s.clone(), last, end - start)


def decode_heavy_requests(
    n: int, *, groups: int = 20, prefix_len: int = 64, unique_len: int = 16, seed: int = 1
) -> Iterator[list[int]]:
    """``n`` short prompts (one of ``groups`` shared prefixes plus a few fresh tokens) for
    :func:`serve_decoding`: the decode steps, one allocation each, dominate."""
    return shared_prefix_requests(n, groups=groups, prefix_len=prefix_len, unique_len=unique_len, seed=seed)
