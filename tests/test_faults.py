"""A target that is down, slow, huge or returns garbage: counted by reason, the daemon keeps going,
derived gauges survive until the staleness limit and then vanish, and the next good scrape recovers."""

from __future__ import annotations

import asyncio

import pytest
from faultserver import FaultServer, huge_chunked, ok, slow_body, status
from fixtures import CPU_032
from harness import Harness
from processes import free_port

from sidecar.config import load_config
from sidecar.reasons import REASONS
from sidecar.scrape_loop import Sidecar

FULL_A = (CPU_032 / "gqa-6mib_full-a.txt").read_bytes()
FULL_B = (CPU_032 / "gqa-6mib_full-b.txt").read_bytes()


def test_error_counters_exist_at_zero_before_any_failure(h):
    for reason in REASONS:
        assert h.errors(reason) == 0.0
    assert h.value("kvcache_sidecar_target_up") == 0.0
    assert h.value("kvcache_sidecar_last_success_timestamp_seconds") is None  # absent before a first success


def test_refused(server):
    port = free_port()
    cfg = load_config(None, env={}, flag_targets=[f"http://127.0.0.1:{port}/metrics"])
    sc = Sidecar(cfg)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(sc.scrape_once(sc.states[0]))
    name = cfg.targets[0].name
    assert (
        sc.registry.get_sample_value("kvcache_sidecar_scrape_errors_total", {"target": name, "reason": "refused"})
        == 1.0
    )
    assert sc.registry.get_sample_value("kvcache_sidecar_target_up", {"target": name}) == 0.0
    loop.run_until_complete(sc.aclose())
    loop.close()


@pytest.mark.parametrize(
    "behaviour,reason",
    [
        (status(500), "http_5xx"),
        (status(503), "http_5xx"),
        (status(404), "http_4xx"),
        (status(401), "http_4xx"),
        (ok(b""), "empty"),
        (ok(b"\x00\x01\x02\xff\xfe binary garbage \x89PNG"), "invalid_text"),
        (ok(b"\xff\xfe\xfd not utf-8 at all"), "invalid_text"),
        (ok(b'# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine="0" 0.5\n'), "invalid_text"),
        (ok(b'vllm:kv_cache_usage_perc{engine="0",model_name="m"} zero\n'), "invalid_text"),
        (ok(b"# HELP up whatever\nup 1\nnode_load1 0.5\n"), "no_engine_metrics"),
        (huge_chunked(20 * 2**20), "too_large"),
    ],
)
def test_each_failure_is_counted_under_its_reason(h, server, behaviour, reason):
    server.behaviour = behaviour
    h.scrape()
    assert h.errors(reason) == 1.0
    assert sum(h.errors(r) for r in REASONS) == 1.0
    assert h.value("kvcache_sidecar_target_up") == 0.0


def test_content_length_above_the_limit_is_too_large_without_reading_it(server):
    harness = Harness(server, body_size_limit_bytes=1000)
    try:
        server.behaviour = ok(FULL_A)
        harness.scrape()
        assert harness.errors("too_large") == 1.0
    finally:
        harness.close()


def test_timeout_and_slow_body(server):
    harness = Harness(server, timeout_s=0.5)
    try:
        server.behaviour = ok(FULL_A, delay_s=1.0)  # headers late
        harness.scrape()
        assert harness.errors("timeout") == 1.0
        server.behaviour = slow_body(FULL_A, seconds=2.0)  # each piece quick, the whole too slow
        harness.scrape()
        assert harness.errors("timeout") == 2.0
    finally:
        harness.close()


def test_gauges_survive_failures_until_staleness_then_vanish_and_recover(h, server):
    server.behaviour = ok(FULL_A)
    h.scrape()
    assert h.value("kvcache_usage_ratio") == pytest.approx(44 / 47)
    assert h.value("kvcache_sidecar_target_up") == 1.0
    staleness = h.config.staleness_s
    assert staleness == 60.0

    server.behaviour = status(500)
    h.scrape(advance_s=staleness - 1)  # still within the limit: the last good values stay
    assert h.value("kvcache_sidecar_target_up") == 0.0
    assert h.value("kvcache_free_tokens") == 384.0
    h.scrape(advance_s=2)  # past it: derived series are withdrawn, self-monitoring stays
    assert h.value("kvcache_usage_ratio") is None
    assert h.value("kvcache_free_tokens") is None
    assert h.value("kvcache_sidecar_scrape_errors_total", reason="http_5xx") == 2.0
    assert h.value("kvcache_sidecar_last_success_timestamp_seconds") is not None

    server.behaviour = ok(FULL_B)
    h.scrape()
    assert h.value("kvcache_sidecar_target_up") == 1.0
    assert h.value("kvcache_usage_ratio") == 1.0
    assert h.value("kvcache_free_tokens") == 0.0


