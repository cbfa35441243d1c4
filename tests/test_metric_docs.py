"""Every emitted metric is documented (docs/metrics.md, generated), and every documented one is emitted."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.artifacts.docs import markdown_table, oncall_table
from sidecar.metrics import BY_NAME, CATALOGUE, ONCALL

REPO = Path(__file__).resolve().parents[1]


def readme_block(name: str) -> str:
    text = (REPO / "README.md").read_text()
    m = re.search(rf"<!-- {name}:begin[^>]*-->\n(.*?)<!-- {name}:end -->", text, re.S)
    assert m, f"README.md lost its {name} markers"
    return m.group(1)


def test_docs_metrics_page_carries_the_catalogue():
    page = (REPO / "docs" / "metrics.md").read_text()
    assert markdown_table() in page, "docs/metrics.md is out of date: run `make generate`"


def test_readme_links_the_full_table_and_keeps_the_ten_oncall_gauges():
    readme = (REPO / "README.md").read_text()
    assert "(docs/metrics.md)" in readme
    assert readme_block("oncall-metrics") == oncall_table(), "README.md is out of date: run `make generate`"
    assert len(ONCALL) == len(set(ONCALL)) == 10 and all(name in BY_NAME for name in ONCALL)
    assert "| `kvcache_server_info` |" not in readme  # the full table lives in docs/metrics.md only


def test_names_follow_prometheus_conventions():
    for m in CATALOGUE:
        assert m.name.startswith("kvcache_"), m.name
        assert (m.type == "counter") == m.name.endswith("_total"), m.name
        assert m.help.endswith("."), m.name
        assert m.action, m.name


def emitted_families(registry) -> dict[str, set[str]]:
    """family name -> label names seen, from a real exposition of the registry."""
    out: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            name = s.name if not s.name.endswith("_created") else None
            if name:
                out.setdefault(name, set()).update(s.labels)
    return out


def test_everything_documented_is_emitted_with_its_labels(full_run_registry):
    emitted = emitted_families(full_run_registry)
    for m in CATALOGUE:
        if m.name in ONLY_ON_FAULT:  # exported once non-zero: tests/test_engine_contract.py makes it appear
            continue
        assert m.name in emitted, f"{m.name} is documented but was never emitted"
        assert emitted[m.name] == set(m.labels), (m.name, emitted[m.name])
    undocumented = set(emitted) - {m.name for m in CATALOGUE}
    assert not undocumented, f"emitted but not documented: {sorted(undocumented)}"


import asyncio  # noqa: E402

import pytest  # noqa: E402
from faultserver import FaultServer, ok  # noqa: E402
from fixtures import CPU_032  # noqa: E402

from sidecar.config import load_config  # noqa: E402
from sidecar.daemon import Sidecar, open_history  # noqa: E402
from sidecar.exporter import ONLY_ON_FAULT  # noqa: E402
from sidecar.layers import build_extenders  # noqa: E402
from sidecar.reload import ReloadStatus  # noqa: E402


@pytest.fixture
def full_run_registry(tmp_path_factory):
    """Two real saturated captures through the daemon: one run with --kv-cache-memory-bytes, one as if with
    --gpu-memory-utilization on a GPU too small for the demand (so shortfall, replicas and levers appear)."""
    full_a = (CPU_032 / "gqa-6mib_full-a.txt").read_text()
    full_b = (CPU_032 / "gqa-6mib_full-b.txt").read_text()
    # The captures ran without --kv-offloading-size: a CPU offload tier's usage line (the family as vLLM 0.32
    # exports it, vllm/v1/kv_offload/cpu/manager.py) is added to the by-utilization run so its gauge is emitted.
    offload = (
        "# TYPE vllm:kv_offload_cpu_cache_usage_perc gauge\n"
        'vllm:kv_offload_cpu_cache_usage_perc{engine="0",model_name="models/tiny-llama-gqa-bf16"} 0.25\n'
    )
    # No released vLLM exports vllm:num_preemptions_by_reason (vLLM PR #58037): the family as
    # tests/fixtures/metrics/vllm-pr58037/ constructs it (README there) is added so its gauge is emitted.
    offload += (CPU_032.parent / "vllm-pr58037" / "num_preemptions_by_reason_fcfs.txt").read_text()
    by_util = [
        p.replace('kv_cache_memory_bytes="6291456"', 'kv_cache_memory_bytes="None"') + offload for p in (full_a, full_b)
    ]
    servers = [FaultServer(), FaultServer()]
    clock = [1_800_000_000.0]
    try:
        config = load_config(
            None,
            env={},
            flags={
                ("model", "config"): str(CPU_032 / "tiny-llama-gqa-bf16.config.json"),
                ("model", "gpu_memory"): "8MiB",
                ("history", "path"): str(tmp_path_factory.mktemp("history") / "history.sqlite"),
                ("forecast", "window"): "1m",
            },
            flag_targets=[s.url for s in servers],
        )
        history = open_history(config, now=clock[0])  # its write-error counter is exported too
        sidecar = Sidecar(config, build_extenders(config), clock=lambda: clock[0], history=history)
        sidecar.collector.reload_status = lambda: ReloadStatus(successful=True, last_success_s=clock[0])  # as serve()
        loop = asyncio.new_event_loop()
        for i in range(25):  # kvcache_burst_*: counted from forecast.window (1m here) after the start, for a minute
            servers[0].behaviour = ok((full_a if i == 0 else full_b).encode())
            servers[1].behaviour = ok((by_util[0] if i == 0 else by_util[1]).encode())
            clock[0] += 5
            for st in sidecar.states:
                loop.run_until_complete(sidecar.scrape_once(st))
        loop.run_until_complete(sidecar.aclose())
        loop.close()
        sidecar.close_history()
        yield sidecar.registry
    finally:
        for s in servers:
            s.stop()
