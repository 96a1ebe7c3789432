"""``kvledger audit`` must start fast: its replay needs only the contracts, never torch or the reference.

Checked in a fresh interpreter (what is already imported in the test process proves nothing).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["kvledger.audit.replay", "kvledger.audit"])
def test_the_audit_imports_neither_torch_nor_the_reference_engine(module: str) -> None:
    code = (
        f"import json, sys, {module}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton')"
        " or m.startswith('kvledger.reference') or m.startswith('kvledger.kernels'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    heavy = json.loads(out.stdout.strip().splitlines()[-1])
    assert heavy == [], f"importing {module} pulled in {heavy[:10]}"
