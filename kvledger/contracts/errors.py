"""Two kinds of failure, kept apart on purpose.

* :class:`KVLedgerError` and its subclasses are *operating errors*: the caller passed bad input (a double
  free, an id outside the pool, a negative count, a tensor on the wrong device). They are raised before
  anything changes, so every pool, tree and queue is exactly as it was. Callers may catch them.
* :class:`ContractViolation` is a *bug*: an invariant of the model does not hold. It carries the
  evidence (pool, slot, owner, recent history) and is never meant to be caught in production code.
"""

from __future__ import annotations


class KVLedgerError(Exception):
    """Base class of every operating error kvledger raises on bad input."""


class InvalidArgument(KVLedgerError, ValueError):
    """An argument has the wrong type, dtype, device, shape or value (e.g. a negative count)."""


class SlotOutOfRange(KVLedgerError, IndexError):
    """An id lies outside the pool's domain, or is a reserved id (slot 0, page 0)."""


class DoubleFree(KVLedgerError):
    """An id passed to ``free`` is already free (or already queued in an open free group)."""


class DuplicateIds(KVLedgerError):
    """The same id (or, for a paged pool, nothing worse than several tokens of one page) is repeated."""


class ForeignSlot(KVLedgerError):
    """An id is held by an owner other than the one that claims to release or hand it over."""


class StaleSnapshot(KVLedgerError):
    """``restore_state`` was given a snapshot that ownership moves since ``backup_state`` have made invalid."""


class FreeGroupError(KVLedgerError):
    """``free_group_begin``/``free_group_end`` called out of order."""


class InvalidKey(KVLedgerError, ValueError):
    """A radix key is malformed: not page-aligned, or its length differs from its value's."""


class PrefixMismatch(KVLedgerError):
    """The ids a caller claims as its locked, tree-owned prefix are not the tree's ids on that path."""


class LockNotHeld(KVLedgerError):
    """A lock release that matches no live lock: released twice, forged, or a count would go below zero."""


class ForeignNode(KVLedgerError):
    """A node or lock handle from another tree, or a node that is no longer in its tree."""


class ContractViolation(AssertionError):
    """An invariant or postcondition of the model failed: a bug, with the evidence in the message."""
