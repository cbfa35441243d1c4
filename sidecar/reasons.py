"""Why a scrape failed: the fixed set of reasons, and the exception that carries one.

Core, no I/O: the HTTP edge (:mod:`sidecar.scrape`), the read pipeline (:mod:`sidecar.pipeline`)
and the target state (:mod:`sidecar.state`) all name failures with these words, and the exporter
publishes ``kvcache_sidecar_scrape_errors_total{reason}`` with every one of them at 0 from the start,
so that a ``rate()`` over them works before the first failure and the counter's cardinality is bounded.
"""

from __future__ import annotations

#: Why a scrape failed; fixed so the error counter's cardinality is bounded.
REASONS: tuple[str, ...] = (
    "refused",  # connection refused, reset or unreachable
    "timeout",  # no complete answer within the target's timeout
    "http_4xx",
    "http_5xx",
    "too_large",  # body above targets[].body_size_limit
    "invalid_text",  # not UTF-8 exposition text, or the parser rejected it
    "empty",  # 200 with an empty body
    "no_engine_metrics",  # 200 with text, but no family of the target's engine
    "token_file",  # targets[].bearer_token_file missing or not one token: nothing was sent
    "sample_limit",  # more sample lines of the families read than targets[].sample_limit
    "label_limit",  # a series read past targets[].label_limit or a label length limit
    "invalid_value",  # a number the capacity stands on cannot be one (vllm:cache_config_info)
    "parse_timeout",  # the page was fetched but not read within the rest of targets[].timeout
    # the engine's families are there but not those its capacity stands on
    # (e.g. TRT-LLM's trtllm-serve without enable_iter_perf_stats serves no trtllm_kv_cache_* family)
    "no_capacity",
    # targets[].engine: auto, and the page carries the signature families of two engines
    "mixed_engines",
)


class ScrapeFailed(Exception):
    """A failed scrape: its reason (one of :data:`REASONS`), a detail for the log, and the field at
    fault when there is one (a run of failures is logged again when the reason or the field changes)."""

    def __init__(self, reason: str, detail: str, field: str | None = None):
        assert reason in REASONS, reason
        self.reason = reason
        self.detail = detail
        self.field = field
        super().__init__(f"{reason}: {detail}")
