#!/usr/bin/env bash
# Install the optional SGLang extra into ./.venv (kvledger.engines.sglang, spec/sglang-attach.md).
#
# * sglang==0.5.23 with --no-deps (its requirement list pins a CUDA torch and GPU kernels), then the
#   packages its memory modules import at module level: pyproject.toml's extra "sglang" (read from
#   there, one list), and compressed-tensors with --no-deps.
# * sglang==0.5.20 (the last release with MambaRadixCache) side by side in .venv/sglang-0.5.20 with
#   --no-deps --target, with the transformers and tokenizers that release pins (5.12.1 checks
#   tokenizers<=0.23.0 at import).
# * sglang==0.5.11, 0.5.12 and 0.5.13 (catalogued bugs' last releases and their fixing releases, for
#   kvledger.engines.sglang.history: B14 0.5.11 -> 0.5.12, N1 0.5.12 -> 0.5.13) side by side in
#   .venv/sglang-X, each with the transformers its release pins (5.6.0 for 0.5.11 and 0.5.12, 5.8.1 for
#   0.5.13), tokenizers==0.22.2 and einops==0.8.2 (imported at module level by a layer module of those
#   releases). About 30 s each on top, 180 to 210 MB each.
# * sglang==0.5.9, 0.5.10, 0.5.5.post1 and 0.5.5.post2 (the scheduler seeds' last releases and their
#   fixing releases, for kvledger.engines.sglang.scheduler: #16067 0.5.9 -> 0.5.10, #12432 0.5.5.post1 ->
#   0.5.5.post2) the same way, with the pins measured in shared/background/sglang-scheduler-on-cpu.md:
#   transformers 4.57.1 / tokenizers 0.22.1 / huggingface_hub 0.36.0 for 0.5.5.x and 0.5.9, transformers
#   5.3.0 for 0.5.10; 0.5.5.x imports fastapi at module level (0.120.0, with starlette 0.48.0).
# * einops==0.8.2 alone in .venv/einops-0.8.2 (--no-deps --target): 0.5.23's scheduler imports it at
#   module level (kvledger.engines.sglang.scheduler.build23); appended to sys.path only by that build, so
#   the venv's own packages are unchanged.
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
HISTORICAL="0.5.11 0.5.12 0.5.13 0.5.9 0.5.10 0.5.5.post1 0.5.5.post2"
HISTORICAL_PINS="einops==0.8.2"
# the transformers each historical release pins (its Requires-Dist)
transformers_for() {
  case "$1" in
    0.5.13) echo "transformers==5.8.1" ;;
    0.5.10) echo "transformers==5.3.0" ;;
    0.5.9) echo "transformers==4.57.1 huggingface_hub==0.36.0" ;;
    0.5.5.*) echo "transformers==4.57.1 huggingface_hub==0.36.0 fastapi==0.120.0 starlette==0.48.0" ;;
    *) echo "transformers==5.6.0" ;;
  esac
}
# tokenizers: 0.22.1 where transformers 4.57.1 is pinned, 0.22.2 elsewhere
tokenizers_for() { case "$1" in 0.5.9|0.5.5.*) echo "tokenizers==0.22.1" ;; *) echo "tokenizers==0.22.2" ;; esac; }
EXTRA=$("$PY" -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml","rb"))["project"]["optional-dependencies"]["sglang"]))')
STAMP=.venv/.sglang-extra.stamp
WANT="sglang==$CURRENT compressed-tensors==0.18.0 $EXTRA | $PREVIOUS_PINS"
# One stamp per historical release (its pins): adding a release installs only that one.
hist_want() { echo "sglang==$1 $(transformers_for "$1") $(tokenizers_for "$1") $HISTORICAL_PINS"; }
hist_ok() { [ -d ".venv/sglang-$1/sglang" ] && [ "$(cat ".venv/sglang-$1/.stamp" 2>/dev/null)" = "$(hist_want "$1")" ]; }
# (a stamp written before the per-release stamps also listed the historical releases after a second "|")
main_ok() {
  [ -f "$STAMP" ] && [ "$(cut -d'|' -f1-2 "$STAMP" | sed 's/ *$//')" = "$WANT" ] && [ -d "$PREVIOUS_DIR/sglang" ] \
    && "$PY" -c "import importlib.metadata as m; assert m.version('sglang') == '$CURRENT'" 2>/dev/null
}
# adopt 0.5.11 and 0.5.12 installed under that older stamp (same pins) instead of installing them again
for v in 0.5.11 0.5.12; do
  if [ -d ".venv/sglang-$v/sglang" ] && [ ! -f ".venv/sglang-$v/.stamp" ] && [ -f "$STAMP" ] \
     && grep -q "| 0.5.11 0.5.12: transformers==5.6.0 tokenizers==0.22.2 einops==0.8.2\$" "$STAMP"; then
    hist_want "$v" > ".venv/sglang-$v/.stamp"
  fi
done
SIDE_DIR=.venv/einops-0.8.2
SIDE_PINS="einops==0.8.2"
side_ok() { [ -d "$SIDE_DIR/einops" ] && [ "$(cat "$SIDE_DIR/.stamp" 2>/dev/null)" = "$SIDE_PINS" ]; }
missing=""
for v in $HISTORICAL; do hist_ok "$v" || missing="$missing $v"; done
if main_ok && [ -z "$missing" ] && side_ok; then
  echo "sglang extra: up to date (sglang $CURRENT in .venv, $PREVIOUS in $PREVIOUS_DIR, $HISTORICAL beside it)"
  exit 0
fi
quiet() { "$@" > .venv/.sglang-extra.log 2>&1 || { cat .venv/.sglang-extra.log >&2; exit 1; }; }
if ! main_ok; then
  echo "sglang extra: installing sglang $CURRENT (+ its import-time packages), $PREVIOUS and$missing side by side ..."
  # shellcheck disable=SC2086
  quiet .venv/bin/pip install --quiet $EXTRA
  quiet .venv/bin/pip install --quiet --no-deps "sglang==$CURRENT" compressed-tensors==0.18.0
  rm -rf "$PREVIOUS_DIR"
  # shellcheck disable=SC2086
  quiet .venv/bin/pip install --quiet --no-deps --target "$PREVIOUS_DIR" $PREVIOUS_PINS
  echo "$WANT" > "$STAMP"
else
  echo "sglang extra: installing the historical release(s)$missing side by side ..."
fi
for v in $missing; do
  rm -rf ".venv/sglang-$v"
  # shellcheck disable=SC2086
  quiet .venv/bin/pip install --quiet --no-deps --target ".venv/sglang-$v" $(hist_want "$v")
  hist_want "$v" > ".venv/sglang-$v/.stamp"
done
if ! side_ok; then
  rm -rf "$SIDE_DIR"
  quiet .venv/bin/pip install --quiet --no-deps --target "$SIDE_DIR" $SIDE_PINS
  echo "$SIDE_PINS" > "$SIDE_DIR/.stamp"
fi
