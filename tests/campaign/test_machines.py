"""The generic machines as a fuzz campaign: many items, any number of pytest-xdist workers, one example
database (``scripts/campaign.py`` runs it; collected only under ``KVLEDGER_CAMPAIGN=1``).

Each item runs one machine for ``KVLEDGER_CAMPAIGN_EXAMPLES`` examples with Hypothesis's random seed,
so the items explore different streams; every worker reads and writes the example database at
``KVLEDGER_FUZZ_DB`` (a directory; Hypothesis's directory database is safe for several processes). A
failure one worker finds is saved there and replayed first by every later item of that machine, on any
worker, in this campaign and the next. ``KVLEDGER_FUZZ_DB`` may also be a Redis URL (``redis://HOST:PORT``,
``unix:///PATH``; :mod:`kvledger.campaign.database`): workers on several machines then share one store.
With ``KVLEDGER_CAMPAIGN_REPROS`` set, an item that fails writes a repro script there (the hunt's form:
``python repro_X.py`` fails naming the invariant), so a failure comes back as a script, not only as a
database entry. ``KVLEDGER_CAMPAIGN_EXHIBIT`` installs a museum exhibit for the
whole campaign (what the campaign's tests use to show a failure shared through the database); without
one the campaign is a clean run and any failure is a bug.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.reporting import with_reporter
from hypothesis.stateful import run_state_machine_as_test

from kvledger.campaign import STEPS_PER_EXAMPLE, example_database
from kvledger.museum.hunt import machine_class, repro_for_failure
from kvledger.museum.machines import MACHINES

SHARDS = int(os.environ.get("KVLEDGER_CAMPAIGN_SHARDS", "4"))
EXAMPLES = int(os.environ.get("KVLEDGER_CAMPAIGN_EXAMPLES", "50"))
CHOSEN = os.environ.get("KVLEDGER_CAMPAIGN_MACHINES", ",".join(MACHINES)).split(",")
EXHIBIT = os.environ.get("KVLEDGER_CAMPAIGN_EXHIBIT") or None
# Replay only what the database holds, generate nothing: after a fix, every known failure re-run at once.
REPLAY_ONLY = os.environ.get("KVLEDGER_CAMPAIGN_REPLAY_ONLY") == "1"
REPROS = os.environ.get("KVLEDGER_CAMPAIGN_REPROS") or None
DATABASE = example_database(os.environ.get("KVLEDGER_FUZZ_DB", ".hypothesis/fuzz-db"))


def _settings() -> settings:
    return settings(
        max_examples=EXAMPLES,
        stateful_step_count=STEPS_PER_EXAMPLE,  # HypoFuzz's budget: its failures replay whole
        deadline=None,
        derandomize=False,
        database=DATABASE,
        phases=(Phase.reuse,) if REPLAY_ONLY else (Phase.reuse, Phase.generate, Phase.target, Phase.shrink),
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )


def _exhibit() -> Any:
    if EXHIBIT is None:
        return None
    from kvledger.museum import exhibit

    return exhibit(EXHIBIT)


def _installed() -> Any:
    chosen = _exhibit()
    return contextlib.nullcontext() if chosen is None else chosen.installed()


@pytest.mark.parametrize("shard", range(SHARDS))
@pytest.mark.parametrize("machine", CHOSEN)
def test_machine(machine: str, shard: int, record_property: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    base = machine_class(machine)
    examples = 0
    original = base.__init__

    def counting_init(self: Any) -> None:
        nonlocal examples
        examples += 1
        original(self)

    # The class itself stays the factory (its digest is the database key every worker shares); only its
    # __init__ counts, for this item.
    monkeypatch.setattr(base, "__init__", counting_init)
    record_property("machine", machine)
    start = time.monotonic()
    report: list[str] = []
    try:
        with _installed(), with_reporter(lambda value: report.append(str(value))):
            run_state_machine_as_test(base, settings=_settings())
    except Exception as exc:
        if REPROS is not None:
            path = repro_for_failure(machine, exc, report, _exhibit(), Path(REPROS), f"{machine}_{shard}")
            record_property("repro", str(path) if path else None)
        raise
    finally:
        record_property("examples", examples)
        record_property("seconds", time.monotonic() - start)
