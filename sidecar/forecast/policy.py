"""The advice policy: from the window's peak demand and the pool, what to suggest and what to withhold.

One pure function, :func:`advise`, over plain numbers: the pool vLLM runs with now
(:class:`Pool`), what the capacity model knows about the served model
(:class:`ServedModel`, absent without ``model.config``) and the policy's settings
(:class:`AdviceSettings`). It decides

- the *memory mode*: the engine's setting that sizes its pool (:data:`LEVERS`). vLLM takes its
  KV budget from ``kv_cache_memory_bytes`` when that is set and ignores
  ``gpu_memory_utilization`` then (``CacheConfig`` in ``vllm/config/cache.py``;
  ``Worker.determine_available_memory`` in ``vllm/v1/worker/gpu_worker.py``), so the
  suggestion names the setting that acts. SGLang's ``--mem-fraction-static`` is a share of
  TOTAL memory like vLLM's utilization and takes the same inverse formula; TensorRT-LLM's
  ``free_gpu_memory_fraction`` is a share of the memory FREE after the weights, and scales the
  pool in proportion (:mod:`sidecar.capacity.trtllm_fraction`); an engine with no such setting
  (TGI, llama.cpp) gets replicas or nothing (``no_memory_lever``);
- the suggested setting, the largest pool the GPU allows (``C_max``), the
  shortfall and replicas when even that pool is too small, and the cheaper
  *levers* (fp8 KV cache, fewer KV heads, a shorter ``max_model_len``);
- the top :class:`~sidecar.forecast.recommendation.Recommendation`;
- the *warm-up gate*: a peak above target is evidence at once, but the absence
  of peaks is evidence only after a whole ``forecast.peak_window`` has been
  watched. Until then nothing that lowers memory is returned: neither a
  ``lower_*`` recommendation nor a suggested setting below the current one (a
  restarted sidecar next to a quiet vLLM must not advise cutting its cache).

:class:`Advice` holds only what the policy allows; a field is ``None`` (or the
levers empty) when there is nothing to say. Formulas: docs/forecast.md
("Suggested memory", "Shortfall and levers", ``kvcache_recommendation_info``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..capacity import trtllm_fraction
from ..capacity.budget import NonKVBytes
from ..capacity.vllm_rules import NEW_UTILIZATION_FLAG, OLD_UTILIZATION_FLAG
from .recommendation import Recommendation, recommend
from .sizing import (
    capacity_at_utilization,
    capacity_shortfall_tokens,
    capacity_with_kv_dtype,
    capacity_with_kv_heads,
    infer_gpu_memory,
    max_concurrent_requests,
    max_model_len_for_concurrency,
    suggest_gpu_memory_utilization,
    suggest_kv_cache_memory_bytes,
    suggested_replicas,
)


@dataclass(frozen=True)
class Lever:
    """An engine's memory setting that sizes its KV pool as a fraction of GPU memory."""

    #: the flag as the engine's command line spells it
    flag: str
    #: "total": a share of the GPU's total memory (the budget moves by Δf × M); "free": a share of the
    #: memory free after the weights (the pool scales in proportion to f)
    share_of: str


#: The memory levers the advice can size, by ``KVPool.memory_lever`` (docs/forecast.md, "Per lever").
#: vLLM: ``requested_memory = total × gpu_memory_utilization`` (``vllm/v1/worker/gpu_worker.py``).
#: SGLang: ``rest_memory = available_gpu_memory − total_gpu_memory × (1 − mem_fraction_static)``,
#: ``max_num_token = rest_memory ÷ cell_size`` (``profile_max_num_token`` in
#: ``python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py`` at v0.5.8; ``model_runner.py``
#: before): ``available_gpu_memory`` is measured after the weights load and does not depend on the
#: fraction, ``total_gpu_memory`` before it (the GPU's memory on a dedicated GPU), so the budget
#: moves by Δf × M exactly as vLLM's does.
#: TensorRT-LLM: ``KV budget = free memory after weights × free_gpu_memory_fraction``.
LEVERS: dict[str, Lever] = {
    "gpu_memory_utilization": Lever("--gpu-memory-utilization", "total"),
    "mem_fraction_static": Lever("--mem-fraction-static", "total"),
    "free_gpu_memory_fraction": Lever(trtllm_fraction.SERVE_FLAG, "free"),
}


