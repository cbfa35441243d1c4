"""A new engine is a module and a row: a made-up engine lights every per-engine gauge.

"Acme" is an inference server that does not exist. Its page (:func:`acme_page`) and its adapter
(:data:`acme`, a module built here from :func:`acme_normalise`) are written in this file, registered as
one row of ``sidecar.engines.ADAPTERS`` (monkeypatched), and read through the real daemon code
(``Sidecar.read_body`` then ``Sidecar.record``, what ``scrape_once`` does after its HTTP fetch) with the
real layers (``build_extenders``, the tiny Llama's config.json). Nothing else is touched: if a gauge
needed anything but the typed contract of :mod:`sidecar.observation`, it would stay dark here.

Acme speaks in tokens, as SGLang and TensorRT-LLM do: it exports the tokens it holds (used, and the
evictable part of them) instead of a usage fraction, and a pool of 48 blocks of 128 tokens with no
null block. Two data-parallel ranks: rank 0 sized by bytes (the exact budget), rank 1 by a fraction of
GPU memory (the estimated budget), so that between them every gauge of the catalogue is lit.

The numbers by hand (rank 0, step ``i`` of 8, 5 s apart): held = used 5000 + 120·i − evictable 64 =
4936 + 120·i tokens of 6144 (no null block), free = 6144 − held; headroom at the 0.9 watermark =
⌊0.9 × 48⌋ × 128 − held = 5504 − held (0 once held passes it).
"""

from __future__ import annotations

import math
import types
from collections import defaultdict
from dataclasses import replace

import pytest
from fixtures import TINY_LLAMA_CONFIG
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sidecar import engines
from sidecar.config import load_config
from sidecar.daemon import Sidecar
from sidecar.exporter import SidecarCollector
from sidecar.layers import build_extenders
from sidecar.metrics import CATALOGUE, KEY, MetricDoc
from sidecar.observation import EngineScrape, Histogram, KVPool, Observation, Rejections
from sidecar.state import Step

START, STEP_S, STEPS = 1_800_000_000.0, 5.0, 8
MODEL = "acme/tiny-llama"

#: Per-engine gauges Acme cannot light by design, with the reason (none: it exports everything the
#: contract asks for). An engine that cannot have one says so in EngineScrape.absent.
CANNOT: dict[str, str] = {}

# --- the made-up engine's page ---------------------------------------------------------------------


def _histogram(name: str, rank: str, mean: float, count: int) -> list[str]:
    """A cumulative histogram of ``count`` requests all of length ``mean`` (one bucket holds them)."""
    lines = []
    for le in (128.0, 256.0, 512.0, 1024.0, math.inf):
        n = count if le >= mean else 0
        shown = "+Inf" if le == math.inf else repr(le)
        lines.append(f'{name}_bucket{{model="{MODEL}",dp_rank="{rank}",le="{shown}"}} {n}')
    lines.append(f'{name}_count{{model="{MODEL}",dp_rank="{rank}"}} {count}')
    lines.append(f'{name}_sum{{model="{MODEL}",dp_rank="{rank}"}} {mean * count}')
    return lines


def acme_page(i: int) -> bytes:
    """Acme's /metrics at step ``i``: the cache fills by 120 tokens a step, the queue grows by one, one
    request a step is refused because the queue is full, and its CPU offload tier is half pinned."""
    lines = ["# TYPE acme_kv_pool_info gauge"]
    for rank, kv_bytes in (("0", "6291456"), ("1", "")):
        lines.append(
            f'acme_kv_pool_info{{dp_rank="{rank}",blocks="48",tokens_per_block="128",kv_dtype="auto",'
            f'kv_bytes="{kv_bytes}",mem_fraction="0.92",max_len="1024",prefix_cache="on"}} 1'
        )
    for rank in ("0", "1"):
        series = f'{{model="{MODEL}",dp_rank="{rank}"}}'
        lines += [
            f"acme_kv_used_tokens{series} {5000 + 120 * i}",
            f"acme_kv_evictable_tokens{series} 64",
            f"acme_requests_running{series} 8",
            f'acme_requests_queued{{model="{MODEL}",dp_rank="{rank}",why="kv"}} {56 + i}',
            f'acme_requests_queued{{model="{MODEL}",dp_rank="{rank}",why="priority"}} 0',
            f"acme_preempted_total{series} {10 + 3 * i}",
            f'acme_preempted_by_total{{model="{MODEL}",dp_rank="{rank}",why="no_memory"}} {10 + 3 * i}',
            f"acme_prefix_lookup_tokens_total{series} {11264 + 1000 * i}",
            f"acme_prefix_hit_tokens_total{series} {200 * i}",
            f"acme_prompt_tokens_total{series} {40000 + 4096 * i}",
            f"acme_generation_tokens_total{series} {9000 + 1024 * i}",
            f"acme_sleeping{series} 0",
            f'acme_refused_total{{model="{MODEL}",dp_rank="{rank}",why="queue_full"}} {i}',
            f'acme_offload_usage{{model="{MODEL}",dp_rank="{rank}",tier="cpu"}} 0.5',
        ]
        lines += _histogram("acme_request_prompt_len", rank, 512.0, 10 + 8 * i)
        lines += _histogram("acme_request_gen_len", rank, 128.0, 10 + 8 * i)
    return ("\n".join(lines) + "\n").encode()


