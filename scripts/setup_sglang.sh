#!/usr/bin/env bash
# Install the optional SGLang extra into ./.venv (kvledger.engines.sglang, spec/sglang-attach.md).
#
# * sglang==0.5.23 with --no-deps (its requirement list pins a CUDA torch and GPU kernels), then the
#   packages its memory modules import at module level: pyproject.toml's extra "sglang" (read from
#   there, one list), and compressed-tensors with --no-deps.
# * sglang==0.5.20 (the last release with MambaRadixCache) side by side in .venv/sglang-0.5.20 with
#   --no-deps --target, with the transformers and tokenizers that release pins (5.12.1 checks
#   tokenizers<=0.23.0 at import).
# * sglang==0.5.11 and 0.5.12 (a catalogued bug's last release and its fixing release, for
#   kvledger.engines.sglang.history) side by side in .venv/sglang-0.5.11 and .venv/sglang-0.5.12, each with
#   the transformers==5.6.0 both pin, tokenizers==0.22.2 and einops==0.8.2 (imported at module level by a
#   layer module of those releases). About 30 s each on top, 180 MB each.
# Never installs torch or triton. Idempotent: a stamp records what was installed; a second run with the
# same pins does nothing. Prints one progress line.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
if [ ! -x "$PY" ]; then
  echo "setup_sglang.sh: run scripts/setup.sh first (no .venv)" >&2
  exit 2
fi
CURRENT=0.5.23
PREVIOUS=0.5.20
PREVIOUS_DIR=.venv/sglang-$PREVIOUS
PREVIOUS_PINS="sglang==$PREVIOUS transformers==5.12.1 tokenizers==0.22.2"
HISTORICAL="0.5.11 0.5.12"
HISTORICAL_PINS="transformers==5.6.0 tokenizers==0.22.2 einops==0.8.2"
EXTRA=$("$PY" -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml","rb"))["project"]["optional-dependencies"]["sglang"]))')
STAMP=.venv/.sglang-extra.stamp
WANT="sglang==$CURRENT compressed-tensors==0.18.0 $EXTRA | $PREVIOUS_PINS | $HISTORICAL: $HISTORICAL_PINS"
historical_present() {
  for v in $HISTORICAL; do [ -d ".venv/sglang-$v/sglang" ] || return 1; done
}
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -d "$PREVIOUS_DIR/sglang" ] && historical_present \
   && "$PY" -c "import importlib.metadata as m; assert m.version('sglang') == '$CURRENT'" 2>/dev/null; then
  echo "sglang extra: up to date (sglang $CURRENT in .venv, $PREVIOUS in $PREVIOUS_DIR, $HISTORICAL beside it)"
  exit 0
fi
echo "sglang extra: installing sglang $CURRENT (+ its import-time packages), $PREVIOUS and $HISTORICAL side by side ..."
quiet() { "$@" > .venv/.sglang-extra.log 2>&1 || { cat .venv/.sglang-extra.log >&2; exit 1; }; }
# shellcheck disable=SC2086
quiet .venv/bin/pip install --quiet $EXTRA
quiet .venv/bin/pip install --quiet --no-deps "sglang==$CURRENT" compressed-tensors==0.18.0
rm -rf "$PREVIOUS_DIR"
# shellcheck disable=SC2086
quiet .venv/bin/pip install --quiet --no-deps --target "$PREVIOUS_DIR" $PREVIOUS_PINS
for v in $HISTORICAL; do
  rm -rf ".venv/sglang-$v"
  # shellcheck disable=SC2086
  quiet .venv/bin/pip install --quiet --no-deps --target ".venv/sglang-$v" "sglang==$v" $HISTORICAL_PINS
done
echo "$WANT" > "$STAMP"
