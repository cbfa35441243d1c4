#!/usr/bin/env bash
# Make promtool, amtool, prometheus and alertmanager available for tests/alerts.
#
# Debian's `prometheus` (promtool, prometheus) and `prometheus-alertmanager`
# (amtool, prometheus-alertmanager) packages, in this order of preference:
#   1. already on PATH, or already unpacked in .tools/bin: nothing to do (idempotent);
#   2. running as root: `apt-get update` + `apt-get install --no-install-recommends`
#      (with services kept stopped: we want the binaries, not a Prometheus on :9090);
#   3. otherwise: `apt-get download` + `dpkg-deb -x` into .tools/, binaries linked
#      into .tools/bin (the Makefile puts .tools/bin on PATH for the tests).
# Exits non-zero with the fix when the tools cannot be had.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/.tools"
# victoria-metrics: the report is tested on it beside Prometheus (tests/report/test_victoria_metrics.py)
PACKAGES=(prometheus prometheus-alertmanager victoria-metrics)

log() { printf 'install-prometheus-tools: %s\n' "$*" >&2; }

# The upstream Alertmanager binary is `alertmanager`; Debian names it
# `prometheus-alertmanager`. Either will do.
have() {
  local name
  for name in "$@"; do
    if command -v "$name" >/dev/null 2>&1 || [[ -x "$TOOLS/bin/$name" ]]; then
      return 0
    fi
  done
  return 1
}

all_present() {
  have promtool && have amtool && have prometheus && have prometheus-alertmanager alertmanager && have victoria-metrics
}

if all_present; then
  log "promtool, amtool, prometheus, alertmanager and victoria-metrics already present; nothing to do"
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  log "missing tools and no apt-get here: install Prometheus >= 2.42 and Alertmanager >= 0.25"
  log "(promtool, amtool, prometheus, alertmanager) on PATH, or into $TOOLS/bin"
  exit 1
fi

if [[ "$(id -u)" == "0" ]]; then
  log "installing ${PACKAGES[*]} with apt-get (root)"
  # Keep the packages' services from starting: a policy-rc.d answering 101
  # ("action forbidden") is the Debian way; ours is removed again afterwards.
  policy=/usr/sbin/policy-rc.d
  created_policy=""
  if [[ ! -e "$policy" ]]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod 755 "$policy"
    created_policy=1
  fi
  cleanup() { if [[ -n "$created_policy" ]]; then rm -f "$policy"; fi; }
  trap cleanup EXIT
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${PACKAGES[@]}"
else
  log "not root: unpacking ${PACKAGES[*]} into $TOOLS with apt-get download + dpkg-deb -x"
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  if ! (cd "$work" && apt-get download "${PACKAGES[@]}"); then
    log "apt-get download failed: the package lists may be empty. Run 'sudo apt-get update' once,"
    log "or install the packages: sudo apt-get install prometheus prometheus-alertmanager"
    exit 1
  fi
  mkdir -p "$TOOLS/root" "$TOOLS/bin"
  for deb in "$work"/*.deb; do
    dpkg-deb -x "$deb" "$TOOLS/root"
  done
  for bin in promtool prometheus amtool prometheus-alertmanager victoria-metrics; do
    if [[ -x "$TOOLS/root/usr/bin/$bin" ]]; then
      ln -sfn "$TOOLS/root/usr/bin/$bin" "$TOOLS/bin/$bin"
    fi
  done
fi

if ! all_present; then
  log "installation finished but a tool is still missing; PATH=$PATH"
  exit 1
fi
for bin in promtool amtool prometheus; do
  log "$(command -v "$bin" || echo "$TOOLS/bin/$bin"): $("$( command -v "$bin" || echo "$TOOLS/bin/$bin")" --version 2>&1 | head -n1)"
done