# --- the made-up engine's adapter: a table and small functions, as engines/<kind>.py would be -------

KIND = "acme"
#: Observation field -> Acme's sample name
SCALARS = {
    "used_tokens": "acme_kv_used_tokens",
    "evictable_tokens": "acme_kv_evictable_tokens",
    "requests_running": "acme_requests_running",
    "preemptions": "acme_preempted_total",
    "prefix_cache_queries_tokens": "acme_prefix_lookup_tokens_total",
    "prefix_cache_hits_tokens": "acme_prefix_hit_tokens_total",
    "prompt_tokens": "acme_prompt_tokens_total",
    "generation_tokens": "acme_generation_tokens_total",
}
HISTOGRAMS = {"prompt_length": "acme_request_prompt_len", "generation_length": "acme_request_gen_len"}
NEEDED = frozenset(
    [
        *SCALARS.values(),
        "acme_kv_pool_info",
        "acme_requests_queued",
        "acme_sleeping",
        "acme_refused_total",
        "acme_preempted_by_total",
        "acme_offload_usage",
    ]
    + [f + s for f in HISTOGRAMS.values() for s in ("_bucket", "_count", "_sum")]
)


def _pool(labels: dict[str, str]) -> KVPool:
    """Acme's pool row, typed; its display strings under the keys kvcache_server_info shows."""
    kv_bytes = int(labels["kv_bytes"]) if labels["kv_bytes"] else None
    blocks, block_size = int(labels["blocks"]), int(labels["tokens_per_block"])
    return KVPool(
        num_blocks=blocks,
        block_size=block_size,
        capacity_tokens=blocks * block_size,
        kv_dtype=labels["kv_dtype"],
        kv_cache_memory_bytes=kv_bytes,
        max_model_len=int(labels["max_len"]),
        prefix_caching=labels["prefix_cache"] == "on",
        memory_lever="gpu_memory_utilization",
        memory_fraction=float(labels["mem_fraction"]),
        info={"block_size": labels["tokens_per_block"], "num_gpu_blocks": labels["blocks"]},
    )


