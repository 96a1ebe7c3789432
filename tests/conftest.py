"""Test-suite settings: Hypothesis profiles, registered in one place.

Profiles (select with ``--hypothesis-profile=NAME`` or ``HYPOTHESIS_PROFILE=NAME``):

* ``ci``: derandomised, no example database, bounded budgets so the default run stays well under
  15 minutes on 2 cores. Hypothesis auto-loads a built-in profile named ``ci`` when ``CI`` is set;
  registering ours under the same name replaces it, so CI gets these budgets.
* ``dev`` (default locally): fewer examples, the local database on so a failure replays at once.
* ``fuzz``: campaigns longer than CI (HypoFuzz's ``hypothesis fuzz``), every worker sharing the example
  database ``$KVLEDGER_FUZZ_DB`` (default ``.hypothesis/fuzz-db``: a directory, or a Redis URL for
  workers on several machines, :mod:`kvledger.campaign.database`), so a failure one finds replays for all.
* ``deep``: long fuzzing (nightly), randomised; use with ``-m deep`` tests too. Under it every
  scheduler also recounts its identity in full after every step and compares it with the
  incremental one (``Accounting.recount_every_step``).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

from kvledger.campaign import STEPS_PER_EXAMPLE, example_database

# Every profile's parent is Hypothesis's own ``default`` profile, never the profile that happens to be
# loaded: with ``CI`` set, Hypothesis loads its built-in ``ci`` profile before this file runs, and a
# profile registered without a parent would inherit its ``derandomize=True`` and ``database=None``. The
# ``fuzz`` profile would then be one HypoFuzz refuses ("No property-based tests were collected"), and
# ``deep`` would not be randomised, on CI machines only (tests/test_hypothesis_profiles.py).
_HYPOTHESIS_DEFAULT = settings.get_profile("default")

settings.register_profile(
    "ci",
    parent=_HYPOTHESIS_DEFAULT,
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev",
    parent=_HYPOTHESIS_DEFAULT,
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "deep",
    parent=_HYPOTHESIS_DEFAULT,
    max_examples=2000,
    stateful_step_count=120,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "fuzz",  # HypoFuzz / long campaigns: a shared example database directory (README, spec/museum.md)
    parent=_HYPOTHESIS_DEFAULT,
    max_examples=10_000,
    stateful_step_count=STEPS_PER_EXAMPLE,  # the campaign's items replay with the same budget
    deadline=None,
    database=example_database(os.environ.get("KVLEDGER_FUZZ_DB", ".hypothesis/fuzz-db")),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

if os.environ.get("HYPOTHESIS_PROFILE") == "deep":  # the full recount after every step, not only at quiescence
    from kvledger.reference.scheduler.accounting import Accounting

    Accounting.recount_every_step = True

# ``@pytest.mark.fires("I-...")``: verified during the run (tests/fires_plugin.py).
from tests.fires_plugin import pytest_configure, pytest_runtest_call  # noqa: E402, F401

DEEP_TIMEOUT_S = 7200


def pytest_collection_modifyitems(config: object, items: list[object]) -> None:
    """A ``deep`` test runs under its own budget, never under the suite's 600 s pytest-timeout: one without
    an explicit ``@pytest.mark.timeout`` gets ``DEEP_TIMEOUT_S`` (issue 9: the model-oracle long fuzz was
    killed at 600 s)."""
    import pytest

    for item in items:
        if item.get_closest_marker("deep") and not item.get_closest_marker("timeout"):  # type: ignore[attr-defined]
            item.add_marker(pytest.mark.timeout(DEEP_TIMEOUT_S))  # type: ignore[attr-defined]
