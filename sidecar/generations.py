"""vLLM metric generations: which names a given vLLM release exports.

One enum, shared by the engine adapter (which detects the generation of a
scrape) and the simulator (which renders a chosen generation). Sources:
vLLM PRs #18354, #24245, #29330, #42206; explained in ``docs/vllm-metrics.md``
("Metric generations").

=====================  ==========================================================
generation             what identifies it
=====================  ==========================================================
``v0``                 V0 engine (<= 0.10): ``vllm:num_requests_swapped``, the
                       ``vllm:gpu_prefix_cache_hit_rate`` gauge, no ``engine``
                       label
``v1-gpu-names``       V1 before 0.9.2: ``vllm:gpu_cache_usage_perc`` and
                       ``vllm:gpu_prefix_cache_*_total`` counters only
``v1-both-names``      0.9.2-0.10: old ``gpu_*`` and new names side by side
``v1``                 0.11+: only ``vllm:kv_cache_usage_perc`` /
                       ``vllm:prefix_cache_*_total``
``v1-capacity-labels`` ``vllm:cache_config_info`` carries ``kv_cache_size_tokens``
                       (vLLM PR #42206, about 0.21+; vLLM 0.32 is one)
=====================  ==========================================================
"""

from __future__ import annotations

import enum


class Generation(enum.StrEnum):
    """A metric generation; ``str()`` is its value, as argparse and labels show it."""

    V0 = "v0"
    V1_GPU_NAMES = "v1-gpu-names"
    V1_BOTH_NAMES = "v1-both-names"
    V1 = "v1"
    V1_CAPACITY_LABELS = "v1-capacity-labels"


GENERATIONS: tuple[str, ...] = tuple(g.value for g in Generation)
