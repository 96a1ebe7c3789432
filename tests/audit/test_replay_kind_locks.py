"""The replay keeps a node's component lock counts per owner kind (issue 36); its messages still name the
Mamba state's count ``mamba_lock_ref``, as before, so the recorded logs and their reports are unchanged."""

from __future__ import annotations

from kvledger.audit import events as E
from kvledger.audit.replay import _Node


def test_a_node_describes_its_locks_with_the_trees_names() -> None:
    node = _Node(3, None)
    assert node.describe_locks() == "lock_ref 0, mamba_lock_ref 0"
    assert not node.locked()
    node.kind_locks[E.STATE_KIND] = 2
    node.lock_ref = 1
    assert node.locked() and node.locks_of(E.STATE_KIND) == 2
    assert node.describe_locks() == "lock_ref 1, mamba_lock_ref 2"
    node.lock_ref = 0
    node.kind_locks[E.STATE_KIND] = 0
    assert not node.locked()
