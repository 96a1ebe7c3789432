"""Bad input to the attach is an operating error: a typed InvalidArgument, and the SGLang objects are left
exactly as they were (no wrapper installed, no id moved)."""

from __future__ import annotations

import types
from typing import Any

import pytest

from kvledger.contracts.errors import InvalidArgument
from kvledger.engines.sglang import build
from kvledger.engines.sglang.attach import watch


def components(sgl: Any) -> dict[str, Any]:
    alloc = build.token_allocator(32, 4)
    rows = build.hybrid_req_pool(4, 4)
    return {"allocator": alloc, "rows": rows, "tree": build.radix_cache(alloc, build.req_pool(4))}


def instance_attrs(*objs: Any) -> list[set[str]]:
    return [set(vars(o)) for o in objs]


BAD_CALLS = {
    "nothing to watch": lambda c: {},
    "audit_each not a bool": lambda c: {"allocator": c["allocator"], "audit_each": "yes"},
    "allocator is a tree": lambda c: {"allocator": c["tree"]},
    "allocator is a plain object": lambda c: {"allocator": types.SimpleNamespace(alloc=1)},
    "tree is an allocator": lambda c: {"allocator": c["allocator"], "tree": c["allocator"]},
    "mamba_pool without Mamba slots": lambda c: {"mamba_pool": build.req_pool(4)},
    "req_pool is a tree": lambda c: {"req_pool": c["tree"]},
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_arguments_are_refused_and_nothing_is_wrapped(sgl: Any, case: str) -> None:
    c = components(sgl)
    before = instance_attrs(c["allocator"], c["rows"], c["tree"])
    free = c["allocator"].available_size()
    with pytest.raises(InvalidArgument, match=r"^watch: "):
        watch(**BAD_CALLS[case](c))
    assert instance_attrs(c["allocator"], c["rows"], c["tree"]) == before
    assert c["allocator"].available_size() == free


def test_a_second_watch_on_a_watched_object_is_refused_until_the_first_detaches(sgl: Any) -> None:
    c = components(sgl)
    first = watch(allocator=c["allocator"], tree=c["tree"])
    wrapped = instance_attrs(c["allocator"], c["tree"])
    with pytest.raises(InvalidArgument, match="already watched"):
        watch(allocator=c["allocator"])
    with pytest.raises(InvalidArgument, match="already watched"):
        watch(tree=c["tree"])
    assert instance_attrs(c["allocator"], c["tree"]) == wrapped  # the first watch is intact
    first.detach()
    watch(allocator=c["allocator"]).detach()


def test_attach_components_refuses_bad_arguments_and_a_kind_already_watched(sgl: Any) -> None:
    """The public step behind ``watch()``: the same checks, plus one component of each kind per watch (a
    second allocator would replace the first one's ledger while its wrappers still report to it)."""
    c = components(sgl)
    w = watch(allocator=c["allocator"])
    other = build.token_allocator(32, 4)
    wrapped = instance_attrs(c["allocator"], other, c["tree"])
    for bad in ({}, {"allocator": other}, {"tree": c["allocator"]}, {"allocator": other, "tree": c["tree"]}):
        with pytest.raises(InvalidArgument, match=r"^watch: "):
            w.attach_components(**bad)
    assert instance_attrs(c["allocator"], other, c["tree"]) == wrapped  # nothing wrapped by a refused call
    assert w.allocator is c["allocator"] and w.tree is None
    w.attach_components(tree=c["tree"])  # a kind not yet watched
    with pytest.raises(InvalidArgument, match="already watches a tree"):
        w.attach_components(tree=build.radix_cache(other, build.req_pool(4)))
    w.detach()


def test_a_bad_holder_key_is_refused(sgl: Any) -> None:
    c = components(sgl)
    w = watch(allocator=c["allocator"])
    for bad in (None, 1.5, ("r", 1), True):
        with pytest.raises(InvalidArgument, match=r"Watch\.holder"), w.holder(bad):
            pass
    with w.holder("r1"):
        ids = c["allocator"].alloc(4)
    assert w.kv is not None and w.kv.held_count(w._holders["r1"]) == 1
    with w.holder("r1"):
        c["allocator"].free(ids)
    w.audit()


@pytest.mark.parametrize(
    ("req", "key"),
    [(None, "r1"), (types.SimpleNamespace(rid="r1"), "r1"), (types.SimpleNamespace(req_pool_idx=None), 1.5)],
)
def test_track_refuses_a_non_request_or_a_bad_key_and_tracks_nothing(sgl: Any, req: Any, key: Any) -> None:
    w = watch(allocator=build.token_allocator(8))
    with pytest.raises(InvalidArgument, match=r"Watch\.(track|holder)"):
        w.track(req, key)
    assert w.check_handles() == 0  # nothing tracked
    w.detach()


def test_kvledgers_own_components_are_refused_and_left_as_they_were() -> None:
    """Issue 42: ``watch(allocator=<kvledger's own allocator>)`` was accepted from ``owners`` up."""
    from kvledger.reference.engine import EngineSpec, build_parts

    parts = build_parts(EngineSpec())
    own = {
        "allocator": parts.kv_allocator,
        "req_pool": parts.req_to_token_pool,
        "mamba_pool": parts.mamba_pool,
        "tree": parts.tree,
    }
    for name, obj in own.items():
        before, free = set(vars(obj)), parts.kv_allocator.available_size()
        with pytest.raises(InvalidArgument, match=rf"^watch: {name}=\w+ is kvledger's own"):
            watch(**{name: obj})
        assert set(vars(obj)) == before
        assert parts.kv_allocator.available_size() == free
