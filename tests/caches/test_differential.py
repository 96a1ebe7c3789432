"""Differential test: generated operation sequences through ``_rule_model.RuleModel`` and both caches.

One sequence of operations (keys written as page symbols, so the same sequence runs at page 1, 4 and
16) drives three things side by side: the rule model in plain mode with ``RadixCache``, and the rule model
in Mamba mode with ``MambaRadixCache``, on tiny pools so eviction runs all the time. Every result is
compared (matched ids, the returned node, copy-on-write results and the state they copied, insert's
``prefix_len`` and adoption, lock handles, eviction counts, allocation successes), and after every
operation every size (KV evictable/protected, states evictable/protected, both pools' free counts) and
the whole cache content (cached prefixes with their ids, states with their tags).

The meta-test puts each of the three old Mamba recency rules back (``_old_recency``) and asserts that
this test finds a divergence, with a short counterexample.

Mamba V2 (``extra_buffer``) runs the same sequences with the cache and the model on a branching grid of
two pages: every match also compares the branching point, and a served request caches only up to its
capture point (the branching point inside its extend, else the extend's last grid point), with a
tracking slot donated to the tree, the KV above it and its working slot going back to the pools.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from kvledger.contracts.errors import InvalidArgument
from kvledger.contracts.mamba_track import extend_track_seqlen
from kvledger.contracts.owners import Owner
from kvledger.reference.radix import LockRef, MambaRadixCache, RadixCache

from ._helpers import extract, make_allocator, make_mamba_pool, new_owner, path_tokens, read_tag, write_tag
from ._old_recency import OLD_RULES
from ._rule_model import ModelLock, RuleModel

PAGE_SIZES = (1, 4, 16)
Op = tuple[Any, ...]


class Divergence(AssertionError):
    """The cache and the rule model disagree; ``ops`` is the sequence up to the disagreeing operation."""

    def __init__(self, message: str, case: Case, index: int) -> None:
        self.ops = case.ops[: index + 1]
        self.case = Case(case.page, case.kv_pages, case.slots, self.ops, case.mamba, case.v2)
        listing = "\n".join(f"  {i}: {op}" for i, op in enumerate(self.ops))
        kind = ("Mamba V2" if case.v2 else "Mamba") if case.mamba else "plain"
        super().__init__(
            f"{message}\n  at op {index} of a {kind} cache, page {case.page},"
            f" {case.kv_pages} KV pages, {case.slots} state slots:\n{listing}"
        )


@dataclass(frozen=True)
class Case:
    page: int
    kv_pages: int
    slots: int
    ops: tuple[Op, ...]
    mamba: bool = True
    v2: bool = False  # Mamba V2: branching points, and serve caches only up to the capture point

    @property
    def chunk(self) -> int | None:
        """V2's branching and capture grid: two pages."""
        return 2 * self.page if self.v2 else None


# ---------------------------------------------------------------------- generated sequences
MAX_KEY_PAGES = 4
SESSION_PAGES = 8  # a session whose key would grow past this starts over


def _key(length_and_bits: tuple[int, int]) -> tuple[int, ...]:
    length, bits = length_and_bits
    return tuple((bits >> i) & 1 for i in range(length))


# Page symbols 0/1, lengths uniform in 1..4 (a plain list strategy would favour one-page keys, and the
# rules only show on paths with several nodes); shrinks towards (0,).
KEYS = st.tuples(st.integers(1, MAX_KEY_PAGES), st.integers(0, 2**MAX_KEY_PAGES - 1)).map(_key)


def _weighted(weight: int, strategy: st.SearchStrategy[Op]) -> list[st.SearchStrategy[Op]]:
    return [strategy] * weight


