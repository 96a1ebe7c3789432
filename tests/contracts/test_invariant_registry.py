"""The invariant registry, its traceability check, the generated spec and the ``fires`` marker.

The repository itself must pass the check (``scripts/test.sh`` runs it too); each rule of the check is
then shown to fail on a small synthetic repository that breaks exactly that rule. Unknown IDs are built
by concatenation here, so this file does not itself use an ID the registry does not know.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from kvledger.contracts.errors import ContractViolation, DoubleFree, InvalidArgument
from kvledger.contracts.invariants import PROOFS, Origin, Severity, all_areas, all_invariants, by_id
from kvledger.contracts.invariants.model import Invariant, contract, proof
from kvledger.contracts.invariants.proofs import Proof
from kvledger.contracts.invariants.render import proof_domain, render_invariant_page, render_spec
from kvledger.contracts.invariants.trace import check, fired_by, resolve, scan_fires
from kvledger.contracts.invariants.unnamed import KNOWN_UNNAMED, unnamed_contracts, unnamed_problems
from tests.fires_plugin import missing_ids, recording_errors

ROOT = Path(__file__).resolve().parents[2]
UNKNOWN = "I-" + "NOT-REGISTERED"


# ---------------------------------------------------------------------- the repository as it is
def test_the_repository_passes_the_traceability_check() -> None:
    report = check(ROOT, all_invariants(), PROOFS, rendered_spec=render_spec(ROOT, all_areas(), PROOFS))
    assert report.ok, "\n".join(report.problems)
    assert report.invariants == len(by_id()) >= 40


def test_the_spec_lists_every_invariant_once_and_marks_its_origin() -> None:
    spec = (ROOT / "spec" / "invariants.md").read_text()
    for inv in all_invariants():
        assert spec.count(f"| **{inv.id}** |") == 1, inv.id
    assert "../shared" not in spec
    origins = {inv.origin for inv in all_invariants()}
    assert origins == {Origin.SGLANG, Origin.KVLEDGER}
    assert {inv.severity for inv in all_invariants()} == {Severity.BUG, Severity.OPERATING_ERROR}


def test_one_invariant_renders_as_a_page_of_its_own() -> None:
    inv = by_id()["I-LOCK-SYMMETRY"]
    page = render_invariant_page(inv, fired_by(ROOT)[inv.id])
    assert page.startswith("# I-LOCK-SYMMETRY: a release undoes exactly what its lock took\n")
    assert "* severity: **bug**" in page and "B14, fixed by SGLang PR #27147" in page
    assert (
        "* `tests/caches/test_contracts_fire.py::test_lock_symmetry_fires_for_the_b14_rederivation`" in page
    )


def test_proof_domains_come_from_the_preconditions() -> None:
    gap = next(p for p in PROOFS if p.function == "identity_gap")
    domain = proof_domain(ROOT, gap)
    assert domain.preconditions == ("len(parts) <= 32",) and domain.postconditions == 1  # MAX_TERMS, imported


# ---------------------------------------------------------------------- each rule, broken on purpose
def _inv(id_: str, *locations: str) -> Invariant:
    return Invariant(
        id=id_,
        title="t",
        statement="s",
        severity=Severity.BUG,
        origin=Origin.KVLEDGER,
        parts=("scheduler",),
        checks=tuple(contract(loc) for loc in locations),
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A tiny repository: one checked function, one test that fires I-COUNT."""
    (tmp_path / "kvledger").mkdir()
    (tmp_path / "kvledger" / "mod.py").write_text(
        "class Pool:\n    def free(self):\n        raise AssertionError('I-COUNT: x')\n\n\ndef f():\n    pass\n"
    )
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text(
        textwrap.dedent(
            """
            import pytest

            @pytest.mark.fires("I-COUNT")
            def test_fires():
                pass

            @pytest.mark.deep
            @pytest.mark.fires("I-CAP")
            def test_only_in_deep_runs():
                pass

            @pytest.mark.parametrize("x", [1, pytest.param(2, marks=pytest.mark.fires("I-COPY"))])
            def test_some_parameters(x):
                pass

            @pytest.mark.fires("I-PENDING")
            class TestGroup:
                def test_in_class(self):
                    pass
            """
        )
    )
    return tmp_path


def _problems(repo: Path, invariants: list[Invariant], proofs: tuple[Proof, ...] = ()) -> list[str]:
    return check(repo, invariants, proofs).problems


