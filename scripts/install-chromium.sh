#!/usr/bin/env bash
# Make headless Chromium available for the report's person's-view test (tests/report/test_render.py):
# it opens the HTML report, checks every plot loaded and the page fits 1280 px, and screenshots it.
#
# Debian's `chromium` package (binary /usr/bin/chromium):
#   1. already on PATH: nothing to do (idempotent);
#   2. running as root: `apt-get update` + `apt-get install --no-install-recommends chromium`;
#   3. otherwise: print the command to run as root; exit non-zero only under CI=true. Elsewhere the
#      test then skips with a loud reason (a laptop's `make test` still runs everything else).
set -euo pipefail

log() { printf 'install-chromium: %s\n' "$*" >&2; }

if command -v chromium >/dev/null 2>&1; then
  exit 0
fi

if [[ "$(id -u)" != "0" ]]; then
  log "chromium is not installed and this is not root; run: sudo apt-get install -y --no-install-recommends chromium"
  [[ "${CI:-}" == "true" ]] && exit 1
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
log "installing Debian's chromium (headless, for the report's HTML check)"
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends chromium >/dev/null
command -v chromium >/dev/null 2>&1 || { log "apt-get ran but chromium is not on PATH"; exit 1; }
