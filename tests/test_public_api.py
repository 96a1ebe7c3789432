"""``import kvledger``: the supported surface is importable from the package, lazily, and typed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import kvledger


def test_every_exported_name_resolves_to_its_definition() -> None:
    import kvledger.audit
    import kvledger.contracts.ledger
    import kvledger.reference.scheduler

    for name in kvledger.__all__:
        assert getattr(kvledger, name) is not None, name
    assert kvledger.Ledger is kvledger.contracts.ledger.Ledger
    assert kvledger.Scheduler is kvledger.reference.scheduler.Scheduler
    assert kvledger.audit_file is kvledger.audit.audit_file
    assert set(kvledger.__all__) <= set(dir(kvledger))


def test_the_surface_covers_pools_caches_scheduler_ownership_and_the_audit() -> None:
    wanted = {
        "TokenToKVPoolAllocator", "PagedTokenToKVPoolAllocator", "ReqToTokenPool", "MambaPool",
        "RadixCache", "MambaRadixCache", "Scheduler", "SchedulerConfig", "build_engine", "EngineSpec",
        "Ledger", "Owner", "Account", "FREE_LIST", "ContractViolation", "KVLedgerError",
        "KVAllocator", "ReqRowPool", "MambaStatePool", "PrefixCache", "MambaPrefixCache",
        "audit_file", "Auditor", "Recorder",
        "build_pd", "PDSpec", "PDSystem", "PrefillScheduler", "DecodeScheduler", "MetadataBufferPool",
    }  # fmt: skip
    assert wanted <= set(kvledger.__all__)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = kvledger.Nope  # type: ignore[attr-defined]


def test_import_kvledger_is_light() -> None:
    code = "import sys, kvledger; print('torch' in sys.modules, 'kvledger.reference' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_the_package_ships_its_type_marker() -> None:
    assert (Path(kvledger.__file__).parent / "py.typed").is_file()