def test_scan_finds_markers_on_functions_parameters_and_classes(repo: Path) -> None:
    found = {t.name: t for t in scan_fires(repo)}
    assert set(found) == {
        "test_fires",
        "test_only_in_deep_runs",
        "test_some_parameters",
        "TestGroup::test_in_class",
    }
    assert found["test_fires"].ids == ("I-COUNT",) and found["test_fires"].default_run
    assert not found["test_only_in_deep_runs"].default_run
    assert found["test_some_parameters"].some_parameters and found["test_some_parameters"].ids == ("I-COPY",)
    assert found["TestGroup::test_in_class"].ids == ("I-PENDING",)


def test_a_clean_repo_passes(repo: Path) -> None:
    invariants = [_inv(i, "kvledger/mod.py:Pool.free") for i in ("I-COUNT", "I-COPY", "I-PENDING", "I-CAP")]
    problems = _problems(repo, invariants)
    assert problems == [
        "I-CAP: no test makes it fire (mark one with @pytest.mark.fires('I-CAP'), outside the"
        " deep/gpu markers)"
    ]


def test_an_id_defined_twice_fails(repo: Path) -> None:
    problems = _problems(repo, [_inv("I-COUNT", "kvledger/mod.py:f"), _inv("I-COUNT", "kvledger/mod.py:f")])
    assert any("I-COUNT: defined twice" in p for p in problems)


@pytest.mark.parametrize(
    ("location", "why"),
    [
        ("kvledger/nope.py:f", "no file kvledger/nope.py"),
        ("kvledger/mod.py:g", "defines no g"),
        ("kvledger/mod.py:Pool.alloc", "defines no Pool.alloc"),
    ],
)
def test_a_check_that_does_not_resolve_fails(repo: Path, location: str, why: str) -> None:
    problems = _problems(repo, [_inv("I-COUNT", location)])
    assert any(why in p for p in problems), problems


def test_an_invariant_without_a_raising_check_fails(repo: Path) -> None:
    only_proof = Invariant(
        id="I-COUNT",
        title="t",
        statement="s",
        severity=Severity.BUG,
        origin=Origin.KVLEDGER,
        parts=("scheduler",),
        checks=(proof("kvledger/mod.py:f"),),
    )
    problems = _problems(repo, [only_proof])
    assert any("no check that raises" in p for p in problems)
    assert any("is called a proof but proofs.PROOFS does not list it" in p for p in problems)
    assert not any(
        "PROOFS" in p for p in _problems(repo, [only_proof], (Proof("kvledger.mod.f", ("I-COUNT",)),))
    )


def test_an_invariant_without_a_firing_test_fails(repo: Path) -> None:
    problems = _problems(repo, [_inv("I-CAP", "kvledger/mod.py:f")])
    assert any(p.startswith("I-CAP: no test makes it fire") for p in problems)  # its only test is deep


def test_an_unknown_id_in_code_or_in_a_marker_fails(repo: Path) -> None:
    (repo / "kvledger" / "other.py").write_text(f'MESSAGE = "{UNKNOWN}: something"\n')
    (repo / "tests" / "test_b.py").write_text(
        f'import pytest\n\n@pytest.mark.fires("{UNKNOWN}")\ndef test_b():\n    pass\n'
    )
    problems = _problems(repo, [_inv("I-COUNT", "kvledger/mod.py:f")])
    assert any(p.startswith(f"{UNKNOWN}: used in kvledger/other.py:1") for p in problems), problems
    assert any(f"tests/test_b.py::test_b: fires {UNKNOWN}" in p for p in problems), problems


def test_a_stale_spec_fails(repo: Path) -> None:
    (repo / "spec").mkdir()
    (repo / "spec" / "invariants.md").write_text("old\n")
    report = check(repo, [_inv("I-COUNT", "kvledger/mod.py:f")], (), rendered_spec="new\n")
    assert any("spec/invariants.md is not up to date" in p for p in report.problems)


UNNAMED_CONTRACTS = textwrap.dedent(
    """
    from hypothesis.stateful import invariant as machine_invariant
    from kvledger.contracts.switch import ensure, invariant, require
    from kvledger.contracts.errors import ContractViolation

    @invariant(lambda self: self.n >= 0, "I-CAP: n is never negative")
    @invariant(lambda self: self.n < 9, "n stays small")
    class Pool:
        @require(lambda n: n > 0)
        @ensure(lambda result: result, description="I-COUNT: counted")
        def take(self, n):
            if n > 5:
                raise ContractViolation(f"took {n}")
            if n > 4:
                raise ContractViolation(f"I-COUNT: took {n}")
            return n

        @machine_invariant()
        def not_a_contract(self):
            pass
    """
)


