"""The report's three formats (sidecar/report/render.py, sidecar/report/plots.py) on a realistic week.

The Report is built by hand (:func:`week_report`): two models, three pods, a week of one-minute steps
(10,080 points per series), one model that needs action. The person's view opens the HTML in headless
Chromium (Debian's ``chromium``; ``scripts/install-chromium.sh``): every image must load with a
non-trivial size, nothing may stick out of a 1280 px window, and the screenshot must show a page,
not a blank one. Without Chromium that test skips loudly, and fails under ``CI=true``.

A screenshot of this test's page (the picture in the docs is a real report's, of the known week:
``tests/report/test_known_week_report.py --screenshot``)::

    .venv/bin/python tests/report/test_render.py --screenshot /tmp/kvcache-report.png
"""

from __future__ import annotations

import html
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sidecar import atomic_write
from sidecar.report import render
from sidecar.report.data import ModelKey, Page, Period
from sidecar.report.growth import GrowthTrend
from sidecar.report.render import ReportWriteError, write_report
from sidecar.report.results import (
    Advice,
    Capacity,
    ModelReport,
    PodReport,
    Pressure,
    Report,
    Timeline,
    Usage,
)

START = datetime(2026, 11, 23, tzinfo=UTC).timestamp()  # a Monday
WEEK = Period(START, START + 7 * 86400)
BASE = "kvcache-report-2026-11-23_2026-11-30"
GENERATED = datetime(2026, 11, 30, 6, 0, 12, tzinfo=UTC).timestamp()
BLOCK = 16
HINT = "pip install 'kv-cache-sidecar[report]'"


# ----------------------------------------------------------------------------- a realistic week


def _usage_series(peak: float, trough: float, seed: int, gap: range | None = None) -> list[float | None]:
    """A diurnal week: low at night, peaks in the UTC afternoon, quieter weekend, a little noise."""
    out: list[float | None] = []
    state = seed
    for i in range(WEEK.steps):
        hour = (i / 60.0) % 24
        day = i // 1440
        daily = max(0.0, math.sin(math.pi * (hour - 6) / 14)) if 6 <= hour <= 20 else 0.0
        weekday = 0.7 if day >= 5 else 1.0
        state = (state * 1103515245 + 12345) % 2**31
        noise = (state / 2**31 - 0.5) * 0.04
        out.append(min(1.0, max(0.0, trough + (peak - trough) * daily * weekday + noise)))
    if gap is not None:  # a restart: no samples
        for i in gap:
            out[i] = None
    return out