# Multi-turn sessions (``turn``: a session's previous key plus new pages, served) build the chains of
# states where the recency rules decide what is evicted; KV eviction is kept rarer than state eviction so
# states mostly leave through the state list. Measured on 300 derandomised cases (Mamba cache), the old
# split / match / insert rules diverge in about 54 % / 22 % / 51 % of them; before sessions, under 3 %.
OPS = st.one_of(
    *_weighted(4, st.tuples(st.just("match"), KEYS, st.booleans(), st.integers(0, 3))),
    *_weighted(3, st.tuples(st.just("serve"), KEYS, st.booleans())),
    *_weighted(6, st.tuples(st.just("turn"), st.integers(0, 2), KEYS, st.booleans())),
    *_weighted(2, st.tuples(st.just("insert"), KEYS, st.just(True))),
    st.tuples(st.just("insert"), KEYS, st.booleans()),  # without a state: refused where a leaf is needed
    *_weighted(2, st.tuples(st.just("lock"), KEYS)),
    *_weighted(2, st.tuples(st.just("unlock"), st.integers(0, 7))),
    st.tuples(st.just("evict"), st.integers(0, 6)),
    *_weighted(2, st.tuples(st.just("evict_states"), st.integers(0, 3))),
    st.tuples(st.just("hold"), st.integers(0, 3), st.integers(0, 1)),
    st.tuples(st.just("release"), st.integers(0, 7)),
    st.tuples(st.just("cow_held"), KEYS),
)
CASES = st.builds(
    Case,
    page=st.sampled_from(PAGE_SIZES),
    kv_pages=st.integers(24, 64),
    slots=st.integers(3, 8),
    ops=st.lists(OPS, min_size=60, max_size=150).map(tuple),
)


