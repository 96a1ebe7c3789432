"""The event log format (``kvledger-events``, version 1): JSON lines an engine's debug build writes.

One JSON object per line, ``"ev"`` naming the event. Line 1 is the header, the last line the ``end``
marker; events are numbered by their line (event 1 is the header). The full description, with which call of SGLang's
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
``step``          the end of a scheduler step: ``step`` (its number, strictly increasing), the engine's own
                  identity ``terms`` per pool (in units), ``quiescent`` when nothing is live
``end``           the last line: ``events`` (the lines before it, the header included), ``outcome``
                  (completed, stopped, violation: how the run ended). A log without it was cut off.
================  ====================================================================================

Owners are named ``kind#key``: ``req#<rid>`` (requests), ``node#<id>`` (a cache node's KV),
``node.mamba#<id>`` (its Mamba state); other kinds are declared by an ``account`` event. The free list
and the free group are implicit in ``alloc``, ``free`` and ``free_group``.

Every number is bounded (the ``MAX_*`` constants below, ``spec/event-log.md`` "Bounds"), so the auditor
refuses a hostile or corrupted log before it allocates anything for it: the replay keeps about 20 bytes
per id of every pool's domain, so the domains together are capped; everything else that names or counts
(ids, node ids, request ids, step numbers, terms, the end marker's count) fits an int64, as in any engine.
"""

from __future__ import annotations

import json
import re
import reprlib
from typing import Any

from kvledger.contracts.errors import EventLogError
from kvledger.contracts.owners import (
    BATCH_INFLIGHT,
    PD_ACCOUNTS,
    REQ_CHUNKED,
    REQ_RUNNING,
    REQ_WAITING,
    Account,
)

FORMAT = "kvledger-events"
VERSION = 1

REQ_STATES: dict[str, Account] = {
    "waiting": REQ_WAITING,
    "chunked": REQ_CHUNKED,
    "running": REQ_RUNNING,
    "inflight": BATCH_INFLIGHT,
    **{acct.name: acct for acct in PD_ACCOUNTS},  # a PD instance's queues and leases (spec/pd.md §3)
}
"""A request's state in the log and the account of the identity its ids count in. A PD instance's log
(one per instance) names its PD queues by their accounts: ``pd.prefill.bootstrap``, ``pd.decode.transfer``,
``pd.decode.lease``, ..."""
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
    "end",
)

END = "end"
OUTCOMES = ("completed", "stopped", "violation")
"""How a run ended, in its end marker: ``completed`` (drained: the engine was quiescent), ``stopped``
(closed while requests were live, no violation), ``violation`` (the engine stopped on a contract
violation). The audit checks the idle identity at ``completed`` and never calls ``violation`` clean."""

# ---------------------------------------------------------------------------------------------- bounds
MAX_LINE_BYTES = 1 << 26
"""A line, its newline included, is at most 64 MiB (a free of a 1M-token request's KV is about 8 MB)."""
MAX_LEDGER_IDS = 1 << 26
"""The pools' domains together: the sum of ``first + size`` over the ``pool`` events is at most 2^26
(67,108,864) ids. The replay keeps about 20 bytes per id from 0 to ``first + size``: 1.3 GB at most."""
MAX_UNIT = 1 << 16
"""A pool's ``unit`` (tokens per id: a paged KV pool's page size) is at most 65,536."""
MAX_NUMBER = (1 << 63) - 1
"""Ids, node ids, integer request ids, step numbers, terms and the end marker's count fit an int64."""
MAX_NAME = 256
"""Pool, owner, account and string request names are at most 256 characters."""

_NUMERIC_KEY = re.compile(r"-?[0-9]{1,19}")


def header(source: str) -> dict[str, Any]:
    """The first line of a log."""
    return {"ev": "header", "format": FORMAT, "version": VERSION, "source": source}


def end(events: int, outcome: str) -> dict[str, Any]:
    """The last line of a log: ``events`` lines came before it (the header included)."""
    return {"ev": END, "events": events, "outcome": outcome}


def owner_name(kind: str, key: object) -> str:
    """``kind#key`` (``kind`` alone for singletons), as :attr:`kvledger.contracts.owners.Owner.name`."""
    return kind if key is None else f"{kind}#{key}"


def split_owner_name(name: str) -> tuple[str, object]:
    """``"req#12"`` -> ``("req", 12)``; a non-numeric key stays a string; no ``#``: ``(name, None)``."""
    kind, sep, key = name.partition("#")
    if not sep:
        return name, None
    return kind, int(key) if _NUMERIC_KEY.fullmatch(key) else key


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


