"""The museum's registry, its scoped patches, and a bounded CI hunt.

The CI hunt bounds each exhibit by a number of example batches at a fixed seed (never by the clock), so
what it asserts (found, and naming an invariant the exhibit lists) is deterministic; ``-m deep`` hunts
every in-scope exhibit. ``kvledger hunt --all --budget 60`` is the measured, wall-clock version.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvledger.contracts import switch
from kvledger.contracts.invariants import by_id
from kvledger.museum import EXHIBITS, exhibit, huntable
from kvledger.museum.hunt import hunt
from kvledger.museum.machines import MACHINES

needs_contracts = pytest.mark.skipif(not switch.ENABLED, reason="contracts are off (KVLEDGER_CONTRACTS=0)")

REQUIRED = {
    "B1", "B2", "B4", "B5", "#16067", "B7", "B8", "B9", "B10", "B11", "B14", "B16", "B17", "B18", "B20",
    "B21", "vLLM-prediction", "vLLM-oversize", "N1", "N4", "N5", "N6a", "N9",
}  # fmt: skip

# Exhibits the generic machines find within CI_BATCHES batches (of 8 examples) at one of the seeds
# 0..CI_SEEDS-1, tried in order (the first find ends the test), measured with ``kvledger hunt --all
# --seeds 5 --batches 8`` (spec/museum.md); the others are hunted by ``-m deep``. A rare exhibit's first
# find moves between seeds whenever a machine's draws change (the edge draws moved B5 from seed 0 to
# seed 2, at the same rate of one seed in five), so a single seed would test the luck of one stream.
CI_BATCHES = 8
CI_SEEDS = 5
# B5 and B7 (an aborted waiting request keeps its copy-on-write slot) are rare: the follow-up arrivals and
# the abort aimed at the waiting queue (issue 25) bring them to 2 seeds in 5 within CI_BATCHES (seeds 0
# and 3, 26 and 43 examples; they were at none of seeds 0..4 once the speculative draws joined).
# Re-measured on the final machines (spec/museum.md, "On the final machines"): every exhibit below is first
# found within CI_BATCHES at seed 0; B2, vLLM-prediction and B16-spec joined (16, 7 and 60 examples).
CI_HUNT = [
    "B1", "B2", "B4", "B5", "#16067", "B7", "B8", "B9", "B11", "B14", "B16", "B17", "B21", "vLLM-prediction",
    "vLLM-oversize", "N1", "N4", "N4-reader", "N5", "N6a", "N9", "B16-spec",
]  # fmt: skip
DEEP_BATCHES = 250  # 2000 examples
NOT_FOUND: dict[str, str] = {}  # exhibit id -> why the deep hunt cannot find it (a strict xfail)


def test_the_catalogue_is_complete_and_every_invariant_is_registered() -> None:
    ids = [e.id for e in EXHIBITS]
    assert len(ids) == len(set(ids))
    assert set(ids) >= REQUIRED
    registry = by_id()
    for e in EXHIBITS:
        assert e.upstream and e.title and len(e.mechanism) > 80, e.id
        assert e.breaks and all(i in registry for i in e.breaks), (e.id, e.breaks)
        if e.scope == "out of scope":
            assert e.reenact is None and len(e.why_out_of_scope) > 40, e.id
            with pytest.raises(LookupError, match="out of the model's scope"):
                e.installed()
        else:
            assert e.reenact is not None and e.replaces and not e.why_out_of_scope, e.id
            assert e.machine in MACHINES, (e.id, e.machine)


def _resolve(dotted: str) -> object:
    """``Class.method`` among the reference's modules, or ``module.function``."""
    import importlib

    import kvledger.reference.disagg.channel as channel
    import kvledger.reference.disagg.decode as decode
    import kvledger.reference.disagg.instance as instance
    import kvledger.reference.disagg.prefill as prefill
    import kvledger.reference.radix as radix
    import kvledger.reference.scheduler.cache_paths as cache_paths
    import kvledger.reference.scheduler.memory as memory
    import kvledger.reference.scheduler.scheduler as scheduler
    import kvledger.reference.scheduler.spec_config as spec_config
    import kvledger.reference.scheduler.speculative as speculative
    import kvledger.reference.scheduler.tracking as tracking

    owner_name, attr = dotted.rsplit(".", 1)
    modules = (
        scheduler, memory, cache_paths, tracking, radix, channel, decode, instance, prefill, speculative, spec_config
    )
    for module in modules:
        if hasattr(module, owner_name):
            return vars(getattr(module, owner_name)).get(attr)
    return getattr(importlib.import_module(owner_name), attr)


@pytest.mark.parametrize("exhibit_id", [e.id for e in huntable()])
def test_an_exhibit_replaces_exactly_what_it_names_and_restores_it(exhibit_id: str) -> None:
    e = exhibit(exhibit_id)
    before = {name: _resolve(name) for name in e.replaced}
    with e.installed():
        for name, original in before.items():
            assert _resolve(name) is not original, f"{e.id} did not replace {name}"
    for name, original in before.items():
        assert _resolve(name) is original, f"{e.id} left {name} replaced"


