"""Catalogued bugs in the SGLang releases that had them: the generic Mamba machine, driven with the attach,
finds the bug in the release that had it and runs the release that fixed it clean (each release in its own
process; spec/sglang-attach.md, "Historical bugs"). B14: the tree-level machine, 0.5.11 -> 0.5.12. N1: the
same machine with SGLang's own request objects (``--tree=requests``), 0.5.12 -> 0.5.13."""

from __future__ import annotations

import os

import pytest

from kvledger.engines.sglang import history
from kvledger.engines.sglang.history import B14_UNIFIED, N1_PING_PONG, HistoricalBug


def require(bug: HistoricalBug) -> None:
    missing = [v for v in (bug.has_it, bug.fixed_in) if not history.installed(v)]
    if not missing:
        return
    if os.environ.get("CI"):
        pytest.fail(
            f"SGLang {', '.join(missing)} missing in CI (scripts/setup_sglang.sh installs them)",
            pytrace=False,
        )
    pytest.skip(f"SGLang {', '.join(missing)} not installed beside .venv: bash scripts/setup_sglang.sh")


@pytest.mark.slow
def test_b14_shrunk_calls_fire_in_the_release_with_the_bug_and_pass_in_the_fixing_one() -> None:
    """CI's budget: the rule calls the hunt shrank to, replayed in 0.5.11 (fires at the last call, the
    eviction) and in 0.5.12 (clean)."""
    require(B14_UNIFIED)
    bad = history.replay_in(B14_UNIFIED.has_it, B14_UNIFIED)
    assert bad["version"] == B14_UNIFIED.has_it
    assert bad["found"] is not None and B14_UNIFIED.invariant in bad["found"], bad
    assert "_cascade_evict" in bad["found"]  # SGLang's own assertion, the attach names the invariant
    good = history.replay_in(B14_UNIFIED.fixed_in, B14_UNIFIED)
    assert good == {"version": B14_UNIFIED.fixed_in, "found": None}


@pytest.mark.slow
def test_b14_own_path_fires_lock_symmetry_at_the_unlock_in_the_release_with_the_bug_only() -> None:
    """B14's path arranged from the machine's rules (drive_mamba.B14_UNLOCK): the unlock of a lock taken
    on a tombstone releases another holder's state lock in 0.5.11; 0.5.12 keeps the skip record."""
    require(B14_UNIFIED)
    bad = history.replay_in(B14_UNIFIED.has_it, B14_UNIFIED, calls="B14_UNLOCK")
    assert bad["found"] is not None and "I-LOCK-SYMMETRY" in bad["found"], bad
    assert "mamba_lock_ref 1 -> 0" in bad["found"]
    good = history.replay_in(B14_UNIFIED.fixed_in, B14_UNIFIED, calls="B14_UNLOCK")
    assert good == {"version": B14_UNIFIED.fixed_in, "found": None}


@pytest.mark.deep
def test_b14_hunt_finds_it_in_the_release_with_the_bug_and_the_fixing_release_runs_clean() -> None:
    """The full hunt (1,500 examples of 30 rule calls in each release; several minutes each)."""
    require(B14_UNIFIED)
    bad = history.hunt_in(B14_UNIFIED.has_it, B14_UNIFIED)
    assert bad["found"] is not None and B14_UNIFIED.invariant in bad["found"], bad
    assert bad["steps"][-1].startswith("state.evict_states")  # found at the eviction, its first bad step
    good = history.hunt_in(B14_UNIFIED.fixed_in, B14_UNIFIED)
    assert good["found"] is None, good


@pytest.mark.slow
def test_n1_shrunk_calls_fire_at_the_retract_in_the_release_with_the_bug_and_pass_in_the_fixing_one() -> None:
    """CI's budget for N1: the three rule calls the hunt shrank to (extra buffer on; admit a request;
    retract it), replayed in 0.5.12 (I-HANDLE-OWNED when the retract's cache_finished_req returns: the
    ping-pong slots are free, the handle still names them) and in 0.5.13 (free_mamba_cache clears it)."""
    require(N1_PING_PONG)
    bad = history.replay_in(N1_PING_PONG.has_it, N1_PING_PONG)
    assert bad["version"] == N1_PING_PONG.has_it
    assert bad["found"] is not None and N1_PING_PONG.invariant in bad["found"], bad
    assert "mamba_ping_pong_track_buffer" in bad["found"] and "free_list" in bad["found"]
    good = history.replay_in(N1_PING_PONG.fixed_in, N1_PING_PONG)
    assert good == {"version": N1_PING_PONG.fixed_in, "found": None}


@pytest.mark.slow
def test_the_request_machine_runs_a_short_budget_clean_on_the_fixing_release() -> None:
    """CI's budgeted run of the request machine itself (not a replay): 25 examples of 30 rule calls on
    0.5.13, every scheduler-level call watched, no violation."""
    require(N1_PING_PONG)
    good = history.hunt_in(N1_PING_PONG.fixed_in, N1_PING_PONG, examples=25)
    assert good["found"] is None, good


@pytest.mark.deep
def test_n1_hunt_finds_it_in_the_release_with_the_bug_and_the_fixing_release_runs_clean() -> None:
    """The full hunt for N1 (300 examples of 30 rule calls in each release, request rules among the
    Mamba machine's; a few minutes each): found at the first release of a request, clean after the fix."""
    require(N1_PING_PONG)
    bad = history.hunt_in(N1_PING_PONG.has_it, N1_PING_PONG)
    assert bad["found"] is not None and N1_PING_PONG.invariant in bad["found"], bad
    assert bad["steps"][-1].startswith("state.retract")  # the release that leaves the handle set
    good = history.hunt_in(N1_PING_PONG.fixed_in, N1_PING_PONG)
    assert good["found"] is None, good
