"""The budget estimate against real vLLM start-up logs from public vLLM issues and PRs.

Each case is a log kept in tests/fixtures/vllm-logs/ (provenance in its README): the model, GPU,
utilization, TP and vLLM version the log states, and the budget vLLM printed (or, where it printed
none for the binding rank, the one its token count implies). A clean profile must land within
max(0.5 GiB, 5%) of vLLM's; the known limits are asserted to stay where docs/capacity.md says.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from capacity_fixtures import GiB, config_path

from sidecar.capacity import kv_layout, load_model
from sidecar.capacity.budget import ServingFlags, estimate_budget
from sidecar.capacity.profile_terms import non_torch_bytes
from sidecar.capacity.startup_log import parse_startup_log
from sidecar.capacity.vllm_rules import rules_for

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-logs"


@dataclass(frozen=True)
class Case:
    log: str
    config: Path
    total_gib: float
    utilization: float
    tp: int
    flags: dict[str, object]
    logged_gib: float
    max_model_len: int | None = None
    #: why this profile is not clean (docs/capacity.md, "Known limits"); None = clean
    limit: str | None = None
    extra: dict[str, object] = field(default_factory=dict)


def _log(name: str) -> Path:
    return LOGS / name


CASES = [
    Case(  # V0 0.6.5 dev build; Meta-Llama-3-8B has Llama-3.1-8B's shapes, max_model_len 8192
        "pr10511-llama3-8b-h100-tp1.log",
        config_path("Llama-3.1-8B"),
        79.22,
        0.9,
        1,
        {"vllm_version": "0.6.5", "gpu_name": "H100-80GB"},
        53.29,
        max_model_len=8192,
    ),
    Case(
        "pr10511-llama3-8b-h100-tp2.log",
        config_path("Llama-3.1-8B"),
        79.22,
        0.9,
        2,
        {"vllm_version": "0.6.5", "gpu_name": "H100-80GB"},
        71.29 - 7.48 - 3.58 - 1.26,  # the log's own terms: its budget line is cut off in the PR
        max_model_len=8192,
        limit="0.6.5 counted torch's cached-but-free memory as non-torch (3.58 GiB at TP 2)",
    ),
    Case(  # V0 0.7 on 2 x RTX 4090; the binding (sampling) rank's budget from its token count
        "vllm13061-r1-distill-qwen-14b-2x4090-tp2.log",
        LOGS / "DeepSeek-R1-Distill-Qwen-14B.config.json",
        23.55,
        0.98,
        2,
        {"vllm_version": "0.7.2", "gpu_name": "RTX-4090"},
        81536 * 98304 / GiB,  # 81,536 tokens x 98,304 B per token per rank (48 layers, 4 KV heads, bf16)
    ),
    Case(  # V1 0.10.1, MXFP4 through Marlin on Hopper
        "vllm23278-gpt-oss-120b-h100.log",
        config_path("gpt-oss-120b"),
        79.19,
        0.9,
        1,
        {"vllm_version": "0.10.1", "gpu_name": "H100-80GB"},
        -2.14,
    ),
    Case(
        "vllm27508-gpt-oss-120b-h100-util095.log",
        config_path("gpt-oss-120b"),
        79.19,
        0.95,
        1,
        {"vllm_version": "0.11.0", "gpu_name": "H100-80GB", "max_num_batched_tokens": 1024},
        1.71,
    ),
    Case(  # `vllm bench latency` = LLM(...): 1024 sequences on a B200; the graphs are not subtracted before 0.21
        "pr21489-gemma-3-4b-it-b200.log",
        LOGS / "gemma-3-4b-it.config.json",
        178.36,
        0.9,
        1,
        {"vllm_version": "0.10.2", "gpu_name": "B200", "offline": True},
        160.53 - 8.58 - 9.96 - 0.07,
    ),
    Case(  # V0 0.6.4 on an RTX 3090, chunked prefill off (max_model_len <= 32K): the forward pass dominates
        "vllm10517-llama-3.1-8b-3090-20k.log",
        config_path("Llama-3.1-8B"),
        23.58,
        0.9,
        1,
        {"vllm_version": "0.6.4", "gpu_name": "RTX-3090"},
        3.81,
        max_model_len=20000,
    ),
    Case(
        "vllm10517-llama-3.1-8b-3090-29k.log",
        config_path("Llama-3.1-8B"),
        23.58,
        0.9,
        1,
        {"vllm_version": "0.6.4", "gpu_name": "RTX-3090"},
        2.89,
        max_model_len=29000,
    ),
    Case(  # VLLM_USE_V1=0 on 0.8.5, --max-num-seqs 8; compressed-tensors W4A16 MoE
        "vllm17327-qwen3-30b-a3b-w4a16-3090-v0.log",
        LOGS / "Qwen3-30B-A3B.w4a16.config.json",
        23.56,
        0.9,
        1,
        {"vllm_version": "0.8.5", "engine": "V0", "gpu_name": "RTX-3090", "max_num_seqs": 8},
        5.34,
    ),
    Case(
        "vllm21348-qwen3-235b-a22b-fp8-4xh100-tp4.log",
        LOGS / "Qwen3-235B-A22B-FP8.config.json",
        79.19,
        0.9,
        4,
        {"vllm_version": "0.10.0", "gpu_name": "H100-80GB"},
        8.11,
        limit="served with the LMCache KV connector, whose GPU buffers enter the profile",
    ),
    # V1 0.10.1.1 on A100s (dennislee22/vLLM-benchmarking): Qwen2-7B-Instruct has Qwen2.5-7B-Instruct's
    # shapes; the log names the sampler (FlashInfer, or the native fallback on the 40 GB pair).
    Case(
        "dennislee-qwen2-7b-a100-tp1-util025.log",
        config_path("Qwen2.5-7B-Instruct"),
        79.15,
        0.25,
        1,
        {"vllm_version": "0.10.1", "gpu_name": "A100-SXM4-80GB", "sampler": "flashinfer"},
        5.01,
        max_model_len=16384,
    ),
    Case(
        "dennislee-qwen2-7b-a100-tp1-util05.log",
        config_path("Qwen2.5-7B-Instruct"),
        79.15,
        0.5,
        1,
        {"vllm_version": "0.10.1", "gpu_name": "A100-SXM4-80GB", "sampler": "flashinfer"},
        24.83,
        max_model_len=16384,
    ),
    Case(
        "dennislee-qwen2-7b-2xa100-tp2-util025.log",
        config_path("Qwen2.5-7B-Instruct"),
        79.15,
        0.25,
        2,
        {"vllm_version": "0.10.1", "gpu_name": "A100-SXM4-80GB", "sampler": "flashinfer"},
        12.02,
        max_model_len=16384,
    ),
    Case(
        "dennislee-qwen2-7b-2xa100-tp2-util05.log",
        config_path("Qwen2.5-7B-Instruct"),
        79.15,
        0.5,
        2,
        {"vllm_version": "0.10.1", "gpu_name": "A100-SXM4-80GB", "sampler": "flashinfer"},
        31.83,
        max_model_len=16384,
    ),
    Case(  # two A100 40GB on two nodes (Ray); FlashInfer absent, the native sampler
        "dennislee-qwen2-7b-2xa100-40gb-tp2-util05.log",
        config_path("Qwen2.5-7B-Instruct"),
        39.39,
        0.5,
        2,
        {"vllm_version": "0.10.1", "gpu_name": "A100-SXM4-40GB", "sampler": "native"},
        11.03,
        max_model_len=16384,
    ),
    Case(  # MXFP4 through Marlin (no FP4 on Ampere), four A100s on four nodes (Ray)
        "dennislee-gpt-oss-120b-4xa100-tp4-util08.log",
        config_path("gpt-oss-120b"),
        79.15,
        0.8,
        4,
        {"vllm_version": "0.10.1", "gpu_name": "A100-SXM4-80GB", "sampler": "flashinfer"},
        45.32,
        max_model_len=16384,
    ),
    Case(  # V1 0.16.0, AWQ 4-bit through awq_marlin on 2 x L40S; the total from vLLM issue #15196's L40S
        "kagaho-llama3-70b-awq-2xl40s-tp2.log",
        LOGS / "Meta-Llama-3-70B-Instruct-AWQ.config.json",
        44.31,
        0.9,
        2,
        {"vllm_version": "0.16.0", "gpu_name": "L40S"},
        20.16,
        max_model_len=8192,
    ),
    # Public logs whose repository is still to be confirmed (vllm-logs README): 0.10.2's full usage line.
    Case(  # 8 x L40S, TP 8 + expert parallel, FP8: PCIe-only, so no custom all-reduce (N = 0.21 GiB logged)
        "qwen3-235b-a22b-2507-fp8-8xl40s-tp8.log",
        LOGS / "Qwen3-235B-A22B-FP8.config.json",
        44.42,
        0.9,
        8,
        {"vllm_version": "0.10.2", "gpu_name": "L40S"},
        10.65,
        max_model_len=32768,
    ),
    Case(  # 2 x H200, hybrid linear attention + MoE, bf16; FlashInfer absent, the native sampler
        "qwen3-next-80b-a3b-2xh200-tp2.log",
        config_path("Qwen3-Next-80B-A3B-Thinking"),
        139.81,
        0.9,
        2,
        {"vllm_version": "0.10.2", "gpu_name": "H200", "sampler": "native"},
        44.59,
    ),
]


def predicted_gib(case: Case) -> float:
    spec = load_model(case.config)
    layout = kv_layout(spec, tp=case.tp, max_model_len=case.max_model_len)
    flags = ServingFlags(**case.flags)  # type: ignore[arg-type]
    b = estimate_budget(
        spec, layout, gpu_memory_bytes=int(case.total_gib * GiB), gpu_memory_utilization=case.utilization, flags=flags
    )
    return b.kv_budget_bytes / GiB


@pytest.mark.parametrize("case", [c for c in CASES if c.limit is None], ids=lambda c: c.log)
def test_clean_profiles_within_half_a_gib_or_five_percent(case):
    error = abs(predicted_gib(case) - case.logged_gib)
    assert error <= max(0.5, 0.05 * abs(case.logged_gib)), f"{case.log}: off by {error:.2f} GiB"


@pytest.mark.parametrize("case", [c for c in CASES if c.limit is not None], ids=lambda c: c.log)
def test_known_limits_overestimate_as_documented(case):
    """The estimate stays above vLLM's here, by the memory the limit leaves out."""
    assert predicted_gib(case) - case.logged_gib > max(0.5, 0.05 * abs(case.logged_gib)) * 0.5, case.limit


