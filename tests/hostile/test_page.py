"""Hostile and broken pages through the daemon's own scrape path (``Sidecar.scrape_once`` against a local
server): every one is a failed scrape counted by its reason, or a series dropped and counted by its
reason, never a traceback, and the sidecar goes on scraping. Time and memory per page are measured
by ``bench/hostile_page.py``, not asserted here.
"""

from __future__ import annotations

import logging
import time

import pytest
from faultserver import FaultServer, ok
from fixtures import CPU_032
from harness import Harness

from sidecar import limits, settings
from sidecar import page_parser as parse
from sidecar.engines import vllm
from sidecar.observation import DROP_REASONS
from sidecar.reasons import REASONS

FULL_A = (CPU_032 / "gqa-6mib_full-a.txt").read_text()
FULL_B = (CPU_032 / "gqa-6mib_full-b.txt").read_text()
MODEL = "models/tiny-llama-gqa-bf16"
SERIES = f'{{engine="0",model_name="{MODEL}"}}'
CAPACITY = ("kvcache_capacity_tokens", "kvcache_free_tokens", "kvcache_used_tokens", "kvcache_server_info")


def page(text: str = FULL_A, **replace: str) -> bytes:
    """The real capture with ``old=new`` replacements of whole substrings (each must occur)."""
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    return text.encode()


def swap(text: str, old: str, new: str) -> bytes:
    assert old in text, old
    return text.replace(old, new).encode()


def long_label_page(labels: int, value_len: int = 60) -> bytes:
    """One cache_config_info line with ``labels`` labels: about 1.4 MB at 20,000 labels."""
    line = "vllm:cache_config_info{" + ",".join(f'l{i}="{"v" * value_len}"' for i in range(labels)) + "} 1.0\n"
    return (FULL_A + line).encode()


def dropped(h: Harness, reason: str) -> float | None:
    return h.value("kvcache_sidecar_series_dropped_total", reason=reason)


def no_traceback(caplog) -> None:
    assert not any(r.exc_info for r in caplog.records), [r.getMessage() for r in caplog.records if r.exc_info]


@pytest.fixture(scope="module")
def server():
    """One local server for the module (each test sets its behaviour): no half-second shutdown per test."""
    s = FaultServer()
    yield s
    s.stop()


@pytest.fixture
def logs(caplog):
    caplog.set_level(logging.DEBUG)
    return caplog


# --- numbers the capacity stands on: the whole page is unusable ------------------------------------------------


@pytest.mark.parametrize(
    "old,new",
    [
        ('num_gpu_blocks="48"', 'num_gpu_blocks="1e999"'),  # OverflowError out of the cycle before
        ('num_gpu_blocks="48"', 'num_gpu_blocks="inf"'),
        ('num_gpu_blocks="48"', 'num_gpu_blocks="-6144"'),
        ('num_gpu_blocks="48"', 'num_gpu_blocks="1.28e32"'),
        ('num_gpu_blocks="48"', 'num_gpu_blocks="48.5"'),
        ('num_gpu_blocks="48"', 'num_gpu_blocks="' + "9" * 200 + '"'),
        ('block_size="128"', 'block_size="0"'),
        ('block_size="128"', 'block_size="nan"'),
        ('gpu_memory_utilization="0.92"', 'gpu_memory_utilization="1.5"'),
        ('gpu_memory_utilization="0.92"', 'gpu_memory_utilization="-0.1"'),
        ('kv_cache_memory_bytes="6291456"', 'kv_cache_memory_bytes="-1"'),
        ('kv_cache_size_tokens="6144"', 'kv_cache_size_tokens="1e300"'),
    ],
)
def test_a_cache_config_number_that_cannot_be_one_fails_the_scrape(h, server, logs, old, new):
    server.behaviour = ok(swap(FULL_A, old, new))
    h.scrape()
    assert h.errors("invalid_value") == 1.0
    assert sum(h.errors(r) for r in REASONS) == 1.0
    assert h.value("kvcache_sidecar_target_up") == 0.0
    for gauge in CAPACITY + ("kvcache_usage_ratio",):
        assert h.value(gauge) is None, gauge
    field = old.split("=")[0]
    assert any(f"cache_config_info.{field}" in r.getMessage() for r in logs.records)
    no_traceback(logs)
    server.behaviour = ok(FULL_A.encode())  # and the next good page is read
    h.scrape()
    assert h.value("kvcache_sidecar_target_up") == 1.0
    assert h.value("kvcache_capacity_tokens") == 6144.0