def test_a_contract_without_an_id_fails_the_check(repo: Path) -> None:
    (repo / "kvledger" / "contracted.py").write_text(UNNAMED_CONTRACTS)
    problems = _problems(repo, [_inv("I-COUNT", "kvledger/mod.py:Pool.free")])
    unnamed = [p for p in problems if "without an invariant ID" in p]
    assert [p.split(": ")[0] for p in unnamed] == [
        "kvledger/contracted.py:7",  # a class invariant's description without an ID
        "kvledger/contracted.py:9",  # a precondition without a description
        "kvledger/contracted.py:13",  # an explicit violation whose text names none
    ], unnamed


def test_the_allowance_of_unnamed_contracts_is_per_file_and_an_upper_bound(repo: Path) -> None:
    (repo / "kvledger" / "contracted.py").write_text(UNNAMED_CONTRACTS)
    path = "kvledger/contracted.py"
    assert unnamed_problems(repo, {path: (3, "a debt")}) == []
    over = unnamed_problems(repo, {path: (2, "a debt")})
    assert len(over) == 3 and all("3 unnamed in this file, 2 allowed" in p for p in over)
    named = UNNAMED_CONTRACTS.replace('"n stays small"', '"I-CAP: n stays small"')
    named = named.replace("lambda n: n > 0)", 'lambda n: n > 0, "I-COUNT: positive")')
    (repo / "kvledger" / "contracted.py").write_text(named.replace('f"took {n}"', 'f"I-COUNT: took {n}"'))
    assert unnamed_problems(repo, {}) == []


def test_the_allowance_of_unnamed_contracts_is_tight() -> None:
    """The check fails on a file over its allowance; this keeps every allowance exact, so a contract fixed
    frees no room for a new unnamed one. The cache tree's contracts and the machines' checks name IDs."""
    per_file = Counter(u.path for u in unnamed_contracts(ROOT))
    assert "kvledger/reference/radix/mamba_radix_cache.py" not in per_file
    assert [p for p in per_file if p.startswith("kvledger/museum/") and not p.endswith("/checks.py")] == []
    loose = {
        path: (allowed, per_file[path]) for path, (allowed, _) in KNOWN_UNNAMED.items() if per_file[path] != allowed
    }
    assert not loose, f"KNOWN_UNNAMED allows more than a file has (path: (allowed, found)), lower it: {loose}"


def test_resolve_accepts_module_level_assignments(repo: Path) -> None:
    (repo / "kvledger" / "consts.py").write_text("LIMIT: int = 3\nOTHER = 4\n")
    assert resolve("kvledger/consts.py:LIMIT", repo) is None
    assert resolve("kvledger/consts.py:OTHER", repo) is None
    assert resolve("kvledger/consts.py", repo) is None


# ---------------------------------------------------------------------- the fires marker
def test_recording_sees_errors_caught_by_pytest_raises_and_restores_the_classes() -> None:
    inits = (ContractViolation.__dict__.get("__init__"), DoubleFree.__dict__.get("__init__"))
    with recording_errors() as seen:
        with pytest.raises(DoubleFree):
            raise DoubleFree("[kv] free: slot 3 already free")
        with pytest.raises(ContractViolation):
            raise ContractViolation("I-COUNT: 1 tokens unaccounted")
        InvalidArgument("count must be >= 0")
    assert [type(e) for e in seen] == [DoubleFree, ContractViolation, InvalidArgument]
    assert missing_ids(["I-NODUP-FREE", "I-COUNT", "I-TYPED-INPUT", "I-CAP"], seen) == ["I-CAP"]
    assert (ContractViolation.__dict__.get("__init__"), DoubleFree.__dict__.get("__init__")) == inits
    with recording_errors() as after:
        pass
    ContractViolation("I-COUNT")
    assert after == []


def test_a_test_that_declares_fires_but_does_not_fire_fails(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(
        "from tests.fires_plugin import pytest_configure, pytest_runtest_call\n"
    )
    (tmp_path / "test_marked.py").write_text(
        textwrap.dedent(
            """
            import pytest
            from kvledger.contracts.errors import ContractViolation

            @pytest.mark.fires("I-COUNT")
            def test_really_fires():
                with pytest.raises(ContractViolation):
                    raise ContractViolation("I-COUNT: 1 tokens unaccounted (leak)")

            @pytest.mark.fires("I-CAP")
            def test_claims_but_does_not_fire():
                with pytest.raises(ContractViolation):
                    raise ContractViolation("I-COUNT: something else")
            """
        )
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), KVLEDGER_CONTRACTS="1")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert "1 failed, 1 passed" in done.stdout, done.stdout + done.stderr
    assert (
        "declared @pytest.mark.fires('I-CAP') but no ContractViolation or KVLedgerError naming it"
        in done.stdout
    )
    assert "saw: ContractViolation: I-COUNT: something else" in done.stdout
