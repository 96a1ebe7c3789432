"""Scheduler-shaped operations on a :class:`~kvledger.engines.vllm.attach.WatchedHybrid`.

What vLLM's v1 ``Scheduler`` does with the KV cache manager, reduced to the calls that move blocks:
admit (prefix lookup, then one ``allocate_slots`` for the uncached tokens), decode (one token, one
``allocate_slots``), preempt (``free``, computed tokens back to 0, to the waiting queue), re-admit,
finish and abort (``free``). Each returns whether vLLM accepted it; the attach checks every call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvledger.engines.vllm.attach import WatchedHybrid


@dataclass
class HybridDriver:
    """Running and waiting requests over one watched manager, with a count model of the full group.

    Invariant (checked by :meth:`check_model`): each running request's full-attention list has
    ``ceil(num_computed_tokens / block_size)`` blocks; waiting and finished requests hold nothing.
    """

    watched: WatchedHybrid
    running: dict[str, Any] = field(default_factory=dict)
    waiting: dict[str, Any] = field(default_factory=dict)
    finished: list[str] = field(default_factory=list)
    serial: int = 0
    refused: int = 0
    hit_tokens: int = 0  # prefix-cache tokens reused by admissions (how much sharing a run saw)

    @property
    def block_size(self) -> int:
        return self.watched.built.layout.block_size

    @property
    def max_len(self) -> int:
        return self.watched.built.layout.max_model_len

    def arrive(self, prompt: list[int]) -> str:
        """A new request enters the waiting queue (nothing allocated yet)."""
        rid = f"r{self.serial}"
        self.serial += 1
        self.waiting[rid] = self.watched.built.new_request(rid, prompt, max_tokens=self.max_len)
        return rid

    def admit(self, rid: str) -> bool:
        """Prefix lookup and one allocation for the rest; refused (stays waiting) when the pool is short."""
        req = self.waiting[rid]
        self.watched.new_step()
        hit, n_hit = self.watched.get_computed_blocks(req)
        todo = req.num_tokens - n_hit
        if self.watched.allocate_slots(req, todo, n_hit, hit) is None:
            self.refused += 1
            return False
        req.num_computed_tokens = req.num_tokens
        self.hit_tokens += n_hit
        self.running[rid] = self.waiting.pop(rid)
        return True

    def decode(self, rid: str, token: int) -> bool:
        """One output token; when vLLM has no block for it the request is preempted, as the scheduler does."""
        req = self.running[rid]
        if req.num_tokens + 1 >= self.max_len:
            self.finish(rid)
            return False
        self.watched.new_step()
        req.append_output_token_ids(token)
        if self.watched.allocate_slots(req, 1) is None:
            self.preempt(rid)
            return False
        req.num_computed_tokens += 1
        return True

    def preempt(self, rid: str) -> None:
        """Free everything; the request keeps its tokens and waits to be re-admitted."""
        req = self.running.pop(rid)
        self.watched.free(req)
        req.num_computed_tokens = 0
        self.waiting[rid] = req

    def finish(self, rid: str) -> None:
        self.watched.free(self.running.pop(rid))
        self.finished.append(rid)

    def abort(self, rid: str) -> None:
        """Abort a running or a waiting request (vLLM frees both the same way)."""
        req = self.running.pop(rid, None) or self.waiting.pop(rid)
        self.watched.free(req)
        self.finished.append(rid)

    def check_model(self) -> None:
        """The count model: full-attention list lengths follow computed tokens; others hold nothing."""
        full = self.watched.built.single_type_managers[0].req_to_blocks
        for rid, req in self.running.items():
            want = -(-req.num_computed_tokens // self.block_size)
            got = len(full.get(rid, ()))
            assert got == want, f"{rid}: {got} full-attention blocks for {req.num_computed_tokens} tokens"
        for rid in [*self.waiting, *self.finished]:
            assert not full.get(rid), f"{rid} is not running but holds {len(full[rid])} blocks"