def test_saturated_target_answering_in_one_and_a_half_timeouts_keeps_its_gauges(server):
    harness = Harness(server, timeout_s=1.0)
    try:
        server.behaviour = ok(FULL_A)
        harness.scrape()
        assert harness.errors("timeout") == 0.0
        server.behaviour = ok(FULL_B, delay_s=1.5)  # 1.5 x timeout: vLLM slow because saturated
        for _ in range(3):
            harness.scrape(advance_s=1)
        assert harness.errors("timeout") == 3.0
        assert harness.value("kvcache_usage_ratio") == pytest.approx(44 / 47)  # not vanished after 3 misses
        server.behaviour = ok(FULL_B)
        harness.scrape()
        assert harness.value("kvcache_usage_ratio") == 1.0
    finally:
        harness.close()


def test_nan_and_inf_values_do_not_break_the_scrape(h, server):
    text = (
        FULL_A.decode()
        .replace(
            'vllm:kv_cache_usage_perc{engine="0",model_name="models/tiny-llama-gqa-bf16"} 0.9361702127659575',
            'vllm:kv_cache_usage_perc{engine="0",model_name="models/tiny-llama-gqa-bf16"} NaN',
        )
        .replace(
            'vllm:num_requests_running{engine="0",model_name="models/tiny-llama-gqa-bf16"} 8.0',
            'vllm:num_requests_running{engine="0",model_name="models/tiny-llama-gqa-bf16"} +Inf',
        )
    )
    assert "NaN" in text and "+Inf\n" in text
    server.behaviour = ok(text.encode())
    h.scrape()
    assert h.value("kvcache_sidecar_target_up") == 1.0
    assert h.value("kvcache_usage_ratio") is None  # unreadable, not zero
    assert h.value("kvcache_used_tokens") is None
    assert h.value("kvcache_requests_running") is None
    assert h.value("kvcache_capacity_tokens") == 6144.0


@pytest.mark.parametrize("value", ["1.7", "-0.3"])
def test_a_usage_outside_0_1_is_dropped_not_clamped(h, server, value):
    # clamped, 1.7 would read as a full cache (time until full 0) and page
    line = 'vllm:kv_cache_usage_perc{engine="0",model_name="models/tiny-llama-gqa-bf16"} 0.9361702127659575'
    server.behaviour = ok(FULL_A.decode().replace(line, line.rsplit(" ", 1)[0] + " " + value).encode())
    h.scrape()
    assert h.value("kvcache_sidecar_target_up") == 1.0
    for gauge in ("kvcache_usage_ratio", "kvcache_used_tokens", "kvcache_time_until_full_seconds"):
        assert h.value(gauge) is None, gauge
    assert h.value("kvcache_capacity_tokens") == 6144.0


def test_counter_reset_passes_through_and_rates_stay_sane(h, server):
    server.behaviour = ok(FULL_B)  # 27 preemptions
    h.scrape()
    restarted = FULL_B.decode().replace(
        'vllm:num_preemptions_total{engine="0",model_name="models/tiny-llama-gqa-bf16"} 27.0',
        'vllm:num_preemptions_total{engine="0",model_name="models/tiny-llama-gqa-bf16"} 3.0',
    )
    server.behaviour = ok(restarted.encode())
    h.scrape(advance_s=10)
    assert h.value("kvcache_preemptions_total") == 3.0  # passed through; Prometheus' rate() handles the reset
    assert h.value("kvcache_preemptions_per_second") == pytest.approx(3 / 10)  # counted since the restart


def test_metric_renamed_between_scrapes_is_still_read(h, server):
    server.behaviour = ok(FULL_A)
    h.scrape()
    renamed = FULL_A.decode().replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    server.behaviour = ok(renamed.encode())
    h.scrape()
    assert h.value("kvcache_usage_ratio") == pytest.approx(44 / 47)
    info = h.sidecar.states[0].snapshot
    assert info.generation == "v1-gpu-names"


