"""What one registry entry is: an invariant, the checks that enforce it, the area it belongs to.

Plain frozen dataclasses, no imports beyond the standard library and ``errors`` (for the ID pattern), so
the registry loads in milliseconds and can be read by tools (the spec generator, the traceability check,
a documentation site) without torch. Locations of checks are strings, never imports: ``contracts/``
must not import ``reference/``; the traceability check resolves them by parsing the files.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from kvledger.contracts.errors import INVARIANT_ID


class Severity(enum.Enum):
    """What it means when the invariant's check fires, and so which exception the caller sees.

    * ``BUG``: the implementation (or the engine under check) is wrong. ``ContractViolation`` with the
      evidence (ids, owner, history); never caught in production code.
    * ``OPERATING_ERROR``: the caller's input would break the invariant. It is refused with a typed
      ``KVLedgerError`` subclass before anything changes; callers may catch it.

    An invariant guarded both ways (an input check in front, a contract behind) is a ``BUG``: its
    violation means a bug got past the input check. Its input checks are listed with kind ``INPUT``.
    """

    BUG = "bug"
    OPERATING_ERROR = "operating error"


class Origin(enum.Enum):
    """Where the invariant comes from."""

    SGLANG = "SGLang"  # an identity of SGLang's own memory bookkeeping, stated from its code and bug history
    KVLEDGER = "kvledger"  # introduced by kvledger (stronger checks, the data plane, the tooling)


class CheckKind(enum.Enum):
    CONTRACT = "contract"  # icontract pre/postcondition, class invariant or explicit check: ContractViolation
    INPUT = "input"  # validation before any change: a typed KVLedgerError
    RECOUNT = "recount"  # a full O(size) recount (``audit``) at quiescence and in tests
    ORACLE = "oracle"  # a comparison with a model or a reference, run by the tests
    PROOF = "proof"  # pure arithmetic proved by CrossHair (see ``proofs.py``)


PARTS = frozenset(
    {
        "kv-token-pool",  # TokenToKVPoolAllocator (page 1)
        "kv-page-pool",  # PagedTokenToKVPoolAllocator
        "req-rows",  # ReqToTokenPool
        "mamba-pool",  # MambaPool
        "ledger",  # the ownership ledger every pool carries in debug builds
        "radix-cache",  # RadixCache and the KV side of MambaRadixCache
        "mamba-radix-cache",  # the state side of MambaRadixCache
        "scheduler",  # admission, chunking, decode, retraction, finish, abort, overlap
        "model-runner",  # the tiny hybrid model reading KV and states through the pools
        "kernels",  # Triton kernels and their torch references
        "metadata-pool",  # MetadataBufferPool (PD metadata slots)
        "pd-prefill",  # the PD prefill instance and its queues
        "pd-decode",  # the PD decode instance and its queues
        "pd-channel",  # the PD transfer channel
        "mamba-v2",  # Mamba V2 (extra_buffer): tracking slots, captures, donation
        "speculative",  # speculative decoding: draft over-allocation, verify, the rejected tail
        "audit",  # the event log, its recorder and its replay (kvledger audit)
        "vllm-block-pool",  # vLLM v1's BlockPool and KV cache managers under kvledger.engines.vllm
        "host-tier",  # the host-memory tier (HiCache): host pools, host copies, load-back
    }
)
"""The parts of the system an invariant can concern. A new part (PD queues, Mamba V2) is one line here."""


@dataclass(frozen=True)
class Check:
    """One place that enforces an invariant.

    ``location`` is ``"path/from/repo/root.py:Symbol"`` or ``"...:Class.method"``; the traceability
    check verifies the file exists and defines the symbol. ``how`` says what it checks, in a few words.
    """

    location: str
    how: str = ""
    kind: CheckKind = CheckKind.CONTRACT

    @property
    def path(self) -> str:
        return self.location.partition(":")[0]

    @property
    def symbol(self) -> str:
        return self.location.partition(":")[2]


def contract(location: str, how: str = "") -> Check:
    return Check(location, how, CheckKind.CONTRACT)


def input_check(location: str, how: str = "") -> Check:
    return Check(location, how, CheckKind.INPUT)


def recount(location: str, how: str = "") -> Check:
    return Check(location, how, CheckKind.RECOUNT)


def oracle(location: str, how: str = "") -> Check:
    return Check(location, how, CheckKind.ORACLE)


def proof(location: str, how: str = "proved by CrossHair") -> Check:
    return Check(location, how, CheckKind.PROOF)


@dataclass(frozen=True)
class Invariant:
    """One invariant with a stable ID.

    * ``statement``: what holds, in one or two sentences (the spec's wording).
    * ``checks``: where it is enforced; at least one that raises (kind other than ``PROOF``).
    * ``exercised_by``: tests that check it on every step without breaking it on purpose (state
      machines), as ``"tests/...py:Class"`` locations. The tests that *make it fire* are not listed
      here: they carry ``@pytest.mark.fires("I-...")`` and are found by the traceability check.
    * ``upstream``: SGLang / vLLM issue and PR numbers, bug names, where the invariant comes from.
    """

    id: str
    title: str
    statement: str
    severity: Severity
    origin: Origin
    parts: tuple[str, ...]
    checks: tuple[Check, ...]
    upstream: tuple[str, ...] = ()
    exercised_by: tuple[str, ...] = ()
    notes: str = ""

    def __post_init__(self) -> None:
        if not INVARIANT_ID.fullmatch(self.id):
            raise ValueError(f"invariant id {self.id!r} is not of the form I-<WORD>[-<WORD>...]")
        unknown = set(self.parts) - PARTS
        if unknown:
            raise ValueError(f"{self.id}: unknown part(s) {sorted(unknown)}; known: {sorted(PARTS)}")
        if not self.parts:
            raise ValueError(f"{self.id}: names no part of the system")


@dataclass(frozen=True)
class Area:
    """A group of invariants that one module of ``kvledger.contracts.invariants.areas`` declares."""

    key: str
    title: str
    order: int  # position in the generated spec
    intro: str = ""
    invariants: tuple[Invariant, ...] = field(default=())
