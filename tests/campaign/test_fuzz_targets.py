"""The generic machines as HypoFuzz targets (``hypothesis fuzz``; README "Campaigns"): collected only
under ``KVLEDGER_CAMPAIGN=1``, like the rest of this folder.

HypoFuzz fuzzes Hypothesis tests that have a database, and a ``RuleBasedStateMachine``'s ``TestCase`` is
one. Each target takes the ``fuzz`` profile's settings (tests/conftest.py: 60 steps per example and the
database ``$KVLEDGER_FUZZ_DB``, a directory or a Redis URL), so the failures HypoFuzz finds land where
every other HypoFuzz worker, on any machine sharing that database, reads them. Run with
``HYPOTHESIS_PROFILE=fuzz``.
"""

from __future__ import annotations

from kvledger.museum.hunt import machine_class

TestSchedulerMachine = machine_class("scheduler").TestCase
TestPDMachine = machine_class("pd").TestCase
TestCacheMachine = machine_class("cache").TestCase