def acme_normalise(samples, *, label_values_limit: int = 32, capacity_tokens: int | None = None):
    """Acme's page -> the contract. Not a full adapter (no limits): enough to prove the route."""
    fields: dict[tuple[str, str], dict[str, object]] = defaultdict(dict)
    pools: dict[str, KVPool] = {}
    buckets: dict[tuple[str, str, str], list[tuple[float, float]]] = defaultdict(list)
    totals: dict[tuple[str, str, str], float] = {}
    by_name = {name: field for field, name in SCALARS.items()}
    for name, labels, value in samples:
        key = (labels.get("model", ""), labels.get("dp_rank", "0"))
        if name == "acme_kv_pool_info":
            pools[labels["dp_rank"]] = _pool(labels)
        elif name in by_name:
            fields[key][by_name[name]] = float(value)
        elif name == "acme_requests_queued":
            waiting = fields[key].setdefault("requests_waiting_by_reason", {})
            waiting[{"kv": "capacity"}.get(labels["why"], labels["why"])] = float(value)  # type: ignore[index]
        elif name == "acme_sleeping":
            fields[key]["sleep_state"] = "sleeping" if value else "awake"
        elif name == "acme_refused_total":
            refused = fields[key].setdefault("admission_rejections_by_reason", {})
            refused[labels["why"]] = float(value)  # type: ignore[index]
        elif name == "acme_preempted_by_total":
            preempted = fields[key].setdefault("preemptions_by_reason", {})
            preempted[labels["why"]] = float(value)  # type: ignore[index]
        elif name == "acme_offload_usage":
            offload = fields[key].setdefault("offload_usage_by_tier", {})
            offload[labels["tier"]] = float(value)  # type: ignore[index]
        elif name.endswith("_bucket"):
            buckets[(*key, name.removesuffix("_bucket"))].append((float(labels["le"]), float(value)))
        elif name.endswith(("_count", "_sum")):
            totals[(*key, name)] = float(value)
    for (model, rank, fam), les in buckets.items():
        field = next(f for f, n in HISTOGRAMS.items() if n == fam)
        count, total = totals[(model, rank, fam + "_count")], totals[(model, rank, fam + "_sum")]
        fields[(model, rank)][field] = Histogram(tuple(sorted(les)), count, total)
    if not fields:
        return None
    observations = tuple(
        Observation(model_name=m, engine=r, pool=pools.get(r), **f)  # type: ignore[arg-type]
        for (m, r), f in sorted(fields.items())
    )
    return EngineScrape(KIND, "acme-1", observations, Rejections().counts, {}, absent=dict(CANNOT))


acme = types.ModuleType("acme")
acme.KIND, acme.NEEDED, acme.SIGNATURE, acme.normalise = KIND, NEEDED, NEEDED, acme_normalise


# --- the proof ---------------------------------------------------------------------------------


def _acme_run(monkeypatch, steps: int = STEPS, flags: dict[tuple[str, str], str] | None = None) -> Sidecar:
    """A sidecar reading Acme for ``steps`` scrapes 5 s apart (past step 7 Acme's page stays as at step 7)."""
    monkeypatch.setitem(engines.ADAPTERS, KIND, acme)
    given = {("scrape", "interval"): "5s", ("model", "config"): str(TINY_LLAMA_CONFIG), ("model", "gpu_memory"): "8MiB"}
    config = load_config(None, env={}, flags={**given, **(flags or {})}, flag_targets=["http://127.0.0.1:9/metrics"])
    config = replace(config, targets=(replace(config.targets[0], engine=KIND),))
    clock = [START]
    sidecar = Sidecar(config, build_extenders(config), clock=lambda: clock[0])
    state = sidecar.states[0]
    for i in range(steps):
        clock[0] += STEP_S
        scrape = sidecar.read_body(state, acme_page(min(i, STEPS - 1)))
        sidecar.record(state, scrape, sample_time=clock[0], wall_time=clock[0], duration_s=0.01)
    return sidecar


@pytest.fixture
def acme_sidecar(monkeypatch):
    """A sidecar reading Acme, its one row registered; the config built as for vLLM, then the target's
    engine set to Acme (the settings' list of engines is another file's: not touched here)."""
    return _acme_run(monkeypatch)


#: The per-engine gauges that need more time than the 8 scrapes of :func:`acme_sidecar`: the burst counts from
#: forecast.window after the engine's start, then needs a minute of samples (docs/forecast.md).
LATER = ("kvcache_burst_tokens", "kvcache_burst_headroom_ratio")


def _exported(sidecar) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for fam in text_string_to_metric_families(generate_latest(sidecar.registry).decode()):
        for s in fam.samples:
            out[s.name].append((s.labels, s.value))
    return out


PER_ENGINE = [m.name for m in CATALOGUE if m.labels[: len(KEY)] == KEY]


def test_the_made_up_engine_lights_every_per_engine_gauge(acme_sidecar):
    exported = _exported(acme_sidecar)
    dark = [name for name in PER_ENGINE if name not in CANNOT and name not in LATER and not exported.get(name)]
    assert not dark, f"per-engine gauges Acme's typed observation did not light: {dark}"
    assert set(CANNOT) <= set(PER_ENGINE)


