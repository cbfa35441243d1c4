#!/usr/bin/env bash
# Make podman, mmdebstrap and runc available for the container image test (tests/image/) and
# `make image` (scripts/build-image.sh).
#
# Debian's `podman`, `mmdebstrap`, `runc` and `uidmap` packages:
#   1. already on PATH: nothing to do (idempotent);
#   2. running as root with apt-get: `apt-get update` + `apt-get install --no-install-recommends`;
#   3. otherwise: print the command to run as root; exit non-zero only under CI=true. Elsewhere the
#      image test then skips with a loud reason (a laptop's `make test` still runs everything else).
# runc rather than podman's default crun: scripts/build-image.sh runs podman with `--runtime runc`.
set -euo pipefail

PACKAGES=(podman mmdebstrap runc uidmap)
COMMANDS=(podman mmdebstrap runc newuidmap)

log() { printf 'install-container-tools: %s\n' "$*" >&2; }

missing() {
  local name
  for name in "${COMMANDS[@]}"; do
    command -v "$name" >/dev/null 2>&1 || printf '%s ' "$name"
  done
}

if [[ -z "$(missing)" ]]; then
  exit 0
fi

give_up() {
  log "$1"
  log "run: sudo apt-get install -y --no-install-recommends ${PACKAGES[*]}"
  log "(without them the container image test skips; under CI=true it fails)"
  [[ "${CI:-}" == "true" ]] && exit 1
  exit 0
}

if ! command -v apt-get >/dev/null 2>&1; then
  give_up "missing $(missing)and no apt-get here"
fi
if [[ "$(id -u)" != "0" ]]; then
  give_up "missing $(missing)and this is not root"
fi

export DEBIAN_FRONTEND=noninteractive
log "installing Debian's ${PACKAGES[*]} (for the container image test)"
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >/dev/null
if [[ -n "$(missing)" ]]; then
  log "apt-get ran but $(missing)is still not on PATH"
  exit 1
fi
log "$(podman --version), $(runc --version | head -n1), mmdebstrap $(mmdebstrap --version | awk '{print $2}')"
