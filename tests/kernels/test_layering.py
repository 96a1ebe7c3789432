"""House rule: ``kvledger.kernels`` depends on nothing else in kvledger (tensors in, tensors out)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kvledger.kernels

PACKAGE = Path(kvledger.kernels.__file__).resolve().parent
FORBIDDEN = ("kvledger.contracts", "kvledger.reference")


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_kernels_source_imports_no_other_kvledger_package():
    offenders = {
        f"{path.name}: {name}"
        for path in PACKAGE.glob("*.py")
        for name in _imported_modules(path)
        if name.startswith(FORBIDDEN)
    }
    assert not offenders


@pytest.mark.slow
def test_importing_kernels_loads_no_other_kvledger_package():
    code = "import sys, kvledger.kernels; print(sorted(m for m in sys.modules if m.startswith('kvledger')))"
    root = str(PACKAGE.parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root, check=False
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert not [m for m in ast.literal_eval(out) if m.startswith(FORBIDDEN)]