def tokens_of(symbols: Sequence[int], page: int) -> tuple[int, ...]:
    """Page symbols as tokens: at page > 1, pages 0 and 1 share all but their last token (so a match
    must compare whole pages)."""
    if page == 1:
        return tuple(symbols)
    return tuple(t for s in symbols for t in (s // 2,) * (page - 1) + (s % 2,))


# ---------------------------------------------------------------------- the runner
@dataclass
class Held:
    owner: Owner
    kv: torch.Tensor | None
    slots: list[torch.Tensor]


class Runner:
    """Applies a case to a cache and the rule model, comparing as it goes."""

    def __init__(self, case: Case) -> None:
        self.case = case
        self.page = case.page
        self.mamba = case.mamba
        self.alloc = make_allocator(case.page, case.kv_pages)
        self.pool = make_mamba_pool(case.slots)
        self.v2 = case.v2
        self.cache: Any = (
            MambaRadixCache(self.alloc, self.pool, mamba_cache_chunk_size=case.chunk)
            if self.mamba
            else RadixCache(self.alloc)
        )
        self.model = RuleModel(
            case.page,
            self.mamba,
            kv_free=self.alloc.available_size(),
            slots_free=self.pool.available_size(),
            chunk=case.chunk,
        )
        self.locks: list[tuple[LockRef, ModelLock]] = []
        self.held: list[Held] = []
        self.tags = iter(range(1, 10**6))
        self.sessions: dict[int, tuple[int, ...]] = {}  # session -> its key so far, in page symbols
        self.index = 0

    # ------------------------------------------------------------------ comparison
    def same(self, what: str, got: Any, want: Any) -> None:
        if got != want:
            raise Divergence(f"{what}: cache {got!r} != model {want!r}", self.case, self.index)

    def compare_state(self) -> None:
        c, m = self.cache, self.model
        self.same("evictable_size", c.evictable_size(), m.evictable())
        self.same("protected_size", c.protected_size(), m.protected())
        self.same("KV pool free", self.alloc.available_size(), m.kv_free)
        pages, states = extract(c, self.pool if self.mamba else None)
        self.same("cached prefixes", pages, m.ids)
        if self.mamba:
            self.same("mamba_evictable_size", c.mamba_evictable_size(), m.states_evictable())
            self.same("mamba_protected_size", c.mamba_protected_size(), m.states_protected())
            self.same("state pool free", self.pool.available_size(), m.slots_free)
            self.same("states", states, m.states())

    def run(self) -> None:
        for index, op in enumerate(self.case.ops):
            self.index = index
            getattr(self, "op_" + op[0])(*op[1:])
            self.compare_state()
        self.cache.audit()

    # ------------------------------------------------------------------ helpers
    def key(self, symbols: Sequence[int]) -> tuple[int, ...]:
        return tokens_of(symbols, self.page)

    def new_tag(self, slot: torch.Tensor) -> int:
        tag = next(self.tags)
        write_tag(self.pool, slot, tag)
        return tag

    def match(self, key: tuple[int, ...], *, cow_owner: Owner | None = None, cow_slot: Any = None) -> Any:
        """match_prefix on both; compares ids, the returned node and the copy-on-write result."""
        if self.mamba:
            got = self.cache.match_prefix(key, cow_owner=cow_owner, cow_slot=cow_slot)
        else:
            got = self.cache.match_prefix(key)
        want = self.model.match(key, cow=cow_owner is not None, into_held=cow_slot is not None)
        self.same("matched ids", got.device_indices.tolist(), want.ids)
        self.same("returned node", path_tokens(got.last_node), want.end)
        if self.mamba:
            copied = None if got.cow_slot is None else read_tag(self.pool, got.cow_slot)
            self.same("copy-on-write", copied, want.cow)
            self.same("branching point", got.mamba_branching_seqlen, want.branching)
        return got

    def evict_kv(self, tokens: int) -> None:
        self.same(f"evict({tokens})", self.cache.evict(tokens), self.model.evict_kv(tokens))

    def evict_states(self, count: int) -> None:
        self.same(f"evict_mamba({count})", self.cache.evict_mamba(count), self.model.evict_states(count))

    def take_kv(self, tokens: int, owner: Owner) -> torch.Tensor | None:
        """The scheduler's allocation: evict the shortfall, then allocate all or nothing."""
        short = tokens - self.alloc.available_size()
        if short > 0:
            self.evict_kv(short)
        kv = self.alloc.alloc(tokens, owner)
        self.same(f"alloc({tokens}) succeeded", kv is not None, self.model.take_kv(tokens))
        return kv

    def take_slot(self, owner: Owner) -> torch.Tensor | None:
        if not self.pool.available_size():
            self.evict_states(1)
        slot = self.pool.alloc(1, owner)
        self.same("state slot alloc succeeded", slot is not None, self.model.take_slot())
        return slot

    def give_back_slot(self, slot: torch.Tensor, owner: Owner) -> None:
        self.pool.free(slot, owner)
        self.model.slots_free += 1

    def give_back_kv(self, kv: torch.Tensor, owner: Owner) -> None:
        self.alloc.free(kv, owner)
        self.model.kv_free += kv.numel()

    def lock(self, node: Any, end: tuple[int, ...]) -> tuple[LockRef, ModelLock]:
        pair = (self.cache.inc_lock_ref(node), self.model.lock(end))
        self.same("lock took the state", pair[0].took_mamba, pair[1].took_state)
        return pair

    def unlock(self, pair: tuple[LockRef, ModelLock]) -> None:
        self.cache.dec_lock_ref(pair[0])
        self.model.unlock(pair[1])

    def insert(
        self,
        key: tuple[int, ...],
        value: torch.Tensor,
        owner: Owner,
        protected: int,
        slot: Any,
        op: str = "insert",
    ) -> None:
        """Insert on both; a state the tree did not adopt goes back to the pool (the caller's duty)."""
        tag = None if slot is None else read_tag(self.pool, slot)
        try:
            want = self.model.insert(key, value.tolist(), protected, tag if self.mamba else None)
        except ValueError:
            want = None
        try:
            if self.mamba:
                res = self.cache.insert(
                    key, value, owner, mamba_slot=slot, protected_len=protected, state_op=op
                )
                got = (res.prefix_len, res.mamba_adopted)
            else:
                got = (self.cache.insert(key, value, owner, protected_len=protected), False)
        except InvalidArgument:
            got = None
        self.same(f"insert({key})", got, want)
        if got is None:  # refused, nothing changed: the caller still holds everything
            self.give_back_kv(value[protected:], owner)
        if slot is not None and not (got is not None and got[1]):
            self.give_back_slot(slot, owner)

    # ------------------------------------------------------------------ operations
    def op_match(self, symbols: Sequence[int], cow: bool, tail: int) -> None:
        key = self.key(symbols) + (0,) * min(tail, self.page - 1)  # an unaligned tail is ignored
        owner = new_owner()
        got = self.match(key, cow_owner=owner if cow else None)
        if self.mamba and got.cow_slot is not None:
            self.give_back_slot(got.cow_slot, owner)

    def op_lock(self, symbols: Sequence[int]) -> None:
        got = self.match(self.key(symbols))
        self.locks.append(self.lock(got.last_node, path_tokens(got.last_node)))

    def op_unlock(self, i: int) -> None:
        if self.locks:
            self.unlock(self.locks.pop(i % len(self.locks)))

    def op_evict(self, pages: int) -> None:
        self.evict_kv(pages * self.page)

    def op_evict_states(self, count: int) -> None:
        if self.mamba:
            self.evict_states(count)

    def op_hold(self, kv_pages: int, slots: int) -> None:
        """Another holder takes KV and state slots (as a running request would), squeezing the cache."""
        owner = new_owner()
        kv = self.take_kv(kv_pages * self.page, owner) if kv_pages else None
        taken = []
        for _ in range(slots if self.mamba else 0):
            slot = self.take_slot(owner)
            if slot is not None:
                taken.append(slot)
        self.held.append(Held(owner, kv, taken))

    def op_release(self, i: int) -> None:
        if self.held:
            held = self.held.pop(i % len(self.held))
            if held.kv is not None:
                self.give_back_kv(held.kv, held.owner)
            for slot in held.slots:
                self.give_back_slot(slot, held.owner)

    def op_insert(self, symbols: Sequence[int], with_state: bool) -> None:
        """A request that matched nothing inserts its whole key (with or without a state)."""
        key, owner = self.key(symbols), new_owner()
        slot = self.take_slot(owner) if self.mamba and with_state else None
        if self.mamba and with_state and slot is None:
            return
        if slot is not None:
            self.new_tag(slot)
        kv = self.take_kv(len(key), owner)
        if kv is None:
            if slot is not None:
                self.give_back_slot(slot, owner)
            return
        self.insert(key, kv, owner, 0, slot)

    def op_serve(self, symbols: Sequence[int], cow: bool) -> None:
        """match (copy-on-write) -> lock -> alloc the rest -> insert with the locked prefix -> unlock."""
        if self.v2:
            self.serve_v2(self.key(symbols), cow)
            return
        key, owner = self.key(symbols), new_owner()
        got = self.match(key, cow_owner=owner if cow else None)
        pair = self.lock(got.last_node, path_tokens(got.last_node))
        cached = got.device_indices.numel()
        working = got.cow_slot if self.mamba else None
        if self.mamba and working is None:
            working = self.take_slot(owner)
            if working is None:
                self.unlock(pair)
                return
        if working is not None:
            self.new_tag(working)
        kv = self.take_kv(len(key) - cached, owner)
        if kv is None:
            if working is not None:
                self.give_back_slot(working, owner)
            self.unlock(pair)
            return
        self.insert(key, torch.cat((got.device_indices, kv)), owner, cached, working)
        self.unlock(pair)

    def serve_v2(self, key: tuple[int, ...], cow: bool) -> None:
        """V2: match (copy-on-write) -> lock -> alloc the rest; the forward captures at the branching point
        inside the extend (else the last grid point) into a tracking slot, which is donated with
        ``tokens[:capture]``; the KV above the capture and the working slot go back; unlock."""
        owner = new_owner()
        got = self.match(key, cow_owner=owner if cow else None)
        pair = self.lock(got.last_node, path_tokens(got.last_node))
        cached = got.device_indices.numel()
        working = got.cow_slot if got.cow_slot is not None else self.take_slot(owner)
        kv = None if working is None else self.take_kv(len(key) - cached, owner)
        tracked = None if kv is None else self.take_slot(owner)
        if tracked is None:  # short of a slot or of KV: nothing is admitted, everything goes back
            if kv is not None:
                self.give_back_kv(kv, owner)
            if working is not None:
                self.give_back_slot(working, owner)
            self.unlock(pair)
            return
        assert self.case.chunk is not None
        capture = extend_track_seqlen(cached, len(key) - cached, self.case.chunk, got.mamba_branching_seqlen)
        value = torch.cat((got.device_indices, kv))
        if capture is None:  # nothing captured: nothing inserted (no ghost node, B16)
            self.give_back_slot(tracked, owner)
        else:
            self.new_tag(tracked)
            self.insert(key[:capture], value[:capture], owner, cached, tracked, op="donate")
        above = value[capture if capture is not None else cached :]
        if above.numel():
            self.give_back_kv(above, owner)
        self.give_back_slot(working, owner)
        self.unlock(pair)

    def op_turn(self, session: int, symbols: Sequence[int], cow: bool) -> None:
        """The next turn of a multi-turn session: its previous key plus new pages, served."""
        key = self.sessions.get(session, ()) + tuple(symbols)
        if len(key) > SESSION_PAGES:
            key = tuple(symbols)
        self.sessions[session] = key
        self.op_serve(key, cow)

    def op_cow_held(self, symbols: Sequence[int]) -> None:
        """A waiting request re-matches into the slot it kept from an earlier round."""
        holders = [h for h in self.held if h.slots]
        if not self.mamba or not holders:
            return
        holder = holders[0]
        self.match(self.key(symbols), cow_owner=holder.owner, cow_slot=holder.slots[0])


def run_case(case: Case) -> None:
    """Run ``case`` through the plain cache and the Mamba cache, each beside the rule model."""
    for mamba in (False, True):
        Runner(Case(case.page, case.kv_pages, case.slots, case.ops, mamba)).run()


@settings(database=None)
@given(case=CASES)
def test_caches_agree_with_the_rule_model(case: Case) -> None:
    run_case(case)


@settings(database=None)
@given(case=CASES)
def test_mamba_v2_cache_agrees_with_the_rule_model(case: Case) -> None:
    """The same sequences through the Mamba cache in V2 (branching points, capture-point serves)."""
    Runner(Case(case.page, case.kv_pages, case.slots, case.ops, True, True)).run()


LONG_CASES = st.builds(
    Case,
    page=st.sampled_from(PAGE_SIZES),
    kv_pages=st.integers(8, 64),
    slots=st.integers(2, 8),
    ops=st.lists(OPS, min_size=200, max_size=600).map(tuple),
)


@pytest.mark.deep
@settings(max_examples=500, deadline=None, derandomize=False, database=None, print_blob=True)
@given(case=LONG_CASES)
def test_caches_agree_with_the_rule_model_long(case: Case) -> None:
    """Nightly: longer sequences, tighter pools (issue 16's external run used 1,000 operations)."""
    run_case(case)


@pytest.mark.deep
@settings(max_examples=300, deadline=None, derandomize=False, database=None, print_blob=True)
@given(case=LONG_CASES)
def test_mamba_v2_cache_agrees_with_the_rule_model_long(case: Case) -> None:
    """Nightly: the V2 run on the long sequences."""
    Runner(Case(case.page, case.kv_pages, case.slots, case.ops, True, True)).run()


# ---------------------------------------------------------------------- regression cases
def test_issue_16_minimal_case_through_the_differential_runner() -> None:
    """Issue 16's minimal divergent sequence as operations (page 1: symbols are tokens)."""
    ops = (
        ("insert", (1, 3, 1), True),
        ("insert", (1, 2), True),
        ("serve", (1, 3, 1, 3), True),
        ("match", (1, 3), False, 0),
        ("evict_states", 2),
    )
    run_case(Case(page=1, kv_pages=64, slots=12, ops=ops))


# ---------------------------------------------------------------------- meta-test
MAX_COUNTEREXAMPLE = 12


def first_divergence() -> Divergence | None:
    """The differential test's search (same cases, same property), stopping at the first divergence.

    Generation only: Hypothesis's own shrinker needs minutes on sequences this long, so the meta-test
    shrinks with :func:`shrink` instead.
    """
    found: list[Divergence] = []

    # Its own budget, not the profile's: it stops at the first divergence, so a generous one costs nothing
    # when the rule is noticed, and ``dev``'s 40 random examples (small ones first) missed the match rule.
    @settings(
        database=None, max_examples=400, phases=(Phase.generate,), suppress_health_check=list(HealthCheck)
    )
    @given(case=CASES)
    def search(case: Case) -> None:
        try:
            run_case(case)
        except Divergence as exc:
            found.append(exc)
            raise

    try:
        search()
    except Divergence:
        return found[0]
    return None


def _diverges(case: Case) -> Divergence | None:
    try:
        Runner(case).run()
    except Divergence as exc:
        return exc
    return None


def _without_sessions(ops: Sequence[Op]) -> tuple[Op, ...]:
    """The same operations with each ``turn`` written as the ``serve`` of the key it served, so that
    deleting an earlier turn does not change what a later one does."""
    sessions: dict[int, tuple[int, ...]] = {}
    out: list[Op] = []
    for op in ops:
        if op[0] == "turn":
            _, session, symbols, cow = op
            key = sessions.get(session, ()) + tuple(symbols)
            sessions[session] = key if len(key) <= SESSION_PAGES else tuple(symbols)
            op = ("serve", sessions[session], cow)
        out.append(op)
    return tuple(out)


def _delete_ops(case: Case) -> Case:
    """Greedy deletion to a fixpoint: drop any operation, or pair of neighbours, the divergence does not
    need (each try is one run; a success also cuts the sequence at its new point of divergence)."""
    for width in (2, 1, 2, 1):
        progress = True
        while progress:
            progress = False
            for i in reversed(range(len(case.ops) - width + 1)):
                ops = case.ops[:i] + case.ops[i + width :]
                smaller = _diverges(Case(case.page, case.kv_pages, case.slots, ops, case.mamba))
                if smaller is not None:
                    case, progress = smaller.case, True
                    break
    return case


def shrink(found: Divergence) -> Case:
    """A short counterexample: sessions unrolled, operations deleted, then a smaller state pool tried
    (fewer operations fill it) and deletion repeated, as long as the sequence gets shorter."""
    case = found.case
    case = _delete_ops(Case(case.page, case.kv_pages, case.slots, _without_sessions(case.ops), case.mamba))
    for slots in range(2, case.slots):
        smaller = _diverges(Case(case.page, case.kv_pages, slots, case.ops, case.mamba))
        if smaller is not None:
            candidate = _delete_ops(smaller.case)
            if len(candidate.ops) < len(case.ops):
                case = candidate
            break
    return case


@pytest.mark.parametrize("rule", sorted(OLD_RULES))
def test_each_old_recency_rule_is_found_with_a_short_counterexample(
    rule: str, request: pytest.FixtureRequest
) -> None:
    """Put one old rule back: the differential search must find a divergence that shrinks to a few ops.

    The counterexample goes into the test's report properties (``--junitxml``), not onto the terminal:
    printed in a quiet run, an expected counterexample reads like a failure."""
    with OLD_RULES[rule]():
        found = first_divergence()
        assert found is not None, f"the differential test does not notice the old {rule} rule"
        small = shrink(found)
        again = _diverges(small)
    assert again is not None and again.case == small
    assert _diverges(small) is None, "the shrunk counterexample diverges without the old rule too"
    request.node.user_properties.append(("counterexample", f"{again.args[0].splitlines()[0]}; {small}"))
    assert len(small.ops) <= MAX_COUNTEREXAMPLE, f"the counterexample did not shrink: {small}"


def _rule_tests() -> dict[str, list[Callable[[], None]]]:
    from . import test_mamba_radix_cache as unit

    return {
        "split": [unit.test_r1_a_split_leaves_the_state_list_alone],
        "match": [unit.test_r2_a_match_refreshes_only_the_state_it_returns],
        "insert": [
            unit.test_r3_the_insert_walk_refreshes_no_state,
            unit.test_r3_a_repeated_insert_refreshes_the_kv_but_not_the_existing_state,
        ],
    }


@pytest.mark.parametrize("rule", sorted(OLD_RULES))
def test_each_rule_test_fails_with_its_old_rule_put_back(rule: str) -> None:
    for test in _rule_tests()[rule]:
        with OLD_RULES[rule](), pytest.raises(AssertionError):
            test()
        test()  # and passes again once the patch is gone


# ---------------------------------------------------------------------- meta-test: V2
def _first_v2_divergence() -> Divergence | None:
    found: list[Divergence] = []

    # Its own budget, not the profile's: it stops at the first divergence, so a generous one costs nothing
    # when the rule is noticed, and ``dev``'s 40 random examples (small ones first) missed the match rule.
    @settings(
        database=None, max_examples=400, phases=(Phase.generate,), suppress_health_check=list(HealthCheck)
    )
    @given(case=CASES)
    def search(case: Case) -> None:
        try:
            Runner(Case(case.page, case.kv_pages, case.slots, case.ops, True, True)).run()
        except Divergence as exc:
            found.append(exc)
            raise

    try:
        search()
    except Divergence:
        return found[0]
    return None


def test_a_wrong_branching_rule_is_found_by_the_v2_differential(monkeypatch: pytest.MonkeyPatch) -> None:
    """Round the deepest state's length instead of the matched length: on the grid (no contract fires),
    but wrong, and the V2 differential run notices."""
    import kvledger.reference.radix.mamba_component as mamba_module  # the V2 policy computes it

    monkeypatch.setattr(
        mamba_module, "branching_seqlen", lambda matched, state, chunk: (state // chunk * chunk) or None
    )
    found = _first_v2_divergence()
    assert found is not None and "branching point" in str(found), found
