"""Tree components by pool kind (issue 36 item 2): the registry, what a cache says it caches, the Mamba
component reached by its kind, and a tree built with a component that refuses to keep some leaves."""

from __future__ import annotations

import pytest

from kvledger.contracts.errors import InvalidArgument
from kvledger.reference.radix import RadixCache, TreeNode
from kvledger.reference.radix.component import TreeComponent, component_class, register_component
from kvledger.reference.radix.full_component import FullComponent
from kvledger.reference.radix.mamba_component import ExtraBuffer, MambaComponent, NoBuffer

from ._helpers import insert_fresh, make_allocator, make_mamba, make_plain, new_owner


def test_the_registry_maps_each_kind_to_its_component() -> None:
    assert component_class("kv") is FullComponent and component_class("mamba") is MambaComponent
    with pytest.raises(InvalidArgument, match="no tree component for pool kind 'nope'"):
        component_class("nope")

    class Impostor(TreeComponent):
        kind = "mamba"

    with pytest.raises(InvalidArgument, match="already has the tree component MambaComponent"):
        register_component(Impostor)
    assert component_class("mamba") is MambaComponent  # the refused registration changed nothing


def test_a_cache_says_which_kinds_it_caches() -> None:
    plain, mamba = make_plain(), make_mamba()
    assert plain.cached_kinds() == ("kv",) and mamba.cached_kinds() == ("kv", "mamba")
    assert isinstance(mamba.component("mamba"), MambaComponent)
    with pytest.raises(InvalidArgument, match="not 'mamba'"):
        plain.component("mamba")
    assert isinstance(mamba.mamba.policy, NoBuffer)
    with pytest.raises(InvalidArgument, match="components must be TreeComponents"):
        RadixCache(make_allocator(1, 16, None), components=[object()])  # type: ignore[list-item]


def test_the_mamba_components_eviction_is_the_trees() -> None:
    cache = make_mamba()
    insert_fresh(cache, [1, 2, 3])
    insert_fresh(cache, [1, 2, 3, 4, 5])
    comp = cache.component("mamba")
    assert cache.counts.of("mamba").evictable == 2 == cache.mamba_evictable_size()
    assert comp.evict_component(1) == 1  # the oldest state: node (1, 2, 3) becomes a tombstone
    assert cache.mamba_evictable_size() == 1 and cache.total_size() == 5
    cache.audit()


def test_the_v2_policy_checks_its_grid() -> None:
    with pytest.raises(InvalidArgument, match="positive multiple of the page size 4"):
        ExtraBuffer(6, 4, "t")
    assert ExtraBuffer(8, 4, "t").branching(20, 4) == 16


class EvenOnly(TreeComponent):
    """A kind held by nodes whose key starts with an even token; a leaf without it may not stay."""

    kind = "even_only_test"

    def keeps_leaf(self, node: TreeNode) -> bool:
        return node.key[0] % 2 == 0

    def match_len(self, nodes: list[TreeNode]) -> int:  # type: ignore[override]
        n = len(nodes)
        while n and nodes[n - 1].key[0] % 2:
            n -= 1
        return n


def test_a_plain_tree_with_a_component_matches_and_prunes_by_it() -> None:
    cache = RadixCache(make_allocator(1, 32, None), components=[EvenOnly()])
    assert cache.cached_kinds() == ("kv", "even_only_test")
    owner = new_owner()
    kv = cache.token_to_kv_pool_allocator.alloc(4, owner)
    assert kv is not None
    cache.insert([2, 4, 5, 7], kv, owner)
    cache.insert([2, 4, 6], cache.token_to_kv_pool_allocator.alloc(3, owner), owner)  # type: ignore[arg-type]
    # (2, 4) | (5, 7) and (6): a match of the odd branch stops where the component can serve it
    assert len(cache.match_prefix([2, 4, 5, 7])) == 2
    lock = cache.inc_lock_ref(cache.match_prefix([2, 4, 6]).last_node)
    assert lock.took == frozenset()  # EvenOnly takes no lock of its own
    cache.dec_lock_ref(lock)
    assert cache.evict(1) >= 1
    cache.audit()
