# kv-cache-sidecar: the daemon (`kv-sidecar run`), the weekly report (`kv-sidecar report`, `reporter`)
# and the rules (`kv-sidecar rules render`) in one image. docs/container.md says how to build and run it.
#
#   podman build -t ghcr.io/kv-cache-sidecar/kv-cache-sidecar:<version> .      (or docker build)
#
# Without a registry, scripts/build-image.sh (`make image`) makes the base from Debian packages and passes
# it as BASE_IMAGE. Any base works that has python3 (>= 3.11) with its venv module, useradd and groupadd.
ARG BASE_IMAGE=docker.io/library/python:3.12-slim-bookworm

# --- builder: the project's wheel, installed with the report's extra into a venv -----------------------
FROM ${BASE_IMAGE} AS builder
# Marks this stage's layers as the project's: scripts/build-image.sh prunes the stale ones by it.
LABEL org.opencontainers.image.source="https://github.com/kv-cache-sidecar/kv-cache-sidecar"
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
# The runtime user, by number (Kubernetes' runAsNonRoot needs a numeric USER); the final stage copies
# /etc/passwd and /etc/group from here, so it needs no RUN and no shell.
RUN groupadd --gid 10001 kv-sidecar \
 && useradd --uid 10001 --gid 10001 --no-create-home --no-log-init --home-dir /nonexistent \
      --shell /usr/sbin/nologin kv-sidecar
WORKDIR /src
# The dependencies first, read from pyproject.toml alone: a change to the code reuses this layer.
COPY pyproject.toml ./
RUN python3 -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb")); \
      run = p["project"]["dependencies"] + p["project"]["optional-dependencies"]["report"]; \
      open("/tmp/build.txt", "w").write("\n".join(p["build-system"]["requires"])); \
      open("/tmp/run.txt", "w").write("\n".join(run))' \
 && python3 -m venv /opt/wheel-build \
 && /opt/wheel-build/bin/pip install --quiet --requirement /tmp/build.txt \
 && python3 -m venv /opt/kv-sidecar \
 && /opt/kv-sidecar/bin/pip install --quiet --requirement /tmp/run.txt
COPY README.md ./
COPY sidecar ./sidecar
RUN /opt/wheel-build/bin/pip wheel --quiet --no-build-isolation --no-deps --wheel-dir /wheels . \
 && /opt/kv-sidecar/bin/pip install --quiet "$(ls /wheels/kv_cache_sidecar-*.whl)[report]" \
 && /opt/kv-sidecar/bin/pip uninstall --quiet --yes pip setuptools \
 && /opt/kv-sidecar/bin/kv-sidecar --version

# --- final: the base, the venv, a default configuration; no build tools, no pip cache ----------------
FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="kv-cache-sidecar" \
      org.opencontainers.image.description="KV-cache capacity monitor for vLLM: a Prometheus exporter run as a sidecar" \
      org.opencontainers.image.source="https://github.com/kv-cache-sidecar/kv-cache-sidecar" \
      org.opencontainers.image.url="https://github.com/kv-cache-sidecar/kv-cache-sidecar" \
      org.opencontainers.image.licenses="Apache-2.0"
ARG BASE_IMAGE
ARG VERSION=0.1.0
ARG REVISION=""
LABEL org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}"
COPY --from=builder /etc/passwd /etc/group /etc/
COPY --from=builder /opt/kv-sidecar /opt/kv-sidecar
# Every setting at its default, scraping vLLM on 127.0.0.1:8000 (the same pod); a mounted ConfigMap or
# file at this path replaces it.
COPY deploy/examples/sidecar.yaml /etc/kv-sidecar/config.yaml
# The root filesystem may be read-only: bytecode is compiled at install time and never written later.
# matplotlib (the report's plots) needs a writable config and cache folder: /tmp must then be a writable
# emptyDir or tmpfs for `kv-sidecar report`/`reporter`; the daemon writes nothing but its history.
ENV PATH=/opt/kv-sidecar/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MPLCONFIGDIR=/tmp/matplotlib
USER 10001:10001
EXPOSE 9437
ENTRYPOINT ["kv-sidecar"]
CMD ["run", "--config.file", "/etc/kv-sidecar/config.yaml"]