@needs_contracts
@pytest.mark.parametrize("exhibit_id", CI_HUNT)
@pytest.mark.timeout(1800)  # bounded by examples, not the clock: B5 took 385 s at load 12-16 (idle: ~40 s)
def test_the_generic_machines_find_the_exhibit(exhibit_id: str, tmp_path: Path) -> None:
    e = exhibit(exhibit_id)
    bounds = {"budget": 3600, "max_batches": CI_BATCHES, "shrink_seconds": 2, "minimize_seconds": 2}
    for seed in range(CI_SEEDS):
        result = hunt(e, out_dir=tmp_path, verify=False, seed=seed, **bounds)  # type: ignore[arg-type]
        if result.found:
            break
    assert result.found, f"{e.id}: not found in {CI_BATCHES} batches at any of seeds 0..{CI_SEEDS - 1}"
    assert result.invariant in e.breaks, (e.id, result.invariant, result.message)
    assert result.repro is not None and result.repro_steps


@needs_contracts
def test_a_repro_script_fails_with_the_same_violation_and_passes_without_the_exhibit(tmp_path: Path) -> None:
    e = exhibit("B8")
    result = hunt(e, budget=3600, seed=0, max_batches=CI_BATCHES, shrink_seconds=5, out_dir=tmp_path, verify=True)
    assert result.found and result.repro_verified, result
    script = Path(result.repro or "")
    clean = script.with_name("repro_without_exhibit.py")
    clean.write_text(script.read_text().replace("EXHIBIT = 'B8'", "EXHIBIT = None"))
    proc = subprocess.run([sys.executable, str(clean)], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]


@needs_contracts
def test_a_clean_hunt_finds_nothing() -> None:
    result = hunt(None, machine="scheduler", budget=3600, seed=1, max_batches=2, verify=False)
    assert not result.found, result.message


@needs_contracts
def test_a_clean_hunt_of_the_cache_machine_finds_nothing() -> None:
    result = hunt(None, machine="cache", budget=3600, seed=1, max_batches=4, verify=False)
    assert not result.found, result.message


@needs_contracts
def test_the_cache_machines_repro_replays_as_a_plain_script(tmp_path: Path) -> None:
    """The cache machine's rules draw plain arguments: the printed calls replay outside Hypothesis.

    Hypothesis's shrink is cut by the clock (5 s), so on a busy machine it stops earlier; the hunt's own
    pass that deletes rule calls one at a time runs here to its fixed point (it stops there, well within
    the generous bound: about 2 s), so the repro's length does not depend on the machine's load."""
    bounds = {"budget": 3600, "seed": 0, "max_batches": CI_BATCHES, "shrink_seconds": 5, "minimize_seconds": 600}
    result = hunt(exhibit("B14"), out_dir=tmp_path, **bounds)  # type: ignore[arg-type]
    assert result.machine == "cache" and result.found and result.repro_verified, result
    assert result.repro_steps is not None and result.repro_steps <= 15, result.steps


@pytest.mark.deep
@needs_contracts
@pytest.mark.parametrize(
    "exhibit_id",
    [
        pytest.param(e.id, marks=pytest.mark.xfail(reason=NOT_FOUND[e.id], strict=True)) if e.id in NOT_FOUND else e.id
        for e in huntable()
    ],
)
def test_deep_hunt_finds_every_exhibit(exhibit_id: str, tmp_path: Path) -> None:
    """``pytest -m deep``: every in-scope exhibit, up to DEEP_BATCHES batches at seed 0, repro verified."""
    e = exhibit(exhibit_id)
    result = hunt(e, budget=3600, seed=0, max_batches=DEEP_BATCHES, shrink_seconds=20, out_dir=tmp_path, verify=True)
    assert result.found and result.repro_verified, (e.id, result.message)
    assert result.invariant in e.breaks, (e.id, result.invariant, result.message)


def test_explore_clean_scopes_to_depth_3() -> None:
    from kvledger.museum.explore import SCOPES, explore

    for scope in SCOPES:
        result = explore(scope, 3)
        assert result.violation is None, (scope.name, result.violation, result.path)
        assert result.complete and result.depth_reached == 3 and result.states > 10


@needs_contracts
def test_explore_finds_the_16067_exhibit_in_a_short_schedule() -> None:
    from kvledger.museum.explore import SCOPES, explore

    with exhibit("#16067").installed():
        result = explore(SCOPES[0], 3)
    assert result.invariant == "I-COW-STOPPER" and len(result.path) <= 3, result


@needs_contracts
def test_a_hunt_draws_the_same_examples_whatever_the_process_imported_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hypothesis draws some values from the constants of the local modules loaded so far; the hunt pins
    that pool, so a module imported in between (here one full of small ints) changes nothing.

    Compared: the examples up to the first failure (fixed by the draws alone) and the invariant it names.
    Not the shrunk steps: Hypothesis's shrink is cut by the clock, so on a busy machine two runs of the
    same draws can stop one deletion apart (seen in CI: an extra ``inject_allocation_failure`` left in)."""
    import importlib

    bounds = {"budget": 3600, "seed": 0, "max_batches": CI_BATCHES, "shrink_seconds": 2, "minimize_seconds": 0}
    first = hunt(exhibit("B21"), out_dir=tmp_path / "a", verify=False, **bounds)  # type: ignore[arg-type]
    (tmp_path / "many_constants.py").write_text(
        "".join(f"C{i} = {i}\n" for i in range(100)) + "".join(f"S{i} = {i * 7 + 3}\n" for i in range(100))
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("many_constants")
    second = hunt(exhibit("B21"), out_dir=tmp_path / "b", verify=False, **bounds)  # type: ignore[arg-type]
    assert first.found and second.found
    assert (first.examples, first.invariant) == (second.examples, second.invariant)