@dataclass(frozen=True)
class Pool:
    """The KV pool the engine runs with now, from its page (:class:`~sidecar.observation.KVPool`)."""

    #: the engine's own capacity figure (vLLM: null block included; unknown for hybrid models: then
    #: there is no advice)
    capacity_tokens: float
    block_size: int
    #: vLLM's ``kv_cache_memory_bytes`` label when set (then it, not the utilization, sizes the pool)
    kv_cache_memory_bytes: float | None = None
    #: the value of ``memory_lever`` (vLLM's ``gpu_memory_utilization`` label, SGLang's
    #: ``mem_fraction_static``, TensorRT-LLM's ``free_gpu_memory_fraction``); None when not on the page
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    #: requests in the running batch (for the ``max_model_len`` lever)
    requests_running: float | None = None
    #: the engine's memory setting (a key of :data:`LEVERS`; anything else: no setting to size)
    memory_lever: str | None = "gpu_memory_utilization"
    #: blocks never allocatable (vLLM 1, the null block; SGLang and TensorRT-LLM 0)
    null_blocks: int = 1
    #: the flag's spelling when it differs from :data:`LEVERS`' (vLLM's ``--device-memory-utilization``
    #: alias, named when the server's version has it: ``vllm_rules.utilization_flag(version)`` of the page's
    #: version floor or ``model.vllm_version``)
    flag: str | None = None


@dataclass(frozen=True)
class ServedModel:
    """What the capacity model (``model.config``) says about the served model on one rank."""

    bytes_per_token: float
    kv_dtype_bytes: float
    kv_heads: int
    attention: str  # "mla" has a single latent "head": no fewer-heads lever
    tensor_parallel: int
    #: ``model.gpu_memory`` when configured (bytes)
    gpu_memory_bytes: float | None
    #: The non-KV bytes on one rank, evaluated only when the advice needs them (an estimate can fail
    #: for a model the capacity model cannot size; that must not matter when nothing reads it).
    non_kv_bytes: Callable[[], NonKVBytes]
    #: ``model.gpu_memory`` when given as a GPU name (``H100-80GB``, as
    #: :func:`sidecar.capacity.budget.gpu_name` spells it), else ""
    gpu_name: str = ""
    #: vLLM's utilization flag as ``model.vllm_version`` spells it
    #: (:func:`sidecar.capacity.vllm_rules.utilization_flag`); None: no version given, the lever's own
    utilization_flag: str | None = None


@dataclass(frozen=True)
class AdviceSettings:
    """The settings the policy reads (``thresholds:`` and ``forecast:`` sections)."""

    target_usage: float  # thresholds.target_usage
    utilization_min: float  # forecast.utilization_min
    utilization_max: float  # forecast.utilization_max
    peak_window_s: float  # forecast.peak_window


@dataclass(frozen=True)
class Advice:
    """What the policy allows to be said; None = withheld or not computable."""

    recommendation: Recommendation
    #: (basis, value): basis "configured" or "inferred" GPU memory
    suggested_gpu_memory_utilization: tuple[str, float] | None = None
    suggested_kv_cache_memory_bytes: int | None = None
    capacity_shortfall_tokens: int | None = None
    suggested_replicas: int | None = None
    #: lever -> capacity it gives, in a fixed order: fp8_kv_cache, half_kv_heads, max_model_len
    lever_capacity_tokens: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class _Memory:
    """The suggested memory setting and the largest pool the GPU allows (``C_max``), before the gate."""

    utilization: tuple[str, float] | None = None
    kv_cache_memory_bytes: int | None = None
    max_capacity_tokens: float | None = None


