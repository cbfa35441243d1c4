"""The simulated server's state as SGLang's ``/metrics`` (SGLang 0.5.23, ``--enable-metrics``).

The families, help texts, label sets and multiprocess modes come from the adapter's own table
(:data:`sidecar.engines.sglang.FAMILIES`), so the page the simulator serves and the page the adapter
reads cannot drift apart. The layout is what prometheus_client's ``MultiProcessCollector`` writes,
which is how SGLang serves ``/metrics`` (``add_prometheus_middleware`` in ``sglang/srt/utils/common.py``):
label names sorted, values as floats, no ``*_created`` series, no process collector, and a ``pid``
label only on gauges of multiprocess mode "all" (``sglang:num_retracted_reqs``).

The same paged-KV engine model as vLLM's page (``sidecar/simulator/engine.py``) stands for SGLang's
token pool with ``--page-size`` = the simulated block size:

=================================  ===========================================================
``max_total_num_tokens``           usable blocks x block size (SGLang's pool has no null block
                                   among its ``max_total_num_tokens``; the simulator's usable
                                   blocks are the ones requests can hold)
``num_pages`` / ``page_size``      usable blocks / block size (``max_total // page_size``)
``kv_used_tokens``                 blocks held by running requests x block size; also
                                   ``num_used_tokens`` (the same figure in 0.5.23)
``kv_evictable_tokens``            free blocks that still hold a cached prefix (SGLang's radix
                                   cache keeps them until it needs the room) x block size
``kv_available_tokens``            the other free blocks x block size
``token_usage``                    used / max_total, rounded to 2 decimals like SGLang
``num_retracted_requests_total``   the engine's preemptions (SGLang retracts a running request
                                   when decode runs out of KV, as vLLM preempts one)
``cached_tokens_total``            prefix-cache hit tokens, ``cache_source="device"``
=================================  ===========================================================

Each simulated engine is one DP rank: with more than one, scheduler series carry ``dp_rank``. The
tokenizer's counters (one tokenizer for the server) sum every rank.
"""

from __future__ import annotations

from collections.abc import Callable

from ...engines.sglang import FAMILIES, GIB
from ..engine import Engine
from ..exposition import Server, format_labels, format_number

#: SGLang's API port serves the metrics there (prometheus_client's ASGI app mounted at ``/metrics``).
PATH = "/metrics"
#: prometheus_client's ``CONTENT_TYPE_LATEST`` (the same as vLLM's, both served by prometheus_client).
CONTENT_TYPE = "text/plain; version=1.0.0; charset=utf-8"
#: The simulated server's process id, as a ``pid`` label value (any number; SGLang's scheduler's pid).
SCHEDULER_PID = "4711"

#: Scheduler gauge -> its value for one engine (one DP rank).
Value = Callable[[Engine], float]


def evictable_blocks(e: Engine) -> int:
    """Free blocks that still hold a cached prefix: shared prefix blocks no request references, and a
    preempted request's own full blocks (``BlockPool.shared_free`` and ``BlockPool.runs``)."""
    pool = e.pool
    return len(pool.shared_free) + sum(run.cacheable for run in pool.runs.values())


def _tokens(e: Engine, blocks: int) -> float:
    return float(blocks * e.config.block_size)


SCHEDULER_VALUES: dict[str, Value] = {
    "sglang:num_running_reqs": lambda e: e.num_running,
    "sglang:num_queue_reqs": lambda e: len(e.waiting),
    "sglang:gen_throughput": lambda e: e.throughput()[1],
    "sglang:cache_hit_rate": lambda e: e.c.prefix_hits / e.c.prefix_queries if e.c.prefix_queries else 0.0,
    "sglang:token_usage": lambda e: round(e.pool.used / e.pool.usable, 2),
    "sglang:num_used_tokens": lambda e: _tokens(e, e.pool.used),
    "sglang:kv_available_tokens": lambda e: _tokens(e, e.pool.free - evictable_blocks(e)),
    "sglang:kv_evictable_tokens": lambda e: _tokens(e, evictable_blocks(e)),
    "sglang:kv_used_tokens": lambda e: _tokens(e, e.pool.used),
    "sglang:num_retracted_reqs": lambda e: 0.0,  # retractions of the last log interval, reset after each log
    "sglang:num_retracted_requests_total": lambda e: e.c.preemptions,
    "sglang:max_total_num_tokens": lambda e: _tokens(e, e.pool.usable),
    "sglang:kv_cache_memory_usage_gb": lambda e: e.pool.usable * e.config.block_bytes / GIB,
    "sglang:page_size": lambda e: e.config.block_size,
    "sglang:num_pages": lambda e: e.pool.usable,
    "sglang:context_len": lambda e: e.config.max_model_len,
}

#: Tokenizer counter -> (its extra label, the value, the server's total over its engines).
TOKENIZER_VALUES: dict[str, tuple[dict[str, str], Value]] = {
    "sglang:prompt_tokens_total": ({"is_streaming": "false"}, lambda e: e.c.prompt_tokens),
    "sglang:generation_tokens_total": ({"is_streaming": "false"}, lambda e: e.c.generation_tokens),
    "sglang:cached_tokens_total": ({"cache_source": "device"}, lambda e: e.c.prefix_hits),
}


def scheduler_labels(sim: Server, e: Engine) -> dict[str, str]:
    """One DP rank's scheduler labels (``SchedulerMetricsCollector.init_new``): TP/PP/EP rank 0."""
    labels = {
        "model_name": sim.config.model_name,
        "engine_type": "unified",
        "tp_rank": "0",
        "pp_rank": "0",
        "moe_ep_rank": "0",
    }
    if len(sim.engines) > 1:
        labels["dp_rank"] = str(e.index)
    return labels


def render(sim: Server) -> str:
    """The ``/metrics`` body SGLang 0.5.23 would serve for the simulated engines now."""
    lines: list[str] = []
    for name, value in SCHEDULER_VALUES.items():
        family = FAMILIES[name]
        _header(lines, name, family.help, family.type)
        for e in sim.engines:
            labels = scheduler_labels(sim, e)
            if family.multiprocess_mode == "all":
                labels = {**dict(sorted(labels.items())), "pid": SCHEDULER_PID}  # appended after the sort
                lines.append(f"{name}{_unsorted(labels)} {format_number(value(e))}")
            else:
                lines.append(f"{name}{format_labels(labels)} {format_number(value(e))}")
    if any(e.c.prompt_tokens for e in sim.engines):  # a tokenizer series exists from its first request on
        for name, (extra, value) in TOKENIZER_VALUES.items():
            total = sum(value(e) for e in sim.engines)
            if name == "sglang:cached_tokens_total" and not total:
                continue  # SGLang counts cached tokens only when a request had some
            family = FAMILIES[name]
            _header(lines, name, family.help, family.type)
            labels = {"model_name": sim.config.model_name, "engine_type": "unified", **extra}
            lines.append(f"{name}{format_labels(labels)} {format_number(total)}")
    return "\n".join(lines) + "\n"


def _header(lines: list[str], name: str, help_: str, typ: str) -> None:
    """prometheus_client's text format names a counter with its ``_total`` in HELP and TYPE too."""
    lines.append(f"# HELP {name} {help_}")
    lines.append(f"# TYPE {name} {typ}")


def _unsorted(labels: dict[str, str]) -> str:
    """Labels in the order given (``pid`` after the sorted ones, as the multiprocess collector adds it)."""
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