def _hour_of_week(usage: list[float | None]) -> list[list[float | None]]:
    grid: list[list[float | None]] = [[None] * 24 for _ in range(7)]
    for i, u in enumerate(usage):
        if u is None:
            continue
        day, hour = (i // 1440) % 7, (i // 60) % 24
        cell = grid[day][hour]
        grid[day][hour] = u if cell is None else max(cell, u)
    return grid


def _timeline(usage: list[float | None], usable: float, burst_hour: int, burst: float) -> Timeline:
    demand = [None if u is None else u * usable * 1.02 for u in usage]
    per_hour = [0.0] * 168
    for h in range(168):
        hot = sum(1 for u in usage[h * 60 : (h + 1) * 60] if u is not None and u > 0.93)
        per_hour[h] = float(hot * 2)
    per_hour[burst_hour] += burst
    return Timeline(
        step_s=WEEK.step_s,
        start=WEEK.start,
        usage_max_ratio=usage,
        demand_tokens=demand,
        usable_tokens=[None if u is None else usable for u in usage],
        preemptions_per_hour=per_hour,
        hour_of_week_peak_ratio=_hour_of_week(usage),
    )


def _pod(name: str, usage: list[float | None], capacity: float, hot: bool, burst_hour: int) -> PodReport:
    usable = capacity - BLOCK
    tl = _timeline(usage, usable, burst_hour, 240.0 if hot else 0.0)
    known = sorted(u for u in usage if u is not None)
    peak = known[-1]
    preempt = sum(tl.preemptions_per_hour)
    worst = max(range(168), key=lambda h: tl.preemptions_per_hour[h])
    advice = (
        Advice(
            "raise_gpu_memory_utilization",
            "peak_above_target",
            f"Raise gpu_memory_utilization from 0.85 to 0.93 on {name}: {round(capacity):,} -> "
            f"{round(capacity * 1.2):,} tokens.",
            suggested_gpu_memory_utilization=0.93,
            peak_usage_after_ratio=peak / 1.2,
        )
        if hot
        else Advice("none", "within_target", "Nothing to change.")
    )
    return PodReport(
        pod=name,
        engine="vllm",
        usage=Usage(
            peak,
            known[len(known) // 2],
            known[int(len(known) * 0.95)],
            known[int(len(known) * 0.99)],
            sum(1 for u in known if u > 0.8) / 60,
            sum(1 for u in known if u > 0.9) / 60,
        ),
        capacity=Capacity(capacity, usable, capacity * 1.04, 1 / 1.04, peak * usable * 1.02, peak * 1.02, None),
        pressure=Pressure(
            preempt, WEEK.start + worst * 3600 if preempt else None, max(tl.preemptions_per_hour), 3.5, 0.41
        ),
        advice=advice,
        pages=2 if name == "llama-0" else 0,  # the week's pages of this pod
        timeline=tl,
    )


#: Eight weeks fitted: +45,000 tokens a week on a trend at 450,000 (10 %), 80 % interval 8-12 %.
LLAMA_GROWTH = GrowthTrend(
    previous_peak_demand_tokens=402_311.0,
    change_ratio=0.118,
    weeks_until_full=1.6,
    verdict="growing",
    method="least squares",
    weeks_fitted=8,
    weeks_skipped=0,
    growth_tokens_per_week=45_000.0,
    growth_standard_error_tokens_per_week=6_250.0,
    growth_low_tokens_per_week=36_000.0,
    growth_high_tokens_per_week=54_000.0,
    growth_ratio_per_week=0.10,
    trend_peak_demand_tokens=450_000.0,
    weeks_until_full_low=1.3,
    weeks_until_full_high=2.1,
    usable_tokens=455_584.0,
)
#: Six weeks fitted, one skipped; infinity (never full) as a figure a renderer must not print.
QWEN_GROWTH = GrowthTrend(
    previous_peak_demand_tokens=301_000.0,
    change_ratio=-0.02,
    weeks_until_full=math.inf,
    verdict="not growing",
    method="least squares",
    weeks_fitted=6,
    weeks_skipped=1,
    growth_tokens_per_week=-6_000.0,
    growth_standard_error_tokens_per_week=8_000.0,
    growth_low_tokens_per_week=-18_000.0,
    growth_high_tokens_per_week=6_000.0,
    growth_ratio_per_week=-0.02,
    trend_peak_demand_tokens=300_000.0,
)


def _model(key: ModelKey, pods: list[PodReport], growth: GrowthTrend, advice: Advice, pages: list[Page]) -> ModelReport:
    """The model's figures from its pods: usage of the hottest pod, capacities summed."""
    usage_tl = [
        max((v for v in vals if v is not None), default=None)
        for vals in zip(*(p.timeline.usage_max_ratio for p in pods), strict=True)
    ]
    usable = sum(p.capacity.usable_tokens or 0 for p in pods)
    capacity = sum(p.capacity.capacity_tokens or 0 for p in pods)
    tl = _timeline(usage_tl, usable, 0, 0.0)
    tl = replace(
        tl, preemptions_per_hour=[sum(h) for h in zip(*(p.timeline.preemptions_per_hour for p in pods), strict=True)]
    )
    peak_demand = max(p.capacity.peak_demand_tokens or 0 for p in pods) * len(pods) * 0.9
    worst = max(pods, key=lambda p: p.pressure.worst_hour_preemptions).pressure
    needs = advice.action != "none"
    return ModelReport(
        model=key,
        usage=replace(pods[0].usage, peak_ratio=max(p.usage.peak_ratio or 0 for p in pods)),
        capacity=Capacity(
            capacity,
            usable,
            capacity * 1.04,
            1 / 1.04,
            peak_demand,
            peak_demand / usable,
            max(0.0, 1 - peak_demand / usable),
        ),
        pressure=Pressure(
            sum(p.pressure.preemptions for p in pods), worst.worst_hour_start, worst.worst_hour_preemptions, 4.2, 0.38
        ),
        growth=growth,
        advice=advice,
        pages=pages,
        pods=pods,
        timeline=tl,
        needs_action=needs,
        summary=(
            f"{key}: peak {max(p.usage.peak_ratio or 0 for p in pods):.1%}, "
            f"{sum(p.usage.hours_above_watermark for p in pods) / len(pods):.1f} h a pod above the watermark "
            f"and {sum(p.pressure.preemptions for p in pods):,.0f} preemptions; raise gpu_memory_utilization "
            "from 0.85 to 0.93 (the peak would sit at 82.1%)."
            if needs
            else f"{key}: within target."
        ),
    )


def week_report(generated_at: float = GENERATED) -> Report:
    """Two models, three pods, 10,080 one-minute steps; llama needs action, qwen does not."""
    llama = ModelKey("prod", "llama-3.1-8b-instruct")
    qwen = ModelKey("prod", "qwen2.5-7b-instruct")
    llama_pods = [
        _pod("llama-0", _usage_series(0.955, 0.22, 1, gap=range(4000, 4025)), 227_808, True, 2 * 24 + 14),
        _pod("llama-1", _usage_series(0.91, 0.18, 2), 227_808, True, 3 * 24 + 15),
    ]
    qwen_pods = [_pod("qwen-0", _usage_series(0.62, 0.10, 3), 458_752, False, 0)]
    pages = [
        Page(
            "KVCacheAlmostFull", "warning", llama, "llama-0", START + 86400 + 13.5 * 3600, START + 86400 + 14.2 * 3600
        ),
        Page(
            "KVCacheAlmostFull",
            "warning",
            llama,
            "llama-0",
            START + 2 * 86400 + 14 * 3600,
            START + 2 * 86400 + 15 * 3600,
        ),
        Page(
            "KVCacheFullSoon", "critical", llama, "", START + 2 * 86400 + 14.1 * 3600, START + 2 * 86400 + 14.4 * 3600
        ),
    ]
    llama_advice = Advice(
        "raise_gpu_memory_utilization",
        "peak_above_target",
        "Raise gpu_memory_utilization from 0.85 to 0.93: capacity 455,616 -> 546,739 tokens, "
        "the week's peak would sit at 82.1% (target 75.0%).",
        suggested_gpu_memory_utilization=0.93,
        capacity_shortfall_tokens=91_123,
        levers={"fp8_kv_cache": 911_232.0, "max_model_len": 500_000.0},
        peak_usage_after_ratio=0.821,
    )
    models = [
        _model(llama, llama_pods, LLAMA_GROWTH, llama_advice, pages),
        _model(
            qwen,
            qwen_pods,
            QWEN_GROWTH,
            Advice("none", "within_target", "Nothing to change."),
            [],
        ),
    ]
    return Report(
        period=WEEK,
        source="Prometheus http://prometheus.monitoring:9090",
        generated_at=generated_at,
        watermark=0.9,
        warning=0.8,
        target_usage=0.75,
        models=models,
        summary=[models[0].summary],
    )


# ----------------------------------------------------------------------------- helpers


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _everything_in(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# ----------------------------------------------------------------------------- the files


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Report, Path, list[Path]]:
    out = tmp_path_factory.mktemp("report")
    report = week_report()
    return report, out, write_report(report, out)


def test_writes_the_three_documents_and_the_images_beside_the_markdown(written):
    report, out, paths = written
    assert [p.name for p in paths[:3]] == [f"{BASE}.md", f"{BASE}.html", f"{BASE}.json"]
    images = sorted((out / f"{BASE}-images").iterdir())
    names = [p.name for p in images]
    for slug in ("prod-llama-3.1-8b-instruct", "prod-qwen2.5-7b-instruct"):
        assert [n for n in names if n.startswith(slug + "-")] == [
            f"{slug}-{n}.png" for n in sorted(("usage", "demand", "preemptions", "heatmap"))
        ]
    assert sorted(paths[3:]) == images
    for p in images:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in out.rglob(".*")], "temporary files left behind"

    md = (out / f"{BASE}.md").read_text()
    linked = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert sorted(linked) == sorted(f"{BASE}-images/{n}" for n in names)
    assert all((out / link).is_file() for link in linked)


def test_the_html_is_one_self_contained_file(written):
    _, out, _ = written
    page = (out / f"{BASE}.html").read_text()
    sources = re.findall(r'src="([^"]*)"', page)
    assert len(sources) == 8 and all(s.startswith("data:image/png;base64,") for s in sources)
    assert not re.search(r'(href|src)="(https?:|//|file:)', page), "the page loads something from outside"
    assert "<link" not in page and "@import" not in page
    assert "@media print" in page and "break-before: page" in page
    assert page.count('<section class="model"') == 2


def test_the_json_has_every_figure_with_nan_and_infinity_as_null(written):
    report, out, _ = written
    text = (out / f"{BASE}.json").read_text()
    doc = json.loads(text)  # strict JSON: no NaN or Infinity tokens
    assert "NaN" not in text and "Infinity" not in text
    assert list(doc) == sorted(doc)
    llama, qwen = doc["models"]
    assert llama["model"] == {"namespace": "prod", "model_name": "llama-3.1-8b-instruct"}
    assert llama["usage"]["peak_ratio"] == report.models[0].usage.peak_ratio
    assert qwen["growth"]["weeks_until_full"] is None  # math.inf
    assert len(llama["timeline"]["usage_max_ratio"]) == 10_080
    assert llama["pods"][0]["timeline"]["usage_max_ratio"][4000] is None  # the restart's gap
    assert len(llama["timeline"]["hour_of_week_peak_ratio"]) == 7
    assert [p["alertname"] for p in llama["pages"]] == ["KVCacheAlmostFull", "KVCacheAlmostFull", "KVCacheFullSoon"]
    assert doc["generated_at"] == GENERATED


def test_the_markdown_says_things_in_order_with_numbers_for_people(written):
    report, out, _ = written
    md = (out / f"{BASE}.md").read_text()
    order = [
        "# KV-cache capacity report: 2026-11-23 to 2026-11-30",
        "Period: Mon 2026-11-23 00:00 UTC to Mon 2026-11-30 00:00 UTC (7 days, 1-minute steps)",
        "Source: Prometheus http://prometheus.monitoring:9090",
        "## Summary",
        "1. prod/llama-3.1-8b-instruct: peak",
        "## Fleet",
        "## prod/llama-3.1-8b-instruct",
        "### Figures",
        "### Recommendation",
        "Raise gpu_memory_utilization from 0.85 to 0.93",
        "Effect: the period's peak would sit at 82.1% of the new capacity (target 75.0%).",
        "### Pods",
        "### Pages",
        "- KVCacheAlmostFull (warning), llama-0: Tue 2026-11-24 13:30 UTC to 14:12 UTC (42 min)",
        "### Plots",
        "## prod/qwen2.5-7b-instruct",
    ]
    at = 0
    for text in order:  # each after the one before
        found = md.find(text, at)
        assert found >= 0, f"{text!r} missing or out of order"
        at = found + len(text)

    llama = report.models[0]
    fleet = next(line for line in md.splitlines() if line.startswith("| prod/llama-3.1-8b-instruct |"))
    cells = [c.strip() for c in fleet.strip("|").split("|")]
    assert cells[1] == f"{llama.usage.peak_ratio * 100:.1f}%" and cells[1].endswith("%")
    assert cells[3] == f"{llama.usage.hours_above_warning:.1f} h"
    assert cells[6] == f"{round(llama.pressure.preemptions):,}"
    # pages split by severity (what paged, then warnings); growth in words; human text for the action
    assert cells[7] == "1 / 2" and cells[8] == "full in 1.6 weeks (1.3 to 2.1)"
    assert cells[10] == "raise --gpu-memory-utilization"
    assert "| Capacity (vLLM) / usable, tokens | 455,616 / 455,584 |" in md
    assert "| Idle at the peak | — |" not in md  # the model's idle share is known ...
    assert "Theoretical capacity, tokens | 473,841 |" in md
    # infinity says nothing more; the fit's interval and weeks in words
    assert "| Growth | not growing: -2.0%/week (80%: -6.0 to +2.0%), over 6 weeks, 1 skipped |" in md
    assert (
        "| Growth | growing +10.0%/week (80%: +8.0 to +12.0%), full in 1.6 weeks (80%: 1.3 to 2.1 weeks), "
        "over 8 weeks |" in md
    )
    assert "- With fp8 KV cache: 911,232 tokens per replica" in md
    assert "| Worst hour for preemptions | " in md and " preemptions in the hour from " in md  # a unit
    qwen_pages = md[md.find("## prod/qwen2.5-7b-instruct") :]
    assert "### Pages\n\nNone." in qwen_pages


def test_a_week_with_nothing_to_change_says_so(tmp_path):
    report = week_report()
    report = replace(report, summary=[], models=[report.models[1]])
    [md] = write_report(report, tmp_path, ("md",))[:1]
    text = md.read_text()
    assert "## Summary\n\nNothing to change this week.\n" in text
    assert "llama" not in text


def test_a_rerun_gives_the_same_bytes_but_the_generation_line(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    write_report(week_report(GENERATED), first)
    write_report(week_report(GENERATED + 3 * 3600 + 17.5), second)
    a, b = _files(first), _files(second)
    assert sorted(a) == sorted(b)
    for name in a:
        if name.endswith(".png"):
            assert a[name] == b[name], f"{name}: the picture changed"
            continue
        if name.endswith(".json"):  # one compact line: equal but for the generation time
            ja, jb = (re.sub(r'"generated_at":[0-9.e+]+', "", x.decode(), count=1) for x in (a[name], b[name]))
            assert ja == jb and a[name] != b[name], name
            continue
        la, lb = a[name].decode().splitlines(), b[name].decode().splitlines()
        assert len(la) == len(lb), name
        differing = [(x, y) for x, y in zip(la, lb, strict=True) if x != y]
        assert len(differing) == 1, f"{name}: {len(differing)} lines differ"
        x, y = differing[0]
        assert "Generated Mon 2026-11-30 06:00 UTC" in x and x.replace("06:00", "09:00") == y


def test_an_unwritable_folder_is_one_clear_line_and_leaves_nothing(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the report's parent folder should be\n")
    report = week_report()
    for out in (blocker / "reports", blocker):  # root can't write into a regular file either
        with pytest.raises(ReportWriteError) as e:
            write_report(report, out)
        message = str(e.value)
        assert "\n" not in message and str(out) in message and "--out" in message
    assert _everything_in(tmp_path) == ["not-a-folder"]


def test_a_failure_after_the_folder_exists_leaves_no_partial_file(tmp_path):
    (tmp_path / f"{BASE}-images").write_text("a file where the images folder goes\n")
    with pytest.raises(ReportWriteError, match="--out"):
        write_report(week_report(), tmp_path)
    assert _everything_in(tmp_path) == [f"{BASE}-images"]


def test_ctrl_c_during_the_renames_never_leaves_a_half_written_document(tmp_path, monkeypatch):
    real_replace = os.replace
    calls = []

    def interrupted(src, dst):
        calls.append(dst)
        if len(calls) == 3:
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(atomic_write.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_report(week_report(), tmp_path)
    monkeypatch.setattr(atomic_write.os, "replace", real_replace)
    left = _everything_in(tmp_path)
    assert not [n for n in left if Path(n).name.startswith(".")], left  # no temporary file
    assert not [n for n in left if n.endswith((".md", ".html", ".json"))], "a document before its images"
    assert len([n for n in left if n.endswith(".png")]) == 2
    paths = write_report(week_report(), tmp_path)  # and a rerun completes the report
    assert all(p.is_file() for p in paths)


def test_without_matplotlib_the_error_names_the_extra_and_json_still_works(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.delitem(sys.modules, "sidecar.report.plots", raising=False)
    with pytest.raises(ImportError, match=re.escape(HINT)) as e:
        write_report(week_report(), tmp_path, ("md", "json"))
    assert e.value.name == "matplotlib"
    assert _everything_in(tmp_path) == []
    [path] = write_report(week_report(), tmp_path, ("json",))
    assert path.name == f"{BASE}.json"


def test_model_names_become_stable_distinct_file_names():
    report = week_report()
    a, b = report.models
    odd = [
        replace(a, model=ModelKey("prod", "Meta/Llama 3.1:8B")),
        replace(b, model=ModelKey("prod-meta", "llama 3.1:8b")),
        replace(b, model=ModelKey("", "../../etc")),
    ]
    slugs = render.model_slugs(replace(report, models=odd))
    assert slugs[2] == "etc"
    assert slugs[0] != slugs[1] and all(s.startswith("prod-meta-llama-3.1-8b-") for s in slugs[:2])
    assert all(re.fullmatch(r"[a-z0-9._-]+", s) for s in slugs)
    assert slugs == render.model_slugs(replace(report, models=odd))


def test_a_period_that_is_not_whole_days_has_the_time_in_its_name():
    assert render.base_name(WEEK) == BASE
    short = Period(START + 9 * 3600, START + 9 * 3600 + 600)
    assert render.base_name(short) == "kvcache-report-2026-11-23T0900_2026-11-23T0910"


# ----------------------------------------------------------------------------- a person's view (Chromium)

PROBE = """
<script>
window.addEventListener("load", () => {
  const de = document.documentElement;
  let right = 0;
  for (const el of document.body.querySelectorAll("*")) right = Math.max(right, el.getBoundingClientRect().right);
  const seen = {
    images: [...document.images].map(
      i => [i.complete, i.naturalWidth, i.naturalHeight, i.getBoundingClientRect().width]),
    scrollWidth: de.scrollWidth, clientWidth: de.clientWidth, innerWidth: window.innerWidth, right: right,
  };
  const pre = document.createElement("pre");
  pre.id = "probe";
  pre.textContent = JSON.stringify(seen);
  document.body.appendChild(pre);
});
</script>
"""


def chromium() -> str:
    """The Chromium binary, or skip loudly (fail under CI=true)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    reason = (
        "chromium is not installed (run scripts/install-chromium.sh); the HTML report's person's view is NOT checked"
    )
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but {reason}")
    pytest.skip(reason)


def _run_chromium(binary: str, *args: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="kvcache-chromium-") as profile:
        return subprocess.run(
            [
                binary,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--hide-scrollbars",
                "--no-first-run",
                f"--user-data-dir={profile}",
                "--window-size=1280,2000",
                "--virtual-time-budget=10000",
                "--run-all-compositor-stages-before-draw",  # every tile painted before the screenshot
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )


def screenshot(html_file: Path, png: Path, height: int = 2000, binary: str | None = None) -> None:
    """A 1280 px wide screenshot of ``html_file`` (the top ``height`` pixels)."""
    binary = binary or shutil.which("chromium") or "chromium"
    done = _run_chromium(binary, f"--window-size=1280,{height}", f"--screenshot={png}", html_file.resolve().as_uri())
    if not png.is_file():
        raise RuntimeError(f"chromium wrote no screenshot: {done.stderr[-2000:]}")


def test_in_chromium_every_plot_loads_and_nothing_overflows_1280_px(written, tmp_path):
    binary = chromium()
    report, out, _ = written
    page = (out / f"{BASE}.html").read_text()
    probed = tmp_path / "probed.html"  # a test-only copy: the report itself carries no script
    probed.write_text(page.replace("</body>", PROBE + "</body>"))
    done = _run_chromium(binary, "--dump-dom", probed.as_uri())
    found = re.search(r'<pre id="probe">(.*?)</pre>', done.stdout, re.S)
    assert found, f"the probe did not run: {done.stderr[-2000:]}"
    seen = json.loads(html.unescape(found.group(1)))
    assert len(seen["images"]) == 8
    for complete, width, height, shown in seen["images"]:
        assert complete and width > 100 and height > 100 and shown > 100, seen["images"]
    assert seen["clientWidth"] >= 1200, seen  # the window really was 1280 px wide
    assert seen["scrollWidth"] <= seen["clientWidth"] <= 1280, seen
    assert seen["right"] <= seen["clientWidth"] + 0.5, seen

    from PIL import Image

    png = tmp_path / "report.png"
    screenshot(out / f"{BASE}.html", png, binary=binary)
    with Image.open(png) as shot:
        assert shot.size == (1280, 2000)
        rgb = shot.convert("RGB")
        colours = rgb.getcolors(maxcolors=1 << 24) or []
        white = sum(n for n, c in colours if min(c) >= 250)
    assert len(colours) > 200, "the screenshot has almost no colours: a blank or unstyled page"
    assert white < 0.95 * 1280 * 2000, "the screenshot is nearly all white"


def main(argv: list[str]) -> int:
    """``--screenshot PATH [HEIGHT]``: a picture of the HTML report of :func:`week_report`."""
    if len(argv) < 2 or argv[0] != "--screenshot":
        print("usage: python tests/report/test_render.py --screenshot docs/images/kvcache-report.png [height]")
        return 2
    target = Path(argv[1])
    height = int(argv[2]) if len(argv) > 2 else 3200
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_report(week_report(), Path(tmp), ("html",))
        screenshot(paths[0], target, height)
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
