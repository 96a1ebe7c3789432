"""The event log format (``kvledger-events``, version 1): JSON lines an engine's debug build writes.

One JSON object per line, ``"ev"`` naming the event. Line 1 is the header; events are numbered by
their line (event 1 is the header). The full description, with which call of SGLang's
``TokenToKVPoolAllocator``, ``ReqToTokenPool``, ``MambaPool``, ``RadixCache``/``MambaRadixCache`` and
scheduler emits each event, is ``spec/event-log.md``. In short:

================  ====================================================================================
``header``        ``format`` ("kvledger-events"), ``version`` (1), ``source`` (free text)
``pool``          a pool: ``pool`` (its name), ``first`` (first id), ``size`` (ids), ``unit`` (tokens per
                  id: the page size of a paged KV pool, else 1), ``unit_name`` (what the identity's terms
                  count: tokens, rows, slots)
``tree``          the prefix cache: ``root`` (the root node's id)
``alloc``         ``ids`` of ``pool`` leave the free list ``to`` an owner (or a list: one owner per id)
``free``          ``ids`` of ``pool`` go back from ``from`` to the free list (into the open free group)
``move``          ``ids`` of ``pool`` change owner ``from`` -> ``to`` (``op``: why; the pool is unchanged)
``free_group``    ``open``: true at ``free_group_begin``, false at ``free_group_end`` (the group's ids
                  reach the free list)
``insert``        a new cache node ``node`` under ``parent`` (its KV and state arrive by the moves after)
``split``         a new node ``upper`` between ``node`` and its parent (it inherits ``node``'s lock count)
``evict``         ``node`` left the tree (after its KV and state were freed)
``lock``          ``inc_lock_ref(node)``: ``node`` and its ancestors +1; ``state``: the state lock too
``unlock``        ``dec_lock_ref``: exactly what the matching lock took
``cow``           copy-on-write of ``node``'s state (slot ``src`` of ``pool``) into slot ``dst``
``req``           request ``rid`` changes ``state``: waiting, chunked, running, inflight, released
``account``       any other holder ``owner`` (PD queues, ...) changes ``account``
``step``          the end of a scheduler step: the engine's own identity ``terms`` per pool (in units),
                  ``quiescent`` when nothing is live
================  ====================================================================================

Owners are named ``kind#key``: ``req#<rid>`` (requests), ``node#<id>`` (a cache node's KV),
``node.mamba#<id>`` (its Mamba state); other kinds are declared by an ``account`` event. The free list
and the free group are implicit in ``alloc``, ``free`` and ``free_group``.
"""

from __future__ import annotations

import json
from typing import Any

from kvledger.contracts.errors import EventLogError
from kvledger.contracts.owners import BATCH_INFLIGHT, REQ_CHUNKED, REQ_RUNNING, REQ_WAITING, Account

FORMAT = "kvledger-events"
VERSION = 1

REQ_STATES: dict[str, Account] = {
    "waiting": REQ_WAITING,
    "chunked": REQ_CHUNKED,
    "running": REQ_RUNNING,
    "inflight": BATCH_INFLIGHT,
}
"""A request's state in the log and the account of the identity its ids count in."""
RELEASED = "released"
"""The request gave everything back: from here on it must hold nothing."""
STATE_OF_ACCOUNT = {acct.name: state for state, acct in REQ_STATES.items()}

REQ_KIND, NODE_KIND, STATE_KIND = "req", "node", "node.mamba"
"""Owner kinds whose accounts the log does not state: derived from ``req`` events and from lock counts."""

EVENTS = (
    "header",
    "pool",
    "tree",
    "alloc",
    "free",
    "move",
    "free_group",
    "insert",
    "split",
    "evict",
    "lock",
    "unlock",
    "cow",
    "req",
    "account",
    "step",
)


def header(source: str) -> dict[str, Any]:
    """The first line of a log."""
    return {"ev": "header", "format": FORMAT, "version": VERSION, "source": source}


def owner_name(kind: str, key: object) -> str:
    """``kind#key`` (``kind`` alone for singletons), as :attr:`kvledger.contracts.owners.Owner.name`."""
    return kind if key is None else f"{kind}#{key}"


def split_owner_name(name: str) -> tuple[str, object]:
    """``"req#12"`` -> ``("req", 12)``; a non-numeric key stays a string; no ``#``: ``(name, None)``."""
    kind, sep, key = name.partition("#")
    if not sep:
        return name, None
    return kind, int(key) if key.lstrip("-").isdigit() else key


def parse(line: str, where: int) -> dict[str, Any]:
    """One line as an event object; :class:`EventLogError` names the line when it is not one."""
    try:
        ev = json.loads(line)
    except json.JSONDecodeError as exc:
        raise EventLogError(f"event {where}: not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(ev, dict) or not isinstance(ev.get("ev"), str):
        raise EventLogError(f'event {where}: not an event object with an "ev" field: {line[:120]}')
    return ev


def check_header(ev: dict[str, Any], where: int) -> None:
    if ev.get("ev") != "header":
        raise EventLogError(f"event {where}: the log must start with a header event, got {ev.get('ev')!r}")
    if ev.get("format") != FORMAT or ev.get("version") != VERSION:
        raise EventLogError(
            f"event {where}: format {ev.get('format')!r} version {ev.get('version')!r};"
            f" this audit reads {FORMAT!r} version {VERSION}"
        )
