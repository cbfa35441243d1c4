"""The KV memory budget: GPU memory × utilization minus what is not KV.

``budget = total × util − W − max(F, S) − N − G`` per rank
(``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``;
``docs/capacity.md``, "The budget"): weights as stored (``weights.py``), the
forward peak and the sampler warm-up of the profile run, non-torch memory and
CUDA graphs (``profile_terms.py``), by the vLLM version's rules
(``vllm_rules.py``) and profile batch (``batch_defaults.py``).

``gpu_memory_utilization`` is a fraction of the GPU's TOTAL memory, not of
what is left after the weights (a common reading gets this wrong: that 90% of
"total − weights − overhead" goes to the KV pool; docs/capacity.md, "The budget").

Each term can be overridden with a measured value (vLLM's start-up log).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TypedDict

from ..units import parse_size
from . import profile_terms as _terms
from . import weights as _weights
from .batch_defaults import ProfileBatch, profile_batch
from .config import ModelSpec
from .dtypes import dtype_bytes
from .errors import CapacityError
from .layout import KVLayout
from .profile_terms import DEFAULT_SAMPLER
from .vllm_rules import VersionRules, rules_for
from .weights import DEFAULT_MXFP4_BACKEND

GiB = 1 << 30
MiB = 1 << 20

#: Total memory vLLM sees per GPU (``torch.cuda.mem_get_info`` total), in
#: GiB as vLLM prints it with two decimals, so ±5 MiB. Sources: vLLM's own
#: start-up lines "Free memory on device (x/TOTAL GiB)" and PyTorch's OOM
#: message "TOTAL GiB total capacity" quoted in public logs; see docs/capacity.md.
GPU_TOTAL_GIB: dict[str, float] = {
    "H100-80GB": 79.19,  # vLLM logs "Free memory on device (78.66/79.19 GiB)" on H100 80GB
    "H200-141GB": 139.72,  # vLLM issue #23192 "Free memory on device (7.34/139.72 GiB)"
    "A100-80GB": 79.15,  # PyTorch OOM "79.15 GiB total capacity" on A100 80GB
    "A100-40GB": 39.39,  # vLLM "Free memory on device cuda:0 (3.71/39.39 GiB)"
    "L4": 22.05,  # vLLM CI (L4) in pytorch/pytorch#175666 "(19.77/22.05 GiB)"
    "A10G": 22.19,  # PyTorch OOM "22.19 GiB total capacity" on AWS A10G
    "RTX-4090": 23.65,  # PyTorch OOM message "23.65 GiB total capacity" (a 24 GB card)
    "RTX-3090": 23.69,  # PyTorch OOM "23.69 GiB total capacity"
    "T4": 14.75,  # PyTorch OOM "14.75 GiB total capacity" (Colab T4)
    "V100-16GB": 15.77,  # PyTorch OOM "15.77 GiB total capacity"
    "V100-32GB": 31.74,  # PyTorch OOM "31.74 GiB total capacity"
    "B200": 178.36,  # vLLM PR #21489's log "Free memory on device (177.66/178.36 GiB)"
    "L40S": 44.31,  # vLLM issue #15196 "total_gpu_memory (44.31GiB)" on an L40S (0.7.2)
}

_GPU_ALIASES: dict[str, str] = {
    "H100": "H100-80GB",
    "H100-SXM": "H100-80GB",
    "H100-PCIE": "H100-80GB",
    "H100-SXM-80GB": "H100-80GB",
    "H100-PCIE-80GB": "H100-80GB",
    "H100-80G": "H100-80GB",
    "H200": "H200-141GB",
    "A100": "A100-80GB",
    "A100-SXM4-80GB": "A100-80GB",
    "A100-80G": "A100-80GB",
    "A100-SXM4-40GB": "A100-40GB",
    "A100-40G": "A100-40GB",
    "4090": "RTX-4090",
    "RTX4090": "RTX-4090",
    "3090": "RTX-3090",
    "RTX3090": "RTX-3090",
    "V100": "V100-16GB",
    "B200-192GB": "B200",
}


def gpu_name(name: str) -> str | None:
    """The table's name of a known GPU (``h100 80gb`` -> ``H100-80GB``), else None."""
    key = re.sub(r"[\s_]+", "-", name.strip().upper()).replace("NVIDIA-", "")
    key = _GPU_ALIASES.get(key, key)
    return key if key in GPU_TOTAL_GIB else None


