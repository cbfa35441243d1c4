"""The advice follows the engine's lever through the real sidecar: a real TensorRT-LLM page.

``tests/fixtures/metrics/trtllm/trtllm_serve_2026_from_issue3376_stats.txt`` (README there): 7240 max
blocks, 5495 used (usage 0.759), TensorRT-LLM's lever ``free_gpu_memory_fraction`` — not on the page.
"""

from __future__ import annotations

from collections import defaultdict

from fixtures import METRICS
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.config import load_config
from sidecar.daemon import Sidecar
from sidecar.layers import build_extenders

PAGE = (METRICS / "trtllm" / "trtllm_serve_2026_from_issue3376_stats.txt").read_bytes()
START = 1_800_000_000.0


def exported(target_usage: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    flags = {("scrape", "interval"): "5s", ("thresholds", "target_usage"): target_usage}
    config = load_config(None, env={}, flags=flags, flag_targets=["http://127.0.0.1:9/prometheus/metrics"])
    sidecar = Sidecar(config, build_extenders(config), clock=lambda: START)
    state = sidecar.states[0]
    for i in range(2):
        t = START + 5.0 * i
        sidecar.record(state, sidecar.read_body(state, PAGE), sample_time=t, wall_time=t, duration_s=0.01)
    out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for fam in text_string_to_metric_families(generate_latest(sidecar.registry).decode()):
        for s in fam.samples:
            out[s.name].append((s.labels, s.value))
    return out


def test_a_trtllm_page_above_target_is_told_to_raise_its_own_lever() -> None:
    """Target 0.6: the peak (≈ 0.759 of the pool, more with the waiting requests) is above 0.65, so raise
    -- TensorRT-LLM's free_gpu_memory_fraction, never vLLM's flag; no value, since the page does not
    say the fraction it runs with (the adapter lists the gauge in EngineScrape.absent)."""
    out = exported("0.6")
    ((labels, value),) = out["kvcache_recommendation_info"]
    assert (labels["action"], labels["reason"], value) == ("raise_free_gpu_memory_fraction", "peak_above_target", 1.0)
    assert not out.get("kvcache_suggested_gpu_memory_utilization")


def test_the_same_page_at_the_default_target_changes_nothing() -> None:
    ((labels, _),) = exported("0.75")["kvcache_recommendation_info"]
    assert (labels["action"], labels["reason"]) == ("none", "within_target")
