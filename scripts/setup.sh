#!/usr/bin/env bash
# Set up kvledger in ./.venv: torch first (the release pinned here), then the package with its test tools.
#
# torch is installed on its own, pinned, and only when the venv cannot already import one: a bare
# "torch>=2.4" resolved by pip would pull the newest release (a multi-GB CUDA build). On this kind of
# machine torch==2.13.0 is a CPU wheel that lies on disk; on a GPU machine it is the CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${KVLEDGER_TORCH_SPEC:-torch==2.13.0}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  .venv/bin/pip install --quiet "$TORCH_SPEC" 2> >(grep -v "is ignored" >&2)
fi
.venv/bin/pip install --quiet -e ".[dev]" 2> >(grep -v "is ignored" >&2)
.venv/bin/kvledger --version