def test_a_bad_value_is_logged_once_per_change_and_the_recovery_with_its_count(h, server, logs):
    server.behaviour = ok(swap(FULL_A, 'num_gpu_blocks="48"', 'num_gpu_blocks="1e999"'))
    for _ in range(5):
        h.scrape()
    server.behaviour = ok(swap(FULL_A, 'num_gpu_blocks="48"', 'num_gpu_blocks="-6144"'))  # another value
    h.scrape()
    server.behaviour = ok(FULL_A.encode())
    h.scrape()
    warnings = [r.getMessage() for r in logs.records if r.levelno >= logging.WARNING]
    assert len([m for m in warnings if "reason=invalid_value" in m]) == 2, warnings
    assert any("1e999" in m for m in warnings) and any("-6144" in m for m in warnings)
    recovered = [r.getMessage() for r in logs.records if "scrape recovered" in r.getMessage()]
    assert recovered == [f"scrape recovered target={h.name} after reason=invalid_value failed_scrapes=6"]
    assert h.errors("invalid_value") == 6.0
    no_traceback(logs)


# --- values that cannot be what they measure: that series is dropped and counted -------------------------------


@pytest.mark.parametrize(
    "name,value,gone",
    [
        ("vllm:kv_cache_usage_perc", "NaN", "kvcache_usage_ratio"),
        ("vllm:kv_cache_usage_perc", "1.7", "kvcache_used_tokens"),
        ("vllm:kv_cache_usage_perc", "-0.3", "kvcache_free_tokens"),
        ("vllm:num_preemptions_total", "-5.0", "kvcache_preemptions_total"),
        ("vllm:num_preemptions_total", "+Inf", "kvcache_preemptions_total"),
        ("vllm:num_preemptions_total", "9" * 5000, "kvcache_preemptions_total"),  # a float's overflow
        ("vllm:num_requests_running", "-1.0", "kvcache_requests_running"),
        ("vllm:prefix_cache_queries_total", "-1e30", "kvcache_prefix_cache_queries_tokens_total"),
    ],
)
def test_an_unusable_value_drops_its_series_and_is_counted(h, server, logs, name, value, gone):
    line = next(li for li in FULL_A.splitlines() if li.startswith(name + SERIES))
    server.behaviour = ok(swap(FULL_A, line, f"{name}{SERIES} {value}"))
    h.scrape()
    assert h.value("kvcache_sidecar_target_up") == 1.0  # the rest of the page is good
    assert dropped(h, "invalid_value") == 1.0
    assert h.value(gone) is None
    assert h.value("kvcache_capacity_tokens") == 6144.0
    no_traceback(logs)


def test_a_dropped_series_is_logged_when_it_starts_and_when_it_ends(h, server, logs):
    line = next(li for li in FULL_A.splitlines() if li.startswith("vllm:kv_cache_usage_perc" + SERIES))
    server.behaviour = ok(swap(FULL_A, line, f"vllm:kv_cache_usage_perc{SERIES} NaN"))
    for _ in range(4):
        h.scrape()
    server.behaviour = ok(FULL_A.encode())
    h.scrape()
    messages = [r.getMessage() for r in logs.records if "series" in r.getMessage() and "dropped" in r.getMessage()]
    assert len(messages) == 2, messages
    assert "reason=invalid_value field=vllm:kv_cache_usage_perc" in messages[0]
    assert "after 4 scrapes" in messages[1]
    assert dropped(h, "invalid_value") == 4.0
    assert h.value("kvcache_usage_ratio") is not None


def test_an_exact_duplicate_series_is_a_protocol_error_not_a_sum(h, server, logs):
    line = f"vllm:num_preemptions_total{SERIES} 10.0"
    server.behaviour = ok(swap(FULL_A, line, line + "\n" + line))  # 20 if it were summed
    h.scrape()
    assert h.value("kvcache_preemptions_total") is None  # the family is not trusted
    assert dropped(h, "duplicate_series") == 2.0
    assert h.value("kvcache_sidecar_target_up") == 1.0
    assert h.value("kvcache_usage_ratio") is not None
    no_traceback(logs)


def test_pid_copies_are_still_folded(h, server):
    line = f"vllm:num_preemptions_total{SERIES} 10.0"
    copies = "\n".join(line.replace('engine="0"', f'engine="0",pid="{pid}"') for pid in (11, 12))
    server.behaviour = ok(swap(FULL_A, line, copies))
    h.scrape()
    assert h.value("kvcache_preemptions_total") == 20.0  # each process counted its own part
    assert dropped(h, "duplicate_series") == 0.0


def test_a_duplicate_histogram_bucket_drops_the_whole_histogram(h, server):
    line = 'vllm:request_prompt_tokens_bucket{engine="0",le="+Inf",model_name="models/tiny-llama-gqa-bf16"} 13.0'
    server.behaviour = ok(swap(FULL_A, line, line + "\n" + line))
    h.scrape()
    assert dropped(h, "duplicate_series") == 1.0 + 11 + 1 + 1  # every series of the family: 12 buckets, _count, _sum
    state = h.sidecar.states[0]
    ((_, obs),) = [entry for hist in state.history.values() for entry in hist]
    assert obs.prompt_length is None and obs.generation_length is not None


