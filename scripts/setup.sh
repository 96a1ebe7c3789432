#!/usr/bin/env bash
# Set up kvledger in ./.venv: torch first (the release pinned here), then the package with its test tools.
#
# torch is installed on its own, pinned, and only when the venv cannot already import one: a bare
# "torch>=2.4" resolved by pip would pull the newest release (a multi-GB CUDA build). On this kind of
# machine torch==2.13.0 is a CPU wheel that lies on disk; on a GPU machine it is the CUDA build.
#
# The package is installed editable in setuptools' "compat" mode: a .pth file that puts this checkout on
# sys.path, which type checkers follow (mypy --strict on a script outside the clone finds kvledger; the
# default editable finder is an import hook that mypy cannot see).
#
# Each step prints one line before it starts, so a quiet pip is never mistaken for a hang.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${KVLEDGER_TORCH_SPEC:-torch==2.13.0}
step() { echo "setup: $* ($(date +%T))"; }
if [ ! -x .venv/bin/python ]; then
  step "creating .venv with $("$PYTHON" --version 2>&1)"
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  step "installing $TORCH_SPEC (about 30 s from a local wheel; minutes if pip has to download it)"
  .venv/bin/pip install --quiet "$TORCH_SPEC" 2> >(grep -v "is ignored" >&2)
fi
step "installing kvledger (editable) and its test and docs tools (about a minute)"
.venv/bin/pip install --quiet -e ".[dev]" --config-settings editable_mode=compat 2> >(grep -v "is ignored" >&2)
step "installing SGLang's memory components for kvledger.engines.sglang (0.5.23; 0.5.20, 0.5.13, 0.5.12, 0.5.11, 0.5.10, 0.5.9 and 0.5.5.post1/post2 beside it; about 6 min the first time)"
bash scripts/setup_sglang.sh
step "installing vLLM's v1 KV cache manager for kvledger.engines.vllm (0.34.0, and 0.29.0/0.30.0 for PR #55450, in .venv/vllm-*; about 30 s each the first time)"
bash scripts/setup_vllm.sh
step "done: $(.venv/bin/kvledger --version)"
