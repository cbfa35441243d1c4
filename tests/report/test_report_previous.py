"""What the report keeps of a period before (``--compare-previous``), and the ``--report-url`` it shows.

The sources read only ``PREVIOUS_FIELDS`` of a period before (the demand) and keep each model's peak
(``model_peaks``): the growth must come out the same as from every series, whatever the other series
hold; and a ``--report-url``
with a ``user:password@`` is shown and posted without it (the redaction of ``sidecar.outbound``).
"""

from __future__ import annotations

import math
from array import array
from pathlib import Path

from sidecar.forecast.policy import AdviceSettings
from sidecar.report import figures
from sidecar.report.cli import Outcome, chat_message, summary_text
from sidecar.report.data import PREVIOUS_FIELDS, ModelKey, Period, PodSeries, Week, model_peaks
from sidecar.thresholds import Thresholds

T0 = 1_799_020_800.0  # Monday 2027-01-04 00:00 UTC
PERIOD = Period(T0, T0 + 3_600)
SETTINGS = AdviceSettings(target_usage=0.75, utilization_min=0.5, utilization_max=0.95, peak_window_s=3600.0)
LLAMA = ModelKey("prod", "llama")
NAN = math.nan


def _pod(period: Period, name: str, demand: list[float], *, everything: bool) -> PodSeries:
    """A pod whose demand is ``demand``; with ``everything``, its other series hold values too."""
    pod = PodSeries.empty(period, LLAMA, name, "0", {"pod": name})
    pod.demand_max = array("d", demand)
    if everything:
        n = period.steps
        pod.usage_max, pod.usage_mean = array("d", [0.5] * n), array("d", [0.4] * n)
        pod.capacity_tokens = array("d", [50_000.0] * n)
        pod.theoretical_capacity_tokens = array("d", [60_000.0] * n)
        pod.block_size = 16
    return pod


def _report(previous_everything: bool) -> figures.Report:
    before = PERIOD.previous()
    n = before.steps
    # b restarts for 20 minutes (NaN); a and b peak in different minutes: the model's peak is a sum per minute
    a = [1_000.0 + 10 * i for i in range(n)]
    b = [NAN if 20 <= i < 40 else 5_000.0 - 50 * i for i in range(n)]
    previous = Week(
        before,
        [_pod(before, "a", a, everything=previous_everything), _pod(before, "b", b, everything=previous_everything)],
        [],
        "test",
    )
    now = [_pod(PERIOD, "a", [8_000.0] * 60, everything=True)]
    week = Week(PERIOD, now, [], "test", history=[model_peaks(previous)])
    return figures.compute(week, thresholds=Thresholds(), advice=SETTINGS, generated_at=0.0)


def test_the_previous_peak_is_the_models_summed_demand_alone():
    """Demand only (what the sources read) or every series: the same growth, the peak of per-minute sums."""
    n = PERIOD.previous().steps
    sums = [(1_000.0 + 10 * i) + (0.0 if 20 <= i < 40 else 5_000.0 - 50 * i) for i in range(n)]
    only_demand, everything = _report(False).models[0].growth, _report(True).models[0].growth
    assert PREVIOUS_FIELDS == ("demand_max",)
    assert only_demand == everything
    assert only_demand.previous_peak_demand_tokens == max(sums) == 6_000.0  # minute 0: 1,000 + 5,000


def test_a_report_url_password_is_neither_printed_nor_posted(tmp_path):
    report = _report(False)
    paths = [Path(tmp_path, "kvcache-report.html"), Path(tmp_path, "kvcache-report.md")]
    url = "https://reader:s3cr%40t-pass@reports.example/kv/"
    text = summary_text(report, paths, url)
    assert "s3cr" not in text and "reader" not in text
    assert "Report: https://reports.example/kv/kvcache-report.html" in text.splitlines()
    chat, link = chat_message(Outcome(report, paths, text), url)
    assert link == "https://reports.example/kv/kvcache-report.html" and "s3cr" not in chat
