"""One import of SGLang's memory modules per test session (about 8 s), shared by every engine test.

Without the extra (``bash scripts/setup_sglang.sh``) the tests skip with a one-line reason; in CI
(``CI`` set) a missing extra fails them instead, so CI never skips them silently.
"""

from __future__ import annotations

import os
from typing import Any

import pytest


@pytest.fixture(scope="session")
def sgl() -> Any:
    from kvledger.engines.sglang import available, load

    reason = available()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"the SGLang extra is missing in CI: {reason}", pytrace=False)
        pytest.skip(f"SGLang extra not installed: {reason}")
    return load()