def test_cache_config_change_is_counted(h, server):
    server.behaviour = ok(FULL_A)
    h.scrape()
    h.scrape()
    assert h.value("kvcache_sidecar_config_changes_total") == 0.0
    bigger = (
        FULL_A.decode()
        .replace('num_gpu_blocks="48"', 'num_gpu_blocks="96"')
        .replace('kv_cache_size_tokens="6144"', 'kv_cache_size_tokens="12288"')
    )
    server.behaviour = ok(bigger.encode())
    h.scrape()
    assert h.value("kvcache_sidecar_config_changes_total") == 1.0
    assert h.value("kvcache_capacity_tokens") == 12288.0


def test_a_model_that_disappears_takes_its_series_with_it(h, server):
    two = FULL_A.decode() + (
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="1",model_name="models/tiny-llama-gqa-bf16"} 0.5\n'
    )
    server.behaviour = ok(two.encode())
    h.scrape()
    assert h.value("kvcache_usage_ratio", engine="1") == 0.5
    server.behaviour = ok(FULL_A)
    h.scrape()
    assert h.value("kvcache_usage_ratio", engine="1") is None
    assert h.value("kvcache_usage_ratio") == pytest.approx(44 / 47)


@pytest.mark.parametrize(
    "mutation",
    [
        ('le="1000.0"', 'le="abc"'),  # an unparsable bucket bound
        (
            'vllm:request_prompt_tokens_sum{engine="0",model_name="models/tiny-llama-gqa-bf16"} 17920.0',
            'vllm:request_prompt_tokens_sum{engine="0",model_name="models/tiny-llama-gqa-bf16"} NaN',
        ),
        (
            'vllm:request_prompt_tokens_bucket{engine="0",le="+Inf",model_name="models/tiny-llama-gqa-bf16"} 35.0',
            'vllm:request_prompt_tokens_bucket{engine="0",le="+Inf",model_name="models/tiny-llama-gqa-bf16"} NaN',
        ),
    ],
)
def test_odd_histograms_cost_only_themselves(h, server, mutation):
    server.behaviour = ok(FULL_A)
    h.scrape()
    broken = FULL_B.decode().replace(*mutation)
    assert broken != FULL_B.decode()
    server.behaviour = ok(broken.encode())
    h.scrape()
    assert h.value("kvcache_sidecar_target_up") == 1.0
    assert sum(h.errors(r) for r in REASONS) == 0.0
    assert h.value("kvcache_usage_ratio") == 1.0
    assert h.value("kvcache_demand_tokens") is not None


def test_compressed_answers_are_refused_not_inflated(h, server):
    import gzip

    def gzipped(handler):
        body = gzip.compress(FULL_A)
        handler.send_response(200)
        handler.send_header("Content-Encoding", "gzip")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    server.behaviour = gzipped
    h.scrape()
    assert h.errors("invalid_text") == 1.0


def test_two_targets_serving_the_same_model_keep_separate_forecasts():
    """Each target's forecast state is its own, even when model_name and engine coincide."""
    from fixtures import CPU_032 as cpu

    ramp_pages = []
    base = (cpu / "gqa-1gib_load.txt").read_text()
    for i in range(8):  # a rising usage on target A
        usage = 'vllm:kv_cache_usage_perc{engine="0",model_name="models/tiny-llama-gqa-bf16"}'
        ramp_pages.append(base.replace(f"{usage} 0.05469417653522157", f"{usage} {0.05 + 0.05 * i}"))
    assert ramp_pages[3] != base
    servers = [FaultServer(), FaultServer()]
    clock = [1_800_000_000.0]
    try:
        cfg = load_config(None, env={}, flag_targets=[s.url for s in servers])
        from sidecar.layers import build_extenders

        sc = Sidecar(cfg, build_extenders(cfg), clock=lambda: clock[0])
        loop = asyncio.new_event_loop()
        servers[1].behaviour = ok(base.encode())  # flat
        for page in ramp_pages:
            servers[0].behaviour = ok(page.encode())
            clock[0] += 5
            for st in sc.states:
                loop.run_until_complete(sc.scrape_once(st))
        names = [t.name for t in cfg.targets]
        labels = {"model_name": "models/tiny-llama-gqa-bf16", "engine": "0"}
        rising = sc.registry.get_sample_value("kvcache_fill_rate_tokens_per_second", {"target": names[0], **labels})
        flat = sc.registry.get_sample_value("kvcache_fill_rate_tokens_per_second", {"target": names[1], **labels})
        assert rising > 0 and flat == 0.0
        loop.run_until_complete(sc.aclose())
        loop.close()
    finally:
        for s in servers:
            s.stop()