def test_the_made_up_engine_lights_the_burst_gauges_given_time(monkeypatch):
    """forecast.window 1m: the burst counts from 60 s after the start (scrape 12) and is published once its
    samples span a minute (scrape 24). Acme's page stays as at step 7 from there: a flat demand, no burst."""
    exported = _exported(_acme_run(monkeypatch, steps=26, flags={("forecast", "window"): "1m"}))
    assert [v for _, v in exported["kvcache_burst_tokens"]] == [0.0, 0.0]  # both ranks
    assert [v for _, v in exported["kvcache_burst_headroom_ratio"]] == [math.inf, math.inf]


def test_the_made_up_engines_figures_are_the_hand_computed_ones(acme_sidecar):
    """The last step (i = 7) of rank 0, by hand (module docstring): held 4936 + 840 = 5776."""
    exported = _exported(acme_sidecar)

    def value(name: str, **labels: str) -> float:
        want = {"model_name": MODEL, "engine": "0", **labels}
        (v,) = [v for got, v in exported[name] if all(got.get(k) == x for k, x in want.items())]
        return v

    assert value("kvcache_used_tokens") == 5776
    assert value("kvcache_free_tokens") == 6144 - 5776
    assert value("kvcache_usage_ratio") == pytest.approx(5776 / 6144)
    assert value("kvcache_capacity_tokens") == 6144
    assert value("kvcache_watermark_headroom_tokens") == 0  # 5504 − 5776 < 0
    assert value("kvcache_requests_waiting", reason="capacity") == 63
    assert value("kvcache_gpu_memory_utilization") == 0.92
    assert value("kvcache_theoretical_capacity_tokens", budget="exact") == 6144  # 6 MiB / 1024 B per token
    # preemptions 3 per 5 s step; prefix hits 200 of 1000 tokens per step (over derive.window)
    assert value("kvcache_preemptions_per_second") == pytest.approx(0.6)
    assert value("kvcache_prefix_cache_hit_ratio") == pytest.approx(0.2)
    # one refusal a step, the counter passed on as it is; the offload tier's usage as Acme reports it
    assert value("kvcache_admission_rejections_total", reason="queue_full") == 7
    assert value("kvcache_preemptions_by_reason_total", reason="no_memory") == 10 + 3 * 7  # as the total
    assert value("kvcache_offload_usage_ratio", tier="cpu") == 0.5
    info = [labels for labels, _ in exported["kvcache_server_info"] if labels["engine"] == "0"]
    assert info[0]["engine_kind"] == "acme" and info[0]["num_gpu_blocks"] == "48"
    assert info[0]["metrics_generation"] == "acme-1" and info[0]["cache_dtype"] == ""  # not in Acme's info


def test_every_value_a_derivation_gives_is_a_catalogue_row(acme_sidecar):
    """Base and layer values are keyed by the catalogue's own rows (a new name is a failure here)."""
    rows = set(CATALOGUE)
    for values in acme_sidecar.states[0].snapshot.values.values():
        unknown = [doc.name for doc in values if doc not in rows]
        assert not unknown, unknown
    assert acme_sidecar.collector.export_errors == 0


# --- a value the catalogue does not know never fails the page -------------------------------------

ROGUE = MetricDoc("kvcache_not_in_the_catalogue", "gauge", "", KEY, "A layer's bug.", "None.")
WRONG_LABELS = next(m for m in CATALOGUE if m.name == "kvcache_demand_tokens")


class Rogue:
    """A layer with two bugs: a row the catalogue lacks, and labels a row does not have."""

    def __call__(self, step: Step):
        return {ROGUE: 1.0, WRONG_LABELS: {("extra",): 2.0}}