@pytest.mark.parametrize(
    "old,new",
    [
        (
            f"vllm:request_prompt_tokens_count{SERIES} 13.0",
            f"vllm:request_prompt_tokens_count{SERIES} 14.0",
        ),  # _count disagrees with +Inf
        (
            'vllm:request_prompt_tokens_bucket{engine="0",le="1000.0",model_name="models/tiny-llama-gqa-bf16"} 13.0',
            'vllm:request_prompt_tokens_bucket{engine="0",le="1000.0",model_name="models/tiny-llama-gqa-bf16"} 99.0',
        ),  # buckets fall with the bound
        (
            'vllm:request_prompt_tokens_bucket{engine="0",le="+Inf",model_name="models/tiny-llama-gqa-bf16"} 13.0\n',
            "",
        ),  # no +Inf bucket
    ],
)
def test_an_inconsistent_histogram_is_flagged_by_reason(h, server, logs, old, new):
    server.behaviour = ok(swap(FULL_A, old, new))
    h.scrape()
    assert dropped(h, "histogram_mismatch") == 1.0
    assert h.value("kvcache_sidecar_target_up") == 1.0
    assert any("reason=histogram_mismatch field=vllm:request_prompt_tokens" in r.getMessage() for r in logs.records)
    no_traceback(logs)


# --- size and shape: bounded before the parser sees the page -----------------------------------------------------


def test_a_page_of_long_label_sets_is_refused_before_it_is_parsed(h, server, logs):
    body = long_label_page(20_000)  # 1.4 MB: 14-16 s in prometheus_client's parser
    assert len(body) > 1_300_000
    server.behaviour = ok(body)
    start = time.perf_counter()
    h.scrape()
    assert time.perf_counter() - start < h.config.targets[0].timeout_s
    assert h.errors("label_limit") == 1.0
    assert h.value("kvcache_sidecar_target_up") == 0.0
    no_traceback(logs)


@pytest.mark.parametrize(
    "line",
    [
        "vllm:cache_config_info{" + ",".join(f'l{i}="x"' for i in range(65)) + "} 1.0",  # 65 labels > 64
        'vllm:kv_cache_usage_perc{engine="0",model_name="' + "m" * 2049 + '"} 0.5',  # a value of 2049 characters
        'vllm:kv_cache_usage_perc{engine="0",' + "n" * 129 + '="x",model_name="m"} 0.5',  # a name of 129
        'vllm:kv_cache_usage_perc{engine="0",model_name="' + '\\"' * 1500 + '"} 0.5',  # escaped quotes: 1500 chars
        'vllm:kv_cache_usage_perc{engine="0",model_name="' + "\\\\" * 70_000 + '"} 0.5',  # a 140,000-character line
    ],
)
def test_a_series_past_a_label_limit_fails_the_scrape(h, server, logs, line):
    server.behaviour = ok((FULL_A + line + "\n").encode())
    h.scrape()
    assert h.errors("label_limit") == 1.0, [r.getMessage() for r in logs.records]
    assert h.value("kvcache_sidecar_target_up") == 0.0
    no_traceback(logs)


def test_too_many_sample_lines_fail_the_scrape_before_the_parse(server, logs):
    # 100,000 lines are 6.6 MB: past the default body_size_limit, raised here so that sample_limit is what holds
    h = Harness(server, body_size_limit_bytes=16 << 20)
    try:
        lines = "".join(f'vllm:num_requests_waiting_by_reason{{engine="0",reason="r{i}"}} 1\n' for i in range(100_000))
        server.behaviour = ok((FULL_A + lines).encode())
        h.scrape()
        assert h.errors("sample_limit") == 1.0
        assert h.value("kvcache_sidecar_target_up") == 0.0
        no_traceback(logs)
    finally:
        h.close()


def test_20000_values_of_an_exported_label_give_at_most_the_cap_in_series(server, logs):
    # (100,000 of them are past the default sample_limit: the test above; bench/hostile_page.py runs both)
    harness = Harness(server, sample_limit=0, timeout_s=60.0)  # no sample limit: the cardinality cap alone holds
    try:
        lines = "".join(
            f'vllm:num_requests_waiting_by_reason{{engine="0",model_name="{MODEL}",reason="r{i}"}} 1\n'
            for i in range(20_000)
        )
        server.behaviour = ok((FULL_A + lines).encode())
        harness.scrape()
        assert harness.value("kvcache_sidecar_target_up") == 1.0
        cap = harness.config.targets[0].label_values_limit
        families = {f.name: f for f in harness.sidecar.registry.collect()}
        waiting = [s for s in families["kvcache_requests_waiting"].samples]
        assert len(waiting) == cap == 32
        assert {s.labels["reason"] for s in waiting} >= {"capacity", "deferred"}  # page order: vLLM's come first
        assert dropped(harness, "label_values") == 20_000 + 2 - cap
        no_traceback(logs)
    finally:
        harness.close()