def test_the_sampler_at_1024_sequences_leaves_no_memory_on_two_3090s():
    """vLLM 0.8.1 (V1: 1024 sequences on every GPU) refused Qwen2.5-32B W8A16 on 2 x RTX 3090 at TP 2
    ("No available memory for the cache blocks", vllm-logs README); with --max-num-seqs 8 it started."""
    case = Case(
        "vllm17238-qwen2.5-32b-w8a16-2x3090-tp2.log",
        LOGS / "Qwen2.5-32B-Instruct-INT8-W8A16.config.json",
        23.56,
        0.9,
        2,
        {"vllm_version": "0.8.1", "gpu_name": "RTX-3090", "enforce_eager": True},
        0.0,
        max_model_len=4096,
    )
    assert predicted_gib(case) <= 0
    assert "No available memory" in _log(case.log).read_text()
    fewer = Case(**{**case.__dict__, "flags": {**case.flags, "max_num_seqs": 8}})
    assert predicted_gib(fewer) > 0


def test_at_least_the_required_spread_of_cases():
    clean = [c for c in CASES if c.limit is None]
    assert len(clean) >= 12
    engines = {rules_for(str(c.flags["vllm_version"])).engine for c in clean}
    assert engines == {"V0", "V1"}
    assert any(c.tp > 1 for c in clean) and any(load_model(c.config).quantization for c in clean)
    gpus = {str(c.flags["gpu_name"]).split("-")[0] for c in clean}
    assert {"A100", "H100", "H200", "L40S", "RTX"} <= gpus


