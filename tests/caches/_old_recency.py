"""The three Mamba-cache recency rules kvledger had before issue 16, re-enacted as scoped patches.

Each context manager puts one old rule back for the duration of the block by wrapping a private step of
``MambaRadixCache`` (outside the reference code, as the house rules ask for re-enacted bugs). The
rule tests and the differential test's meta-test use them to show that each rule is pinned down.

* ``old_split_rule``: a split moved the lower node's state to the most recent end of the state list.
* ``old_match_rule``: a match refreshed the state of every node on the matched path, not only the
  returned one (SGLang before PR #31643).
* ``old_insert_rule``: the insert walk refreshed the state of every existing node it passed, the end
  node included.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from kvledger.reference.radix import MambaRadixCache
from kvledger.reference.radix.tree_node import TreeNode


@contextmanager
def _wrapped(name: str, make: Callable[[Any], Any]) -> Iterator[None]:
    original = getattr(MambaRadixCache, name)
    setattr(MambaRadixCache, name, make(original))
    try:
        yield
    finally:
        setattr(MambaRadixCache, name, original)


def old_split_rule() -> AbstractContextManager[None]:
    def make(split: Any) -> Any:
        def _split(self: MambaRadixCache, child: TreeNode, m: int) -> TreeNode:
            upper = split(self, child, m)
            if child.mamba_value is not None:
                self._touch_state(child)
            return upper

        return _split

    return _wrapped("_split", make)


def old_match_rule() -> AbstractContextManager[None]:
    def make(touch_path: Any) -> Any:
        def _touch_path(self: MambaRadixCache, nodes: Sequence[TreeNode]) -> None:
            touch_path(self, nodes)
            for node in nodes:  # root to leaf, as the old per-node touch did
                if node.mamba_value is not None:
                    self._touch_state(node)

        return _touch_path

    return _wrapped("_touch_path", make)


def old_insert_rule() -> AbstractContextManager[None]:
    def make(apply_insert: Any) -> Any:
        def _apply_insert(self: MambaRadixCache, plan: Any) -> Any:
            for node, _ in plan.path:  # the walk's order; splits move no state, so the order is the same
                if node.mamba_value is not None:
                    self._touch_state(node)
            return apply_insert(self, plan)

        return _apply_insert

    return _wrapped("_apply_insert", make)


OLD_RULES: dict[str, Callable[[], AbstractContextManager[None]]] = {
    "split": old_split_rule,
    "match": old_match_rule,
    "insert": old_insert_rule,
}