def test_an_unknown_value_is_logged_once_counted_and_the_page_is_served(caplog):
    from fixtures import CPU_032

    config = load_config(None, env={}, flags={("scrape", "interval"): "5s"}, flag_targets=["http://127.0.0.1:9/m"])
    sidecar = Sidecar(config, (*build_extenders(config), Rogue()), clock=lambda: START)
    state = sidecar.states[0]
    body = (CPU_032 / "gqa-6mib_full-a.txt").read_bytes()
    sidecar.record(state, sidecar.read_body(state, body), sample_time=START, wall_time=START, duration_s=0.01)
    collector: SidecarCollector = sidecar.collector
    first = generate_latest(sidecar.registry).decode()
    second = generate_latest(sidecar.registry).decode()
    assert "kvcache_usage_ratio{" in first and "kvcache_not_in_the_catalogue" not in first  # the page is served
    assert "kvcache_sidecar_export_errors_total 2.0" in first  # two refused values per collect
    assert "kvcache_sidecar_export_errors_total 4.0" in second
    assert collector.export_errors == 4
    refused = [r for r in caplog.records if "exporter refused" in r.getMessage()]
    assert len(refused) == 2  # once per name, not per collect
    assert {r.getMessage().split(":")[0].split()[-1] for r in refused} == {ROGUE.name, WRONG_LABELS.name}


def test_a_healthy_page_has_no_export_errors_family():
    collector = SidecarCollector([], staleness_s=60.0)
    assert "kvcache_sidecar_export_errors_total" not in {m.name for m in collector.collect()}


def test_detect_finds_the_registered_engine_by_its_signature(monkeypatch):
    monkeypatch.setitem(engines.ADAPTERS, KIND, acme)
    assert engines.detect({"acme_kv_used_tokens", "process_cpu_seconds_total"}) == [acme]
    assert [m.KIND for m in engines.detect({"acme_sleeping", "vllm:num_requests_running"})] == ["vllm", "acme"]
    assert engines.detect({"process_cpu_seconds_total"}) == []


# --- derive's token path, for engines that count their used tokens ------------------------------


def _derive_one(obs: Observation):
    from sidecar.derive import derive

    return derive([(0.0, obs)], 0.0, window_s=300, watermark=0.9)


def test_used_tokens_give_the_usage_the_engine_itself_reports():
    """SGLang's 2024 documentation page (tests/fixtures/metrics/sglang_production_metrics_doc_example.txt)
    shows num_used_tokens 123859 and token_usage 0.28, and SGLang computes token_usage = num_used_tokens /
    max_total_num_tokens (python/sglang/srt/managers/scheduler.py): its pool held round(123859 / 0.28) =
    442354 tokens. Given that capacity (token-granular: block_size 1), derive's usage is SGLang's 0.28."""
    pool = KVPool(num_blocks=442354, block_size=1, capacity_tokens=442354)
    d = _derive_one(Observation("meta-llama/Llama-3.1-8B-Instruct", "0", used_tokens=123859.0, pool=pool))
    assert d.usage_ratio == pytest.approx(0.28, abs=5e-6)
    assert (d.used_tokens, d.free_tokens) == (123859.0, 442354 - 123859)
    assert d.watermark_headroom_tokens == math.floor(0.9 * 442354) - 123859  # ⌊0.9 × 442354⌋ − used
    assert d.capacity_tokens == 442354


def test_evictable_tokens_count_as_free_and_the_engines_usage_is_kept():
    """Of 5000 used tokens 1000 are evictable cache: 4000 held, 2144 free of 6144; a usage fraction the
    engine exports itself is shown as it is, not recomputed."""
    pool = KVPool(num_blocks=48, block_size=128, capacity_tokens=6144)
    d = _derive_one(Observation("m", "0", used_tokens=5000.0, evictable_tokens=1000.0, usage_ratio=0.5, pool=pool))
    assert (d.used_tokens, d.free_tokens, d.usage_ratio) == (4000.0, 2144.0, 0.5)
    assert d.watermark_headroom_tokens == 43 * 128 - 4000  # ⌊0.9 × 48⌋ whole blocks − held


def test_a_pool_known_only_by_its_capacity_and_a_hybrid_pool():
    """No block geometry: the capacity is the usable size. Hybrid: no used/free split at all."""
    only_capacity = KVPool(capacity_tokens=1000)
    d = _derive_one(Observation("m", "0", used_tokens=250.0, pool=only_capacity))
    assert (d.used_tokens, d.free_tokens, d.watermark_headroom_tokens) == (250.0, 750.0, 650.0)
    hybrid = KVPool(num_blocks=48, block_size=128, capacity_tokens=6144, hybrid=True)
    d = _derive_one(Observation("m", "0", used_tokens=250.0, pool=hybrid))
    assert (d.used_tokens, d.free_tokens, d.capacity_tokens) == (None, None, None)
