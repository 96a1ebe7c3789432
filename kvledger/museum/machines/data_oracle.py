"""The data oracle of the generic machines: every state and KV slot holds what its owner's tokens imply.

The machines run the engine with the tagged hash runner (``model="hash-tags"``,
``kvledger.reference.scheduler.tagging_runner``): the state after a prefix, and the KV of each position,
carry a tag that is a pure function of the tokens up to there (``kvledger.contracts.data_tags``), as a
real recurrent state is. The runner checks what each forward reads; :func:`check_scheduler_data` checks,
after every rule, everything that holds data nobody is reading yet:

* every cached state: a tree node's Mamba slot holds the state of the node's whole prefix (I-DATA-STATE);
* every cached KV position: the KV slot a node names for position ``p`` holds the tag of the prefix up to
  ``p`` (I-DATA-KV);
* every working state: a request's Mamba slot (its copy-on-write slot while waiting, its working slot
  once admitted, the landed state once a PD transfer committed) holds the state of its first
  ``kv_committed_len`` tokens;
* every V2 tracking slot with a capture in it: the keep half holds the state at
  ``mamba_last_track_seqlen``;
* every host copy of a retracted PD decode request: its state is the state of its first ``length``
  tokens, both components, and its K/V (when kept) the tags of those positions.

So a copy-on-write that copies the wrong way, a donation of the wrong ping-pong half, a capture recorded
at one length and taken at another, a backup that misses a component or a landing of another request's
state fails at the rule that did it, with the slot and what it holds. Machines on another runner (the
tiny model has its own state oracle) are not checked here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import torch

from kvledger.contracts.data_tags import encode
from kvledger.contracts.mamba_track import other_track_idx
from kvledger.museum.machines.checks import violation
from kvledger.reference.engine import EngineSpec, ModelKind
from kvledger.reference.scheduler import ReqState
from kvledger.reference.scheduler.tagging_runner import (
    TaggingHashRunner,
    describe_state,
    kv_mismatches,
    kv_rows,
    state_mismatches,
)

DATA_MODEL: ModelKind = "hash-tags"
# Where a request's Mamba slot holds its data: queued or admitted here, a PD prefill sending it, a PD
# decode that committed the transfer. (A decode still receiving has a slot the landing has yet to fill.)
_HOLDING = frozenset(
    {ReqState.WAITING, ReqState.CHUNKED, ReqState.RUNNING, ReqState.INFLIGHT, ReqState.PREBUILT}
)


def with_data_tags(spec: EngineSpec) -> EngineSpec:
    """``spec`` on the tagged hash runner (unchanged when it runs another model); speculative decoding
    included: the tagged runner is also the verify forward. (The one combination these tags found wrong,
    the V1 Mamba tree under overlap with speculative decoding, is refused by ``EngineSpec``.)"""
    if spec.model != "hash":
        return spec
    return replace(spec, model=DATA_MODEL)


def with_data_tags_pd(spec: Any) -> Any:
    """A ``PDSpec`` with both instances on the tagged hash runner (unchanged for another model)."""
    return replace(spec, prefill=with_data_tags(spec.prefill), decode=with_data_tags(spec.decode))


def check_scheduler_data(sched: Any) -> None:
    """I-DATA-STATE and I-DATA-KV over one scheduler's tree, live requests and host copies (a no-op unless
    it runs the tagged hash runner)."""
    runner = sched.runner
    if not isinstance(runner, TaggingHashRunner):
        return
    owners: list[str] = []
    slots: list[int] = []
    tags: list[int] = []
    lengths: list[int] = []
    contexts: list[list[int]] = []
    pool = runner.mamba_pool

    def expect(owner: str, slot: int, tag_list: list[int], length: int) -> None:
        owners.append(owner)
        slots.append(slot)
        tags.append(tag_list[length])
        lengths.append(length)
        contexts.append(tag_list)

    kv_slots: list[int] = []
    kv_tags: list[int] = []
    kv_positions: list[int] = []
    kv_nodes: list[Any] = []
    if sched.tree is not None:
        for node, path_tags, depth in _tree_nodes(sched.tree, runner):
            mamba_value = getattr(node, "mamba_value", None)
            if pool is not None and mamba_value is not None:
                expect(f"tree {node!r}", int(mamba_value.reshape(-1)[0]), path_tags, depth)
            if runner.kv_buffer is not None and node.key:
                first = depth - len(node.key)
                kv_slots.extend(node.value.tolist())
                kv_tags.extend(path_tags[first + 1 : depth + 1])
                kv_positions.extend(range(first, depth))
                kv_nodes.extend([node] * len(node.key))
    if pool is not None:
        tracking = getattr(getattr(sched, "memory", None), "tracking", None)
        verifying = _in_flight_verifies(sched)
        for req in _holding(sched.live_requests()):
            length = _data_plane_length(sched, req, verifying)
            req_tags = runner.prefix_tags.tags(req.context_ids()[:length])
            if req.mamba_pool_idx is not None:
                expect(f"{req.owner!r} (working slot)", int(req.mamba_pool_idx.reshape(-1)[0]), req_tags, length)
            seqlen = req.mamba_last_track_seqlen
            pp = req.mamba_ping_pong_track_buffer
            if tracking is not None and seqlen is not None and pp is not None and pp.numel() == tracking.k:
                keep = other_track_idx(req.mamba_next_track_idx, tracking.k)  # not keep_idx: the oracle's own
                context = req.context_ids()
                if seqlen > len(context):
                    raise violation(
                        "I-DATA-STATE",
                        f"{req.owner!r}'s tracking slot (keep half {keep}, slot {int(pp[keep])}) is recorded at"
                        f" {seqlen} tokens, beyond the {len(context)} its data plane has: a state of tokens it"
                        " never kept",
                    )
                full = runner.prefix_tags.tags(context[:seqlen])
                expect(f"{req.owner!r} (tracking slot, keep half {keep})", int(pp[keep]), full, seqlen)
    _check_states(pool, owners, slots, tags, lengths, contexts)
    _check_tree_kv(runner, kv_slots, kv_tags, kv_positions, kv_nodes)
    for req in getattr(sched, "retracted_queue", ()):
        check_host_copy(req, runner)


def _in_flight_verifies(sched: Any) -> set[int]:
    """The ids of the requests in a launched speculative verify whose results are not processed yet."""
    return {id(r) for b in getattr(sched, "inflight", ()) if getattr(b, "spec", None) is not None for r in b.reqs}


def _data_plane_length(sched: Any, req: Any, verifying: set[int]) -> int:
    """The tokens a request's working state stands for: its committed length, except while a verify of it
    is in flight (overlap): that verify already moved the state to the accepted prefix, which the results
    commit later (``SpecDecoding.data_start``: every token of the data plane's context but the last)."""
    if id(req) in verifying:
        return int(sched.speculative.data_start(req))
    return int(req.kv_committed_len)


def _holding(reqs: Iterable[Any]) -> Iterable[Any]:
    return (r for r in reqs if r.state in _HOLDING)


def _tree_nodes(tree: Any, runner: TaggingHashRunner) -> Iterable[tuple[Any, list[int], int]]:
    """Every node with the tags of its whole path and its depth (root excluded)."""
    stack: list[tuple[Any, tuple[int, ...]]] = [(c, ()) for c in tree.root.children.values()]
    while stack:
        node, before = stack.pop()
        path = before + tuple(node.key)
        yield node, runner.prefix_tags.tags(path), len(path)
        stack.extend((c, path) for c in node.children.values())


def _check_states(
    pool: Any,
    owners: list[str],
    slots: list[int],
    tags: list[int],
    lengths: list[int],
    contexts: list[list[int]],
) -> None:
    bad = state_mismatches(pool, slots, tags, lengths) if pool is not None else []
    if bad:
        i = bad[0]
        raise violation(
            "I-DATA-STATE",
            lambda: (
                f"{owners[i]} should hold the state of its first {lengths[i]} tokens: "
                + describe_state(pool, slots[i], contexts[i])
            ),
        )


def _check_tree_kv(
    runner: TaggingHashRunner, slots: list[int], tags: list[int], positions: list[int], nodes: list[Any]
) -> None:
    if runner.kv_buffer is None:  # no KV data: nothing was collected to check
        return
    bad = kv_mismatches(runner.kv_buffer, slots, tags, positions)
    if not bad:
        return
    j = bad[0]
    kb, vb = runner.kv_buffer.k_buffer[0], runner.kv_buffer.v_buffer[0]
    raise violation(
        "I-DATA-KV",
        lambda: (
            f"tree {nodes[j]!r} names KV slot {slots[j]} for position {positions[j]}, which holds K"
            f" {kb[slots[j]].tolist()} V {vb[slots[j]].tolist()}, not the tag of the first {positions[j] + 1} tokens"
            " of its path"
        ),
    )


def check_host_copy(req: Any, runner: TaggingHashRunner) -> None:
    """I-DATA-STATE / I-DATA-KV on a retracted request's host copy: the state (both components, every
    layer) after ``length`` tokens, and the K/V of each of those positions when the copy keeps K/V."""
    copy = getattr(req, "host_copy", None)
    if copy is None:
        return
    tag_list = runner.prefix_tags.tags(req.context_ids()[: copy.length])
    if copy.conv is not None:
        lo, hi = encode(tag_list[copy.length], copy.length)
        for what, part, lead in (("conv", copy.conv, lo), ("temporal", copy.temporal, hi)):
            flat = part.reshape(part.shape[0], -1)
            want = torch.full_like(flat, float(copy.length))
            want[:, 0] = float(lead)
            if not torch.equal(flat, want):
                raise violation(
                    "I-DATA-STATE",
                    f"{req.owner!r}'s host copy of its {what} state holds {flat.tolist()}, not the state of its"
                    f" first {copy.length} tokens ({want.tolist()})",
                )
    if copy.k is not None and copy.length:
        want_k, want_v = kv_rows(tag_list[1 : copy.length + 1], list(range(copy.length)))
        want_k, want_v = want_k.to(copy.k.dtype), want_v.to(copy.v.dtype)
        if not (torch.equal(copy.k[0].cpu(), want_k) and torch.equal(copy.v[0].cpu(), want_v)):
            raise violation(
                "I-DATA-KV",
                lambda: (
                    f"{req.owner!r}'s host copy of its K/V does not hold the tags of its first {copy.length}"
                    " positions"
                ),
            )