_DECODER = json.JSONDecoder(
    parse_constant=_no_constant
)  # one decoder: json.loads(..., kw) builds one per call


def parse(line: str, where: int) -> dict[str, Any]:
    """One line as an event object; :class:`EventLogError` names the line when it is not one.

    Refused here, whatever the event: a line over :data:`MAX_LINE_BYTES`, text that is not JSON (or
    nests deeper than Python's recursion limit), ``NaN``/``Infinity``, strings with lone surrogates (they
    cannot be printed), anything but an object with a string ``ev``."""
    if len(line) > MAX_LINE_BYTES:
        raise EventLogError(f"event {where}: a line longer than {MAX_LINE_BYTES} bytes")
    if line.startswith("\ufeff"):
        raise EventLogError(f"event {where}: not JSON (a UTF-8 byte order mark: write the log without one)")
    try:
        ev = _DECODER.decode(line)
    except json.JSONDecodeError as exc:
        raise EventLogError(f"event {where}: not JSON ({exc.msg} at column {exc.colno})") from None
    except ValueError as exc:  # parse_constant
        raise EventLogError(f"event {where}: not JSON: {exc}") from None
    except RecursionError:
        raise EventLogError(f"event {where}: not an event: JSON nested too deep") from None
    if not isinstance(ev, dict) or not isinstance(ev.get("ev"), str):
        raise EventLogError(f'event {where}: not an event object with an "ev" field: {line[:120]!r}')
    if "\\u" in line:  # an escape may hide a lone surrogate, which no output can encode
        try:
            json.dumps(ev, ensure_ascii=False).encode("utf-8")
        except (UnicodeEncodeError, RecursionError):
            raise EventLogError(f"event {where}: a string with a lone surrogate or nested too deep") from None
    return ev


def check_header(ev: dict[str, Any], where: int) -> None:
    if ev.get("ev") != "header":
        raise EventLogError(f"event {where}: the log must start with a header event, got {ev.get('ev')!r}")
    fmt, version = ev.get("format"), ev.get("version")
    if fmt != FORMAT or type(version) is not int or version != VERSION:  # not True, not 1.0
        raise EventLogError(
            f"event {where}: format {fmt!r} version {version!r}; this audit reads {FORMAT!r} version {VERSION}"[
                :300
            ]
        )
    if not isinstance(ev.get("source", ""), str):
        raise EventLogError(f"event {where}: header: source must be a string")


# ------------------------------------------------------------------ typed fields
def number(ev: dict[str, Any], key: str, where: int, *, low: int = 0, high: int = MAX_NUMBER) -> int:
    """``ev[key]``, an int (not a bool, not a float) in ``[low, high]``; else :class:`EventLogError`."""
    value = ev.get(key)
    if type(value) is not int:
        raise EventLogError(
            f"event {where}: {ev['ev']}: {key} must be an integer, got {show(value)}"
            + (" (missing)" if key not in ev else "")
        )
    if not low <= value <= high:
        raise EventLogError(
            f"event {where}: {ev['ev']}: {key} must be in [{low}, {high}], got {show(value)}"
        )
    return value


def flag(ev: dict[str, Any], key: str, where: int, default: bool | None = None) -> bool:
    """``ev[key]``, true or false (``default`` when absent, if there is one); else :class:`EventLogError`."""
    value = ev.get(key, default)
    if type(value) is not bool:
        raise EventLogError(f"event {where}: {ev['ev']}: {key} must be true or false, got {show(value)}")
    return value


def name(ev: dict[str, Any], key: str, where: int, default: str | None = None) -> str:
    """``ev[key]``, a non-empty string of at most :data:`MAX_NAME` characters; else :class:`EventLogError`."""
    value = ev.get(key, default)
    if not is_name(value):
        raise EventLogError(
            f"event {where}: {ev['ev']}: {key} must be a string of 1 to {MAX_NAME} characters, got {show(value)}"
        )
    assert isinstance(value, str)
    return value


def is_name(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_NAME


def show(value: object) -> str:
    """A value for a message, cut: a 10^30, a long list or a deeply nested one must not flood the terminal
    (reprlib stops at a depth and a length, so it never recurses as deep as the value)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"a {value.bit_length()}-bit integer"
    text = _REPR.repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 3, 8, 4, 60, 60