def gpu_memory_bytes(name: str) -> int | None:
    """Total memory of a known GPU name (``H100-80GB``, ``a100 40gb``...), else None."""
    key = gpu_name(name)
    return None if key is None else round(GPU_TOTAL_GIB[key] * GiB)


def parse_memory(text: str, name: str = "--gpu-memory") -> int:
    """Bytes from ``80GiB`` (2^30), ``80GB`` (10^9), a plain byte count, or a GPU name.

    A known GPU name (``H100-80GB``) gives the total memory vLLM sees, which
    is less than the marketing size (an H100 80GB reports 79.19 GiB).
    Errors name ``name``: the calculator's flag, or the sidecar's config field.
    """
    raw = str(text)
    known = gpu_memory_bytes(raw)
    if known is not None:
        return known
    try:
        value = parse_size(raw)
    except ValueError:
        names = ", ".join(GPU_TOTAL_GIB)
        raise CapacityError(
            f"{name}: {raw!r} is not a size or a known GPU (write 80GiB, 80GB = 80×10^9 bytes, or one of: {names})"
        ) from None
    if value <= 0:
        raise CapacityError(f"{name}: {raw!r} must be more than 0")
    return value


# ------------------------------------------------------------ the terms
# Weights and the profile's terms live in their own modules; these names stay for the callers.

weights_bytes = _weights.weights_bytes
parameter_counts = _weights.parameter_counts


def activation_estimate_bytes(
    spec: ModelSpec, layout: KVLayout, max_num_batched_tokens: int, max_num_seqs: int = 256
) -> int:
    """``A = max(F, S)``: the torch peak of vLLM's profile run with the native sampler
    (``profile_terms.forward_bytes`` and ``sampler_bytes``; ``docs/capacity.md``, "The budget")."""
    forward = _terms.forward_bytes(
        spec, tokens=max_num_batched_tokens, tp=layout.tp, activation_bytes=dtype_bytes(layout.served_dtype)
    )
    sampler = _terms.sampler_bytes(spec, rows=min(max_num_seqs, max_num_batched_tokens))
    return max(forward, sampler)


def non_torch_estimate_bytes(layout: KVLayout, vllm_version: str | None = None) -> int:
    """``N`` for this layout under the version's rules (``profile_terms.non_torch_bytes``)."""
    return _terms.non_torch_bytes(rules_for(vllm_version), tp=layout.tp, pp=layout.pp)


def cudagraph_estimate_bytes(layout: KVLayout, spec: ModelSpec | None = None) -> int:
    """``G`` as vLLM ≥ 0.21 subtracts it (``profile_terms.cudagraph_bytes``); without the model, 0.45 GiB
    (a dense model up to 20B)."""
    if spec is None:
        return int(1.5 * 0.3 * GiB)
    return _terms.cudagraph_bytes(spec, rules_for(None))


@dataclass(frozen=True)
class NonKVBytes:
    """What stays on one rank besides the KV cache (bytes): vLLM's ``non_kv_cache_memory`` and CUDA graphs."""

    weights: int
    activation: int
    non_torch: int
    cudagraph: int

    @property
    def total(self) -> int:
        return self.weights + self.activation + self.non_torch + self.cudagraph


def non_kv_bytes(
    spec: ModelSpec,
    layout: KVLayout,
    *,
    max_num_batched_tokens: int,
    weights: int | None = None,
    activation_bytes: int | None = None,
    non_torch_bytes: int | None = None,
    cudagraph_bytes: int = 0,
) -> NonKVBytes:
    """Weights, activation peak and non-torch memory on the most loaded rank: each the measured value
    when given (vLLM's start-up log), else the estimate above; the CUDA-graph term as given."""
    w = weights_bytes(spec, tp=layout.tp, pp=layout.pp, dtype=layout.served_dtype) if weights is None else weights
    act = (
        activation_estimate_bytes(spec, layout, max_num_batched_tokens)
        if activation_bytes is None
        else activation_bytes
    )
    nt = non_torch_estimate_bytes(layout) if non_torch_bytes is None else non_torch_bytes
    return NonKVBytes(w, act, nt, cudagraph_bytes)