def test_a_page_that_cannot_be_read_in_time_is_a_parse_timeout_and_the_loop_never_waits(server, logs):
    # every bound off, a short timeout: the page takes seconds in the parser, the scrape does not
    harness = Harness(server, timeout_s=0.3, label_limit=0, label_name_length_limit=0, label_value_length_limit=0)
    try:
        server.behaviour = ok(long_label_page(20_000))
        start = time.perf_counter()
        harness.scrape()
        assert time.perf_counter() - start < 1.0
        assert harness.errors("parse_timeout") == 1.0
        harness.scrape()  # the reader is still on the previous page: refused, not read beside it
        assert harness.errors("parse_timeout") == 2.0
        assert any("still being read" in r.getMessage() for r in logs.records)
        rt = harness.sidecar._targets[harness.name]
        assert rt.reading is not None
        assert rt.reading.finished.wait(timeout=60)  # let the reader finish before the next test
        server.behaviour = ok(FULL_A.encode())
        harness.scrape()
        assert harness.value("kvcache_sidecar_target_up") == 1.0
        no_traceback(logs)
    finally:
        harness.close()


def test_a_huge_line_of_a_family_not_read_costs_nothing(h, server):
    junk = "some_other_metric{" + ",".join(f'l{i}="v"' for i in range(50_000)) + "} 1\n"
    server.behaviour = ok((FULL_A + junk).encode())
    h.scrape()
    assert h.value("kvcache_sidecar_target_up") == 1.0
    assert sum(h.errors(r) for r in REASONS) == 0.0


def test_too_many_engines_are_refused_under_the_configured_limit(server):
    harness = Harness(server, engine_limit=4)
    try:
        body = "".join(f'vllm:kv_cache_usage_perc{{engine="{i}",model_name="m"}} 0.5\n' for i in range(5))
        server.behaviour = ok(body.encode())
        harness.scrape()
        assert harness.errors("too_large") == 1.0
    finally:
        harness.close()


# --- state of vanished engines is pruned; every counter exists from the start -------------------------------------


def test_the_state_of_a_vanished_engine_is_pruned(h, server):
    extra = FULL_A.replace('engine="0"', 'engine="1"')
    server.behaviour = ok((FULL_A + extra).encode())
    h.scrape()
    state = h.sidecar.states[0]
    assert {engine for _, engine in state.last_cache_config} == {"0", "1"}
    server.behaviour = ok(FULL_B.encode())
    h.scrape()
    assert {engine for _, engine in state.last_cache_config} == {"0"}
    assert {key[1] for key in state.history} == {"0"}


def test_every_reason_is_exported_at_zero_from_the_start(h):
    for reason in REASONS:
        assert h.errors(reason) == 0.0
    for reason in DROP_REASONS:
        assert dropped(h, reason) == 0.0


def test_the_limits_table_holds_the_defaults_the_code_uses():
    rows = {row.key: row for row in limits.LIMITS}
    for key in ("sample_limit", "label_limit", "label_name_length_limit", "label_value_length_limit", "engine_limit"):
        assert rows[f"page.{key}"].default == settings.default(f"targets.{key}"), key
    assert rows["page.label_values_limit"].default == settings.default("targets.label_values_limit")
    assert rows["page.label_values_limit"].default == vllm.LABEL_VALUES_LIMIT
    assert rows["page.body_size_limit"].default == settings.default("targets.body_size_limit")
    names = ("sample_limit", "label_limit", "label_name_length_limit", "label_value_length_limit")
    page_limits = parse.PageLimits(*(settings.default(f"targets.{k}") for k in names))
    assert rows["page.line_length"].default == page_limits.line_limit
    for key, (_, _, high) in vllm.CACHE_NUMBERS.items():
        row = rows.get(f"page.{key}") or rows["page.kv_cache_size_tokens"]
        assert row.default == high, key
    assert rows["page.count"].default == vllm.MAX_COUNT


def test_small_bounded_pages_are_read_at_once_larger_ones_in_a_reader_thread(h, server):
    rt = h.sidecar._targets[h.name]
    server.behaviour = ok(FULL_A.encode())  # 64 KiB, every label limit on: its cost is bounded by them
    h.scrape()
    assert rt.reading is None and h.value("kvcache_sidecar_target_up") == 1.0
    padding = "# " + "x" * 1000 + "\n"
    server.behaviour = ok((FULL_A + padding * 300).encode())  # 360 KiB: read by a thread, within the deadline
    h.scrape()
    assert rt.reading is not None and rt.reading.finished.is_set()
    assert h.value("kvcache_sidecar_target_up") == 1.0