_NO_MEMORY = _Memory()  # nothing to suggest: the inputs for the memory setting are missing


def advise(
    *, peak_demand_tokens: float, watched_s: float, pool: Pool, model: ServedModel | None, settings: AdviceSettings
) -> Advice:
    """Suggested memory setting, shortfall, replicas, levers and the top recommendation.

    ``peak_demand_tokens`` is the largest demand of the peak window; ``watched_s`` how long
    this engine has been watched (the warm-up gate). Without a pool size or a peak there is
    nothing to advise: the caller says ``none/insufficient_data`` then.
    """
    c0, bs, peak = _with_null_block(pool), pool.block_size, peak_demand_tokens
    bpt: float | None = model.bytes_per_token if model is not None else None
    if bpt is None and pool.kv_cache_memory_bytes:
        # the engine's own pool: budget ÷ its tokens (exact up to the floor to blocks)
        bpt = pool.kv_cache_memory_bytes / pool.capacity_tokens
    mode = memory_mode(pool)
    if mode == "free_gpu_memory_fraction":
        memory = _free_fraction_memory(peak, pool, settings)
    elif mode == "none":
        memory = _Memory(max_capacity_tokens=c0)  # no setting to raise: today's pool is the largest
    else:
        memory = _memory(peak, c0, bs, bpt, pool, model, settings)

    shortfall = replicas = None
    levers: dict[str, float] = {}
    c_max = memory.max_capacity_tokens
    if c_max is not None:
        missing = capacity_shortfall_tokens(
            peak_demand_tokens=peak, target_usage=settings.target_usage, max_capacity_tokens=c_max, block_size=bs
        )
        if missing > 0 and c_max > bs:
            shortfall = missing
            replicas = suggested_replicas(
                peak_demand_tokens=peak,
                target_usage=settings.target_usage,
                capacity_per_replica_tokens=c_max,
                block_size=bs,
            )
            levers = _levers(c_max, bs, pool, model)

    rec = recommend(
        asleep=False,
        peak_demand_tokens=peak,
        capacity_tokens=c0,
        block_size=bs,
        target_usage=settings.target_usage,
        max_capacity_tokens=c_max,
        memory_mode=mode,
        kv_dtype_bytes=model.kv_dtype_bytes if model is not None else None,
        max_model_len=pool.max_model_len,
    )
    utilization, kv_bytes = memory.utilization, memory.kv_cache_memory_bytes
    if watched_s < settings.peak_window_s:  # warming up: nothing that lowers memory yet
        if rec.action.startswith("lower_"):
            rec = Recommendation("none", "insufficient_data")
        u0 = pool.gpu_memory_utilization
        if utilization is not None and u0 and utilization[1] < u0:
            utilization = None
        if kv_bytes is not None and pool.kv_cache_memory_bytes and kv_bytes < pool.kv_cache_memory_bytes:
            kv_bytes = None
    return Advice(
        rec,
        suggested_gpu_memory_utilization=utilization,
        suggested_kv_cache_memory_bytes=kv_bytes,
        capacity_shortfall_tokens=shortfall,
        suggested_replicas=replicas,
        lever_capacity_tokens=levers,
    )