#: The terms the output and the dominant-term series name, in vLLM's log order.
TERMS = ("weights", "forward", "sampler", "non_torch", "cudagraph")


@dataclass(frozen=True)
class Budget:
    """The KV cache budget of one rank and how it was formed (bytes)."""

    kv_budget_bytes: int
    requested_bytes: int
    weights_bytes: int
    activation_bytes: int
    non_torch_bytes: int
    cudagraph_bytes: int
    gpu_memory_bytes: int
    gpu_memory_utilization: float
    #: "exact" when given (--kv-cache-memory-bytes or a measured value), "estimated" otherwise
    source: str = "estimated"
    #: the two candidates of the activation peak: the forward pass F and the sampler warm-up S
    forward_bytes: int = 0
    sampler_bytes: int = 0
    #: the profile batch and the rules used (for --explain)
    batch: ProfileBatch | None = None
    rules: VersionRules | None = None
    sampler: str = DEFAULT_SAMPLER
    #: which terms were measured values (overrides) rather than estimates
    measured: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, object]:
        """Plain values for JSON: every field, the batch and rules flattened, and the dominant overhead."""
        out: dict[str, object] = {
            k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("batch", "rules", "measured")
        }
        out["measured"] = list(self.measured)
        if self.batch is not None:
            out |= {
                "max_num_seqs": self.batch.max_num_seqs,
                "max_num_batched_tokens": self.batch.max_num_batched_tokens,
            }
        if self.rules is not None:
            out["rules"] = self.rules.label
        if self.source == "estimated":
            out["dominant_overhead"] = self.dominant_overhead
        return out

    def term_bytes(self) -> dict[str, int]:
        """The subtracted terms by name (:data:`TERMS`); the activation split into F and S, the
        smaller of which vLLM's peak does not add."""
        return {
            "weights": self.weights_bytes,
            "forward": self.forward_bytes,
            "sampler": self.sampler_bytes,
            "non_torch": self.non_torch_bytes,
            "cudagraph": self.cudagraph_bytes,
        }

    @property
    def dominant_overhead(self) -> str:
        """The largest term after the weights (the one a planner can act on): ``forward`` (lower
        --max-num-batched-tokens), ``sampler`` (lower --max-num-seqs), ``non_torch`` or ``cudagraph``
        (--enforce-eager). With the activation measured as one number, ``activation``."""
        if "activation" in self.measured or not (self.forward_bytes or self.sampler_bytes):
            options = {"activation": self.activation_bytes}
        else:
            options = {"forward": self.forward_bytes, "sampler": self.sampler_bytes}
        options |= {"non_torch": self.non_torch_bytes, "cudagraph": self.cudagraph_bytes}
        return max(options, key=lambda k: options[k])


def exact_budget(kv_cache_memory_bytes: int) -> Budget:
    """A budget given as ``--kv-cache-memory-bytes`` (vLLM then ignores the utilization)."""
    if (
        isinstance(kv_cache_memory_bytes, bool)
        or not isinstance(kv_cache_memory_bytes, int)
        or kv_cache_memory_bytes <= 0
    ):
        raise CapacityError(
            f"--kv-cache-memory-bytes: must be a positive number of bytes, got {kv_cache_memory_bytes!r}"
        )
    return Budget(kv_cache_memory_bytes, kv_cache_memory_bytes, 0, 0, 0, 0, 0, 0.0, source="exact")


def check_utilization(value: float) -> float:
    """vLLM's ``CacheConfig`` bound: 0 < gpu_memory_utilization ≤ 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise CapacityError(
            f"--gpu-memory-utilization: must be in (0, 1], got {value!r} (vLLM's default is 0.92, 0.9 before 0.20.0)"
        )
    return float(value)


class MeasuredMemory(TypedDict, total=False):
    """Measured non-KV terms that replace ``estimate_budget``'s estimates (bytes per rank)."""

    activation_bytes: int | None
    non_torch_bytes: int | None
    cudagraph_bytes: int | None


@dataclass(frozen=True)
class ServingFlags:
    """The vLLM flags and facts the profile depends on; None = vLLM's default for the version and GPU."""

    vllm_version: str | None = None
    #: "V0" for VLLM_USE_V1=0 (up to 0.10); None = the version's default engine
    engine: str | None = None
    gpu_name: str | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enforce_eager: bool = False
    sampler: str = DEFAULT_SAMPLER
    #: LLM(...) in Python (UsageContext.LLM_CLASS) rather than `vllm serve`
    offline: bool = False
    mxfp4_backend: str = DEFAULT_MXFP4_BACKEND


