#!/usr/bin/env bash
# The test command (README, CI): lint, CrossHair proofs, Triton-interpreter kernel tests, then the suite.
# The main pytest run comes last so its closing line is the summary CI reads.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
export KVLEDGER_CONTRACTS="${KVLEDGER_CONTRACTS:-1}"
echo "== ruff"
"$PY" -m ruff check kvledger tests scripts benchmarks
echo "== crosshair (pure arithmetic, bounded per condition)"
"$PY" scripts/crosshair_gate.py kvledger/contracts/arith.py kvledger/contracts/identity.py
echo "== kernels under the Triton interpreter (own process: TRITON_INTERPRET is read at import)"
TRITON_INTERPRET=1 "$PY" -m pytest -q -m interp tests/kernels -p no:cacheprovider
echo "== test suite (contracts on, Hypothesis profile ${HYPOTHESIS_PROFILE:-ci})"
HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}" "$PY" -m pytest -q -m "not interp and not gpu and not deep" "$@"
