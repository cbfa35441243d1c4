"""The terms of vLLM's memory profile besides the weights, per rank, each a pure function.

``budget = total × util − W − max(F, S) − N − G`` (``docs/capacity.md``, "The budget"):

* ``F`` the forward peak of ``profile_run()``'s dummy batch (``vllm/v1/worker/gpu_model_runner.py``
  ``_dummy_run``; V0 ``vllm/worker/model_runner.py`` ``profile_run``);
* ``S`` the sampler warm-up that ends ``profile_run()`` (V1 ``_dummy_sampler_run``; V0 the sampler
  of the same ``execute_model``), which sorts ``n × vocab`` logits;
* ``N`` non-torch memory: NCCL and custom all-reduce buffers, cuBLAS workspaces (``memory_profiling``'s
  ``non_torch_increase``);
* ``G`` the CUDA-graph estimate vLLM subtracts from v0.21 (``profile_cudagraph_memory``).

vLLM measures ``A = max(F, S)`` as one torch peak: the forward pass and the sampler run one after
the other and each frees its tensors before the next starts.
"""

from __future__ import annotations

import re

from .config import ModelSpec
from .vllm_rules import VersionRules
from .weights import parameter_counts

GiB = 1 << 30

#: Sampler peak in units of ``rows × vocab × 4 B`` (one fp32 logits matrix), by implementation.
#: PyTorch-native ``apply_top_k_top_p`` (``vllm/v1/sample/ops/topk_topp_sampler.py``; V0
#: ``vllm/model_executor/layers/sampler.py`` ``_apply_top_k_top_p``) holds at once: bf16 logits ½,
#: fp32 logits 1, sorted values 1 + int64 indices 2, softmax / cumsum 1, masks, scatter 1, probs 1,
#: noise 1 ≈ 9.7. FlashInfer's fused ``top_k_top_p_sampling_from_logits`` keeps ≈ 3.5. Model
#: Runner V2 (``vllm/v1/worker/gpu/model_runner.py``) skips top-k/top-p while profiling ≈ 1.5.
SAMPLER_FACTORS: dict[str, float] = {"native": 9.7, "flashinfer": 3.5, "v2-runner": 1.5}
#: The conservative default: it gives the smallest budget, and the image's sampler is rarely known.
DEFAULT_SAMPLER = "native"

#: ``VLLM_FUSED_MOE_CHUNK_SIZE``: fused MoE works through the batch in chunks of this many tokens
#: (``vllm/model_executor/layers/fused_moe/fused_moe.py``).
FUSED_MOE_CHUNK = 32768


def _experts(spec: ModelSpec) -> tuple[int, int, int]:
    """(experts, experts per token, expert MLP width) of a MoE model, zeros for a dense one."""
    t = spec.text
    experts = int(t.get("n_routed_experts") or t.get("num_local_experts") or t.get("num_experts") or 0)
    if not experts:
        return 0, 0, 0
    top_k = int(t.get("num_experts_per_tok") or t.get("moe_topk") or t.get("num_experts_per_token") or 1)
    width = int(t.get("moe_intermediate_size") or spec.intermediate_size or 0)
    return experts, top_k, width