def _memory(
    peak: float, c0: float, bs: int, bpt: float | None, pool: Pool, model: ServedModel | None, settings: AdviceSettings
) -> _Memory:
    """The setting that sizes vLLM's pool, at which the peak would sit at target, and ``C_max``."""
    target, hi = settings.target_usage, settings.utilization_max
    kv_bytes, u0, max_len = pool.kv_cache_memory_bytes, pool.gpu_memory_utilization, pool.max_model_len
    if kv_bytes and bpt:
        # The most KV the GPU can give: its share at the upper bound minus weights, activation,
        # non-torch and CUDA graphs, which stay on the GPU when vLLM takes its KV budget from
        # kv_cache_memory_bytes (docs/capacity.md, "The budget"). Unknown without the GPU's memory
        # and the model: then the suggestion is not capped. The budget vLLM runs with now evidently
        # fits, whatever the estimates of the other terms say.
        max_bytes = None
        if model is not None and model.gpu_memory_bytes:
            max_bytes = max(kv_bytes, model.gpu_memory_bytes * hi - model.non_kv_bytes().total)
        suggested = suggest_kv_cache_memory_bytes(
            peak_demand_tokens=peak,
            target_usage=target,
            bytes_per_token=bpt,
            block_size=bs,
            max_model_len=max_len,
            max_bytes=max_bytes,
        )
        # whole blocks, as vLLM sizes the pool (num_blocks = ⌊bytes ÷ page⌋, get_num_blocks in
        # vllm/v1/core/kv_cache_utils.py)
        c_max = None if max_bytes is None else math.floor(max_bytes / (bs * bpt)) * bs
        return _Memory(kv_cache_memory_bytes=suggested, max_capacity_tokens=c_max)
    if kv_bytes or not (u0 and bpt and model is not None):
        return _NO_MEMORY
    if pool.memory_lever != "gpu_memory_utilization" and not model.gpu_memory_bytes:
        # inferring M takes vLLM's non-KV terms (activation peak, CUDA graphs), which another
        # engine's profile does not share: the suggestion needs model.gpu_memory there
        return _NO_MEMORY
    memory, basis = gpu_memory_of(model, c0, bpt, u0)
    if not memory:
        return _NO_MEMORY
    u = suggest_gpu_memory_utilization(
        u0=u0,
        capacity_tokens=c0,
        peak_demand_tokens=peak,
        target_usage=target,
        bytes_per_token=bpt,
        gpu_memory_bytes=memory,
        block_size=bs,
        max_model_len=max_len,
        lo=settings.utilization_min,
        hi=hi,
    )
    c_max = capacity_at_utilization(
        u=hi, u0=u0, capacity_tokens=c0, bytes_per_token=bpt, gpu_memory_bytes=memory, block_size=bs
    )
    return _Memory(utilization=(basis, u), max_capacity_tokens=c_max)


def memory_mode(pool: Pool) -> str:
    """The setting that sizes the pool: ``kv_cache_memory_bytes`` when set (vLLM), else the lever, else "none"."""
    if pool.kv_cache_memory_bytes:
        return "kv_cache_memory_bytes"
    if pool.memory_lever in LEVERS:
        return pool.memory_lever
    return "none"


def _with_null_block(pool: Pool) -> float:
    """The capacity in vLLM's convention (null block included), which sizing.py's formulas take.

    An engine without a null block (SGLang, TensorRT-LLM) gets one virtual block added, so that
    ``capacity − block_size`` is its whole pool, as usage is measured there.
    """
    return pool.capacity_tokens + max(0, 1 - pool.null_blocks) * pool.block_size


