"""The protocols of ``kvledger.contracts.protocols``: kvledger's components satisfy them (mypy checks this
file in ``scripts/test.sh``), and another implementation behind an adapter gets the same checks."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from kvledger.contracts import switch
from kvledger.contracts.errors import ContractViolation, DoubleFree
from kvledger.contracts.ledger_by_level import AnyLedger, make_ledger
from kvledger.contracts.owners import FREE_LIST, Owner
from kvledger.contracts.protocols import (
    KVAllocator,
    MambaPrefixCache,
    MambaStatePool,
    PagedKVAllocator,
    PrefixCache,
    ReqRowPool,
)
from kvledger.reference.pools import (
    MambaPool,
    PagedTokenToKVPoolAllocator,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)
from kvledger.reference.radix import MambaRadixCache, RadixCache
from kvledger.reference.scheduler import Scheduler, SchedulerConfig

needs_contracts = pytest.mark.skipif(not switch.ENABLED, reason="contracts are off (KVLEDGER_CONTRACTS=0)")


def test_the_reference_components_satisfy_the_protocols() -> None:
    """Statically (mypy reads these annotations) and at run time (the attributes are there)."""
    kv: KVAllocator = TokenToKVPoolAllocator(16)
    paged: PagedKVAllocator = PagedTokenToKVPoolAllocator(16, 4)
    rows: ReqRowPool = ReqToTokenPool(2, 8)
    mamba: MambaStatePool = MambaPool(4, num_layers=1, conv_state_shape=(2,), temporal_state_shape=(2,))
    cache: PrefixCache = RadixCache(kv)
    mamba_cache: MambaPrefixCache = MambaRadixCache(kv, mamba)
    for obj, proto in [
        (kv, KVAllocator),
        (paged, PagedKVAllocator),
        (rows, ReqRowPool),
        (mamba, MambaStatePool),
        (cache, PrefixCache),
        (mamba_cache, MambaPrefixCache),
    ]:
        members = {
            m for c in proto.__mro__ if c.__name__ != "Protocol" for m in vars(c) if not m.startswith("__")
        }
        members -= {"_is_protocol", "_is_runtime_protocol", "_abc_impl"}
        assert members and all(hasattr(obj, m) for m in members), (type(obj).__name__, proto.__name__)


class ListAllocator:
    """Another engine's token allocator, as an adapter: a Python list, its own rules, kvledger's ledger.

    ``lose_every`` simulates that engine's bug: every n-th free is recorded in the ledger but the id never
    reaches the list again.
    """

    page_size = 1

    def __init__(self, size: int, lose_every: int = 0) -> None:
        self.size = size
        self.device = torch.device("cpu")
        self.ledger: AnyLedger = make_ledger("kv", range(1, size + 1), level=switch.LEVEL)
        self._free = list(range(1, size + 1))
        self._frees = 0
        self.lose_every = lose_every

    def available_size(self) -> int:
        return len(self._free)

    def pending_free_size(self) -> int:
        return 0

    def free_ids(self) -> list[int]:
        return list(self._free)

    def alloc(self, n: int, owner: Owner) -> torch.Tensor | None:
        if n > len(self._free):
            return None
        ids, self._free = self._free[:n], self._free[n:]
        self.ledger.transfer(ids, FREE_LIST, owner, "alloc")
        return torch.tensor(ids, dtype=torch.int64)

    def alloc_decode(
        self, seq_lens: Sequence[int], last_loc: Sequence[int], owners: Sequence[Owner]
    ) -> torch.Tensor | None:
        if len(owners) > len(self._free):
            return None
        ids, self._free = self._free[: len(owners)], self._free[len(owners) :]
        self.ledger.transfer_each(ids, FREE_LIST, owners, "alloc_decode")
        return torch.tensor(ids, dtype=torch.int64)

    def free(self, ids: Any, owner: Owner) -> None:
        ids = [int(i) for i in torch.as_tensor(ids).reshape(-1).tolist()]
        if any(i in self._free for i in ids):
            raise DoubleFree(f"[kv] {ids} already free")
        self.ledger.transfer(ids, owner, FREE_LIST, "free")
        self._frees += 1
        if self.lose_every and self._frees % self.lose_every == 0:
            return  # the bug
        self._free += ids

    def _free_unchecked(self, ids: torch.Tensor, owner: Owner, op: str = "free") -> None:
        self.free(ids, owner)

    def audit(self) -> None:
        self.ledger.audit(self._free)


def _run(allocator: ListAllocator) -> Scheduler:
    config = SchedulerConfig(
        max_running_requests=2, max_prefill_tokens=64, chunked_prefill_size=None, max_context_len=64
    )
    sched = Scheduler(config, kv_allocator=allocator, req_to_token_pool=ReqToTokenPool(3, 64))
    for rid in range(4):
        sched.add_request(rid, [1, 2, 3, rid], 3)
    sched.run_until_idle(200)
    return sched


def test_an_adapter_runs_under_the_same_checks() -> None:
    sched = _run(ListAllocator(64))
    assert sched.stats.finished == 4
    if switch.ENABLED:
        assert sched.stats.busy_checks > 0 and sched.stats.idle_checks > 0  # identities and audits ran on it


@needs_contracts
@pytest.mark.fires("I-COUNT")
def test_a_bug_in_the_adapter_is_named_by_id() -> None:
    with pytest.raises(ContractViolation) as info:
        _run(ListAllocator(64, lose_every=2))
    message = str(info.value)
    assert re.match(r"I-COUNT: \d+ tokens unaccounted \(leak\)", message), message
    assert re.search(
        r"leaked \[[\d, ]+\].*: ledger owner free_list\[free\]; the bookkeeping says no holder", message
    ), message
