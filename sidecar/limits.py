"""Every bound the sidecar puts on what it reads, one row each, and the checks that apply them.

Whatever vLLM (or anything else on its port) returns, and whatever a ConfigMap or a model directory
holds, the sidecar must keep serving, stay small and say precisely what is wrong. So every input is
bounded: a page's size and series, a label's length and its distinct values, a file's size and depth,
a model's shape, the HTTP endpoint's connections. The rows of :data:`LIMITS` name each bound, its
default, what happens when it is exceeded and how to raise it; ``docs/limits.md`` is generated from
them (``make generate``).

Numbers read from a page, a configuration file or a model's ``config.json`` pass through
:func:`whole_number` or :func:`finite_number` (or a check built on them), so that an overflow, a NaN,
a negative count or an absurd size becomes one :class:`OutOfRange` naming the field, the value and
what was expected, never a traceback and never a gauge.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Limit:
    """One bound on an input."""

    #: ``<surface>.<name>``: the surface is one of page, config, model, http, history.
    key: str
    #: The default (a constant's value, or the default of the setting that changes it).
    default: int | float
    #: ``bytes``, ``series``, ``characters``, ``seconds``, ``connections``, ...
    unit: str
    #: What it bounds, in one line.
    bounds: str
    #: What happens past it: the reason counted (``kvcache_sidecar_scrape_errors_total{reason=...}``,
    #: ``..._dropped_total``) or the exit code.
    exceeded: str
    #: How to raise it: the setting (``targets[].label_limit``) or why it is a constant.
    change: str
    #: The setting that changes it, as docs/configuration.md names it (``targets[].label_limit``), if
    #: any: a test checks that ``default`` is that setting's default.
    setting: str | None = None


class OutOfRange(ValueError):
    """A number that cannot be used: not a number, not finite, not whole, or outside its range."""

    def __init__(self, field: str, value: Any, expected: str):
        self.field = field
        self.value = value
        self.expected = expected
        shown = repr(value)
        if len(shown) > 40:
            shown = shown[:37] + "..."
        super().__init__(f"{field}: {shown} is not {expected}")


def finite_number(value: Any, field: str, *, low: float, high: float) -> float:
    """``value`` (a number, or the text of one) as a finite float in ``[low, high]``; else :class:`OutOfRange`.

    Booleans are refused (YAML's ``yes`` is not a count); so are integers too big for a float.
    """
    expected = f"a finite number from {low:g} to {high:g}"
    if isinstance(value, bool):
        raise OutOfRange(field, value, expected)
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise OutOfRange(field, value, expected) from None
    if not math.isfinite(number) or not low <= number <= high:
        raise OutOfRange(field, value, expected)
    return number


def whole_number(value: Any, field: str, *, low: int, high: int) -> int:
    """``value`` as an int in ``[low, high]``: an int, an integral float (``6144.0``) or its text.

    Anything else is an :class:`OutOfRange`.
    """
    expected = f"a whole number from {low} to {high}"
    if isinstance(value, int) and not isinstance(value, bool):
        if not low <= value <= high:
            raise OutOfRange(field, value, expected)
        return value
    if isinstance(value, str) and len(value) > 64:  # int("9" * 10**6) is quadratic; no count is that long
        raise OutOfRange(field, value, expected)
    try:
        number = finite_number(value, field, low=low, high=high)
    except OutOfRange:
        raise OutOfRange(field, value, expected) from None
    if not number.is_integer():
        raise OutOfRange(field, value, expected)
    return int(number)


#: Every bound, grouped by surface. Add a row where its surface's marker is.
LIMITS: tuple[Limit, ...] = (
    # --- page ---
    Limit(
        "page.body_size_limit",
        4 << 20,
        "bytes",
        "the body of one answer of a target (a vLLM page is 20-100 KiB; while it is read, the sidecar holds "
        "about five times the body: bytes, text, kept lines, samples)",
        'a failed scrape, reason="too_large"; the download stops at the limit',
        "targets[].body_size_limit",
    ),
    Limit(
        "page.sample_limit",
        10_000,
        "samples",
        "sample lines of the families the sidecar reads, in one answer (a vLLM engine has about 60; each costs "
        "about 2.4 KiB while the page is read; 0 = no limit)",
        'a failed scrape, reason="sample_limit", counted before anything is parsed',
        "targets[].sample_limit",
    ),
    Limit(
        "page.label_limit",
        64,
        "labels",
        "labels of one series the sidecar reads (vllm:cache_config_info has 37 on vLLM 0.32; 0 = no limit)",
        'a failed scrape, reason="label_limit"',
        "targets[].label_limit",
    ),
    Limit(
        "page.label_name_length_limit",
        128,
        "characters",
        "a label name in a series the sidecar reads (0 = no limit)",
        'a failed scrape, reason="label_limit"',
        "targets[].label_name_length_limit",
    ),
    Limit(
        "page.label_value_length_limit",
        2048,
        "characters",
        "a label value in a series the sidecar reads, model_name included (0 = no limit)",
        'a failed scrape, reason="label_limit"',
        "targets[].label_value_length_limit",
    ),
    Limit(
        "page.line_length",
        1024 + 64 * (128 + 2 * 2048 + 6),
        "characters",
        "one sample line the sidecar reads: 1024 + label_limit x (label_name_length_limit + "
        "2 x label_value_length_limit + 6), what the three label limits allow with every character escaped; "
        "checked before the line is parsed, so no line can make the parse slow",
        'a failed scrape, reason="label_limit"',
        "follows the three label limits (none when one of them is 0)",
    ),
    Limit(
        "page.engine_limit",
        256,
        "engines",
        "(model_name, engine) pairs in one answer: a vLLM server has one per data-parallel rank (0 = no limit)",
        'a failed scrape, reason="too_large"',
        "targets[].engine_limit",
    ),
    Limit(
        "page.label_values_limit",
        32,
        "values",
        "distinct values of a label the sidecar exports again per engine: the reason of "
        "vllm:num_requests_waiting_by_reason (vLLM has two), and the sleep states (0 = no limit)",
        "the series past it are dropped and counted: kvcache_sidecar_series_dropped_total"
        '{reason="label_values"}; the first ones in page order are kept',
        "targets[].label_values_limit",
    ),
    Limit(
        "page.processing_time",
        10,
        "seconds",
        "decoding, parsing and reading one answer within what is left of the target's timeout after the "
        "download (default 0.8 x scrape.interval, at most 10s), in a reader thread; an answer of at most "
        "256 KiB whose label limits are all on is read at once, its cost bounded by them",
        'a failed scrape, reason="parse_timeout"; the event loop, /healthz and SIGTERM never wait for it',
        "targets[].timeout",
    ),
    Limit(
        "page.num_gpu_blocks",
        1 << 31,
        "blocks",
        "vllm:cache_config_info's num_gpu_blocks: a whole number from 1",
        'a failed scrape, reason="invalid_value", naming the label and its value',
        "a constant (sidecar/engines/vllm.py CACHE_NUMBERS)",
    ),
    Limit(
        "page.block_size",
        1 << 20,
        "tokens",
        "vllm:cache_config_info's block_size: a whole number from 1 (vLLM uses 1 to a few thousand)",
        "as page.num_gpu_blocks",
        "a constant (sidecar/engines/vllm.py CACHE_NUMBERS)",
    ),
    Limit(
        "page.kv_cache_size_tokens",
        1 << 40,
        "tokens",
        "vllm:cache_config_info's kv_cache_size_tokens and kv_cache_max_concurrency: from 0",
        "as page.num_gpu_blocks",
        "a constant (sidecar/engines/vllm.py CACHE_NUMBERS)",
    ),
    Limit(
        "page.kv_cache_memory_bytes",
        1 << 50,
        "bytes",
        "vllm:cache_config_info's kv_cache_memory_bytes: a whole number from 0",
        "as page.num_gpu_blocks",
        "a constant (sidecar/engines/vllm.py CACHE_NUMBERS)",
    ),
    Limit(
        "page.gpu_memory_utilization",
        1,
        "ratio",
        "vllm:cache_config_info's gpu_memory_utilization: from 0 to 1",
        "as page.num_gpu_blocks",
        "a constant (vLLM itself refuses more than 1)",
    ),
    Limit(
        "page.usage_ratio",
        1,
        "ratio",
        "vllm:kv_cache_usage_perc (and the gpu_ name): a finite number from 0 to 1",
        'the series is dropped and counted: kvcache_sidecar_series_dropped_total{reason="invalid_value"}; '
        "the usage gauges are then absent, the others stay",
        "a constant (vLLM computes 1 - free / total)",
    ),
    Limit(
        "page.count",
        1 << 63,
        "count",
        "every counter and request count read (preemptions, prefix-cache tokens, queues, histogram buckets): "
        "a finite number from 0",
        "as page.usage_ratio; a histogram whose _count differs from its +Inf bucket, or whose buckets fall, is "
        'dropped with reason="histogram_mismatch"',
        "a constant",
    ),
    Limit(
        "page.duplicate_series",
        1,
        "copies",
        "copies of one series (same name and labels; copies that differ by pid are folded, not duplicates)",
        'the whole family is dropped and counted: kvcache_sidecar_series_dropped_total{reason="duplicate_series"}',
        "a constant (a duplicate is a protocol error: Prometheus refuses the whole page)",
    ),
    # --- config ---
    Limit(
        "config.file_size",
        1 << 20,
        "bytes",
        "a YAML configuration file (--config.file, --web.config.file); the example with every field is about 10 KiB",
        "exit 2: the file is refused by its size before it is parsed",
        "a constant (sidecar/input_files.py YAML_MAX_BYTES): split the file if a real one ever needs more",
    ),
    Limit(
        "config.depth",
        64,
        "levels",
        "nesting of mappings and lists in a YAML or JSON file; real files nest 4 levels deep",
        "exit 2, naming the line where the bound is crossed",
        "a constant (sidecar/input_files.py MAX_DEPTH)",
    ),
    Limit(
        "config.alias_nodes",
        100_000,
        "values",
        "values a YAML document expands to through its anchors and aliases (a full configuration has a few "
        "hundred): the 'billion laughs' document is refused after its first aliases",
        "exit 2, naming the line of the alias that crosses it",
        "a constant (sidecar/input_files.py YAML_MAX_NODES): write the values out instead of multiplying them",
    ),
    Limit(
        "config.integer_digits",
        64,
        "characters",
        "an integer in a YAML or JSON file (no count or size the sidecar reads has more than 20 digits)",
        "exit 2, naming the line",
        "a constant (sidecar/input_files.py MAX_INT_DIGITS)",
    ),
    Limit(
        "config.token_file_size",
        64 << 10,
        "bytes",
        "a bearer-token file (targets[].bearer_token_file); a Kubernetes service-account token is about 1 KiB",
        "exit 2 at start; at a scrape, a failed scrape",
        "a constant (sidecar/input_files.py TOKEN_MAX_BYTES)",
    ),
    Limit(
        "config.duration",
        10 * 365 * 86400,
        "seconds",
        "any duration setting (scrape.interval, history.retention, ...): ten years",
        "exit 2, naming the setting",
        "a constant (sidecar/units.py MAX_DURATION_S)",
    ),
    Limit(
        "config.size",
        1 << 50,
        "bytes",
        "any size setting (targets[].body_size_limit, history.max_size, model.*_memory): 1 PiB",
        "exit 2, naming the setting",
        "a constant (sidecar/units.py MAX_SIZE)",
    ),
    # --- model ---
    Limit(
        "model.config_size",
        16 << 20,
        "bytes",
        "a model's config.json (model.config, --model-config); real ones are a few KiB",
        "exit 2 (check-config, capacity); in run, the capacity gauges stay absent and the reason is logged once",
        "a constant (sidecar/input_files.py JSON_MAX_BYTES)",
    ),
    Limit(
        "model.index_size",
        64 << 20,
        "bytes",
        "model.safetensors.index.json beside config.json: one line per tensor, a few MB for the largest models",
        "as model.config_size",
        "a constant (sidecar/input_files.py INDEX_MAX_BYTES)",
    ),
    Limit(
        "model.layers",
        1024,
        "layers",
        "num_hidden_layers and the other layer counts of config.json (first_k_dense_replace, max_window_layers, "
        "full_attention_interval, nope_layer_interval, sliding_window_pattern); the deepest real model, "
        "Llama 3.1 405B, has 126",
        "as model.config_size, naming the field and its value",
        "a constant (sidecar/capacity/config.py): a model deeper than this is not a real one yet",
    ),
    Limit(
        "model.heads",
        1024,
        "heads",
        "num_attention_heads, num_key_value_heads and the linear-attention head counts; real models have at "
        "most 232 (Falcon-180B), most 128 or fewer",
        "as model.layers",
        "a constant (sidecar/capacity/config.py)",
    ),
    Limit(
        "model.head_dim",
        8192,
        "elements",
        "head_dim, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim and the linear-attention head "
        "dimensions; real heads are 64-256 wide, DeepSeek's MLA latent 576",
        "as model.layers",
        "a constant (sidecar/capacity/config.py)",
    ),
    Limit(
        "model.width",
        1 << 20,
        "elements",
        "hidden_size, intermediate_size, moe_intermediate_size, q_lora_rank and the shared experts' width; "
        "the widest real model (Nemotron-4 340B) has an intermediate size of 73,728",
        "as model.layers",
        "a constant (sidecar/capacity/config.py)",
    ),
    Limit(
        "model.vocab",
        1 << 24,
        "tokens",
        "vocab_size; the largest real vocabulary (Gemma 3) has 262,208 tokens",
        "as model.layers",
        "a constant (sidecar/capacity/config.py)",
    ),
    Limit(
        "model.context",
        1 << 30,
        "tokens",
        "max_position_embeddings, sliding_window and attention_chunk_size; the longest real context "
        "(Llama 4 Scout) is 10,485,760 tokens",
        "as model.layers",
        "a constant (sidecar/capacity/config.py)",
    ),
    Limit(
        "model.experts",
        65536,
        "experts",
        "n_routed_experts, num_experts, num_experts_per_tok, n_shared_experts; the most in a real model "
        "(Kimi K2) is 384",
        "as model.layers",
        "a constant (sidecar/capacity/config.py)",
    ),
    # --- http ---
    Limit(
        "http.listen_backlog",
        1024,
        "connections",
        "connections the kernel queues before the endpoint accepts them (Linux caps it at net.core.somaxconn)",
        "the kernel drops the new connection's handshake and the client retries",
        "a constant (sidecar/endpoint.py LISTEN_BACKLOG)",
    ),
    Limit(
        "http.max_connections",
        1024,
        "connections",
        "HTTP connections open at once (lowered to the process' open-file limit minus 64)",
        "the connection that has waited longest for its request is closed to make room (a probe always gets "
        "in); when every one is being answered, the new one gets a 503; logged when the limit is reached and "
        "when the connections are below half of it again, with the count",
        "a constant (sidecar/endpoint.py MAX_CONNECTIONS); raise the open-file limit (ulimit -n) if it is lower",
    ),
    Limit(
        "http.request_timeout",
        10.0,
        "seconds",
        "time for a whole request to arrive, from its first byte (a connection's first request: from the "
        "accept, TLS handshake included), however the client spreads it",
        "a 408 and the connection closed; a connection that sent nothing is closed without a word",
        "a constant (sidecar/endpoint.py REQUEST_TIMEOUT_S)",
    ),
    Limit(
        "http.idle_timeout",
        120.0,
        "seconds",
        "time a kept-alive connection may wait for its next request (longer than usual scrape intervals)",
        "the connection is closed; the client opens a new one",
        "a constant (sidecar/endpoint.py IDLE_TIMEOUT_S)",
    ),
    Limit(
        "http.response_timeout",
        30.0,
        "seconds",
        "time a client may take to read an answer",
        "the connection is closed and the rest of the answer dropped",
        "a constant (sidecar/endpoint.py RESPONSE_TIMEOUT_S)",
    ),
    Limit(
        "http.tls_handshake_timeout",
        10.0,
        "seconds",
        "time a client may take to finish the TLS handshake (with --web.config.file)",
        "the connection is closed",
        "a constant (sidecar/webconfig.py HANDSHAKE_TIMEOUT_S)",
    ),
    Limit(
        "http.request_line",
        8192,
        "bytes",
        "the request line (method, path, query, version); Prometheus' is about 30 bytes",
        "a 414 and the connection closed",
        "a constant (sidecar/endpoint.py MAX_REQUEST_LINE_BYTES)",
    ),
    Limit(
        "http.header_bytes",
        16384,
        "bytes",
        "request line and headers together (a basic-auth header is at most 4 KiB)",
        "a 431 and the connection closed",
        "a constant (sidecar/endpoint.py MAX_HEADER_BYTES)",
    ),
    Limit(
        "http.body_bytes",
        65536,
        "bytes",
        "a request body (only POST /-/reload takes one, and ignores it)",
        "a 413 and the connection closed, the body unread",
        "a constant (sidecar/endpoint.py MAX_BODY_BYTES)",
    ),
    Limit(
        "http.requests_in_flight",
        64,
        "requests",
        "answers being computed or written at once (/metrics, basic auth, a reload); /healthz and /readyz are "
        "answered at once, outside it",
        "the request waits for a place up to http.request_timeout, then gets a 503 with Retry-After: 1",
        "a constant (sidecar/endpoint.py MAX_REQUESTS_IN_FLIGHT)",
    ),
    Limit(
        "http.bcrypt_cost",
        14,
        "bcrypt cost",
        "the cost of a basic_auth_users hash (--web.config.file); the exporter toolkit takes up to 31, but a check "
        "at cost 14 already holds a core for about a second, at 31 for days",
        "exit 2 at start (check-config too), a refused reload, naming the user and the limit",
        "a constant (sidecar/webconfig.py MAX_BCRYPT_COST)",
    ),
    Limit(
        "http.auth_checks_pending",
        4,
        "checks",
        "basic-auth credentials not remembered being checked or waiting for a check (one bcrypt check runs at a "
        "time, on a thread of its own); remembered credentials are answered without waiting",
        "a 429 with Retry-After: 1 at once, no check run",
        "a constant (sidecar/webconfig.py AUTH_CHECKS_PENDING)",
    ),
    Limit(
        "http.auth_failures_per_client",
        5,
        "failures",
        "failed basic-auth checks of one client address within a minute (4,096 addresses remembered at most)",
        "a 429 with Retry-After: 1 at once, no check run, until the minute has passed",
        "a constant (sidecar/webconfig.py AUTH_FAILURES_PER_CLIENT)",
    ),
    Limit(
        "http.workers",
        4,
        "threads",
        "threads that compute answers; the other requests in flight wait for one",
        "the request waits (its place among the requests in flight is kept)",
        "a constant (sidecar/endpoint.py WORKERS)",
    ),
)
