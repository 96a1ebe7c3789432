#!/usr/bin/env bash
# The test command (README, CI): lint, invariant traceability, type checks, the docs build, CrossHair proofs,
# Triton-interpreter kernel tests, then the suite.
# The main pytest run comes last so its closing line is the summary CI reads.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
export KVLEDGER_CONTRACTS="${KVLEDGER_CONTRACTS:-1}"
echo "== ruff"
"$PY" -m ruff check kvledger tests scripts benchmarks
echo "== invariant traceability (registry, contracts, firing tests, IDs in use, generated spec)"
"$PY" -m kvledger.contracts.invariants check
echo "== mypy (strict on kvledger/contracts and kvledger/audit, the project's config elsewhere; pyproject.toml)"
"$PY" -m mypy kvledger tests/contracts/test_protocols.py
echo "== docs (mkdocs build --strict: spec pages from spec/, the invariant table, diagrams, API reference; scripts/mkdocs_hooks.py)"
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet  # into site/ (ignored by git)
echo "== crosshair (the registry's proof targets: every postcondition declared proved must be confirmed)"
"$PY" scripts/crosshair_gate.py
echo "== kernels under the Triton interpreter (own process: TRITON_INTERPRET is read at import)"
TRITON_INTERPRET=1 "$PY" -m pytest -q -m interp tests/kernels -p no:cacheprovider
echo "== bad-input sweep with contracts off (own process: KVLEDGER_CONTRACTS is read at import)"
KVLEDGER_CONTRACTS=0 "$PY" -m pytest -q tests/sweep -p no:cacheprovider
echo "== test suite (contracts on, Hypothesis profile ${HYPOTHESIS_PROFILE:-ci})"
HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}" "$PY" -m pytest -q -m "not interp and not gpu and not deep" "$@"
