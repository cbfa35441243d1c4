"""The simulator's /metrics against the real vLLM 0.32 capture, and the older generations."""

from __future__ import annotations

import pytest
from fixtures import CPU_032
from prometheus_client.parser import text_string_to_metric_families

from sidecar.generations import Generation
from sidecar.simulator import SimConfig, Simulator

IDLE = (CPU_032 / "gqa-1gib_idle.txt").read_text()


def families(text: str) -> dict[str, tuple[str, set[frozenset[str]]]]:
    """vllm: family name -> (type, set of label-key sets of its samples)."""
    out = {}
    for f in text_string_to_metric_families(text):
        if f.name.startswith("vllm:"):
            out[f.name] = (f.type, {frozenset(s.labels) for s in f.samples})
    return out


def family_order(text: str) -> list[str]:
    return [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE vllm:")]


def sample(text: str, name: str, **labels: str) -> float:
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise KeyError(name)


def test_every_vllm_family_of_the_real_capture_with_same_type_and_label_keys():
    sim = Simulator(scenario="vllm-cpu-1gib-load", seed=1)
    ours = sim.render(Generation.V1_CAPACITY_LABELS)
    real, mine = families(IDLE), families(ours)
    assert set(mine) == set(real), (set(real) - set(mine), set(mine) - set(real))
    for name, (typ, keys) in real.items():
        assert mine[name][0] == typ, name
        assert mine[name][1] == keys, name
    # Same order of families, so a diff of the two bodies lines up.
    assert family_order(ours) == family_order(IDLE)
    # Same HELP text.
    help_real = {line for line in IDLE.splitlines() if line.startswith("# HELP vllm:")}
    help_mine = {line for line in ours.splitlines() if line.startswith("# HELP vllm:")}
    assert help_mine == help_real


def test_histogram_buckets_match_the_capture_for_its_max_model_len():
    ours = Simulator(scenario="vllm-cpu-1gib-load").render()
    real_b = sorted(
        {line.split(" ")[0] for line in IDLE.splitlines() if "_bucket{" in line and line.startswith("vllm:")}
    )
    mine_b = sorted(
        {
            line.split(" ")[0].replace("models/tiny-llama-gqa-bf16", "M")
            for line in ours.splitlines()
            if "_bucket{" in line
        }
    )
    assert mine_b == sorted(b.replace("models/tiny-llama-gqa-bf16", "M") for b in real_b)


@pytest.mark.parametrize(
    "capture,scenario", [("gqa-1gib_idle.txt", "vllm-cpu-1gib-load"), ("gqa-6mib_full-a.txt", "vllm-cpu-6mib-full")]
)
def test_cache_config_info_has_the_37_labels_with_the_captures_values(capture, scenario):
    real_text = (CPU_032 / capture).read_text()
    ours = Simulator(scenario=scenario).render()

    def info(text):
        [s] = [s for f in text_string_to_metric_families(text) if f.name == "vllm:cache_config_info" for s in f.samples]
        return s.labels, s.value

    real, rv = info(real_text)
    mine, mv = info(ours)
    assert len(real) == 37 and rv == mv == 1.0
    assert mine == real  # every value, incl. num_gpu_blocks, kv_cache_size_tokens, concurrency


def test_cache_config_values_follow_the_config():
    cfg = SimConfig()  # the scenario library's server
    text = Simulator(cfg, scenario="steady-low").render()
    lab = next(
        s.labels for f in text_string_to_metric_families(text) if f.name == "vllm:cache_config_info" for s in f.samples
    )
    assert lab["num_gpu_blocks"] == "8193" and lab["block_size"] == "16"
    assert lab["kv_cache_size_tokens"] == str(8193 * 16)
    assert float(lab["kv_cache_max_concurrency"]) == 8193 * 16 / 8192
    assert lab["gpu_memory_utilization"] == "0.9" and lab["kv_cache_memory_bytes"] == "None"


def test_usage_and_counters_render_the_engine_state():
    sim = Simulator(scenario="vllm-cpu-6mib-full", seed=1)
    sim.advance(10)
    text = sim.render()
    e = sim.engines[0]
    assert sample(text, "vllm:kv_cache_usage_perc") == pytest.approx(e.used_blocks / 47, abs=1e-12)
    assert sample(text, "vllm:num_requests_running") == e.num_running
    assert sample(text, "vllm:num_requests_waiting_by_reason", reason="capacity") == len(e.waiting)
    assert sample(text, "vllm:num_preemptions_total") == sim.preemptions > 0
    assert sample(text, "vllm:prefix_cache_queries_total") == sample(
        text, "vllm:prompt_tokens_total"
    )  # no recompute counted, like the capture (22016/22016)
    assert sample(text, "vllm:request_num_preemptions_count") == sample(
        text, "vllm:request_success_total", finished_reason="length"
    )


def test_engines_label_one_series_per_engine():
    sim = Simulator(SimConfig(engines=3), scenario="steady", seed=2)
    sim.advance(60)
    text = sim.render()
    running = [
        s for f in text_string_to_metric_families(text) if f.name == "vllm:num_requests_running" for s in f.samples
    ]
    assert sorted(s.labels["engine"] for s in running) == ["0", "1", "2"]
    assert sum(s.value for s in running) == sim.running > 0
    assert all(s.value > 0 for s in running)  # the load balancer spreads the work
    infos = [s for f in text_string_to_metric_families(text) if f.name == "vllm:cache_config_info" for s in f.samples]
    assert len(infos) == 3 and "model_name" not in infos[0].labels


def names(text: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_v0_generation():
    sim = Simulator(scenario="steady", seed=1)
    sim.advance(30)
    text = sim.render(Generation.V0)
    n = names(text)
    assert {
        "vllm:gpu_cache_usage_perc",
        "vllm:num_requests_swapped",
        "vllm:gpu_prefix_cache_hit_rate",
        "vllm:num_preemptions_total",
    } <= n
    assert not any(x.endswith("_created") for x in n)
    assert "vllm:kv_cache_usage_perc" not in n
    assert all("engine" not in s.labels for f in text_string_to_metric_families(text) for s in f.samples)
    # V0 has no null block: usage = used / num_gpu_blocks, num_gpu_blocks = usable blocks.
    assert sample(text, "vllm:gpu_cache_usage_perc") == sim.used_blocks / 8192
    lab = next(
        s.labels for f in text_string_to_metric_families(text) if f.name == "vllm:cache_config_info" for s in f.samples
    )
    assert lab["num_gpu_blocks"] == "8192"
    off = Simulator(SimConfig(enable_prefix_caching=False), scenario="steady").render("v0")
    assert sample(off, "vllm:gpu_prefix_cache_hit_rate") == -1.0


@pytest.mark.parametrize(
    "gen,present,absent",
    [
        (
            Generation.V1_GPU_NAMES,
            {"vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_hits_total"},
            {"vllm:kv_cache_usage_perc", "vllm:prefix_cache_hits_total"},
        ),
        (
            Generation.V1_BOTH_NAMES,
            {
                "vllm:gpu_cache_usage_perc",
                "vllm:kv_cache_usage_perc",
                "vllm:gpu_prefix_cache_hits_total",
                "vllm:prefix_cache_hits_total",
            },
            {"vllm:num_requests_waiting_by_reason"},
        ),
        (
            Generation.V1,
            {"vllm:kv_cache_usage_perc", "vllm:prefix_cache_hits_total", "vllm:inter_token_latency_seconds_count"},
            {"vllm:gpu_cache_usage_perc", "vllm:num_requests_waiting_by_reason"},
        ),
    ],
)
def test_v1_generations(gen, present, absent):
    sim = Simulator(scenario="shared-prefix", seed=1)
    sim.advance(30)
    text = sim.render(gen)
    n = names(text)
    assert present <= n and not (absent & n)
    assert "vllm:num_preemptions_created" in n  # V1 keeps the _created series
    lab = next(
        s.labels for f in text_string_to_metric_families(text) if f.name == "vllm:cache_config_info" for s in f.samples
    )
    assert "kv_cache_size_tokens" not in lab
    assert ("engine" in lab) == (gen != Generation.V1_GPU_NAMES)
    if gen in (Generation.V1_GPU_NAMES, Generation.V1_BOTH_NAMES):
        hits = sample(text, "vllm:gpu_prefix_cache_hits_total")
        assert hits == sim.engines[0].c.prefix_hits > 0


def test_render_is_deterministic_for_a_seed():
    a, b = Simulator(scenario="burst", seed=7), Simulator(scenario="burst", seed=7)
    for s in (a, b):
        s.advance(200)
    assert a.render() == b.render()
    c = Simulator(scenario="burst", seed=8)
    c.advance(200)
    assert c.render() != a.render()