def _free_fraction_memory(peak: float, pool: Pool, settings: AdviceSettings) -> _Memory:
    """TensorRT-LLM's ``free_gpu_memory_fraction`` at which the peak sits at target, and ``C_max``.

    The pool scales in proportion to the fraction (``F × f`` bytes with ``F`` the memory free after
    the weights, which does not depend on ``f``): ``f* = f0 × ⌈peak ÷ target ÷ tpb⌉ ÷ B0``
    (:func:`sidecar.capacity.trtllm_fraction.suggest_free_gpu_memory_fraction`), clamped to
    ``[utilization_min, utilization_max]``; ``C_max`` = the blocks at the upper bound,
    ``⌊B0 × hi ÷ f0⌋``, plus the virtual null block (:func:`_with_null_block`). Needs only the page
    and the fraction the engine runs with: basis "proportional".
    """
    f0, bs = pool.gpu_memory_utilization, pool.block_size
    blocks0 = int(pool.capacity_tokens // bs)
    if not f0 or blocks0 < 1:
        return _NO_MEMORY
    f = trtllm_fraction.suggest_free_gpu_memory_fraction(
        f0=f0, max_blocks=blocks0, tokens_per_block=bs, peak_demand_tokens=peak, target_usage=settings.target_usage
    )
    f = min(max(f, settings.utilization_min), settings.utilization_max)
    hi_blocks = trtllm_fraction.blocks_at_fraction(f=settings.utilization_max, f0=f0, blocks0=blocks0)
    return _Memory(utilization=("proportional", f), max_capacity_tokens=(hi_blocks + 1) * bs)


def gpu_memory_of(model: ServedModel, c0: float, bpt: float, u0: float) -> tuple[float, str]:
    """M: the configured GPU memory, else inferred from the pool (:func:`~sidecar.forecast.sizing.infer_gpu_memory`)."""
    if model.gpu_memory_bytes:
        return float(model.gpu_memory_bytes), "configured"
    non_kv = model.non_kv_bytes()
    return infer_gpu_memory(
        capacity_tokens=c0,
        bytes_per_token=bpt,
        weights_bytes=non_kv.weights,
        activation_bytes=non_kv.activation,
        non_torch_bytes=non_kv.non_torch,
        u0=u0,
        cudagraph_bytes=non_kv.cudagraph,
    ), "inferred"


def _levers(c_max: float, bs: int, pool: Pool, model: ServedModel | None) -> dict[str, float]:
    """Capacity each cheaper lever would give the largest pool, when it applies."""
    levers: dict[str, float] = {}
    if model is not None and model.kv_dtype_bytes > 1:
        levers["fp8_kv_cache"] = capacity_with_kv_dtype(
            capacity_tokens=c_max, kv_dtype_bytes=model.kv_dtype_bytes, block_size=bs
        )
    if model is not None and model.kv_heads > 1 and model.attention != "mla":
        levers["half_kv_heads"] = capacity_with_kv_heads(
            capacity_tokens=c_max,
            kv_heads=model.kv_heads,
            new_kv_heads=max(1, model.kv_heads // 2),
            tensor_parallel=model.tensor_parallel,
            block_size=bs,
        )
    running = pool.requests_running
    if running and running >= 1:
        # the longest max_model_len at which today's running requests all fit at full length;
        # a lever only when it is below the current one (lowering is the lever)
        shorter = max_model_len_for_concurrency(
            usable_blocks=max(0, int(c_max // bs) - 1), block_size=bs, concurrency=int(running)
        )
        if pool.max_model_len is None or shorter < pool.max_model_len:
            levers["max_model_len"] = shorter
    return levers


# --- the capacity a suggestion gives, and the flags that set it ------------------------------


def capacity_after(advice: Advice, pool: Pool, model: ServedModel | None) -> float | None:
    """The engine's capacity (its own figure) one replica gets from the advice; None: nothing to compute.

    A suggested ``kv_cache_memory_bytes``: its whole blocks (``get_num_blocks`` in
    ``vllm/v1/core/kv_cache_utils.py`` floors the budget to pages). A suggested fraction of total
    memory: :func:`~sidecar.forecast.sizing.capacity_at_utilization` with the GPU memory the
    suggestion used; of free memory (TensorRT-LLM): ``⌊B0 × f ÷ f0⌋`` blocks. ``enable_fp8_kv_cache``:
    the fp8 lever's pool. Anything else keeps the current pool.
    """
    bs, c0 = pool.block_size, _with_null_block(pool)
    virtual = c0 - pool.capacity_tokens  # the null block added for engines without one
    if advice.recommendation.action == "enable_fp8_kv_cache" and "fp8_kv_cache" in advice.lever_capacity_tokens:
        return float(advice.lever_capacity_tokens["fp8_kv_cache"]) - virtual
    if advice.suggested_kv_cache_memory_bytes is not None:
        bpt = model.bytes_per_token if model is not None else None
        if bpt is None and pool.kv_cache_memory_bytes:
            bpt = pool.kv_cache_memory_bytes / pool.capacity_tokens  # as advise() does without model.config
        if not bpt:
            return None
        # 1e-6 of a block: the suggestion is C* × bpt rounded to a byte, which must not lose C*'s last block
        return float(math.floor(advice.suggested_kv_cache_memory_bytes / (bs * bpt) + 1e-6) * bs)
    u0, suggested = pool.gpu_memory_utilization, advice.suggested_gpu_memory_utilization
    if suggested is None or not u0:
        return None
    if memory_mode(pool) == "free_gpu_memory_fraction":
        blocks0 = int(pool.capacity_tokens // bs)
        return float(trtllm_fraction.blocks_at_fraction(f=suggested[1], f0=u0, blocks0=blocks0) * bs)
    if model is None:
        return None
    memory, _basis = gpu_memory_of(model, c0, model.bytes_per_token, u0)  # the M the suggestion used
    after = capacity_at_utilization(
        u=suggested[1],
        u0=u0,
        capacity_tokens=c0,
        bytes_per_token=model.bytes_per_token,
        gpu_memory_bytes=memory,
        block_size=bs,
    )
    return float(after - virtual)


def utilization_text(u: float) -> str:
    """``--gpu-memory-utilization`` as it is printed: rounded *up* to 0.001, at least two decimals.

    Up, so that setting the printed value gives at least the capacity the effect was computed for.
    """
    up = math.ceil(u * 1000 - 1e-6) / 1000
    text = f"{up:.3f}"
    return text[:-1] if text.endswith("0") else text


def lever_flag(pool: Pool) -> str | None:
    """The flag that sets the pool's lever, as the engine's command line spells it (None: no lever).

    vLLM's utilization is ``--gpu-memory-utilization``, which every version accepts, unless ``Pool.flag``
    names the alias ``--device-memory-utilization`` (vLLM PR #56547, from 0.31.0:
    :func:`sidecar.capacity.vllm_rules.utilization_flag`). The exact flags (:func:`current_flags`,
    :func:`flags_to_set`) name one spelling, to paste as it is: both on one command line set the same
    value twice, the last silently winning. The sentence (:func:`advice_text`) names both.
    """
    if pool.flag:
        return pool.flag
    lever = LEVERS.get(pool.memory_lever or "")
    return None if lever is None else lever.flag


def current_flags(pool: Pool) -> tuple[str, ...]:
    """The memory flag the engine runs with now, as it would be written on its command line."""
    flag = lever_flag(pool)
    if pool.kv_cache_memory_bytes:
        return (f"--kv-cache-memory-bytes {int(pool.kv_cache_memory_bytes)}",)
    if pool.gpu_memory_utilization and flag:
        return (f"{flag} {pool.gpu_memory_utilization:.2f}",)
    return ()


def flags_to_set(advice: Advice, pool: Pool) -> tuple[str, ...]:
    """The exact flags the advice sets (empty: nothing to change, or no value computable).

    The memory setting when one is suggested and differs from today's (the lever's own flag:
    ``--gpu-memory-utilization`` or its alias, ``--mem-fraction-static``,
    ``--kv_cache_free_gpu_memory_fraction``), then ``--kv-cache-dtype fp8`` for
    ``enable_fp8_kv_cache`` and ``--max-model-len N`` for ``lower_max_model_len``.
    """
    action = advice.recommendation.action
    if action == "none":
        return ()
    out: list[str] = []
    kv, u = advice.suggested_kv_cache_memory_bytes, advice.suggested_gpu_memory_utilization
    flag = lever_flag(pool)
    if kv is not None and kv != pool.kv_cache_memory_bytes:
        out.append(f"--kv-cache-memory-bytes {kv}")
    elif u is not None and flag and utilization_text(u[1]) != utilization_text(pool.gpu_memory_utilization or 0):
        out.append(f"{flag} {utilization_text(u[1])}")
    if action == "enable_fp8_kv_cache":
        out.append("--kv-cache-dtype fp8")
    if action == "lower_max_model_len" and "max_model_len" in advice.lever_capacity_tokens:
        out.append(f"--max-model-len {int(advice.lever_capacity_tokens['max_model_len'])}")
    return tuple(out)


def advice_text(advice: Advice, pool: Pool) -> str:
    """The memory suggestion as a sentence a person can act on, saying what the value is a share of.

    TensorRT-LLM's fraction is a share of the memory FREE after the weights
    (:func:`sidecar.capacity.trtllm_fraction.advice_text`); vLLM's and SGLang's of the GPU's total.
    Empty when the advice suggests no memory setting.
    """
    u = advice.suggested_gpu_memory_utilization
    if advice.suggested_kv_cache_memory_bytes is not None:
        return f"--kv-cache-memory-bytes {advice.suggested_kv_cache_memory_bytes} (bytes of KV cache per GPU)"
    flag = lever_flag(pool)
    if u is None or flag is None:
        return ""
    if memory_mode(pool) == "free_gpu_memory_fraction":
        return trtllm_fraction.advice_text(u[1])
    if flag == NEW_UTILIZATION_FLAG:
        # an operator whose command line says --gpu-memory-utilization must recognise the setting
        return (
            f"{flag} {utilization_text(u[1])} (alias of {OLD_UTILIZATION_FLAG}: change whichever your command "
            "line uses; a share of the GPU's TOTAL memory)"
        )
    return f"{flag} {utilization_text(u[1])} (a share of the GPU's TOTAL memory)"


# --- one recommendation per workload ---------------------------------------------------------

#: A replica is "hot" when its own peak demand exceeds the workload's even share by more than this
#: share: a skewed router or session affinity, a routing finding rather than a sizing one.
UNEVEN_MARGIN = 0.25


@dataclass(frozen=True)
class Replica:
    """One pod of a workload, as the workload's advice reads it."""

    name: str
    peak_demand_tokens: float
    pool: Pool


@dataclass(frozen=True)
class WorkloadAdvice:
    """One recommendation for every replica of a workload (namespace, model, and the owner when known).

    ``advice`` is :func:`advise` on one replica carrying the even share of the workload's peak
    (what a balanced router gives each), so replicas of one Deployment never get different advice.
    """

    advice: Advice
    block_size: int
    replicas_now: int
    #: the workload's peak demand (the largest sum over its replicas at one time)
    peak_demand_tokens: float
    #: the even share: peak ÷ replicas_now
    even_share_tokens: float
    #: the flags vLLM runs with now, and those to set (e.g. ``--gpu-memory-utilization 0.93``)
    current_flags: tuple[str, ...]
    set_flags: tuple[str, ...]
    #: one replica's capacity (vLLM's figure) now, and with the advice applied
    capacity_now_tokens: float
    capacity_after_tokens: float
    #: replicas for the peak at target_usage: at today's setting, and with the advice applied
    replicas_needed_now: int
    replicas_needed: int
    #: where the peak would sit with ``replicas_needed`` replicas at ``capacity_after_tokens``
    peak_usage_after_ratio: float
    #: requests of max_model_len that fit one replica now and after (None: max_model_len unknown)
    concurrency_now: int | None
    concurrency_after: int | None
    #: replicas whose own peak exceeded the even share by more than :data:`UNEVEN_MARGIN`, hottest first
    hot_replicas: tuple[str, ...]
    #: the replicas do not all run the same pool (a rollout in progress, or hand-edited pods)
    mixed_pools: bool


def advise_workload(
    *,
    replicas: Sequence[Replica],
    peak_demand_tokens: float,
    watched_s: float,
    model: ServedModel | None,
    settings: AdviceSettings,
) -> WorkloadAdvice | None:
    """The workload's one recommendation, the replicas it needs, and whether its load is uneven.

    ``peak_demand_tokens`` is the workload's peak (the largest sum over its replicas at one time;
    never more than the sum of their own peaks). The pool is the smallest replica's (a suggestion
    sized on it holds on every replica). Replicas needed: :func:`~sidecar.forecast.sizing.suggested_replicas`
    of the workload's peak at the capacity one replica has now and after the advice. With one
    replica the advice is :func:`advise`'s on it: the daemon's per-pod gauges. None when no replica
    has a usable pool.
    """
    usable = [r for r in replicas if r.pool.capacity_tokens > r.pool.block_size > 0]
    if not usable:
        return None
    n = len(usable)
    pool = min(usable, key=lambda r: (r.pool.capacity_tokens, r.name)).pool
    share = peak_demand_tokens / n
    advice = advise(peak_demand_tokens=share, watched_s=watched_s, pool=pool, model=model, settings=settings)
    bs, target = pool.block_size, settings.target_usage
    after = capacity_after(advice, pool, model) if advice.recommendation.action != "none" else None
    if after is None or after <= bs:
        after = pool.capacity_tokens

    virtual = _with_null_block(pool) - pool.capacity_tokens  # sizing.py counts a null block

    def needed(capacity: float) -> int:
        return suggested_replicas(
            peak_demand_tokens=peak_demand_tokens,
            target_usage=target,
            capacity_per_replica_tokens=capacity + virtual,
            block_size=bs,
        )

    replicas_after = needed(after)
    hot = sorted(
        (r for r in usable if n > 1 and r.peak_demand_tokens > (1 + UNEVEN_MARGIN) * share),
        key=lambda r: (-r.peak_demand_tokens, r.name),
    )
    settings_seen = {
        (r.pool.capacity_tokens, r.pool.gpu_memory_utilization, r.pool.kv_cache_memory_bytes) for r in usable
    }
    return WorkloadAdvice(
        advice=advice,
        block_size=bs,
        replicas_now=n,
        peak_demand_tokens=peak_demand_tokens,
        even_share_tokens=share,
        current_flags=current_flags(pool),
        set_flags=flags_to_set(advice, pool),
        capacity_now_tokens=pool.capacity_tokens,
        capacity_after_tokens=after,
        replicas_needed_now=needed(pool.capacity_tokens),
        replicas_needed=replicas_after,
        peak_usage_after_ratio=peak_demand_tokens / (replicas_after * (after + virtual - bs)),
        concurrency_now=_concurrency(pool.capacity_tokens, pool),
        concurrency_after=_concurrency(after, pool),
        hot_replicas=tuple(r.name for r in hot),
        mixed_pools=len(settings_seen) > 1,
    )


def _concurrency(capacity: float, pool: Pool) -> int | None:
    """Requests of ``max_model_len`` tokens that fit one replica's usable blocks (None: length unknown)."""
    if not pool.max_model_len:
        return None
    return max_concurrent_requests(
        usable_blocks=int(capacity // pool.block_size) - 1,
        request_tokens=pool.max_model_len,
        block_size=pool.block_size,
    )


def sizing_gpu_memory(pool: Pool, model: ServedModel | None) -> tuple[float, str] | None:
    """(M, basis): the GPU memory per rank the memory suggestion is sized with, as :func:`advise` takes it.

    ``kvcache_gpu_memory_bytes`` exports it, so that a dashboard can size a whole workload's
    ``--gpu-memory-utilization`` with the same formula (``u* = u0 + (C* − C0) × bytes_per_token ÷ M``,
    :func:`~sidecar.forecast.sizing.suggest_gpu_memory_utilization`). ``model.gpu_memory`` when
    configured (basis "configured"); else, for a pool sized by vLLM's ``gpu_memory_utilization``,
    :func:`gpu_memory_of` inferred from the pool exactly as :func:`advise` infers it (basis
    "inferred"); None when the advice has no M either (no ``model.config``, no utilization).
    """
    if model is None:
        return None
    if model.gpu_memory_bytes:
        return float(model.gpu_memory_bytes), "configured"
    u0 = pool.gpu_memory_utilization
    if memory_mode(pool) != "gpu_memory_utilization" or not u0:
        return None
    memory, basis = gpu_memory_of(model, _with_null_block(pool), model.bytes_per_token, u0)
    return (memory, basis) if memory else None
