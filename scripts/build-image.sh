#!/usr/bin/env bash
# Build the kv-cache-sidecar images with podman from this checkout (`make image`; tests/image/ runs them):
# the daemon (the Dockerfile's default target) and the weekly report's (--target report, with matplotlib).
#
#   scripts/build-image.sh                      base made from Debian packages (no container registry needed)
#   scripts/build-image.sh --base-image IMAGE   base from a registry: docker.io/library/python:3.12-slim-bookworm
#   scripts/build-image.sh --tag NAME           default: ghcr.io/kv-cache-sidecar/kv-cache-sidecar:<version>
#                                               (the report's: the same name with -report before the tag)
#
# With a registry, `podman build .` or `docker build .` alone is enough; this script is for machines that
# reach Debian's mirrors and the Python package index but no container registry:
#   1. mmdebstrap makes a minimal Debian bookworm root with python3, its venv module and CA certificates.
#      The tar is cached in .test-artifacts/image/, keyed by the mmdebstrap arguments, and imported once
#      as localhost/kv-cache-sidecar/base:<key>; delete the tar to take newer Debian packages.
#   2. podman builds the Dockerfile with --build-arg BASE_IMAGE=<that base>. pip inside the build reaches
#      the package index the way this machine's pip does: over the host network, trusting the CA bundle
#      this machine's pip trusts (PIP_CERT or pip's `cert` setting) and using its index-url when that is
#      an http(s) URL. Both are mounted into the build from a temporary pip.conf and never end up in the
#      image (the final stage copies only the venv) nor in the repository.
# podman runs with `--runtime runc --cgroup-manager cgroupfs` (override with PODMAN="podman ..."), which
# works where podman's default crun or systemd cgroups are refused.
# Prints the report image's reference, then the daemon image's as its last line of standard output; build
# logs go to standard error.
set -euo pipefail
shopt -s inherit_errexit

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="$ROOT/.test-artifacts/image"
read -r -a PODMAN <<<"${PODMAN:-podman --runtime runc --cgroup-manager cgroupfs}"
SUITE=bookworm
SOURCE_LABEL=org.opencontainers.image.source=https://github.com/kv-cache-sidecar/kv-cache-sidecar
# python3 (3.11 in bookworm), venv (with pip's wheel for the builder stage), CA certificates, useradd
# (passwd), libstdc++ (numpy's, in the report's image); the path filters are those of Debian's own slim images. The essential variant has no apt (the
# images install nothing with it), and the merged-usr hook makes /bin, /lib... links itself, so the usrmerge
# package, which pulls in all of perl (48 MB), is not installed: with the gconv filter below the daemon's
# image stays under 120 MB.
MMDEBSTRAP_ARGS=(
  --variant=essential
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
  --include=python3,python3-venv,ca-certificates,passwd,libstdc++6
  --dpkgopt='path-exclude=/usr/share/man/*'
  --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/locale/*'
  # glibc's iconv modules (8 MB): Python's codecs are its own, and nothing in the images calls iconv(3)
  --dpkgopt='path-exclude=/usr/lib/*/gconv/*'
)

log() { printf 'build-image: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

usage() {
  sed -n '2,6p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit "$1"
}

VERSION="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$ROOT/sidecar/__init__.py")"
[[ -n "$VERSION" ]] || die "no __version__ = \"...\" line in $ROOT/sidecar/__init__.py"
TAG="ghcr.io/kv-cache-sidecar/kv-cache-sidecar:$VERSION"
BUILDER_TAG="localhost/kv-cache-sidecar/builder:latest"
BASE_IMAGE=""
while (($#)); do
  case "$1" in
    --base-image) [[ $# -ge 2 ]] || usage 2; BASE_IMAGE="$2"; shift 2 ;;
    --tag) [[ $# -ge 2 ]] || usage 2; TAG="$2"; shift 2 ;;
    -h|--help) usage 0 ;;
    *) log "unknown argument: $1"; usage 2 ;;
  esac
done

command -v "${PODMAN[0]}" >/dev/null 2>&1 \
  || die "${PODMAN[0]} not found: run scripts/install-container-tools.sh (as root), or build with docker build ."

debian_base() {
  command -v mmdebstrap >/dev/null 2>&1 || die "mmdebstrap not found: run scripts/install-container-tools.sh (as root)"
  local key tar ref
  key="$(printf '%s\n' "$SUITE" "${MMDEBSTRAP_ARGS[@]}" | sha256sum | cut -c1-12)"
  tar="$CACHE/base-$SUITE-$key.tar"
  ref="localhost/kv-cache-sidecar/base:$SUITE-$key"
  mkdir -p "$CACHE"
  if [[ ! -s "$tar" ]]; then
    log "making the Debian $SUITE base with mmdebstrap (about a minute; cached in ${tar#"$ROOT"/})"
    mmdebstrap --quiet --format=tar "${MMDEBSTRAP_ARGS[@]}" "$SUITE" "$tar.partial" >&2
    mv "$tar.partial" "$tar"
  fi
  if ! "${PODMAN[@]}" image exists "$ref"; then
    log "importing ${tar#"$ROOT"/} as $ref"
    "${PODMAN[@]}" import --quiet "$tar" "$ref" >/dev/null
  fi
  printf '%s\n' "$ref"
}

# The pip setting `key` of this machine: the environment first (PIP_CERT, PIP_INDEX_URL), then pip's
# configuration files. Empty when unset or when no pip is here.
host_pip_setting() {
  local env_name="$1" key="$2" python
  if [[ -n "${!env_name:-}" ]]; then
    printf '%s' "${!env_name}"
    return
  fi
  for python in "$ROOT/.venv/bin/python" python3; do
    if "$python" -m pip --version >/dev/null 2>&1; then
      "$python" -m pip config get "global.$key" 2>/dev/null || true
      return
    fi
  done
}

if [[ -z "$BASE_IMAGE" ]]; then
  BASE_IMAGE="$(debian_base)"
  PULL=(--pull=never)
else
  PULL=()
fi

MOUNTS=()
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
ca="$(host_pip_setting PIP_CERT cert)"
index="$(host_pip_setting PIP_INDEX_URL index-url)"
if [[ -n "$ca" || "$index" == http://* || "$index" == https://* ]]; then
  printf '[global]\n' >"$work/pip.conf"
  if [[ -n "$ca" ]]; then
    [[ -r "$ca" ]] || die "pip trusts the CA bundle $ca, but it cannot be read"
    ca="$(cd "$(dirname "$ca")" && pwd)/$(basename "$ca")"
    MOUNTS+=(--volume "$ca:/etc/ssl/certs/ca-certificates.crt:ro")
    printf 'cert = /etc/ssl/certs/ca-certificates.crt\n' >>"$work/pip.conf"
  fi
  if [[ "$index" == http://* || "$index" == https://* ]]; then
    printf 'index-url = %s\n' "$index" >>"$work/pip.conf"
  fi
  MOUNTS+=(--volume "$work/pip.conf:/etc/pip.conf:ro")
fi

REVISION=""
if command -v git >/dev/null 2>&1 && git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  REVISION="$(git -C "$ROOT" rev-parse HEAD)"
  [[ -z "$(git --no-optional-locks -C "$ROOT" status --porcelain --untracked-files=no)" ]] || REVISION="$REVISION-dirty"
fi

build() {
  "${PODMAN[@]}" build \
    --network host \
    --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 \
    "${PULL[@]}" "${MOUNTS[@]}" \
    --build-arg "BASE_IMAGE=$BASE_IMAGE" \
    --build-arg "VERSION=$VERSION" \
    --build-arg "REVISION=$REVISION" \
    --file "$ROOT/Dockerfile" \
    "$@" "$ROOT" >&2
}

REPORT_TAG="${TAG%:*}-report:${TAG##*:}"
log "building $TAG and $REPORT_TAG from $ROOT on $BASE_IMAGE"
start=$SECONDS
# The builder stage gets a name too: its layers (the installed venv) are the cache of the next build,
# and an image nothing names would be pruned below.
build --target builder --tag "$BUILDER_TAG"
build --target report --tag "$REPORT_TAG"
build --tag "$TAG"
# Layers of earlier builds that no image uses any more, and only this project's (by the label both
# stages of the Dockerfile set).
"${PODMAN[@]}" image prune --force --filter "label=$SOURCE_LABEL" >/dev/null
size="$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$TAG")"
report_size="$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$REPORT_TAG")"
log "built $TAG ($((size / 1000000)) MB) and $REPORT_TAG ($((report_size / 1000000)) MB) in $((SECONDS - start)) s"
printf '%s\n' "$REPORT_TAG" "$TAG"
