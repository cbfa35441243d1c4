"""The simulated server's state as TensorRT-LLM's metrics: trtllm-serve's page and the Triton backend's.

:func:`render` is trtllm-serve with ``enable_iter_perf_stats: true`` (generation ``serve-blocks``,
TensorRT-LLM 2026): the families, help texts and types come from the adapter's own table
(:data:`sidecar.engines.trtllm.SERVE`), so the page the simulator serves and the page the adapter reads
cannot drift apart; the labels are collector.py's ``{"model_name": ..., "engine_type": ...}`` in that
order (prometheus_client writes labels in ``labelnames`` order), values as floats, served at
``/prometheus/metrics``. :func:`render_triton` is the Triton backend's two labelled gauges (generation
``triton-fraction``), served on Triton's metrics port at ``/metrics``.

The same paged-KV engine model as vLLM's page (``sidecar/simulator/engine.py``) stands for TRT-LLM's
block pool, with ``tokens_per_block`` = the simulated block size:

==================================  ==========================================================
``kv_cache_max_blocks``             usable blocks (TRT-LLM has no null block; the simulator's
                                    usable blocks are the ones requests can hold)
``kv_cache_used_blocks`` / ``free``  blocks held by running requests / the other usable blocks
``kv_cache_utilization``            used ÷ max (collector.py ``log_iteration_stats``)
``num_paused_requests``             preempted requests waiting to run again (TRT-LLM pauses a
                                    request when the KV cache runs out, as vLLM preempts one)
``num_requests_running``            ``numActiveRequests``: running + paused
``num_requests_waiting``            ``numQueuedRequests``: the others waiting (not yet taken in)
``prompt_cached_tokens_total``      prefix-cache hit tokens
Triton ``scheduled`` / ``waiting``  running / active − scheduled (``model_instance_state.cc``)
==================================  ==========================================================

trtllm-serve has no data-parallel rank in its labels: one pool per server. With several simulated
engines only the first is rendered (its page is what one trtllm-serve process serves).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.utils import floatToGoString

from ...engines.trtllm import (
    SERVE,
    TRITON_KV,
    TRITON_KV_LABEL,
    TRITON_REQ,
    TRITON_REQ_LABEL,
)
from ..engine import Engine
from ..exposition import Server

#: trtllm-serve mounts prometheus_client's ASGI app there; its ``/metrics`` is the JSON iteration stats.
PATH = "/prometheus/metrics"
#: prometheus_client's ``CONTENT_TYPE_LATEST``, which ``make_asgi_app`` answers with.
CONTENT_TYPE = "text/plain; version=1.0.0; charset=utf-8"
#: Triton's metrics endpoint (port 8002) and its Content-Type (Triton's own prometheus-cpp exposer).
TRITON_PATH = "/metrics"
TRITON_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: collector.py's ``engine_type`` label value as the simulator sets it.
ENGINE_TYPE = "trtllm"
#: Triton's model name and version for the TRT-LLM model of the ensemble (the backend README's example).
TRITON_MODEL, TRITON_VERSION = "tensorrt_llm", "1"

Value = Callable[[Engine], float]
#: prometheus_client's number format (Go's), which trtllm-serve's page uses (typed here: the library's is not).
go_float: Callable[[float], str] = floatToGoString


def paused(e: Engine) -> int:
    """Preempted requests waiting to run again (TRT-LLM's paused requests)."""
    return sum(1 for r in e.waiting if r.preemptions > 0)


def _utilization(e: Engine) -> float:
    return e.pool.used / e.pool.usable if e.pool.usable else 0.0


#: trtllm-serve family -> its value for one engine; every family of the adapter's SERVE table.
SERVE_VALUES: dict[str, Value] = {
    "trtllm_kv_cache_utilization": _utilization,
    "trtllm_num_requests_running": lambda e: e.num_running + paused(e),
    "trtllm_num_requests_waiting": lambda e: len(e.waiting) - paused(e),
    "trtllm_kv_cache_max_blocks": lambda e: e.pool.usable,
    "trtllm_kv_cache_free_blocks": lambda e: e.pool.free,
    "trtllm_kv_cache_used_blocks": lambda e: e.pool.used,
    "trtllm_kv_cache_tokens_per_block": lambda e: e.config.block_size,
    "trtllm_num_paused_requests": paused,
    "trtllm_prompt_tokens_total": lambda e: e.c.prompt_tokens,
    "trtllm_generation_tokens_total": lambda e: e.c.generation_tokens,
    "trtllm_prompt_cached_tokens_total": lambda e: e.c.prefix_hits,
}

#: Triton's (family, label value) -> value; the README's order (request family first).
TRITON_VALUES: dict[tuple[str, str], Value] = {
    (TRITON_REQ, "waiting"): paused,
    (TRITON_REQ, "context"): lambda e: len(e.prefilling),
    (TRITON_REQ, "scheduled"): lambda e: e.num_running,
    (TRITON_REQ, "max"): lambda e: e.config.max_num_seqs,
    (TRITON_REQ, "active"): lambda e: e.num_running + paused(e),
    (TRITON_KV, "fraction"): _utilization,
    (TRITON_KV, "tokens_per"): lambda e: e.config.block_size,
    (TRITON_KV, "used"): lambda e: e.pool.used,
    (TRITON_KV, "free"): lambda e: e.pool.free,
    (TRITON_KV, "max"): lambda e: e.pool.usable,
}
#: Counters whose labelled child collector.py creates in ``__init__`` (``counter_tokens_cached_prompt
#: .labels(**self.labels)``), so they show 0 from the start; the others appear at their first increment.
CREATED_AT_START = frozenset({"trtllm_prompt_cached_tokens_total"})
TRITON_HELP = {TRITON_REQ: "TRT LLM request metrics", TRITON_KV: "TRT LLM KV cache block metrics"}


def _labels(pairs: list[tuple[str, str]]) -> str:
    """Labels in the order given (prometheus_client keeps ``labelnames`` order), values escaped."""
    esc = [(k, v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')) for k, v in pairs]
    return "{" + ",".join(f'{k}="{v}"' for k, v in esc) + "}"


def render(sim: Server) -> str:
    """The ``/prometheus/metrics`` body trtllm-serve (2026, ``enable_iter_perf_stats``) would serve now.

    Counters appear from their first increment on, as prometheus_client creates a labelled child then,
    except those of :data:`CREATED_AT_START`.
    """
    e = sim.engines[0]
    labels = _labels([("model_name", sim.config.model_name), ("engine_type", ENGINE_TYPE)])
    lines: list[str] = []
    for name, value in SERVE_VALUES.items():
        family = SERVE[name]
        v = float(value(e))
        lines += [f"# HELP {name} {family.help}", f"# TYPE {name} {family.type}"]
        if family.type == "counter" and not v and name not in CREATED_AT_START:
            continue
        lines.append(f"{name}{labels} {go_float(v)}")
    return "\n".join(lines) + "\n"


def render_triton(sim: Server) -> str:
    """The ``nv_trt_llm_*`` part of Triton's ``/metrics`` for the simulated engine (backend of 2025+)."""
    e = sim.engines[0]
    lines: list[str] = []
    for family in (TRITON_REQ, TRITON_KV):
        label = TRITON_REQ_LABEL if family == TRITON_REQ else TRITON_KV_LABEL
        lines += [f"# HELP {family} {TRITON_HELP[family]}", f"# TYPE {family} gauge"]
        for (fam, which), value in TRITON_VALUES.items():
            if fam == family:
                pairs = sorted([(label, which), ("model", TRITON_MODEL), ("version", TRITON_VERSION)])
                v = value(e)
                text = go_float(float(v)) if isinstance(v, float) else str(int(v))
                lines.append(f"{family}{_labels(pairs)} {text}")
    return "\n".join(lines) + "\n"
