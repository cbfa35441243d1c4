"""Property: whatever a page holds, ``Sidecar.read_body`` raises nothing but ``ScrapeFailed``, and the
sidecar's own ``/metrics`` stays a valid exposition (``promtool check metrics``) whose numbers are
finite and non-negative where they must be.

The pages are the real fixtures of ``tests/fixtures/metrics`` with a few of their lines mutated:
a value or a label value replaced by a hostile one, a line duplicated, cut, deleted or replaced
by arbitrary text. Each example scrapes the intact page first (so derived state exists), then the
mutated one, through the daemon's own ``read_body`` and ``record``. Deterministic (``derandomize``)
with a fixed number of examples, so CI replays the same pages every run.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from fixtures import METRICS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.config import load_config
from sidecar.engines import vllm
from sidecar.layers import build_extenders
from sidecar.reasons import ScrapeFailed
from sidecar.scrape_loop import Sidecar

PAGES = sorted(p for p in METRICS.rglob("*.txt") if "sglang" not in p.name)
TEXTS = [p.read_text() for p in PAGES]
TOOLS = Path(__file__).resolve().parents[2] / ".tools"

HOSTILE_NUMBERS = [
    "NaN", "+Inf", "-Inf", "-1", "-6144", "0", "1e999", "-1e999", "1.28e32", "1e308", "4.9e-324", "9" * 400,
    "0x10", "1_000", "", "abc", "1.0.0", "--1", "+", "1e", " 1", "inf", "nan",
]  # fmt: skip
HOSTILE_LABELS = [
    "1e999", "inf", "-inf", "nan", "-6144", "1.28e32", "0", "-0", "None", "", "True", "0.5", "1.5", "-0.1",
    "9" * 100, "x" * 3000, "é漢字", '\\"', "\\\\", "\\n", "a,b=c", '"', "}",
]  # fmt: skip


def _promtool() -> str | None:
    found = shutil.which("promtool")
    if found:
        return found
    candidate = TOOLS / "bin" / "promtool"
    return str(candidate) if candidate.is_file() else None


PROMTOOL = _promtool()


def test_promtool_checks_the_expositions():
    """Without promtool the property below still checks the numbers, and this test says what is missing."""
    if PROMTOOL is None:
        reason = "promtool not found on PATH or in .tools/bin; run `bash scripts/install-prometheus-tools.sh`"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but {reason}", pytrace=False)
        pytest.skip(f"PROMETHEUS TOOL MISSING: {reason}")


#: Gauges that may be negative (a trend) or +Inf (never full); every other value must be finite and >= 0.
SIGNED = {"kvcache_fill_rate_tokens_per_second"}
MAY_BE_INF = {"kvcache_time_until_full_seconds", "kvcache_time_until_watermark_seconds"}
RATIOS = {"kvcache_usage_ratio", "kvcache_prefix_cache_hit_ratio", "kvcache_sidecar_target_up"}

VALUE = re.compile(r"^(?P<head>[^ ]+(?:\{.*\})?) (?P<value>[^ ]+)$")
LABEL_VALUE = re.compile(r'="((?:[^"\\]|\\.)*)"')


class Pages:
    """An intact fixture and its mutated copy; shown as the fixture's name and the lines changed."""

    def __init__(self, index: int, mutated: str, changes: list[str]):
        self.name, self.intact, self.mutated, self.changes = PAGES[index].name, TEXTS[index], mutated, changes

    def __repr__(self) -> str:
        return f"Pages({self.name!r}, changes={self.changes!r})"


@st.composite
def mutated_pages(draw) -> Pages:
    index = draw(st.integers(0, len(TEXTS) - 1))
    text = TEXTS[index]
    lines = text.splitlines()
    before = list(lines)
    # the lines the adapter reads: a mutation elsewhere would only test the pre-filter
    sample_lines = [i for i, line in enumerate(lines) if re.split(r"[{ ]", line, maxsplit=1)[0] in vllm.NEEDED]
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.sampled_from(sample_lines)) if sample_lines else draw(st.integers(0, len(lines) - 1))
        line = lines[i]
        kind = draw(st.sampled_from(["value", "label", "cache", "cache", "duplicate", "delete", "cut", "text", "pid"]))
        if kind == "cache":  # the numbers the capacity stands on
            info = [j for j, li in enumerate(lines) if li.startswith(vllm.CACHE_CONFIG_INFO)]
            key = draw(st.sampled_from(sorted(vllm.CACHE_NUMBERS)))
            if info and f'{key}="' in lines[info[0]]:
                j = info[0]
                new = f'{key}="{draw(st.sampled_from(HOSTILE_LABELS))}"'
                lines[j] = re.sub(rf'{key}="(?:[^"\\]|\\.)*"', lambda _, new=new: new, lines[j])
        elif kind == "value" and (m := VALUE.match(line)):
            lines[i] = f"{m['head']} {draw(st.sampled_from(HOSTILE_NUMBERS))}"
        elif kind == "label" and (found := list(LABEL_VALUE.finditer(line))):
            m = draw(st.sampled_from(found))
            lines[i] = line[: m.start(1)] + draw(st.sampled_from(HOSTILE_LABELS)) + line[m.end(1) :]
        elif kind == "duplicate":
            lines.insert(i, line)
        elif kind == "delete":
            del lines[i]
        elif kind == "cut":
            lines[i] = line[: draw(st.integers(0, len(line)))]
        elif kind == "pid":
            lines.insert(i, line.replace("{", '{pid="7",', 1))
        else:
            lines[i] = draw(st.text(max_size=80))
    changes = [line[:300] for line in lines if line not in set(before)] + [f"(lines: {len(before)} -> {len(lines)})"]
    return Pages(index, "\n".join(lines) + "\n", changes)


def _check_exposition(text: str) -> None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, value = sample.name, sample.value
            assert not math.isnan(value), sample
            if name in MAY_BE_INF and value == math.inf:
                continue
            assert math.isfinite(value), sample
            if name not in SIGNED:
                assert value >= 0, sample
            if name in RATIOS:
                assert value <= 1, sample
    if PROMTOOL is not None:
        done = subprocess.run([PROMTOOL, "check", "metrics"], input=text.encode(), capture_output=True, timeout=30)
        assert done.returncode == 0, (done.stdout + done.stderr).decode()[:2000]


@settings(
    max_examples=120,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(mutated_pages())
def test_no_page_breaks_the_sidecar_or_its_exposition(pages):
    intact, mutated = pages.intact, pages.mutated
    clock = [1_800_000_000.0]
    config = load_config(
        None, env={}, flags={("scrape", "interval"): "5s"}, flag_targets=["http://127.0.0.1:9/metrics"]
    )
    sidecar = Sidecar(config, build_extenders(config), clock=lambda: clock[0])
    state = sidecar.states[0]
    for body in (intact, mutated):
        clock[0] += 5
        try:
            scrape = sidecar.read_body(state, body.encode())
        except ScrapeFailed:
            continue  # a failed scrape: the daemon counts it, nothing to record
        sidecar.record(state, scrape, sample_time=clock[0], wall_time=clock[0], duration_s=0.01)
    _check_exposition(generate_latest(sidecar.registry).decode())