def test_the_logged_terms_agree_with_the_estimated_ones():
    """Where 0.10.2 printed every term, the sampler named by the log and the weights land near vLLM's."""
    for name, tp, sampler in (("qwen3-235b-a22b-2507-fp8-8xl40s-tp8.log", 8, "native"),):
        case = next(c for c in CASES if c.log == name)
        logged = parse_startup_log(_log(name).read_text())
        spec = load_model(case.config)
        b = estimate_budget(
            spec,
            kv_layout(spec, tp=tp, max_model_len=case.max_model_len),
            gpu_memory_bytes=int(case.total_gib * GiB),
            gpu_memory_utilization=case.utilization,
            flags=ServingFlags(**case.flags),  # type: ignore[arg-type]
        )
        assert abs(b.weights_bytes / GiB - logged.weights_gib) < 0.5
        assert abs(b.activation_bytes / GiB - logged.activation_gib) < 0.1, sampler
        assert abs(b.non_torch_bytes / GiB - logged.non_torch_gib) < 0.1


def test_no_custom_all_reduce_buffers_above_two_pcie_only_gpus():
    """vLLM disables its custom all-reduce above two GPUs without an NVLink mesh, so 8 x L40S carry
    NCCL's small buffers only, while 8 x H100 on 0.10 carry the collectives' ≥ 1.5 GiB."""
    rules = rules_for("0.10.2")
    assert non_torch_bytes(rules, tp=8, gpu_name="L40S") < non_torch_bytes(rules, tp=8, gpu_name="H100-80GB")
    assert non_torch_bytes(rules, tp=8, gpu_name="L40S") < 0.25 * GiB
    assert non_torch_bytes(rules, tp=8, gpu_name="H100-80GB") >= 1.5 * GiB
    # two PCIe GPUs keep it (vLLM allows the custom all-reduce at world size 2)
    assert non_torch_bytes(rules, tp=2, gpu_name="RTX-4090") == non_torch_bytes(rules, tp=2, gpu_name="H100-80GB")


