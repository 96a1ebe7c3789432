#!/usr/bin/env bash
# Install vLLM's v1 KV cache manager for kvledger.engines.vllm (spec/vllm-attach.md), side by side.
#
# * vllm==X with --no-deps --target .venv/vllm-X: vLLM's requirement list pins a CUDA torch and GPU
#   kernels; kvledger only imports vllm.v1.core (block pool, KV cache manager, coordinator) on CPU.
# * Into the same folder, with --no-deps and exact pins, the small pure-Python packages that
#   vllm.v1.core imports at module level and the shared venv lacks. Nothing in .venv itself is installed
#   or upgraded (torch, pydantic, msgspec, numpy already there are used as they are).
# * 0.29.0 and 0.30.0 (the release pair of vLLM PR #55450, spec/vllm-attach.md "Historical bugs") also
#   import the OpenAI front-end types at module level: exact pins of openai, openai-harmony and fastapi
#   go into their folders (never into .venv, whose older openai other code uses).
# * Grammar back-ends (xgrammar, llguidance) are not installed: kvledger.engines.vllm.loader gives them
#   stand-in modules, since vllm.v1.request only names their classes in annotations.
# Idempotent: each folder holds a stamp of its pins; a second run with the same pins does nothing.
# Prints one progress line.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
if [ ! -x "$PY" ]; then
  echo "setup_vllm.sh: run scripts/setup.sh first (no .venv)" >&2
  exit 2
fi
RELEASES=${KVLEDGER_VLLM_RELEASES:-0.34.0 0.29.0 0.30.0}
DEPS="cachetools==8.0.2 cbor2==6.3.0 cloudpickle==3.1.3 py-cpuinfo==9.0.0 prometheus_client==0.26.0 uvloop==0.23.0 blake3==1.0.11"
FRONTEND="openai==2.25.0 openai-harmony==0.0.8 fastapi==0.136.3"
want() {
  case $1 in
    0.29.0 | 0.30.0) echo "vllm==$1 $DEPS $FRONTEND" ;;
    *) echo "vllm==$1 $DEPS" ;;
  esac
}
todo=""
for v in $RELEASES; do
  dir=.venv/vllm-$v
  if [ -d "$dir/vllm" ] && [ "$(cat "$dir/.stamp" 2>/dev/null)" = "$(want "$v")" ]; then continue; fi
  todo="$todo $v"
done
if [ -z "$todo" ]; then
  echo "setup_vllm: vLLM$(printf ' %s' $RELEASES) already installed in .venv/vllm-*"
  exit 0
fi
echo "setup_vllm: installing vLLM$todo side by side in .venv/vllm-* (--no-deps, about 30 s each)"
for v in $todo; do
  dir=.venv/vllm-$v
  rm -rf "$dir"
  # shellcheck disable=SC2086
  "$PY" -m pip install --quiet --no-deps --target "$dir" $(want "$v") 2> >(grep -vE "already exists|is ignored" >&2 || true)
  want "$v" > "$dir/.stamp"
done
