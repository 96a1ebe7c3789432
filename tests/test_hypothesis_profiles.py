"""The Hypothesis profiles of tests/conftest.py mean the same on a CI machine as on a laptop.

With ``CI`` set, Hypothesis loads its built-in ``ci`` profile (derandomised, no database) at import,
before the suite's conftest registers its own. A stop's CI once failed on this: the ``fuzz`` profile,
registered without a parent, inherited ``derandomize=True``, and HypoFuzz refused every target ("No
property-based tests were collected") on CI machines only. Each profile is loaded here in a fresh
interpreter, with and without ``CI``, exactly as ``HYPOTHESIS_PROFILE`` selects it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_READ_LOADED = (
    "import json, tests.conftest; from hypothesis import settings; s = settings.default; "
    "print(json.dumps({'derandomize': s.derandomize, 'database': s.database is not None, "
    "'max_examples': s.max_examples}))"
)


def _loaded(profile: str, *, ci: bool) -> dict[str, object]:
    """The settings a fresh interpreter ends up with after the suite's conftest loads ``profile``."""
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "HYPOTHESIS_PROFILE")}
    env["HYPOTHESIS_PROFILE"] = profile
    env["KVLEDGER_FUZZ_DB"] = str(ROOT / ".hypothesis" / "profile-test-db")  # a directory: nothing is written
    if ci:
        env["CI"] = "true"
    out = subprocess.run(
        [sys.executable, "-c", _READ_LOADED], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    loaded: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return loaded


@pytest.mark.parametrize("ci", [False, True], ids=["laptop", "CI-set"])
def test_the_fuzz_profile_is_one_hypofuzz_accepts(ci: bool) -> None:
    """HypoFuzz skips a test that is derandomised or has no database (hypofuzz/collection.py)."""
    loaded = _loaded("fuzz", ci=ci)
    assert loaded["derandomize"] is False, loaded
    assert loaded["database"] is True, loaded


@pytest.mark.parametrize("ci", [False, True], ids=["laptop", "CI-set"])
def test_the_deep_profile_is_randomised_wherever_it_runs(ci: bool) -> None:
    loaded = _loaded("deep", ci=ci)
    assert loaded["derandomize"] is False, loaded
    assert loaded["max_examples"] == 2000, loaded


@pytest.mark.parametrize("ci", [False, True], ids=["laptop", "CI-set"])
def test_the_ci_profile_is_derandomised_without_a_database_wherever_it_runs(ci: bool) -> None:
    loaded = _loaded("ci", ci=ci)
    assert loaded == {"derandomize": True, "database": False, "max_examples": 100}, loaded
