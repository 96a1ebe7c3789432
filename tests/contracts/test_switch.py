"""The contracts switch: ``KVLEDGER_CONTRACTS`` read once at import; a pool's ledger from the level it is handed.

The decorators cannot be toggled inside a process, so the on/off checks run fresh interpreters. How
icontract marks what it decorated (checked against icontract 2.7.3): a checked function is a wrapper
carrying ``__preconditions__`` / ``__postconditions__`` / ``__postcondition_snapshots__`` lists, and a
class with invariants carries ``__invariants__``; with ``enabled=False`` the decorator returns its
argument unchanged, so none of these attributes exist.

The ledger is the exception by design (issue 12): its I-COUNT invariant is checked by the ledger itself
at every transfer and retag (not by icontract around every per-id query), so it is live whenever a real
ledger exists, including one built with ``checks=CheckLevel.LEDGER`` under ``KVLEDGER_CONTRACTS=0``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from kvledger.contracts import switch
from kvledger.contracts.errors import InvalidArgument
from kvledger.contracts.ledger import Ledger
from kvledger.contracts.levels import CheckLevel
from kvledger.contracts.null_ledger import NullLedger
from kvledger.contracts.owner_table import OwnerTable
from kvledger.contracts.switch import ENV_VAR
from kvledger.reference.pools import TokenToKVPoolAllocator

REPO = Path(__file__).resolve().parents[2]

PROBE = textwrap.dedent(
    """
    import json, torch
    from kvledger.contracts import arith, switch
    from kvledger.contracts.errors import ContractViolation
    from kvledger.contracts.ledger import Ledger
    from kvledger.contracts.owners import FREE_LIST, Owner, REQ_RUNNING
    from kvledger.reference.pools import (
        MambaPool, PagedTokenToKVPoolAllocator, ReqToTokenPool, TokenToKVPoolAllocator)
    import kvledger.kernels

    def marks(f):
        return sorted(a for a in ("__preconditions__", "__postconditions__", "__postcondition_snapshots__")
                      if hasattr(f, a))

    def raises(call):
        try:
            call()
        except ContractViolation:
            return True
        return False

    owner = Owner("req", 1, REQ_RUNNING)
    mamba = MambaPool(2, num_layers=1, conv_state_shape=(1,), temporal_state_shape=(1,))
    slot = mamba.alloc(1, owner)
    mamba.conv_state[:, slot] = 1.0
    mamba.free(slot, owner)
    kvledger.kernels.zero_slots = lambda state, slots: None  # alloc's postcondition must notice
    pools = {
        "token": TokenToKVPoolAllocator(4),
        "paged": PagedTokenToKVPoolAllocator(8, 4),
        "req": ReqToTokenPool(2, 4),
        "mamba": mamba,
    }
    from kvledger.contracts.levels import CheckLevel
    forced = TokenToKVPoolAllocator(4, checks=CheckLevel.LEDGER)
    ids = forced.alloc(2, owner)

    def miscounted_transfer():
        ledger = Ledger("t", range(1, 5))
        ledger._count[REQ_RUNNING] += 1  # a count no transfer made: I-COUNT at the next boundary
        ledger.transfer([1], FREE_LIST, owner, "alloc")

    print(json.dumps({
        "enabled": switch.ENABLED,
        "ledgers_enabled": switch.LEVEL.tracks_owners,
        "marks": {
            "arith.pages_needed": marks(arith.pages_needed),
            "arith.matched_prefix_len": marks(arith.matched_prefix_len),
            "TokenToKVPoolAllocator.alloc": marks(TokenToKVPoolAllocator.alloc),
            "PagedTokenToKVPoolAllocator.free": marks(PagedTokenToKVPoolAllocator.free),
            "MambaPool.copy_from": marks(MambaPool.copy_from),
            "Ledger.transfer": marks(Ledger.transfer),
        },
        "invariants": {
            c.__name__: hasattr(c, "__invariants__")
            for c in (TokenToKVPoolAllocator, PagedTokenToKVPoolAllocator, ReqToTokenPool, MambaPool)
        },
        "ledgers": {k: type(p.ledger).__name__ for k, p in pools.items()},
        "forced_ledger": type(forced.ledger).__name__,
        "precondition_fires": raises(lambda: arith.pages_needed(-1, 4)),
        # the zeroing is scheduled: its postcondition fires where the bytes move, at the next read
        "postcondition_fires": raises(lambda: (mamba.alloc(2, owner), mamba.states)),
        "ledger_check_fires": raises(lambda: forced._free_unchecked(ids, Owner("req", 2, REQ_RUNNING))),
        "ledger_invariant_fires": raises(lambda: miscounted_transfer()),
    }))
    """
)

# Every checked callable carries all three lists (empty ones included); an unchecked one carries none.
ICONTRACT_MARKS = ["__postcondition_snapshots__", "__postconditions__", "__preconditions__"]
MARKED = {
    name: ICONTRACT_MARKS
    for name in (
        "arith.pages_needed",
        "arith.matched_prefix_len",
        "TokenToKVPoolAllocator.alloc",
        "PagedTokenToKVPoolAllocator.free",
        "MambaPool.copy_from",
        "Ledger.transfer",
    )
}


def run_probe(value: str | None, code: str = PROBE) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    if value is not None:
        env[ENV_VAR] = value
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def probe(value: str | None) -> dict[str, Any]:
    done = run_probe(value)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow
def test_contracts_on() -> None:
    result = probe("1")
    assert result["enabled"] is True and result["ledgers_enabled"] is True
    assert result["marks"] == MARKED
    assert all(result["invariants"].values()), result["invariants"]
    assert set(result["ledgers"].values()) == {"Ledger"}
    assert result["precondition_fires"] is True
    assert result["postcondition_fires"] is True
    assert result["ledger_check_fires"] is True
    assert result["ledger_invariant_fires"] is True


@pytest.mark.slow
def test_contracts_off() -> None:
    result = probe("0")
    assert result["enabled"] is False and result["ledgers_enabled"] is False
    assert result["marks"] == {name: [] for name in MARKED}, "icontract left a wrapper behind"
    assert not any(result["invariants"].values()), result["invariants"]
    assert set(result["ledgers"].values()) == {"NullLedger"}
    assert result["precondition_fires"] is False  # pages_needed(-1, 4) just computes
    assert result["postcondition_fires"] is False  # the dirty slot is handed out unnoticed
    # checks=CheckLevel.LEDGER still gives a real ledger, and the ledger checks transfers by itself
    assert result["forced_ledger"] == "Ledger"
    assert result["ledger_check_fires"] is True
    assert result["ledger_invariant_fires"] is True  # the ledger checks I-COUNT by itself


@pytest.mark.slow
def test_unset_means_on() -> None:
    result = probe(None)
    assert result["enabled"] is True and result["marks"] == MARKED


@pytest.mark.parametrize("value", ["maybe", "2", "enabled"])
def test_invalid_value_fails_loudly(value: str) -> None:
    done = run_probe(value, "import kvledger.contracts.switch")
    assert done.returncode != 0
    assert f"{ENV_VAR} must be 0 or 1, got {value!r}" in done.stderr


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, True),
        ("1", True),
        ("true", True),
        (" On ", True),
        ("yes", True),
        ("0", False),
        ("FALSE", False),
        ("off", False),
        ("no", False),
    ],
)
def test_read_env(value: str | None, expected: bool) -> None:
    assert switch._read_env(value) is expected


@pytest.mark.parametrize("value", ["maybe", "", "10", "onn"])
def test_read_env_refuses_anything_else(value: str) -> None:
    with pytest.raises(ValueError, match=ENV_VAR):
        switch._read_env(value)


# ------------------------------------------------------------- the level handed to a pool, in process
@pytest.mark.parametrize(
    ("level", "ledger_type"),
    [(CheckLevel.RELEASE, NullLedger), (CheckLevel.OWNERS, OwnerTable), (CheckLevel.LEDGER, Ledger)],
)
def test_a_pool_gets_the_ledger_of_the_level_it_is_handed(level: CheckLevel, ledger_type: type) -> None:
    pool = TokenToKVPoolAllocator(4, checks=level)
    assert type(pool.ledger) is ledger_type


def test_a_pool_handed_no_level_is_built_at_the_processs() -> None:
    expected = Ledger if switch.LEVEL >= CheckLevel.LEDGER else OwnerTable if switch.LEVEL.tracks_owners else NullLedger
    assert type(TokenToKVPoolAllocator(4).ledger) is expected


def test_full_in_a_process_below_full_is_a_typed_error_and_builds_nothing() -> None:
    if switch.ENABLED:
        assert switch.building_level(CheckLevel.FULL) is CheckLevel.FULL
        return
    with pytest.raises(InvalidArgument, match="full needs a process started at full"):
        TokenToKVPoolAllocator(4, checks=CheckLevel.FULL)


def test_a_level_that_is_not_a_checklevel_is_a_typed_error() -> None:
    with pytest.raises(InvalidArgument, match="expected a CheckLevel"):
        TokenToKVPoolAllocator(4, checks="ledger")  # type: ignore[arg-type]


def test_a_level_handed_down_does_not_redecorate() -> None:
    """The decorators keep the state they got at import, whatever level a pool is built at."""
    TokenToKVPoolAllocator(4, checks=CheckLevel.RELEASE if switch.ENABLED else CheckLevel.LEDGER)
    assert hasattr(TokenToKVPoolAllocator.alloc, "__postconditions__") is switch.ENABLED
