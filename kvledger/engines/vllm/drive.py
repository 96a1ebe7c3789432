"""Scheduler-shaped operations on a :class:`~kvledger.engines.vllm.attach.WatchedHybrid`.

What vLLM's v1 ``Scheduler`` does with the KV cache manager, reduced to the calls that move blocks:
admit (prefix lookup, then one ``allocate_slots`` for the uncached tokens, or for the first chunk of
them), prefill (the next chunk), decode (one token, one ``allocate_slots``), preempt (``free``,
computed tokens back to 0, to the waiting queue), re-admit, finish and abort (``free``). Each returns
whether vLLM accepted it; the attach checks every call.

With ``async_depth`` > 0 the driver schedules as vLLM's async scheduler does: a step's tokens count as
computed when scheduled and stay in ``request.num_in_flight_tokens`` until ``async_depth`` later steps
of the request have been scheduled (its output has come back); the manager frees old state only up to
the processed (not in-flight) tokens.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from kvledger.engines.vllm.attach import WatchedHybrid


@dataclass
class HybridDriver:
    """Running and waiting requests over one watched manager, with a count model of the full group.

    Invariant (checked by :meth:`check_model`): each running request's full-attention list has
    ``ceil(num_computed_tokens / block_size)`` blocks; waiting and finished requests hold nothing;
    a request's in-flight tokens are the sum of its last ``async_depth`` scheduled steps.
    ``chunk`` caps the prompt tokens one step schedules (chunked prefill); None schedules the rest.
    """

    watched: WatchedHybrid
    chunk: int | None = None
    async_depth: int = 0
    in_flight: dict[str, deque[int]] = field(default_factory=dict)
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
        todo = self._next_chunk(req.num_tokens - n_hit)
        if self.watched.allocate_slots(req, todo, n_hit, hit) is None:
            self.refused += 1
            return False
        req.num_computed_tokens = n_hit + todo
        self.hit_tokens += n_hit
        self.running[rid] = self.waiting.pop(rid)
        self._scheduled(req, todo)
        return True

    def prefilling(self) -> list[str]:
        """Running requests whose prompt is not all scheduled yet (chunked prefill)."""
        return sorted(r for r, q in self.running.items() if q.num_computed_tokens < q.num_tokens)

    def prefill(self, rid: str) -> bool:
        """The next prompt chunk; no block for it means preemption, as for a decode."""
        req = self.running[rid]
        self.watched.new_step()
        todo = self._next_chunk(req.num_tokens - req.num_computed_tokens)
        if self.watched.allocate_slots(req, todo) is None:
            self.preempt(rid)
            return False
        req.num_computed_tokens += todo
        self._scheduled(req, todo)
        return True

    def _next_chunk(self, remaining: int) -> int:
        return remaining if self.chunk is None else min(self.chunk, remaining)

    def _scheduled(self, req: Any, tokens: int) -> None:
        """Count a scheduled step in flight; the steps beyond ``async_depth`` have come back."""
        steps = self.in_flight.setdefault(req.request_id, deque())
        steps.append(tokens)
        req.num_in_flight_tokens += tokens
        while len(steps) > self.async_depth:
            req.num_in_flight_tokens -= steps.popleft()

    def decode(self, rid: str, token: int) -> bool:
        """One output token; when vLLM has no block for it the request is preempted, as the scheduler does."""
        req = self.running[rid]
        if req.num_computed_tokens < req.num_tokens:
            return self.prefill(rid)  # the scheduler finishes a prompt before it decodes
        if req.num_tokens + 1 >= self.max_len:
            self.finish(rid)
            return False
        self.watched.new_step()
        req.append_output_token_ids(token)
        if self.watched.allocate_slots(req, 1) is None:
            self.preempt(rid)
            return False
        req.num_computed_tokens += 1
        self._scheduled(req, 1)
        return True

    def preempt(self, rid: str) -> None:
        """Free everything; the request keeps its tokens and waits to be re-admitted."""
        req = self.running.pop(rid)
        self.watched.free(req)
        self._drop_in_flight(req)
        req.num_computed_tokens = 0
        self.waiting[rid] = req

    def _drop_in_flight(self, req: Any) -> None:
        """A freed request's in-flight steps are discarded (their outputs are ignored)."""
        self.in_flight.pop(req.request_id, None)
        req.num_in_flight_tokens = 0

    def finish(self, rid: str) -> None:
        req = self.running.pop(rid)
        self.watched.free(req)
        self._drop_in_flight(req)
        self.finished.append(rid)

    def abort(self, rid: str) -> None:
        """Abort a running or a waiting request (vLLM frees both the same way)."""
        req = self.running.pop(rid, None) or self.waiting.pop(rid)
        self.watched.free(req)
        self._drop_in_flight(req)
        self.finished.append(rid)

    def check_model(self) -> None:
        """The count model: full-attention list lengths follow computed tokens; others hold nothing."""
        full = self.watched.built.single_type_managers[0].req_to_blocks
        for rid, req in self.running.items():
            want = -(-req.num_computed_tokens // self.block_size)
            got = len(full.get(rid, ()))
            assert got == want, f"{rid}: {got} full-attention blocks for {req.num_computed_tokens} tokens"
            steps = self.in_flight.get(rid, ())
            assert len(steps) <= self.async_depth and req.num_in_flight_tokens == sum(steps), rid
        for rid in [*self.waiting, *self.finished]:
            assert not full.get(rid), f"{rid} is not running but holds {len(full[rid])} blocks"