def _measured(**values: int | None) -> tuple[str, ...]:
    return tuple(name for name, value in values.items() if value is not None)


def estimate_budget(
    spec: ModelSpec,
    layout: KVLayout,
    *,
    gpu_memory_bytes: int,
    gpu_memory_utilization: float,
    max_num_batched_tokens: int | None = None,
    vllm_version: str | None = None,
    activation_bytes: int | None = None,
    non_torch_bytes: int | None = None,
    cudagraph_bytes: int | None = None,
    weights: int | None = None,
    flags: ServingFlags | None = None,
) -> Budget:
    """``budget = total × util − W − max(F, S) − N − G`` on the most loaded rank.

    vLLM ``Worker.determine_available_memory`` (``vllm/v1/worker/gpu_worker.py``; V0
    ``vllm/worker/worker.py`` ``determine_num_available_blocks``): the utilization is a fraction of
    TOTAL memory per GPU; ``W`` from :mod:`.weights`, ``F``, ``S``, ``N``, ``G`` from
    :mod:`.profile_terms` under the version's rules (:mod:`.vllm_rules`) and profile batch
    (:mod:`.batch_defaults`). Each term given as a measured value replaces its estimate.
    ``vllm_version=None`` means the newest rules. The result may be ≤ 0; ``num_blocks`` refuses it
    as vLLM does.
    """
    if gpu_memory_bytes <= 0:
        raise CapacityError(f"--gpu-memory: must be more than 0 bytes, got {gpu_memory_bytes}")
    util = check_utilization(gpu_memory_utilization)
    f = flags or ServingFlags(vllm_version=vllm_version, max_num_batched_tokens=max_num_batched_tokens)
    rules = rules_for(f.vllm_version if f.vllm_version is not None else vllm_version, f.engine)
    batch = profile_batch(
        rules,
        gpu_name=f.gpu_name,
        gpu_memory_bytes=gpu_memory_bytes,
        max_model_len=layout.max_model_len,
        max_num_seqs=f.max_num_seqs,
        max_num_batched_tokens=f.max_num_batched_tokens or max_num_batched_tokens,
        offline=f.offline,
    )
    requested = int(gpu_memory_bytes * util)
    w = (
        _weights.weights_bytes(
            spec, tp=layout.tp, pp=layout.pp, dtype=layout.served_dtype, mxfp4_backend=f.mxfp4_backend
        )
        if weights is None
        else weights
    )
    forward = _terms.forward_bytes(
        spec, tokens=batch.max_num_batched_tokens, tp=layout.tp, activation_bytes=dtype_bytes(layout.served_dtype)
    )
    # Only the last pipeline stage samples; with PP the most loaded rank may not, but the budget is the
    # minimum over ranks, and the last stage's is the smaller one.
    sampler = _terms.sampler_bytes(spec, rows=batch.sampler_rows, sampler=f.sampler)
    act = max(forward, sampler) if activation_bytes is None else activation_bytes
    nt = (
        _terms.non_torch_bytes(rules, tp=layout.tp, pp=layout.pp, gpu_name=f.gpu_name)
        if non_torch_bytes is None
        else non_torch_bytes
    )
    graphs = (
        _terms.cudagraph_bytes(spec, rules, enforce_eager=f.enforce_eager)
        if cudagraph_bytes is None
        else cudagraph_bytes
    )
    return Budget(
        kv_budget_bytes=requested - (w + act + nt + graphs),
        requested_bytes=requested,
        weights_bytes=w,
        activation_bytes=act,
        non_torch_bytes=nt,
        cudagraph_bytes=graphs,
        gpu_memory_bytes=gpu_memory_bytes,
        gpu_memory_utilization=util,
        source="estimated",
        forward_bytes=forward,
        sampler_bytes=sampler,
        batch=batch,
        rules=rules,
        sampler=f.sampler,
        measured=_measured(
            weights=weights, activation=activation_bytes, non_torch=non_torch_bytes, cudagraph=cudagraph_bytes
        ),
    )
