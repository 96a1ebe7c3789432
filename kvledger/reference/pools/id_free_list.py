"""The free list every pool is built on: ids, their free/held state, free groups, backup/restore.

One implementation of alloc/free for token slots, pages, request rows and Mamba slots, so the ownership
rules are written once. Control plane only: it hands out and takes back ids, never touches tensor
contents (the pools do that through ``kvledger.kernels``).

Each id is in one of four states, kept in a per-id ``uint8`` array beside the free list so that a
double free is detected in O(len(ids)) without scanning the list:

* ``FREE``: on the free list; ``HELD``: handed out; ``PENDING``: freed inside an open free group,
  back on the free list at ``free_group_end``; ``RESERVED``: padding ids (0) never handed out.

Why the bookkeeping lives on the host, in numpy (issue 16): it is control-plane state, read and written
a few ids at a time, and a numpy or Python-int operation on a handful of ids costs a fraction of a
torch operation. The free list is a ring buffer (a push writes ``n`` ids instead of copying the whole
list, as ``torch.cat`` does); the state array is shared with a bytearray for scalar access and with a
CPU tensor (``state``) for readers that want one. Validation of a release stays complete and O(n):
range, repeats (a position scatter, no sort) and state, all against the per-id state array. ``alloc``
returns a fresh int64 tensor on the pool's device (a copy: callers may keep it as long as they like).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kvledger.contracts.diagnosis import free_list_report
from kvledger.contracts.errors import (
    ContractViolation,
    DoubleFree,
    DuplicateIds,
    FreeGroupError,
    SlotOutOfRange,
    StaleSnapshot,
)
from kvledger.contracts.ledger import BYTE_TESTS, HIGH_BYTES, as_id_array
from kvledger.contracts.ledger_by_level import AnyLedger, make_ledger
from kvledger.contracts.levels import CheckLevel
from kvledger.contracts.owners import FREE_LIST, Owner
from kvledger.contracts.switch import building_level

HELD, FREE, PENDING, RESERVED = 0, 1, 2, 3
_INT64 = np.dtype(np.int64)

SMALL = 8
HANDED_KEPT = 256
"""At most this many handed-out host arrays are remembered for the free (:meth:`IdFreeList._host_view`)."""
"""Releases of at most this many ids are validated with Python ints (faster than numpy calls there)."""



@dataclass(frozen=True)
class FreeListSnapshot:
    """What ``backup_state`` returns: the free list at that moment (speculative rollback point)."""

    free: np.ndarray
    owner: object  # the IdFreeList it came from; restoring into another pool is refused


def host_ids(ids: torch.Tensor) -> np.ndarray:
    """A 1-D int64 id tensor as a host numpy array (zero-copy on CPU)."""
    return ids.numpy() if ids.is_cpu else ids.cpu().numpy()


def free_list_of(pool: object) -> IdFreeList:
    """The :class:`IdFreeList` a kvledger pool is built on: its public ``free_list`` (``pools.base.IdPool``).

    For the scheduler's per-step identity: it reads the pools' counters and checks them itself (the busy
    identity and the ledger cross-check cover the pools' cheap invariants I-COUNT and I-CAP), so going
    through ``available_size()`` would evaluate those invariants twice per read for nothing. Another
    implementation (an adapter) has none: TypeError, and the caller reads its public accessors instead.
    """
    found = getattr(pool, "free_list", None)
    if isinstance(found, IdFreeList):
        return found
    raise TypeError(f"{type(pool).__name__} is not built on an IdFreeList")


class IdFreeList:
    """Ids ``first .. first+count-1`` of pool ``name``; ids below ``first`` are reserved padding.
    ``reuse`` is part of the contract (I-REUSE-ORDER) (vLLM #51482 shows reuse order matters): ``"fifo"`` appends freed
    ids at the tail (SGLang's token allocator and Mamba pool), ``"lifo"`` puts them at the head
    (SGLang's paged allocator).
    """

    def __init__(
        self,
        name: str,
        first: int,
        count: int,
        device: torch.device,
        *,
        unit: int = 1,
        reuse: str = "fifo",
        checks: CheckLevel | None = None,
    ) -> None:
        if reuse not in ("fifo", "lifo"):
            raise ValueError(f"reuse must be 'fifo' or 'lifo', got {reuse!r}")
        self.name = name
        self.first = first
        self.last = first + count - 1
        self.count = count
        self.unit = unit  # tokens per id (the page size of a paged pool)
        self.device = device
        self.reuse = reuse  # sets ``_lifo`` (see the property)
        self._on_cpu = device.type == "cpu"
        # The state of every id, three views of one buffer: bytes (scalar access), numpy (vectors),
        # and a CPU tensor for readers that index with tensors.
        # One RESERVED guard byte past the last id: release's free gathers with ``take(mode="clip")``, which
        # sends an id past the end to the guard and a negative one to id 0 (reserved where ``first`` >= 1),
        # so one gather tests range, sign and state together (:meth:`_free_plain`).
        self._state_bytes = bytearray([FREE]) * (first + count) + bytearray([RESERVED])
        self._guarded = np.frombuffer(self._state_bytes, dtype=np.uint8)
        self._state = self._guarded[: first + count]
        self._state[:first] = RESERVED
        self.state = torch.from_numpy(self._state)
        # The free list: ``_len`` ids from ``_head`` on, wrapping around a ring of ``count`` entries.
        self._ring = np.arange(first, first + count, dtype=np.int64)
        self._head = 0
        self._len = count
        # Repeats in a release: positions scattered by id and read back (int32: sizes are below 2**31,
        # and half the bytes of int64 keep a large pool's scratch in cache).
        self._positions = np.arange(first + count, dtype=np.int32)
        self._scratch = np.zeros(first + count, dtype=np.int32)
        # Per release size n (up to BYTE_TESTS): the positions 0..n-1, their bytes and n zero bytes.
        self._plain_keys: dict[int, tuple[np.ndarray, bytes, bytes]] = {}
        # The host arrays behind the tensors alloc handed out, by address, until freed (_host_view).
        self._handed: dict[int, tuple[np.ndarray, bytes]] = {}
        self.pending: list[np.ndarray] | None = None
        self._pending_n = 0
        self.ledger: AnyLedger = make_ledger(
            name, range(first, first + count), unit=unit, level=building_level(checks)
        )
        self._ledger_on = bool(self.ledger.enabled)
        # Data-plane hooks the owning pool installs: zero what is handed out, poison what comes back
        # (debug builds), so a stale read of a freed slot is visible in the data (I-POISON-ON-FREE).
        self.on_alloc: Callable[[torch.Tensor], None] | None = None
        self.on_release: Callable[[torch.Tensor], None] | None = None

    @property
    def reuse(self) -> str:
        """``"fifo"`` or ``"lifo"`` (I-REUSE-ORDER); a plain flag is what the hot path reads."""
        return "lifo" if self._lifo else "fifo"

    @reuse.setter
    def reuse(self, value: str) -> None:
        self._lifo = value == "lifo"

    # ------------------------------------------------------------------ queries
    def available(self) -> int:
        return self._len

    def pending_count(self) -> int:
        return self._pending_n

    def in_free_group(self) -> bool:
        return self.pending is not None

    def is_held(self, i: int) -> bool:
        """Whether id ``i`` (a Python int in range) is handed out."""
        return 0 <= i <= self.last and self._state_bytes[i] == HELD

    def all_held(self, ids: torch.Tensor) -> bool:
        """Whether every id (range-checked by the caller) is handed out."""
        a = host_ids(ids)
        return a.size == 0 or not bool(self._state[a].any())  # HELD is 0

    def free_ids(self) -> np.ndarray:
        """The free list in reuse order (a copy)."""
        return self._take(self._len)

    @property
    def free(self) -> torch.Tensor:
        """The free list in reuse order, as a CPU tensor (a copy; for reports and tests)."""
        return torch.from_numpy(self.free_ids())

    @free.setter
    def free(self, ids: Any) -> None:
        """Replace the free list wholesale (tests that tamper with a pool behind its ledger)."""
        a = as_id_array(ids).astype(np.int64, copy=True)
        pad = max(self.count - a.size, 0)
        self._ring = np.concatenate((a, np.zeros(pad, dtype=np.int64)))
        self._head, self._len = 0, int(a.size)

    def _device_tensor(self, a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(a)
        return t if self._on_cpu else t.to(self.device)

    # ------------------------------------------------------------------ alloc
    def _take(self, n: int) -> np.ndarray:
        """A copy of the first ``n`` free ids (the ring is not changed)."""
        h, cap = self._head, self._ring.size
        if h + n <= cap:
            return self._ring[h : h + n].copy()
        return np.concatenate((self._ring[h:], self._ring[: h + n - cap]))

    def _commit_take(self, a: np.ndarray) -> None:
        n = a.size
        self._head = (self._head + n) % self._ring.size
        self._len -= n
        if n <= SMALL:
            st = self._state_bytes
            for i in a.tolist():
                st[i] = HELD
        else:
            self._state[a] = HELD

    def alloc(self, n: int, owner: Owner, op: str = "alloc") -> torch.Tensor | None:
        """Take ``n`` ids off the front, all or nothing (None when fewer are free)."""
        a = self.alloc_host(n, owner, op)
        if a is None:
            return None
        if not self._on_cpu:
            return self._device_tensor(a)
        t = torch.from_numpy(a)
        if n > SMALL:
            handed = self._handed
            if len(handed) >= HANDED_KEPT:
                handed.clear()  # ids freed through other tensors never come back here: stay bounded
            handed[t.data_ptr()] = (a, a.tobytes())  # the bytes: to tell, at the free, that they are unchanged
        return t

    def _host_view(self, ids: torch.Tensor, n: int) -> np.ndarray:
        """The host array of ``n`` (> SMALL) int64 ids: the one :meth:`alloc` handed out under this tensor
        when it comes back as it left (``ids.numpy()`` is a third of a 64-id free at release, issue 38).

        Why this is the tensor's content: ``_handed`` keeps each array alive, so no other memory can sit at
        its address; a tensor starting there, contiguous, with as many int64 elements, reads those bytes.
        """
        entry = self._handed.pop(ids.data_ptr(), None) if self._on_cpu else None
        if entry is None or entry[0].size != n or not ids.is_contiguous():
            return ids.numpy() if ids.is_cpu else ids.cpu().numpy()
        return entry[0]

    def alloc_host(self, n: int, owner: Owner, op: str = "alloc") -> np.ndarray | None:
        """:meth:`alloc`, returning the ids as a host array (the caller's to keep)."""
        if n > self._len:
            return None
        if n == 1:  # a decode token, one page: the id as a Python int, no _take / _commit_take
            ring, h = self._ring, self._head
            a = ring[h : h + 1].copy()
            i = a.item()
            if self._ledger_on and not self.ledger.move_one(i, FREE_LIST, owner, op):
                self.ledger.transfer([i], FREE_LIST, owner, op)  # raises with the evidence, nothing changed
            h += 1
            self._head = h if h < ring.size else 0
            self._len -= 1
            self._state_bytes[i] = HELD
            if self.on_alloc is not None:
                self.on_alloc(self._device_tensor(a))
            return a
        a = self._take(n)
        if self._ledger_on:
            self.ledger.transfer(a, FREE_LIST, owner, op)  # checks first: a bug leaves the pool as it was
        self._commit_take(a)
        if self.on_alloc is not None and n:
            self.on_alloc(self._device_tensor(a))
        return a

    def alloc_each(self, owners: Sequence[Owner], op: str = "alloc") -> torch.Tensor | None:
        """One id for each owner, in order, all or nothing (a decode step's allocation in one call)."""
        n = len(owners)
        if n > self._len:
            return None
        a = self._take(n)
        if self._ledger_on:
            self.ledger.transfer_each(a, FREE_LIST, owners, op)
        self._commit_take(a)
        out = self._device_tensor(a)
        if self.on_alloc is not None and n:
            self.on_alloc(out)
        return out

    # ------------------------------------------------------------------ free
    def check_release(self, a: np.ndarray, owner: Owner, op: str, unit: str = "id") -> None:
        """Everything that makes a release of ``a`` bad input, checked before any change: O(len(a)).

        The fast path answers "all fine" with a few operations; only a bad call pays for the
        classification into :class:`SlotOutOfRange`, :class:`DuplicateIds` or :class:`DoubleFree`.
        """
        n = a.size
        if n == 0:
            return
        if n <= SMALL:
            ids = a.tolist()
            st, first, last = self._state_bytes, self.first, self.last
            ok = all(first <= i <= last and st[i] == HELD for i in ids) and (n == 1 or len(set(ids)) == n)
        else:
            ok = self._held_distinct(a, n)
        if not ok:
            self._refuse_release(a, op, unit)
        if self._ledger_on:
            self.ledger.require_held_by(a, owner, op)

    def _held_distinct(self, a: np.ndarray, n: int) -> bool:
        """Whether ``n`` (> SMALL) int64 host ids are all in range, all held and pairwise distinct.

        Release's hot path (issue 24: free at least as fast as SGLang's ``torch.cat``), so every test is
        a byte comparison instead of a numpy reduction (a reduction's fixed cost is several times a
        gather's): the high byte of every id is zero (no negative id, which numpy would wrap around to
        another id's entry); the gather of the state raises IndexError past the last id and reads
        RESERVED below the first; HELD is 0, so "all held" is "the gathered states are all zero bytes";
        repeats are found by scattering positions and reading them back. O(n), no sort.
        """
        if a.dtype != np.int64:
            a = a.astype(np.int64)
        if n <= BYTE_TESTS:
            if a.tobytes()[HIGH_BYTES] != bytes(n):
                return False
        elif int(a.view(np.uint64).max()) > self.last:
            return False
        try:
            if self._state[a].tobytes() != bytes(n):
                return False
        except IndexError:
            return False
        if n > self._positions.size:
            return False
        pos = self._positions[:n]
        scratch = self._scratch
        scratch[a] = pos
        return bool(scratch[a].tobytes() == pos.tobytes())

    def _free_plain(self, a: np.ndarray, n: int, op: str, unit: str) -> None:
        """Validate and release ``n`` (> SMALL) int64 host ids at the release level: range, sign and held in
        one gather, repeats by a scatter of positions read back, then the ring write. A refusal changes nothing.

        Release's free path (issue 38: the page-1 free of a small pool against SGLang's ``torch.cat``), so
        it is written out in one frame: each numpy call costs a fixed ~0.2 us. Where ``first`` >= 1 the
        gather is ``take(mode="clip")`` on the guarded state (a negative id reads id 0, one past the end
        reads the guard: both RESERVED, so refused); where id 0 is usable, the high bytes test the sign first
        and a plain gather raises IndexError past the end. The tests are :meth:`_held_distinct`'s.
        """
        if a.dtype is not _INT64:
            a = a.astype(np.int64)
        keys = self._plain_keys.get(n)
        if keys is None:
            keys = self._plain_key(n)
        pos, pos_bytes, zeros = keys
        try:
            if self.first:
                ok = self._guarded.take(a, mode="clip").tobytes() == zeros
            else:
                ok = a.tobytes()[HIGH_BYTES] == zeros and self._state[a].tobytes() == zeros
        except IndexError:
            ok = False
        if ok and n <= self._positions.size:
            scratch = self._scratch
            scratch[a] = pos
            ok = scratch[a].tobytes() == pos_bytes
        else:
            ok = False
        if not ok:
            self._refuse_release(a, op, unit)
        self._push_plain(a, n)

    def _push_plain(self, a: np.ndarray, n: int) -> None:
        """:meth:`_push_free` for ``n`` validated int64 host ids (> SMALL), without its list branch."""
        ring = self._ring
        cap = ring.size
        if self._len + n > cap:  # not reachable: every id was held, so the ring has room for them
            self._push_free(a)
            return
        if self._lifo:
            start = self._head - n
            if start < 0:
                start += cap
            self._head = start
        else:
            start = self._head + self._len
            if start >= cap:
                start -= cap
        end = start + n
        if end <= cap:
            ring[start:end] = a
        else:
            split = cap - start
            ring[start:] = a[:split]
            ring[: end - cap] = a[split:]
        self._len += n
        self._state[a] = FREE

    def _plain_key(self, n: int) -> tuple[np.ndarray, bytes, bytes]:
        """:meth:`_free_plain`'s constants for ``n`` ids (kept for sizes up to BYTE_TESTS)."""
        pos = self._positions[:n]
        keys = (pos, pos.tobytes(), bytes(n))
        if n <= BYTE_TESTS:
            self._plain_keys[n] = keys
        return keys

    def _refuse_release(self, a: np.ndarray, op: str, unit: str) -> None:
        """The precise typed error for a release the fast path refused (range, repeats, then state)."""
        bad = (a < self.first) | (a > self.last)
        if bool(bad.any()):
            offenders = a[bad][:8].tolist()
            raise SlotOutOfRange(
                f"[{self.name}] {unit}(s) {offenders} outside the usable range [{self.first}, {self.last}]"
            )
        uniq, counts = np.unique(a, return_counts=True)  # only on the error path
        if uniq.size != a.size:
            raise DuplicateIds(f"[{self.name}] {unit}(s) repeated in one call: {uniq[counts > 1][:8].tolist()}")
        states = self._state[a]
        not_held = states != HELD
        bad_ids = a[not_held][:8].tolist()
        where = ["free" if s == FREE else "pending in a free group" for s in states[not_held][:8].tolist()]
        raise DoubleFree(f"[{self.name}] {op}: {unit}(s) {bad_ids} already {sorted(set(where))} (I-NODUP-FREE)")

    def validate_release(self, ids: torch.Tensor, owner: Owner, op: str, unit: str = "id") -> None:
        """:meth:`check_release` for an id tensor."""
        self.check_release(host_ids(ids), owner, op, unit)

    def free_checked(self, ids: torch.Tensor, owner: Owner, op: str = "free", unit: str = "id") -> None:
        """Validate and release an id tensor: :meth:`validate_release` then :meth:`release`, one pass.

        A handful of ids (a decode step's frees) never leave Python ints; more go through numpy.
        """
        n = ids.numel()
        if n == 0:
            return
        if n > SMALL:
            # Release's own path (no ledger, no open free group, no poisoning hook): validate, then straight
            # onto the free list, without the general path's calls (issue 24: free at SGLang's speed).
            if not self._ledger_on and self.pending is None and self.on_release is None:
                entry = self._handed.pop(ids.data_ptr(), None) if self._on_cpu else None
                if entry is not None and entry[0].size == n and ids.is_contiguous():
                    a, sent = entry
                    # Unchanged since alloc (issue 38): ids the free list handed out, so in range and
                    # distinct; what is left to test is that each is still held (a view or a copy of this
                    # tensor may have freed some already). Otherwise the full tests below.
                    if a.tobytes() == sent and self._state[a].tobytes() == bytes(n):
                        self._push_plain(a, n)
                        return
                else:
                    a = ids.numpy() if ids.is_cpu else ids.cpu().numpy()
                self._free_plain(a, n, op, unit)
                return
            a = self._host_view(ids, n)
            self.check_release(a, owner, op, unit)
            self._release(a, ids, owner, op, held=self._ledger_on)
            return
        st, first, last = self._state_bytes, self.first, self.last
        if n == 1:
            i: int = ids.item()  # type: ignore[assignment]  # an int: the tensor is int64 (as_index_tensor)
            if not (first <= i <= last and st[i] == HELD):
                self._refuse_release(np.asarray([i], dtype=np.int64), op, unit)
            if self.pending is None and self.on_release is None and self._len < self.count:
                # Straight onto the ring; with a ledger, after the owner check and the checked move of the
                # id (ForeignSlot first, nothing changed).
                if self._ledger_on and not self.ledger.move_one(i, owner, FREE_LIST, op):
                    self.ledger.give_back([i], owner, FREE_LIST, op)  # raises ForeignSlot with the evidence
                self._push_one(i)
                return
            lst = [i]
        else:
            lst = ids.tolist()
            if not (all(first <= i <= last and st[i] == HELD for i in lst) and len(set(lst)) == n):
                self._refuse_release(np.asarray(lst, dtype=np.int64), op, unit)
        if self._ledger_on:  # a few ids: the ledger takes the list as it is (the owner table reads ints)
            if self.pending is None and self.on_release is None:
                # the owner check and the move in one pass (ForeignSlot first, nothing changed)
                self.ledger.give_back(lst, owner, FREE_LIST, op)
                self._push_free(lst)
                return
            self.ledger.require_held_by(lst, owner, op)
        self._release(lst, ids, owner, op, held=self._ledger_on)

    def release_if_clean(self, a: np.ndarray, owner: Owner, op: str = "free") -> bool:
        """Release int64 host ids if they are in range, held and distinct, and say so; False (nothing
        changed) otherwise, for the caller's general path to deduplicate or refuse precisely.

        With a ledger, an id held by another owner is still refused here (``ForeignSlot``)."""
        n = a.size
        if n <= SMALL:
            lst: list[int] = a.tolist()
            st, first, last = self._state_bytes, self.first, self.last
            if not (all(first <= i <= last and st[i] == HELD for i in lst) and (n < 2 or len(set(lst)) == n)):
                return False
            if n == 1 and self.pending is None and self.on_release is None and self._len < self.count:
                # the owner check and the checked move of one id (ForeignSlot first)
                if self._ledger_on and not self.ledger.move_one(lst[0], owner, FREE_LIST, op):
                    self.ledger.give_back(lst, owner, FREE_LIST, op)  # raises ForeignSlot, nothing changed
                self._push_one(lst[0])
                return True
            if self._ledger_on:
                self.ledger.require_held_by(lst, owner, op)
            self._release(lst, None, owner, op, held=self._ledger_on)
            return True
        if not self._held_distinct(a, n):
            return False
        if self._ledger_on:
            self.ledger.require_held_by(a, owner, op)
        self._release(a, None, owner, op, held=self._ledger_on)
        return True

    def free_distinct(self, a: np.ndarray, owner: Owner, op: str = "free", unit: str = "id") -> None:
        """Validate and release host ids the caller already knows to be in range and distinct (a paged
        pool's deduplicated pages): what is left to check is that each is held (and by ``owner``)."""
        if a.size == 0:
            return
        if a.size <= SMALL:
            st = self._state_bytes
            lst = a.tolist()
            if not all(st[i] == HELD for i in lst):
                self._refuse_release(a, op, unit)
            if not self._ledger_on:
                self._release(lst, None, owner, op)
                return
        elif bool(self._state[a].any()):  # HELD is 0
            self._refuse_release(a, op, unit)
        if self._ledger_on:
            self.ledger.require_held_by(a, owner, op)
        self._release(a, None, owner, op, held=self._ledger_on)

    def release(self, ids: torch.Tensor | np.ndarray, owner: Owner, op: str = "free") -> None:
        """Return validated ids. The ledger moves first, so a bookkeeping bug leaves the pool as it was.

        Inside a free group the ids go to the group's pending owner (I-PENDING) until ``free_group_end``.
        """
        if isinstance(ids, np.ndarray):
            self._release(ids, None, owner, op)
        else:
            self._release(host_ids(ids), ids, owner, op)

    def _release(
        self, ids: np.ndarray | list[int], tensor: torch.Tensor | None, owner: Owner, op: str, held: bool = False
    ) -> None:
        """``ids`` as a host array or a short list of ints; ``tensor`` the caller's, if any. ``held``: the
        caller's ``ledger.require_held_by`` just confirmed ``owner`` holds them (the owner table then only
        records the move; a ledger checks it again)."""
        n = len(ids)
        if n == 0:
            return
        if self._ledger_on:
            move = self.ledger.move_held if held else self.ledger.transfer
        hook = self.on_release
        if self.pending is not None:
            a = np.asarray(ids, dtype=np.int64)
            if self._ledger_on:
                move(a, owner, self.ledger.pending_owner, op + "(group)")
            if hook is not None:
                hook(tensor if tensor is not None else self._device_tensor(a))
            self.pending.append(a.copy())
            self._pending_n += n
            self._state[a] = PENDING
            return
        if self._ledger_on:
            move(ids, owner, FREE_LIST, op)
        self._push_free(ids)
        if hook is not None:
            hook(tensor if tensor is not None else self._device_tensor(np.asarray(ids, dtype=np.int64)))

    def _push_one(self, i: int) -> None:
        """Put one held id back on the free list (the caller checked that the ring has room)."""
        ring = self._ring
        if self._lifo:
            h = self._head
            h = h - 1 if h else ring.size - 1
            ring[h] = i
            self._head = h
        else:
            pos = self._head + self._len
            cap = ring.size
            ring[pos - cap if pos >= cap else pos] = i
        self._state_bytes[i] = FREE
        self._len += 1

    def _push_free(self, ids: np.ndarray | list[int]) -> None:
        """Put ``ids`` back on the free list (tail for fifo, head for lifo) and mark them FREE."""
        n = len(ids)
        ring = self._ring
        cap = ring.size
        if self._len + n > cap:  # only reachable with the ledger off and a double free: keep everything
            current = self._take(self._len)
            extra = np.asarray(ids, dtype=np.int64)
            self._ring = np.concatenate((extra, current) if self._lifo else (current, extra))
            self._head, self._len = 0, self._ring.size
            self._state[extra] = FREE
            return
        if type(ids) is list:
            st = self._state_bytes
            if self._lifo:
                h = self._head
                for i in reversed(ids):
                    h = h - 1 if h else cap - 1
                    ring[h] = i
                self._head = h
            else:
                pos = (self._head + self._len) % cap
                for i in ids:
                    ring[pos] = i
                    pos = pos + 1 if pos + 1 < cap else 0
            for i in ids:
                st[i] = FREE
            self._len += n
            return
        if self._lifo:
            start = (self._head - n) % cap
            self._head = start
        else:
            start = (self._head + self._len) % cap
        end = start + n
        if end <= cap:
            ring[start:end] = ids
        else:
            split = cap - start
            ring[start:] = ids[:split]
            ring[: end - cap] = ids[split:]
        self._len += n
        self._state[ids] = FREE

    # ------------------------------------------------------------------ free groups
    def free_group_begin(self) -> None:
        if self.pending is not None:
            raise FreeGroupError(f"[{self.name}] free_group_begin inside an open free group")
        self.pending = []

    def free_group_end(self) -> None:
        if self.pending is None:
            raise FreeGroupError(f"[{self.name}] free_group_end without free_group_begin")
        buffered, self.pending = self.pending, None
        self._pending_n = 0
        if buffered:
            ids = np.concatenate(buffered)
            if self._ledger_on:
                self.ledger.transfer(ids, self.ledger.pending_owner, FREE_LIST, "free_group_end")
            self._push_free(ids)

    # ------------------------------------------------------------------ backup / restore
    def backup(self) -> FreeListSnapshot:
        if self.pending is not None:
            raise FreeGroupError(f"[{self.name}] backup_state inside an open free group")
        return FreeListSnapshot(self.free_ids(), self)

    def restore(self, snap: FreeListSnapshot) -> None:
        """Roll back to ``snap`` (I-ROLLBACK): ids allocated since go back to the free list from their holders.
        Only allocations may have happened since the backup (the speculative-decoding use): an id freed
        since then would have to be taken back from the free list, which no owner asked for, so that
        snapshot is stale and refused.
        """
        if snap.owner is not self:
            raise StaleSnapshot(f"[{self.name}] snapshot belongs to another pool")
        if self.pending is not None:
            raise FreeGroupError(f"[{self.name}] restore_state inside an open free group")
        in_snap = np.zeros(self._state.size, dtype=bool)
        in_snap[snap.free] = True
        freed_since = (self._state == FREE) & ~in_snap
        if bool(freed_since.any()):
            ids = np.flatnonzero(freed_since)[:8].tolist()
            raise StaleSnapshot(f"[{self.name}] ids {ids} were freed after backup_state; cannot restore")
        taken = np.flatnonzero(in_snap & (self._state == HELD))
        if self._ledger_on:
            self.ledger.return_to_free_list(taken, "restore_state")
        if self.on_release is not None and taken.size:
            self.on_release(self._device_tensor(taken))
        self.free = snap.free
        self._state[taken] = FREE

    # ------------------------------------------------------------------ audit
    def ledger_disagreement(self, what: str) -> ContractViolation:
        """The evidence when the free list and the ledger's free account disagree (a pool's I-COUNT class
        invariant): the ids listed as free that the ledger gives to someone, and the ids the ledger calls
        free that the list lacks, each with its owner and last moves."""
        pending = np.concatenate(self.pending).tolist() if self.pending else []
        return ContractViolation(f"{what}\n{free_list_report(self.ledger, self.free_ids().tolist(), pending)}")

    def audit(self) -> None:
        """Recount the free list and state mask against each other and the ledger (O(size))."""
        free_ids = self.free_ids()
        pending_ids = np.concatenate(self.pending) if self.pending else np.zeros(0, dtype=np.int64)
        state = self._state
        if self._len > self.count or not np.array_equal(np.sort(free_ids), np.flatnonzero(state == FREE)):
            raise ContractViolation(f"[{self.name}] free list and state mask disagree")
        if not np.array_equal(np.sort(pending_ids), np.flatnonzero(state == PENDING)):
            raise ContractViolation(f"[{self.name}] free-group buffer and state mask disagree")
        if bool((state[: self.first] != RESERVED).any()):
            raise ContractViolation(f"[{self.name}] a reserved id left the RESERVED state")
        if self._pending_n != pending_ids.size:
            raise ContractViolation(f"[{self.name}] free-group count and buffer disagree")
        self.ledger.audit(free_ids, pending_ids.tolist())
