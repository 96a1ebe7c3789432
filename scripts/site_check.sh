#!/usr/bin/env bash
# The documentation site in a real browser (a CI stage; README "The documentation site").
# Installs what is missing, builds the site and loads every page in headless Chromium
# (scripts/check_site.py): broken links and anchors, console errors, outside requests, undrawn diagrams.
#   1. Debian's chromium at /usr/bin/chromium (apt-get, as root; about 50 s and 400 MB the first time)
#   2. playwright's Python package into .venv (the `site-check` extra; it drives that Chromium, no download)
#   3. the site: mkdocs build --strict (skipped with --no-build, when the caller has just built it)
#   4. the check; it fetches the Mermaid runtime once (npm pack) into .cache/mermaid/
# Screenshots and summary.json go to site-check/ (ignored by git).
# Where an install is impossible (no apt-get, not root, no network) it says so in one line and fails:
# the check is never skipped. A second run installs nothing.
# CHROMIUM and APT_GET name other programs (tests use them to reach the refusal without installing).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
APT_GET="${APT_GET:-apt-get}"
build=1
for arg in "$@"; do
    case "$arg" in
        --no-build) build=0 ;;
        *) echo "site check: unknown argument $arg (usage: scripts/site_check.sh [--no-build])" >&2; exit 2 ;;
    esac
done

fail() { echo "site check: $*" >&2; exit 1; }
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
last_line() { tail -n 1 "$log" | tr -s '[:space:]' ' '; }

if [ ! -x "$CHROMIUM" ]; then
    command -v "$APT_GET" >/dev/null 2>&1 \
        || fail "cannot install Chromium: no $APT_GET on this machine (install a Chromium at $CHROMIUM)"
    [ "$(id -u)" = 0 ] || fail "cannot install Chromium: not root (as root, once: apt-get install chromium)"
    echo "site check: installing Debian's chromium (apt-get, about 50 s and 400 MB, once)"
    { "$APT_GET" update -qq && DEBIAN_FRONTEND=noninteractive "$APT_GET" install -y -qq --no-install-recommends chromium; } \
        >"$log" 2>&1 || fail "cannot install Chromium (apt-get failed; no access to Debian's archive?): $(last_line)"
    [ -x "$CHROMIUM" ] || fail "apt-get installed chromium, but there is no $CHROMIUM"
fi

[ -x "$PY" ] || fail "no .venv: run bash scripts/setup.sh first"
if ! "$PY" -c "import playwright.sync_api" 2>/dev/null; then
    echo "site check: installing playwright into .venv (the site-check extra, about 40 s and 170 MB, once)"
    # The extra's requirements alone: `pip install -e ".[site-check]"` would also reinstall kvledger
    # itself, in pip's default editable mode, undoing setup.sh's .pth install that type checkers read.
    extra=$("$PY" -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["site-check"]))')
    # shellcheck disable=SC2086
    "$PY" -m pip install -q $extra >"$log" 2>&1 \
        || fail "cannot install playwright (pip failed; no access to PyPI?): $(last_line)"
fi

if [ "$build" = 1 ]; then
    echo "site check: building the site (mkdocs build --strict)"
    NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet
fi
exec "$PY" scripts/check_site.py --no-build --chromium "$CHROMIUM" --out site-check
