"""Two kinds of failure, kept apart on purpose.

* :class:`KVLedgerError` and its subclasses are *operating errors*: the caller passed bad input (a double
  free, an id outside the pool, a negative count, a tensor on the wrong device). They are raised before
  anything changes, so every pool, tree and queue is exactly as it was. Callers may catch them.
* :class:`ContractViolation` is a *bug*: an invariant of the model does not hold. It carries the
  evidence (pool, slot, owner, recent history) and is never meant to be caught in production code.

Both name the invariant they are about (``I-...``, see ``kvledger.contracts.invariants``): a violation's
message starts with or contains its ID; an operating error names the invariant its refusal protects,
appended from the class attribute ``invariant`` unless the message already names one.
"""

from __future__ import annotations

import re

INVARIANT_ID = re.compile(r"(?<![A-Za-z0-9_-])I-[A-Z][A-Z0-9]*(?:-[A-Z0-9]+)*(?![A-Za-z0-9])")
"""How an invariant ID looks wherever it is written: ``I-`` then upper-case words joined by ``-``."""


class KVLedgerError(Exception):
    """Base class of every operating error kvledger raises on bad input.

    ``invariant`` is the ID of the rule the refusal protects; ``str()`` appends it as ``[I-...]`` when
    the message names no invariant itself, so every operating error says which rule it enforces.
    """

    invariant = "I-TYPED-INPUT"

    def __str__(self) -> str:
        message = super().__str__()
        if INVARIANT_ID.search(message):
            return message
        return f"{message} [{self.invariant}]"


class InvalidArgument(KVLedgerError, ValueError):
    """An argument has the wrong type, dtype, device, shape or value (e.g. a negative count)."""


class SizeOutOfRange(InvalidArgument):
    """A size, count, length or step count beyond its stated bound (a configuration field, a pool size,
    a fault count), or one whose tensors cannot be allocated: refused before anything is allocated."""


class SlotOutOfRange(KVLedgerError, IndexError):
    """An id lies outside the pool's domain, or is a reserved id (slot 0, page 0)."""

    invariant = "I-DIAG-DOMAIN"


class DoubleFree(KVLedgerError):
    """An id passed to ``free`` is already free (or already queued in an open free group)."""

    invariant = "I-NODUP-FREE"


class DuplicateIds(KVLedgerError):
    """The same id (or, for a paged pool, nothing worse than several tokens of one page) is repeated."""


class ForeignSlot(KVLedgerError):
    """An id is held by an owner other than the one that claims to release or hand it over."""

    invariant = "I-EXCLUSIVE"


class StaleSnapshot(KVLedgerError):
    """``restore_state`` was given a snapshot that ownership moves since ``backup_state`` have made invalid."""

    invariant = "I-ROLLBACK"


class FreeGroupError(KVLedgerError):
    """``free_group_begin``/``free_group_end`` called out of order."""

    invariant = "I-PENDING"


class InvalidKey(KVLedgerError, ValueError):
    """A radix key is malformed: not page-aligned, or its length differs from its value's."""

    invariant = "I-NODE-NONEMPTY"


class PrefixMismatch(KVLedgerError):
    """The ids a caller claims as its locked, tree-owned prefix are not the tree's ids on that path."""

    invariant = "I-NO-TREE-ALIAS"


class LockNotHeld(KVLedgerError):
    """A lock release that matches no live lock: released twice, forged, or a count would go below zero."""

    invariant = "I-LOCK-TREE"


class ForeignNode(KVLedgerError):
    """A node or lock handle from another tree, or a node that is no longer in its tree."""


class UnknownRoom(KVLedgerError):
    """A bootstrap room the transfer channel never opened (a room that was opened and has closed since is
    known: calls about it are answered as for a closed room)."""


class ContractViolation(AssertionError):
    """An invariant or postcondition of the model failed: a bug, with the evidence in the message."""


class IdentityFailure(ContractViolation):
    """A count identity failed in a build without contracts (``KVLEDGER_CONTRACTS=0``).

    The same bug a contract-enabled build reports as a :class:`ContractViolation` (I-COUNT, I-CAP,
    I-IDLE-IDENTITY), found by the O(1)-per-term count identities that stay on in every build, so that a
    release run never reports "0 violations" for a leak it could see. Its own class so reports can keep
    it apart from the violations that only contract-enabled builds look for.
    """


class EventLogError(KVLedgerError, ValueError):
    """A recorded event log that cannot be audited: unreadable, not JSON, an unknown event, a missing
    or mistyped field, an undeclared pool or owner kind. An operating error about the input file; the
    log's *contents* breaking an invariant is a violation, not this."""

    invariant = "I-EVENT-LOG"


class InvalidState(KVLedgerError):
    """The call is well formed but not allowed in the object's current state (retracting a request that
    is not running, building a batch outside ``step``): refused before anything changes."""

    invariant = "I-CALL-STATE"


class BatchNotInFlight(InvalidState):
    """``process_batch_result`` named a batch that is not the oldest one in flight: already processed,
    launched by another scheduler, or not yet due (results are processed once, in launch order)."""

    invariant = "I-RESULTS-ONCE"
