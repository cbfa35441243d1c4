"""The sidecar's vLLM adapter reads the simulator exactly as it reads the real captures."""

from __future__ import annotations

import pytest

from sidecar import page_parser as parse
from sidecar.derive import derive
from sidecar.engines import vllm
from sidecar.generations import Generation
from sidecar.simulator import SimConfig, Simulator


@pytest.mark.parametrize("gen", list(Generation), ids=str)
def test_adapter_sees_the_ground_truth(gen):
    # Two engines with half the library's cache each, so the shared ramp saturates both.
    two = SimConfig(engines=2, kv_cache_memory_bytes=4097 * 16 * 131072)
    sim = Simulator(two, scenario="shared-prefix-heavy", seed=2)
    sim.advance(33 * 60)  # saturated: preemptions, capacity waiting, prefix hits
    assert sim.preemptions > 0 and sim.waiting > 0
    scrape = vllm.normalise(parse.samples(sim.render(gen)))
    assert scrape.generation == gen.value
    obs = sorted(scrape.observations, key=lambda o: o.key)
    if gen == Generation.V0:
        # V0 pages have no engine label: a V0 server is one engine; check engine 0's numbers.
        return _check_v0(sim, obs)
    assert [o.key for o in obs] == [("simulated/llama-3-8b", "0"), ("simulated/llama-3-8b", "1")]
    for o, e in zip(obs, sim.engines, strict=False):
        d = derive([(0.0, o)], 0.0, window_s=300, watermark=0.9)
        assert o.usage_ratio == pytest.approx(e.usage(), abs=1e-12)
        assert d.capacity_tokens == sim.config.num_blocks * 16
        assert d.used_tokens == e.used_blocks * 16
        assert d.used_tokens + d.free_tokens == d.capacity_tokens - 16  # the null block
        assert d.requests_running == e.num_running
        assert d.preemptions == e.c.preemptions
        assert (d.prefix_cache_queries_tokens, d.prefix_cache_hits_tokens) == (e.c.prefix_queries, e.c.prefix_hits)
        if gen == Generation.V1_CAPACITY_LABELS:
            assert d.requests_waiting == e.waiting_by_reason()


def _check_v0(sim, obs):
    sim1 = Simulator(SimConfig(), scenario="shared-prefix-heavy", seed=2)
    sim1.advance(34 * 60)
    assert sim1.preemptions > 0
    (o,) = vllm.normalise(parse.samples(sim1.render(Generation.V0))).observations
    d = derive([(0.0, o)], 0.0, window_s=300, watermark=0.9)
    e = sim1.engines[0]
    assert o.usage_ratio == pytest.approx(e.used_blocks / 8192, abs=1e-12)
    assert d.requests_running == e.num_running and d.preemptions == e.c.preemptions
    assert d.requests_waiting == {"all": len(e.waiting)}
