"""The sidecar's whole /metrics, byte for byte, on the real captures: a refactor changes no series.

Each scenario feeds real ``/metrics`` bodies (``tests/fixtures/metrics``) through the daemon's own
code path (``Sidecar.read_body`` then ``Sidecar.record``, the two calls ``scrape_once`` makes after
its HTTP fetch) on a fixed clock, and compares the exposition after every step with the golden file
in ``tests/fixtures/exposition/``. The golden files were written by the code before the layout
refactor; a change that is meant to alter the output regenerates them with

    python tests/test_exposition_unchanged.py --update

and says so in CHANGELOG.md (exported names, labels and values are a public API).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from prometheus_client import generate_latest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `fixtures` when run as a script
from fixtures import CPU_032, FIXTURES, METRICS, TINY_LLAMA_CONFIG

from sidecar.config import load_config
from sidecar.daemon import Sidecar
from sidecar.layers import build_extenders

GOLDEN = FIXTURES / "exposition"
START = 1_800_000_000.0
STEP_S = 5.0


def _cpu(name: str) -> bytes:
    return (CPU_032 / f"{name}.txt").read_bytes()


def _by_utilization(body: bytes) -> bytes:
    """The same page as if vLLM sized its pool with --gpu-memory-utilization instead of the byte flag."""
    return body.replace(b'kv_cache_memory_bytes="6291456"', b'kv_cache_memory_bytes="None"')


#: name -> (model flags, the bodies scraped in order)
SCENARIOS: dict[str, tuple[dict[tuple[str, str], str], list[bytes]]] = {
    "1gib-run": (
        {("model", "config"): str(TINY_LLAMA_CONFIG), ("model", "gpu_memory"): "8GiB"},
        [_cpu("gqa-1gib_idle"), _cpu("gqa-1gib_load"), _cpu("gqa-1gib_load"), _cpu("gqa-1gib_prefix-after")],
    ),
    "6mib-saturated": (
        {("model", "config"): str(TINY_LLAMA_CONFIG), ("model", "gpu_memory"): "8MiB"},
        [_cpu("gqa-6mib_full-a")] + [_cpu("gqa-6mib_full-b")] * 7,
    ),
    "6mib-by-utilization": (
        {("model", "config"): str(TINY_LLAMA_CONFIG), ("model", "gpu_memory"): "8MiB"},
        [_by_utilization(_cpu("gqa-6mib_full-a"))] + [_by_utilization(_cpu("gqa-6mib_full-b"))] * 7,
    ),
    "6mib-no-model": ({}, [_cpu("gqa-6mib_full-a"), _cpu("gqa-6mib_full-b")]),
    "1gib-no-model": ({}, [_cpu("gqa-1gib_idle"), _cpu("gqa-1gib_load"), _cpu("gqa-1gib_prefix-after")]),
    "public-v0-aibrix": ({}, [(METRICS / "vllm_v0_0.7x_aibrix_runtime_doc_excerpt.txt").read_bytes()]),
    "public-v1-head40": ({}, [(METRICS / "vllm_v1_head40_engine_label.txt").read_bytes()]),
    "public-datadog": ({}, [(METRICS / "vllm_datadog_integrations_core_fixture.txt").read_bytes()]),
}


def exposition(name: str) -> str:
    """Every step's full exposition of scenario ``name``, separated by ``# step N`` lines."""
    flags, bodies = SCENARIOS[name]
    clock = [START]
    config = load_config(
        None, env={}, flags={("scrape", "interval"): "5s", **flags}, flag_targets=["http://127.0.0.1:9/metrics"]
    )
    sidecar = Sidecar(config, build_extenders(config), clock=lambda: clock[0])
    state = sidecar.states[0]
    out = []
    for i, body in enumerate(bodies):
        clock[0] += STEP_S
        scrape = sidecar.read_body(state, body)
        sidecar.record(state, scrape, sample_time=clock[0], wall_time=clock[0], duration_s=0.01)
        out.append(f"# step {i}\n" + generate_latest(sidecar.registry).decode())
    return "".join(out)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_exposition_is_unchanged(name):
    golden = GOLDEN / f"{name}.prom"
    got = exposition(name)
    assert got == golden.read_text(), (
        f"the exported series of scenario {name!r} changed; if that is intended, run "
        f"`python tests/test_exposition_unchanged.py --update` and record it in CHANGELOG.md"
    )


def test_scenarios_export_derived_gauges():
    """The golden files hold what matters: capacity, forecast and advice series, not only raw ones."""
    text = (GOLDEN / "6mib-saturated.prom").read_text()
    for series in (
        "kvcache_capacity_tokens",
        "kvcache_theoretical_bytes_per_token",
        "kvcache_recommendation_info",
        "kvcache_suggested_replicas",
        "kvcache_watermark_headroom_tokens",
        "kvcache_time_until_full_seconds",
    ):
        assert series in text, series


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python tests/test_exposition_unchanged.py --update")
    GOLDEN.mkdir(exist_ok=True)
    for scenario in sorted(SCENARIOS):
        (GOLDEN / f"{scenario}.prom").write_text(exposition(scenario))
        print(f"wrote {GOLDEN / scenario}.prom")