# ------------------------------------------------------------- the parser


def test_reads_the_v0_065_table():
    p = parse_startup_log(_log("pr10511-llama3-8b-h100-tp1.log").read_text())
    assert (p.total_gib, p.utilization, p.weights_gib, p.non_torch_gib, p.activation_gib, p.kv_gib) == (
        79.22,
        0.9,
        14.96,
        1.79,
        1.26,
        53.29,
    )


def test_reads_the_v0_064_line():
    p = parse_startup_log(_log("vllm10517-llama-3.1-8b-3090-29k.log").read_text())
    assert (p.total_gib, p.utilization, p.weights_gib, p.activation_gib, p.non_torch_gib, p.kv_gib) == (
        23.58,
        0.9,
        14.9888,
        2.99,
        0.35,
        2.89,
    )


def test_reads_the_v0_one_line_format():
    p = parse_startup_log(_log("pr12126-llama-3.2-11b-vision-h100.log").read_text())
    assert (p.total_gib, p.utilization, p.weights_gib, p.activation_gib, p.kv_gib) == (79.22, 0.9, 19.86, 36.63, 14.65)


def test_reads_the_v1_usage_line():
    p = parse_startup_log(_log("pr21489-gemma-3-4b-it-b200.log").read_text())
    assert (p.total_gib, p.weights_gib, p.activation_gib, p.non_torch_gib, p.cudagraph_gib) == (
        178.36,
        8.58,
        9.96,
        0.07,
        0.65,
    )


def test_reads_the_v1_available_line_and_weights():
    p = parse_startup_log(_log("vllm23278-gpt-oss-120b-h100.log").read_text())
    assert (p.weights_gib, p.kv_gib) == (65.9651, -2.14)
    assert parse_startup_log(_log("vllm21348-qwen3-235b-a22b-fp8-4xh100-tp4.log").read_text()).kv_tokens == 178880


def test_a_log_without_a_profile_is_refused():
    from sidecar.capacity import CapacityError

    with pytest.raises(CapacityError, match="no memory profile found"):
        parse_startup_log("INFO starting\n")


# ------------------------------------------------------------- properties


def _budget(**kw):
    spec = load_model(config_path("Qwen3-32B"))
    tp = int(kw.pop("tp", 1))
    layout = kv_layout(spec, tp=tp)
    util = float(kw.pop("util", 0.9))
    return estimate_budget(
        spec, layout, gpu_memory_bytes=int(79.19 * GiB), gpu_memory_utilization=util, flags=ServingFlags(**kw)
    )


def test_more_utilization_more_budget():
    budgets = [_budget(util=u).kv_budget_bytes for u in (0.5, 0.7, 0.9, 0.95)]
    assert budgets == sorted(budgets) and len(set(budgets)) == 4


def test_more_sequences_more_sampler_memory():
    samplers = [_budget(max_num_seqs=n).sampler_bytes for n in (64, 256, 1024)]
    assert samplers == sorted(samplers) and len(set(samplers)) == 3


def test_more_tensor_parallelism_fewer_weights_per_rank():
    weights = [_budget(tp=tp).weights_bytes for tp in (1, 2, 4, 8)]
    assert weights == sorted(weights, reverse=True) and len(set(weights)) == 4


def test_enforce_eager_drops_the_graph_term_only_where_vllm_subtracts_it():
    assert _budget(vllm_version="0.21.0").cudagraph_bytes > 0
    assert _budget(vllm_version="0.21.0", enforce_eager=True).cudagraph_bytes == 0
    assert _budget(vllm_version="0.20.0").cudagraph_bytes == 0


def test_batch_defaults_follow_the_gpu_class():
    assert _budget(vllm_version="0.9.2", gpu_name="H100-80GB").batch.max_num_seqs == 1024
    assert _budget(vllm_version="0.9.2", gpu_name="A100-80GB").batch.max_num_seqs == 256
    assert _budget(vllm_version="0.8.5", gpu_name="A100-80GB").batch.max_num_seqs == 1024  # before the A100 carve-out
    assert _budget(vllm_version="0.8.2", gpu_name="L40S").batch.max_num_seqs == 1024  # 1024 everywhere
    assert _budget(vllm_version="0.31.0", gpu_name="H100-80GB").batch.max_num_batched_tokens == 8192
    b200 = estimate_budget(
        load_model(config_path("Qwen3-32B")),
        kv_layout(load_model(config_path("Qwen3-32B"))),
        gpu_memory_bytes=int(178.36 * GiB),
        gpu_memory_utilization=0.9,
        flags=ServingFlags(vllm_version="0.32.0", gpu_name="B200"),
    )
    assert b200.batch.max_num_batched_tokens == 16384  # >= 160 GiB: the largest defaults for serve too
