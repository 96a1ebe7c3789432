"""The host tier (spec/hicache.md) under the shared-prefix workload, in two runs.

:class:`HostTierSpec` builds the engine of ``kvledger simulate --hicache``: the real scheduler over a
:class:`HiRadixCache` (its match loads host hits back), so the run's summary, timeline and per-step
identity cover both tiers.

:class:`HiCacheSim` is a cache-level run, where a load stays in flight across steps: requests of
:class:`~kvledger.sim.workload.GSPWorkload` arrive, match the device tree and then the host tier beyond it
(SGLang's ``host_hit_length``), load the host tail back (a transfer that takes ``delay`` steps and may fail),
compute the rest (tagged KV, as the tagging runner writes it), and insert; device memory is short, so device
eviction moves cached KV to the host (write-through or write-back), and host eviction makes room there. Every
step ends with the tree's audit, which runs the host tier's recounts (I-HOST-RESIDENCY, I-HOST-IDENTITY,
I-HOST-DATA); the timeline records both tiers.

Decode is not modelled there (the prompt is the request): it is the tier's own driver, for loads that
outlive a step (aborted or failed while in flight), which the scheduler's synchronous load-back has not.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field, replace

import torch

from kvledger import kernels
from kvledger.contracts import data_tags
from kvledger.contracts.errors import InvalidArgument
from kvledger.contracts.levels import CheckLevel
from kvledger.contracts.owners import REQ_RUNNING, Owner
from kvledger.reference.engine import EngineSpec, build_parts
from kvledger.reference.hicache import HostKVComponent, HostPool, LoadBack, PendingLoad, WritePolicy
from kvledger.reference.hicache import match_with_host as match_both
from kvledger.reference.hicache.hi_radix_cache import HiRadixCache
from kvledger.reference.hicache.load_back import FAILED, LANDED
from kvledger.reference.hicache.scheduler import HiCacheScheduler
from kvledger.reference.pools import TokenToKVPoolAllocator
from kvledger.reference.radix import RadixCache
from kvledger.reference.radix.results import LockRef
from kvledger.sim.workload import GSPWorkload

SMALL_WORKLOAD = GSPWorkload(num_groups=6, prompts_per_group=6, system_prompt_len=96, question_len=32)


@dataclass(frozen=True)
class HiCacheOptions:
    """The run: the workload, both tiers' sizes (tokens), the write policy, the transfer's delay (steps)
    and failure chance, the chance a waiting request is aborted while its load is in flight."""

    workload: GSPWorkload = field(default_factory=lambda: SMALL_WORKLOAD)
    device_tokens: int = 512
    host_tokens: int = 1024
    policy: str = "write_through"
    delay: int = 1
    fail_rate: float = 0.0
    abort_rate: float = 0.0
    seed: int = 0
    checks: CheckLevel = CheckLevel.LEDGER


@dataclass
class Waiting:
    rid: int
    prompt: list[int]
    owner: Owner
    lock: LockRef
    prefix: torch.Tensor
    load: PendingLoad


@dataclass
class HiCacheResult:
    steps: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    timeline: list[dict[str, int]] = field(default_factory=list)
    component: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict[str, object]:
        return {
            "steps": self.steps,
            **dict(self.counts),
            **{f"tier.{k}": v for k, v in self.component.items()},
        }


class HiCacheSim:
    """One run of the host tier (see the module docstring)."""

    def __init__(self, opts: HiCacheOptions) -> None:
        self.opts = opts
        self.rng = random.Random(opts.seed)
        self.kv = TokenToKVPoolAllocator(opts.device_tokens, checks=opts.checks)
        self.buffer = torch.zeros((1, opts.device_tokens + 1, 2), dtype=torch.float32)
        self.host = HostPool(opts.host_tokens, self.buffer, checks=opts.checks)
        self.comp = HostKVComponent(self.host, self.buffer, WritePolicy(opts.policy))
        self.tree = RadixCache(self.kv, components=[self.comp])
        self.loads = LoadBack(self.tree, self.comp, delay=opts.delay, fails=self._fails)
        self.waiting: list[Waiting] = []
        self.result = HiCacheResult()

    def _fails(self, load: PendingLoad) -> bool:
        return self.rng.random() < self.opts.fail_rate

    def run(self) -> HiCacheResult:
        arrivals = self.opts.workload.requests()
        per_step = self.opts.workload.arrivals_per_step
        while arrivals or self.waiting:
            self.result.steps += 1
            self._step([arrivals.pop(0) for _ in range(min(per_step, len(arrivals)))])
        self.result.component = dict(self.comp.stats)
        return self.result

    def _step(self, arrived: list[tuple[int, list[int], int]]) -> None:
        self.loads.poll()
        for w in list(self.waiting):
            self._progress(w)
        for rid, prompt, _ in arrived:
            self._arrive(rid, prompt)
        self.tree.audit()  # the host tier's recounts run inside (the component's audit)
        self._record()

    def _arrive(self, rid: int, prompt: list[int]) -> None:
        owner = Owner("req", rid, REQ_RUNNING)
        result, hit = match_both(self.tree, self.comp, prompt)
        lock = self.tree.inc_lock_ref(result.last_node)
        self.result.counts["requests"] += 1
        self.result.counts["device_hit_tokens"] += result.device_indices.numel()
        if hit.host_len and self._make_room(hit.host_len):
            ids = self.kv.alloc(hit.host_len, owner)
            assert ids is not None
            load = self.loads.start(prompt, hit, ids, owner)
            self.waiting.append(Waiting(rid, prompt, owner, lock, result.device_indices, load))
            self.result.counts["loads_started"] += 1
            return
        self._compute(prompt, owner, lock)

    def _progress(self, w: Waiting) -> None:
        if w.load.state == LANDED and self.rng.random() >= self.opts.abort_rate:
            self.loads.commit(w.load, w.prefix, w.prefix.numel())
            self.result.counts["loads_committed"] += 1
            self.result.counts["host_hit_tokens"] += w.load.hit.host_len
        elif w.load.state == FAILED:
            self.kv.free(w.load.device_ids, w.owner)
            self.result.counts["loads_failed"] += 1  # recomputed below
        elif self.rng.random() < self.opts.abort_rate:
            self.loads.abort(w.load)
            self.kv.free(w.load.device_ids, w.owner)
            self.tree.dec_lock_ref(w.lock)
            self.waiting.remove(w)
            self.result.counts["loads_aborted"] += 1
            return
        else:
            return  # still in flight
        self.waiting.remove(w)
        self._compute(w.prompt, w.owner, w.lock)

    def _make_room(self, tokens: int) -> bool:
        short = tokens - self.kv.available_size()
        if short > 0:
            self.tree.evict(short)
        return tokens <= self.kv.available_size()

    def _compute(self, prompt: list[int], owner: Owner, lock: LockRef) -> None:
        """Compute the tokens past the device match (their KV tagged) and cache the prompt."""
        self.tree.dec_lock_ref(lock)
        result = self.tree.match_prefix(prompt)
        lock = self.tree.inc_lock_ref(result.last_node)
        done = result.device_indices.numel()
        self.loads.check_readable(result.device_indices, f"the forward of {owner.kind}:{owner.key}")
        if not self._make_room(len(prompt) - done):
            self.tree.dec_lock_ref(lock)
            self.result.counts["refused"] += 1
            return
        ids = self.kv.alloc(len(prompt) - done, owner)
        assert ids is not None
        _tag(self.buffer, ids, prompt, done)
        self.result.counts["computed_tokens"] += len(prompt) - done
        self.tree.insert(prompt, torch.cat([result.device_indices, ids]), owner, done)
        self.tree.dec_lock_ref(lock)

    def _record(self) -> None:
        c, h = self.tree.counts, self.comp.counts
        self.result.timeline.append(
            {
                "step": self.result.steps,
                "device_free": self.kv.available_size(),
                "device_evictable": c.evictable,
                "device_protected": c.protected,
                "device_loading": sum(int(w.load.device_ids.numel()) for w in self.waiting),
                "host_free": self.host.available_size(),
                "host_evictable": h.evictable,
                "host_protected": h.protected,
                "loads_in_flight": len(self.loads.loads),
            }
        )


def _tag(buffer: torch.Tensor, ids: torch.Tensor, tokens: list[int], start: int) -> None:
    """The KV of position p holds the prefix tag through p (kvledger.contracts.data_tags), as the tagged
    runner writes it: a copy that lands in the wrong slot shows in I-HOST-DATA."""
    tags = data_tags.fold(tokens)[start : start + ids.numel()]
    values = [[float(t & data_tags.HALF_MASK), float(start + i + 1)] for i, t in enumerate(tags)]
    rows = torch.tensor(values, dtype=buffer.dtype).unsqueeze(1)  # [T, 1, 2]: store_kv's [T, H, D]
    kernels.store_kv(buffer.unsqueeze(2), buffer.unsqueeze(2), 0, ids, rows, rows)


# ---------------------------------------------------------------------------------- the scheduler's run
@dataclass(frozen=True)
class HostTierSpec:
    """The host tier of a scheduler run (``kvledger simulate --hicache``): host tokens (None: twice the
    device pool, SGLang's ``hicache_ratio``), write policy, transfer delay and failure chance."""

    host_tokens: int | None = None
    policy: str = "write_through"
    delay: int = 0
    fail_rate: float = 0.0
    seed: int = 0
    built: list[HiCacheScheduler] = field(default_factory=list, compare=False, repr=False)

    def build(self, spec: EngineSpec) -> HiCacheScheduler:
        self.built.append(self._build(spec))
        return self.built[-1]

    def report(self) -> dict[str, int]:
        """The last built engine's host-tier counts: loads (tokens loaded, failed, refused) and the
        component's (backups, device evictions kept on the host, adoptions, host evictions)."""
        if not self.built:
            return {}
        tree = self.built[-1].tree
        assert isinstance(tree, HiRadixCache)
        return {**{f"load_{k}": v for k, v in tree.load_stats.items()}, **tree.host.stats}

    def _build(self, spec: EngineSpec) -> HiCacheScheduler:
        """The engine of ``spec`` with a :class:`HiRadixCache` as its tree (a KV-only model at page size 1:
        typed error otherwise)."""
        if spec.hybrid or spec.page_size != 1 or spec.tree != "radix":
            raise InvalidArgument(
                "--hicache models the host tier of a KV-only engine: --no-mamba, --page-size 1"
            )
        parts = build_parts(replace(spec, tree="none"))
        kv = parts.kv_allocator
        buffer = parts.kv_buffer.k_buffer if parts.kv_buffer is not None else torch.zeros((1, kv.size + 1, 2))
        host = HostPool(self.host_tokens or 2 * kv.size, buffer, name="host_kv", checks=spec.checks)
        rng = random.Random(self.seed)
        tree = HiRadixCache(
            kv,
            host,
            buffer,
            policy=WritePolicy(self.policy),
            delay=self.delay,
            fails=(lambda load: rng.random() < self.fail_rate) if self.fail_rate else None,
        )
        return HiCacheScheduler(
            parts.config,
            kv_allocator=parts.kv_allocator,
            req_to_token_pool=parts.req_to_token_pool,
            mamba_pool=parts.mamba_pool,
            tree=tree,
            runner=parts.runner,
        )