def test_a_run_of_failures_is_logged_once_and_the_recovery_too(h, server, caplog):
    import logging

    server.behaviour = status(503)
    with caplog.at_level(logging.INFO, logger="kv_sidecar.daemon"):
        for _ in range(4):
            h.scrape()
        server.behaviour = ok(FULL_A)
        h.scrape()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("scrape failed" in m for m in messages) == 1
    assert sum("scrape recovered" in m and "reason=http_5xx" in m for m in messages) == 1
    assert h.errors("http_5xx") == 4.0


# --- the bearer token: sent, re-read at every scrape, never logged --------------------------------------------


def _recording(body: bytes, seen: list):
    def behave(h):
        seen.append(h.headers.get("Authorization"))
        ok(body)(h)

    return behave


def test_the_bearer_token_is_sent_and_reread_at_every_scrape(server, tmp_path):
    token = tmp_path / "token"
    token.write_text("eyJhbGciOi.J9-x_y~z+/ab==\n")  # every RFC 6750 b64token character class
    seen: list = []
    server.behaviour = _recording(FULL_A, seen)
    harness = Harness(server, bearer_token_file=str(token))
    try:
        harness.scrape()
        token.write_text("rotated-2\n")  # a rotated secret is picked up without a restart
        harness.scrape()
        assert seen == ["Bearer eyJhbGciOi.J9-x_y~z+/ab==", "Bearer rotated-2"]
        assert harness.errors("token_file") == 0.0
    finally:
        harness.close()


@pytest.mark.parametrize(
    "content",
    [
        b"s3cr3t-TOKEN\nsecond-line\n",  # h11 would refuse the header and quote it in its error
        b"s3cr3t-TOKEN-\xc3\xa9\n",  # non-ASCII: cannot be encoded as a header
        b"s3cr3t-TOKEN-\xff\n",  # not even UTF-8
        b"s3cr3t TOKEN\n",  # a space
        b"\n",  # empty
        None,  # the file vanished after start-up
    ],
)
def test_a_bad_token_file_is_counted_never_sent_and_never_logged(server, tmp_path, caplog, content):
    import logging

    token = tmp_path / "token"
    if content is not None:
        token.write_bytes(content)
    server.behaviour = ok(FULL_A)
    harness = Harness(server, bearer_token_file=str(token))  # past validation: as if rotated while running
    try:
        with caplog.at_level(logging.DEBUG):
            harness.scrape()
        assert harness.errors("token_file") == 1.0
        assert server.requests == 0  # nothing was sent
        text = "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
        assert "s3cr3t" not in text and "second-line" not in text
        assert not any(r.exc_info for r in caplog.records), "a bad token file is one line, not a traceback"
        assert str(token) in text  # the log names the file to fix
    finally:
        harness.close()


def test_a_page_of_too_many_engines_is_refused_whole(h, server):
    # Under the byte limit, but 257 (model, engine) pairs: not one inference server (targets[].engine_limit)
    page = "".join(f'vllm:kv_cache_usage_perc{{engine="{i}",model_name="m"}} 0.5\n' for i in range(257))
    server.behaviour = ok(page.encode())
    h.scrape()
    assert h.errors("too_large") == 1.0
    assert h.value("kvcache_usage_ratio", engine="0", model_name="m") is None
    server.behaviour = ok(page.replace('engine="256"', 'engine="255"').encode())  # 256 pairs: fine
    h.scrape()
    assert h.errors("too_large") == 1.0
    assert h.value("kvcache_sidecar_target_up") == 1.0


def test_a_redirect_is_a_4xx_that_names_the_url_without_its_query(h, server, caplog):
    import logging

    def redirect(handler):
        handler.send_response(302)
        handler.send_header("Location", "/metrics-new?X-Signature=s3cr3t-sig")
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    server.behaviour = redirect
    with caplog.at_level(logging.WARNING):
        h.scrape()
    assert h.errors("http_4xx") == 1.0
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "redirect to /metrics-new?<query>: use that URL" in text
    assert "s3cr3t" not in text
