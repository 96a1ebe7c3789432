"""The generic machines as HypoFuzz targets (``hypothesis fuzz``; README "Campaigns"): collected only
under ``KVLEDGER_CAMPAIGN=1``, like the rest of this folder.

HypoFuzz fuzzes Hypothesis tests that have a database, and a ``RuleBasedStateMachine``'s ``TestCase`` is
one. Each target takes the ``fuzz`` profile's settings (tests/conftest.py: 60 steps per example and the
database ``$KVLEDGER_FUZZ_DB``, a directory or a Redis URL), so the failures HypoFuzz finds land where
every other HypoFuzz worker, on any machine sharing that database, reads them. Run with
``HYPOTHESIS_PROFILE=fuzz``.

``KVLEDGER_CAMPAIGN_EXHIBIT=B1`` installs a museum exhibit for the life of the fuzzing process (as
``scripts/campaign.py --exhibit`` does for its workers): a planted bug for HypoFuzz to find, which shows
that what HypoFuzz saves is what ``scripts/campaign.py --replay-only`` replays.
"""

from __future__ import annotations

import contextlib
import os

from kvledger.museum import exhibit
from kvledger.museum.hunt import machine_class

_EXHIBIT = os.environ.get("KVLEDGER_CAMPAIGN_EXHIBIT") or None
_INSTALLED = contextlib.ExitStack()  # never closed: a HypoFuzz worker exists to fuzz this one build
if _EXHIBIT is not None:
    _INSTALLED.enter_context(exhibit(_EXHIBIT).installed())

TestSchedulerMachine = machine_class("scheduler").TestCase
TestPDMachine = machine_class("pd").TestCase
TestCacheMachine = machine_class("cache").TestCase