def forward_bytes(spec: ModelSpec, *, tokens: int, tp: int = 1, activation_bytes: int = 2) -> int:
    """``F``: the forward pass' peak over ``tokens`` (the profile's ``max_num_batched_tokens``).

    The widest moment is the MLP: gate_up ``[T, 2I/tp]`` + its activation ``[T, I/tp]`` + about
    three ``[T, H]`` (residual, normed input, output): ``F = b × T × (3·I/tp + 3·H)``, b the
    activation dtype's bytes. MoE layers (fused MoE, in chunks of 32768 tokens) hold each token
    ``top_k`` times: ``b × T × top_k × (3·I_moe/tp + H)``. Attention adds little with paged kernels.
    """
    h = spec.hidden_size
    dense_width = int(spec.intermediate_size or 4 * h)
    dense = activation_bytes * tokens * (3 * dense_width // tp + 3 * h)
    experts, top_k, width = _experts(spec)
    if not experts:
        return dense
    chunk = min(tokens, FUSED_MOE_CHUNK)
    moe = activation_bytes * chunk * top_k * (3 * width // tp + h) + activation_bytes * tokens * 3 * h
    has_dense_layers = int(spec.text.get("first_k_dense_replace") or 0) > 0
    return max(moe, dense) if has_dense_layers else moe


def sampler_bytes(spec: ModelSpec, *, rows: int, sampler: str = DEFAULT_SAMPLER) -> int:
    """``S = c × rows × vocab × 4 B``: the sampler warm-up over ``rows`` requests.

    ``rows = min(max_num_seqs, max_num_batched_tokens)``; the logits are gathered on every TP rank
    (V1 ``LogitsProcessor`` all-gathers; V0 gathers to the driver, the rank that limits the budget),
    so TP does not divide it. ``c`` from :data:`SAMPLER_FACTORS`.
    """
    if sampler not in SAMPLER_FACTORS:
        raise ValueError(f"sampler: {sampler!r} is not one of {', '.join(SAMPLER_FACTORS)}")
    return int(SAMPLER_FACTORS[sampler] * rows * int(spec.vocab_size or 0) * 4)


#: GPUs without an NVLink/NVSwitch mesh (PCIe cards, and pairwise NVLink bridges at most): vLLM turns its
#: custom all-reduce off above two of them (``vllm/distributed/device_communicators/custom_all_reduce.py``
#: "Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs", decided by
#: ``is_fully_connected`` in ``vllm/platforms/cuda.py``). Matched against the GPU's name.
_PCIE_ONLY = re.compile(r"\bL4\b|L40|\bA10G?\b|\bA40\b|\bA16\b|\bA2\b|\bT4\b|RTX|[2345]0[6-9]0|PCIE|A6000|\bNVL\b")


def custom_all_reduce_buffers(gpu_name: str | None, world: int) -> bool:
    """Whether vLLM's custom all-reduce (and its IPC buffers) runs: always at world size 2, above that
    only on a full NVLink mesh (SXM A100/H100/H200, B200). An unknown GPU counts as a mesh, the
    conservative choice (a larger ``N``, a smaller budget)."""
    if world <= 1:
        return False
    if world == 2 or gpu_name is None:
        return True
    return _PCIE_ONLY.search(gpu_name.upper()) is None


def non_torch_bytes(rules: VersionRules, *, tp: int = 1, pp: int = 1, gpu_name: str | None = None) -> int:
    """``N``: memory outside torch's allocator that grows during the profile, per rank.

    cuBLAS workspaces and kernel images ≈ 0.1 GiB on one GPU; NCCL and custom all-reduce buffers
    with more ranks (0.5 GiB at TP 2, 0.3 + 0.1 × world size above). V1 ≤ 0.9.0 also counted the CUDA
    context (``total − free − torch allocated``, +0.4 GiB); 0.9.1–0.10 made the collectives' buffers
    inside the profile, ≈ 1.5 GiB from TP 4 (``vllm/v1/worker/gpu_worker.py`` ``init_device``).
    Above two PCIe-only GPUs there is no custom all-reduce (:func:`custom_all_reduce_buffers`): only
    NCCL's small buffers, 0.2 GiB (0.21 GiB logged on 8 × L40S, 0.20 GiB on RTX 3090s in vLLM PR #14447).
    Ranges from vLLM start-up logs: ``docs/capacity.md``, "The terms, by vLLM's profile run".
    """
    world = tp * pp
    if world == 1:
        base = 0.1
    elif world == 2:
        base = 0.5
    elif not custom_all_reduce_buffers(gpu_name, world):
        return int((0.2 + rules.context_in_non_torch_gib) * GiB)
    else:
        base = 0.3 + 0.1 * world
    if rules.collectives_in_non_torch and tp >= 4:
        base = max(base, 1.5)
    return int((base + rules.context_in_non_torch_gib) * GiB)


def _billions_of_parameters(spec: ModelSpec) -> float:
    return sum(parameter_counts(spec).values()) / 1e9


def cudagraph_bytes(spec: ModelSpec, rules: VersionRules, *, enforce_eager: bool = False) -> int:
    """``G``: the CUDA-graph memory vLLM subtracts (only from v0.21, and never with ``--enforce-eager``).

    ``profile_cudagraph_memory`` captures two graphs per mode and extrapolates: 1.5 × what the
    graphs take after capture, which is ≈ 0.3 GiB for dense models up to 20B, 0.6 GiB above, 1.5 GiB
    for MoE models (``docs/capacity.md``, "The terms, by vLLM's profile run").
    """
    if enforce_eager or not rules.cudagraph_subtracted:
        return 0
    experts, _, _ = _experts(spec)
    if experts:
        graphs = 1.5
    elif _billions_of_parameters(spec) <= 20:
        graphs = 0.3
    else:
        graphs = 0.6
    return int(1.5 * graphs * GiB)
