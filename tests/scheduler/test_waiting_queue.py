"""The waiting queue answers ``req in queue`` from a count (issue 38: ``_leave_queues`` scanned the queue).

``WaitingQueue`` must stay the list it replaces: the same entries in the same order after every list
operation, and the same membership answer as the list's own (identity or ``==``), for plain requests and
for objects with their own ``__eq__`` (the list's scan). A Hypothesis run drives both side by side. The
scheduler keeps one from construction and through an admission rollback (which rebuilds the queue), so a
finished request's ``_leave_queues`` does not scan the waiting requests.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from kvledger.reference.scheduler.queues import WaitingQueue
from tests.scheduler.harness import Setup, build


class _Plain:
    """Compares by identity, as ``Req`` (a ``dataclass(eq=False)``)."""


@dataclasses.dataclass
class _Valued:
    """Compares by value: two distinct objects may be ``==`` (the list's scan answers for these)."""

    v: int


POOL: list[object] = [_Plain() for _ in range(5)] + [_Valued(1), _Valued(1), _Valued(2)]

_index = st.integers(-6, 6)
_obj = st.sampled_from(range(len(POOL))).map(POOL.__getitem__)
_ops = st.one_of(
    st.tuples(st.just("append"), _obj),
    st.tuples(st.just("extend"), st.lists(_obj, max_size=4)),
    st.tuples(st.just("iadd"), st.lists(_obj, max_size=3)),
    st.tuples(st.just("insert"), _index, _obj),
    st.tuples(st.just("remove"), _obj),
    st.tuples(st.just("pop"), _index),
    st.tuples(st.just("setitem"), _index, _obj),
    st.tuples(st.just("setslice"), _index, _index, st.lists(_obj, max_size=4)),
    st.tuples(st.just("delitem"), _index),
    st.tuples(st.just("delslice"), _index, _index),
    st.tuples(st.just("imul"), st.integers(0, 2)),
    st.tuples(st.just("reverse")),
    st.tuples(st.just("sort")),
    st.tuples(st.just("clear")),
    st.tuples(st.just("copy")),
)


def _apply(q: list[object], op: tuple) -> list[object]:  # type: ignore[type-arg]
    name, *args = op
    if name == "iadd":
        q += args[0]
    elif name == "imul":
        q *= args[0]
    elif name == "setitem":
        q[args[0]] = args[1]
    elif name == "setslice":
        q[args[0] : args[1]] = args[2]
    elif name == "delitem":
        del q[args[0]]
    elif name == "delslice":
        del q[args[0] : args[1]]
    elif name == "sort":
        q.sort(key=id)
    elif name == "copy":
        return q  # copies are checked separately (below)
    else:
        getattr(q, name)(*args)
    return q


def _outcome(q: list[object], op: tuple) -> tuple[str, list[object]]:  # type: ignore[type-arg]
    try:
        q = _apply(q, op)
    except (IndexError, ValueError) as exc:
        return type(exc).__name__, q
    return "ok", q


@given(st.lists(_ops, max_size=30))
def test_the_waiting_queue_is_the_list_it_replaces(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    plain: list[object] = []
    queue: list[object] = WaitingQueue()
    for op in ops:
        got_plain, plain = _outcome(plain, op)
        got_queue, queue = _outcome(queue, op)
        assert got_queue == got_plain, op
        assert type(queue) is WaitingQueue and len(queue) == len(plain)
        assert all(a is b for a, b in zip(queue, plain, strict=True)), op
        assert [x in queue for x in POOL] == [x in plain for x in POOL], op
        assert queue._count == dict(Counter(map(id, plain))), op  # the invariant itself
    for twin in (copy.copy(queue), copy.deepcopy(queue), pickle.loads(pickle.dumps(queue))):
        assert type(twin) is WaitingQueue and twin._count == dict(Counter(map(id, twin)))


def test_a_request_is_in_the_queue_by_identity_only() -> None:
    a, b = _Plain(), _Plain()
    q = WaitingQueue([a, a])
    assert a in q and b not in q
    q.remove(a)
    assert a in q
    q.remove(a)
    assert a not in q and not q._count


def test_the_scheduler_keeps_a_counted_queue_through_a_rollback() -> None:
    """The queue is a WaitingQueue from construction, and still one (requeued requests first, then the rest,
    in order) after an admission that could not get its KV slots rebuilt it."""
    sched = build(Setup(tree="radix", hybrid=False, kv_tokens=512, rows=4, max_running=2))
    assert type(sched.waiting) is WaitingQueue
    for rid in range(6):
        sched.add_request(rid, [7, rid, 3, 5], 2)
    order = [r.rid for r in sched.waiting]
    before = sched.waiting
    real = sched.memory.prepare_extend
    sched.memory.prepare_extend = lambda *a, **k: None  # type: ignore[method-assign]
    sched.step()
    sched.memory.prepare_extend = real  # type: ignore[method-assign]
    assert type(sched.waiting) is WaitingQueue and sched.waiting is not before  # rebuilt by the rollback
    assert [r.rid for r in sched.waiting] == order
    assert sched.waiting._count == dict(Counter(map(id, sched.waiting)))
    sched.run_until_idle(1_000)
    assert sched.stats.finished == 6 and not sched.waiting and not sched.waiting._count
