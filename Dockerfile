# kv-cache-sidecar's two images (docs/container.md says how to build and run them):
#   the daemon, the default target: `kv-sidecar run` (and `rules render`), small, in every vLLM pod
#     podman build -t ghcr.io/kv-cache-sidecar/kv-cache-sidecar:<version> .                 (or docker build)
#   the report, for the weekly CronJob: the same and matplotlib
#     podman build --target report -t ghcr.io/kv-cache-sidecar/kv-cache-sidecar-report:<version> .
#
# Without a registry, scripts/build-image.sh (`make image`) makes the base from Debian packages and passes
# it as BASE_IMAGE. Any base works that has python3 (>= 3.11) with its venv module, useradd and groupadd.
ARG BASE_IMAGE=docker.io/library/python:3.12-slim-bookworm

# --- builder: the dependencies and the project's wheel in a venv; pip stays here for the stages below ----
FROM ${BASE_IMAGE} AS builder
# Marks this stage's layers as the project's: scripts/build-image.sh prunes the stale ones by it.
LABEL org.opencontainers.image.source="https://github.com/kv-cache-sidecar/kv-cache-sidecar"
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
# The runtime user, by number (Kubernetes' runAsNonRoot needs a numeric USER); the final stages copy
# /etc/passwd and /etc/group from here, so they need no RUN and no shell.
RUN groupadd --gid 10001 kv-sidecar \
 && useradd --uid 10001 --gid 10001 --no-create-home --no-log-init --home-dir /nonexistent \
      --shell /usr/sbin/nologin kv-sidecar
WORKDIR /src
# The dependencies first, read from pyproject.toml alone: a change to the code reuses this layer.
COPY pyproject.toml ./
RUN python3 -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb")); \
      open("/tmp/build.txt", "w").write("\n".join(p["build-system"]["requires"])); \
      open("/tmp/run.txt", "w").write("\n".join(p["project"]["dependencies"])); \
      open("/tmp/report.txt", "w").write("\n".join(p["project"]["optional-dependencies"]["report"]))' \
 && python3 -m venv /opt/wheel-build \
 && /opt/wheel-build/bin/pip install --quiet --requirement /tmp/build.txt \
 && python3 -m venv /opt/kv-sidecar \
 && /opt/kv-sidecar/bin/pip install --quiet --requirement /tmp/run.txt
COPY README.md LICENSE ./
COPY sidecar ./sidecar
RUN /opt/wheel-build/bin/pip wheel --quiet --no-build-isolation --no-deps --wheel-dir /wheels . \
 && /opt/kv-sidecar/bin/pip install --quiet --no-deps "$(ls /wheels/kv_cache_sidecar-*.whl)" \
 && /opt/kv-sidecar/bin/kv-sidecar --version

# --- the daemon's venv: what `kv-sidecar run` imports, no pip, no setuptools ------------------------------
FROM builder AS daemon-venv
RUN /opt/kv-sidecar/bin/pip uninstall --quiet --yes pip setuptools

# --- the report's venv: the daemon's and the report extra (matplotlib) ----------------------------------
FROM builder AS report-venv
RUN /opt/kv-sidecar/bin/pip install --quiet --requirement /tmp/report.txt \
 && /opt/kv-sidecar/bin/pip uninstall --quiet --yes pip setuptools

# --- report: `kv-sidecar report`/`reporter` (the weekly report's CronJob) --------------------------------
#   podman build --target report -t ghcr.io/kv-cache-sidecar/kv-cache-sidecar-report:<version> .
FROM ${BASE_IMAGE} AS report
ARG BASE_IMAGE
ARG VERSION=0.1.0
ARG REVISION=""
LABEL org.opencontainers.image.title="kv-cache-sidecar-report" \
      org.opencontainers.image.description="The weekly KV-cache capacity report of kv-cache-sidecar (kv-sidecar report)" \
      org.opencontainers.image.source="https://github.com/kv-cache-sidecar/kv-cache-sidecar" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}"
COPY --from=builder /etc/passwd /etc/group /etc/
COPY --from=report-venv /opt/kv-sidecar /opt/kv-sidecar
# matplotlib needs a writable config and cache folder: /tmp must be a writable emptyDir or tmpfs.
ENV PATH=/opt/kv-sidecar/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MPLCONFIGDIR=/tmp/matplotlib
USER 10001:10001
ENTRYPOINT ["kv-sidecar"]
CMD ["report", "--help"]

# --- daemon (the default target): `kv-sidecar run` in every vLLM pod; small, no matplotlib ---------------
FROM ${BASE_IMAGE} AS daemon
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
COPY --from=daemon-venv /opt/kv-sidecar /opt/kv-sidecar
# Every setting at its default, scraping vLLM on 127.0.0.1:8000 (the same pod); a mounted ConfigMap or
# file at this path replaces it.
COPY deploy/examples/sidecar.yaml /etc/kv-sidecar/config.yaml
# The root filesystem may be read-only: bytecode is compiled at install time and never written later;
# the daemon writes nothing but its history.
ENV PATH=/opt/kv-sidecar/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
EXPOSE 9437
ENTRYPOINT ["kv-sidecar"]
CMD ["run", "--config.file", "/etc/kv-sidecar/config.yaml"]
