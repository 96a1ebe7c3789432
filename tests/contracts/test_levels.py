"""Checking levels (spec/checking-levels.md): one level per process, passed down through the engine spec.

* ``KVLEDGER_CHECKS`` names the level; ``KVLEDGER_CONTRACTS=1/0`` is its alias for ``full``/``release``
  (``KVLEDGER_CHECKS`` wins when both are set); neither set means ``full``.
* Each level gives the pools the ledger it promises: none at ``release``, an :class:`OwnerTable` at
  ``owners``, a :class:`Ledger` with its history at ``ledger`` and ``full``; icontract only at ``full``.
* From ``owners`` up a foreign free is a typed error that changes nothing (probed in fresh processes).
* ``EngineSpec.checks`` builds an engine's pools at a level below the process's; ``full`` needs a
  process started at ``full``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvledger.contracts import switch
from kvledger.contracts.errors import ContractViolation, ForeignSlot, InvalidArgument
from kvledger.contracts.ledger import Ledger
from kvledger.contracts.levels import CheckLevel, parse_level
from kvledger.contracts.null_ledger import NullLedger
from kvledger.contracts.owner_table import OwnerTable
from kvledger.contracts.owners import FREE_LIST, REQ_RUNNING, Owner
from kvledger.reference.engine import EngineSpec, build_engine

REPO = Path(__file__).resolve().parents[2]

PROBE = textwrap.dedent(
    """
    import json
    from kvledger.contracts import switch
    from kvledger.contracts.errors import KVLedgerError
    from kvledger.contracts.owners import Owner, REQ_RUNNING
    from kvledger.reference.pools import TokenToKVPoolAllocator

    pool = TokenToKVPoolAllocator(8)
    a, b = Owner("req", 1, REQ_RUNNING), Owner("req", 2, REQ_RUNNING)
    ids = pool.alloc(2, b)
    before = pool.available_size()
    try:
        pool.free(ids, a)  # a frees what b holds
        refused = None
    except KVLedgerError as exc:
        refused = type(exc).__name__
    print(json.dumps({
        "level": switch.LEVEL.label,
        "contracts": switch.ENABLED,
        "ledger": type(pool.ledger).__name__,
        "decorated": hasattr(TokenToKVPoolAllocator.alloc, "__postconditions__"),
        "foreign_free": refused,
        "unchanged": pool.available_size() == before,
    }))
    """
)


def probe(env: dict[str, str]) -> dict[str, Any]:
    base = {k: v for k, v in os.environ.items() if k not in (switch.ENV_VAR, switch.LEVEL_ENV_VAR)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=base | env, cwd=REPO, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env", "level", "ledger", "refused"),
    [
        ({"KVLEDGER_CHECKS": "release"}, "release", "NullLedger", None),
        ({"KVLEDGER_CHECKS": "owners"}, "owners", "OwnerTable", "ForeignSlot"),
        ({"KVLEDGER_CHECKS": "ledger"}, "ledger", "Ledger", "ForeignSlot"),
        ({"KVLEDGER_CHECKS": "full"}, "full", "Ledger", "ForeignSlot"),
        ({"KVLEDGER_CONTRACTS": "0"}, "release", "NullLedger", None),
        ({"KVLEDGER_CONTRACTS": "1"}, "full", "Ledger", "ForeignSlot"),
        ({"KVLEDGER_CONTRACTS": "1", "KVLEDGER_CHECKS": "owners"}, "owners", "OwnerTable", "ForeignSlot"),
        ({}, "full", "Ledger", "ForeignSlot"),
    ],
)
def test_each_level_builds_what_it_promises(
    env: dict[str, str], level: str, ledger: str, refused: str | None
) -> None:
    result = probe(env)
    assert result["level"] == level
    assert result["ledger"] == ledger
    assert result["contracts"] is (level == "full") and result["decorated"] is (level == "full")
    assert result["foreign_free"] == refused
    if refused is not None:
        assert result["unchanged"] is True


def test_an_unknown_level_fails_loudly() -> None:
    base = {k: v for k, v in os.environ.items() if k not in (switch.ENV_VAR, switch.LEVEL_ENV_VAR)}
    done = subprocess.run(
        [sys.executable, "-c", "import kvledger.contracts.switch"],
        env=base | {"KVLEDGER_CHECKS": "paranoid"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "KVLEDGER_CHECKS: unknown checking level 'paranoid': one of release, owners, ledger, full" in done.stderr


@pytest.mark.parametrize(
    ("checks", "contracts", "expected"),
    [
        (None, None, CheckLevel.FULL),
        ("owners", None, CheckLevel.OWNERS),
        (" Ledger ", None, CheckLevel.LEDGER),
        (None, "0", CheckLevel.RELEASE),
        (None, "1", CheckLevel.FULL),
        ("release", "1", CheckLevel.RELEASE),
        ("", "0", CheckLevel.RELEASE),
    ],
)
def test_read_level(checks: str | None, contracts: str | None, expected: CheckLevel) -> None:
    assert switch._read_level(checks, contracts) is expected


def test_levels_are_ordered_and_named() -> None:
    assert [lv.label for lv in CheckLevel] == ["release", "owners", "ledger", "full"]
    assert all(parse_level(lv.label) is lv for lv in CheckLevel)
    assert CheckLevel.RELEASE < CheckLevel.OWNERS < CheckLevel.LEDGER < CheckLevel.FULL
    assert bool(CheckLevel.RELEASE)  # a level is never falsy, release included
    assert [lv.tracks_owners for lv in CheckLevel] == [False, True, True, True]
    assert [lv.keeps_history for lv in CheckLevel] == [False, False, True, True]
    assert [lv.contracts for lv in CheckLevel] == [False, False, False, True]
    with pytest.raises(ValueError, match="unknown checking level"):
        parse_level("on")


# ---------------------------------------------------------------------- the engine spec carries the level
@pytest.mark.parametrize(
    ("level", "ledger"),
    [(CheckLevel.RELEASE, NullLedger), (CheckLevel.OWNERS, OwnerTable), (CheckLevel.LEDGER, Ledger)],
)
def test_engine_spec_picks_the_pools_ledgers(level: CheckLevel, ledger: type) -> None:
    sched = build_engine(EngineSpec(checks=level))
    pools = (sched.kv_allocator, sched.req_to_token_pool, sched.mamba_pool)
    assert all(type(p.ledger) is ledger for p in pools), [type(p.ledger).__name__ for p in pools]
    assert not any(p.ledger.debug for p in pools)  # the data checks (poisoning) are the level full's


def test_engine_spec_refuses_full_in_a_process_below_full() -> None:
    if switch.ENABLED:
        assert EngineSpec(checks=CheckLevel.FULL).checks is CheckLevel.FULL
    else:
        with pytest.raises(InvalidArgument, match="needs a process started at full"):
            EngineSpec(checks=CheckLevel.FULL)


def test_engine_spec_refuses_a_level_given_by_name() -> None:
    with pytest.raises(InvalidArgument, match=r"EngineSpec\.checks"):
        EngineSpec(checks="owners")  # type: ignore[arg-type]


# ---------------------------------------------------------------------- the owner table itself
def _table() -> tuple[OwnerTable, Owner, Owner]:
    table = OwnerTable("t", range(1, 65))
    a, b = Owner("req", 1, REQ_RUNNING), Owner("req", 2, REQ_RUNNING)
    table.transfer(np.arange(1, 5), FREE_LIST, a, "alloc")
    table.transfer_each(np.arange(5, 45), FREE_LIST, [b] * 40, "alloc")
    return table, a, b


@pytest.mark.parametrize("ids", [[5], [1, 5], list(range(1, 30)), np.array([2, 40])])
def test_owner_table_refuses_ids_another_owner_holds(ids: Any) -> None:
    table, a, _b = _table()
    before = table.owner_table()
    with pytest.raises(ForeignSlot, match="not held by"):
        table.require_held_by(ids, a, "free")
    with pytest.raises(ContractViolation, match="I-NODUP-FREE / I-EXCLUSIVE"):
        table.transfer(ids, a, FREE_LIST, "free")
    assert table.owner_table() == before


def test_owner_table_refuses_a_repeated_id_and_keeps_no_history() -> None:
    table, a, _ = _table()
    with pytest.raises(ContractViolation, match="repeated"):
        table.transfer([1, 1], a, FREE_LIST, "free")
    table.transfer([1, 2], a, FREE_LIST, "free")
    assert table.held_count(a) == 2 and table.owner_of(1) is FREE_LIST
    assert table.history_of(1) == [] and "no move history" in table.describe([1], "x")
    table.audit(free_ids=[1, 2, *range(45, 65)])  # the counts and the table agree
    assert table.debug is False and Ledger("x", range(1, 3)).debug is True and NullLedger.debug is False


def test_the_spec_page_shows_the_levels_as_the_code_describes_them() -> None:
    """spec/checking-levels.md's table of levels is :func:`levels_table` (the CLI's ``--checks`` help is
    made from the same descriptions), so the page, the help and the run summary cannot drift apart."""
    from pathlib import Path

    from kvledger.contracts.levels import levels_table

    page = (Path(__file__).resolve().parents[2] / "spec" / "checking-levels.md").read_text(encoding="utf-8")
    start = page.index("| level | pools get |")
    table = page[start : page.index("\n\n", start)]
    assert table == levels_table(), "regenerate the table: print(kvledger.contracts.levels.levels_table())"


def test_the_checks_help_names_every_level_with_its_description() -> None:
    import argparse

    from kvledger.cli.checks import add_checks_option
    from kvledger.contracts.levels import LEVEL_DOCS

    parser = argparse.ArgumentParser()
    add_checks_option(parser)
    (action,) = [a for a in parser._actions if a.dest == "checks"]
    for level, doc in LEVEL_DOCS.items():
        assert f"{level.label}: {doc.short}" in (action.help or "")
    assert "poison" not in LEVEL_DOCS[CheckLevel.LEDGER].short  # ledger does not poison; full does
