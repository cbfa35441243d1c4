"""The batch vLLM's profile run uses: ``max_num_seqs`` and ``max_num_batched_tokens`` by version and GPU.

The user's flags win; otherwise the defaults of ``EngineArgs`` (``vllm/engine/arg_utils.py``:
V1 ``_set_default_args_v1``, from 0.9 ``get_batch_defaults``; V0 ``vllm/config.py``
``SchedulerConfig``), which depend on the GPU (its name and memory) and on how vLLM runs
(``vllm serve`` = ``UsageContext.OPENAI_API_SERVER``, ``LLM(...)`` = ``LLM_CLASS``).
``docs/capacity.md``, "Versions".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .vllm_rules import VersionRules

GiB = 1 << 30

#: V0 ``SchedulerConfig``: chunked prefill is on by default above this max_model_len
#: (``EngineArgs.create_engine_config`` ``use_long_context``).
V0_LONG_CONTEXT = 32 * 1024


@dataclass(frozen=True)
class ProfileBatch:
    """The batch the profile run uses, and where each number came from."""

    max_num_seqs: int
    max_num_batched_tokens: int
    #: "flag" or "default (rule)" for each of the two
    seqs_from: str
    tokens_from: str

    @property
    def sampler_rows(self) -> int:
        """Rows the dummy sampler sees: ``min(max_num_seqs, max_num_batched_tokens)``
        (``gpu_model_runner.py`` ``_dummy_run`` splits the tokens over at most that many requests)."""
        return min(self.max_num_seqs, self.max_num_batched_tokens)


def is_large_gpu(gpu_name: str | None, gpu_memory_bytes: int, *, exclude_a100: bool = True) -> bool:
    """vLLM's "large GPU" class: ≥ 70 GiB of device memory and (from 0.9) not an A100.

    ``get_batch_defaults`` tests ``device_memory >= 70 GiB and "a100" not in device_name``; H100,
    H200, H20, B200, MI300x and RTX PRO 6000 are large, A100 80GB, L40S, L4 and consumer cards are not.
    """
    if gpu_memory_bytes < 70 * GiB:
        return False
    return not (exclude_a100 and gpu_name is not None and "A100" in gpu_name.upper())


def _is_h100_or_h200(gpu_name: str | None) -> bool:
    return gpu_name is not None and re.search(r"H[12]00", gpu_name.upper()) is not None


def _v1_defaults(rule: str, gpu_name: str | None, gpu_memory_bytes: int, offline: bool) -> tuple[int, int]:
    if rule == "v1-1024-everywhere":
        large_tokens = _is_h100_or_h200(gpu_name)
        return 1024, (16384 if offline else 8192) if large_tokens else (8192 if offline else 2048)
    if rule == "v1-160gib" and gpu_memory_bytes >= 160 * GiB:
        return 1024, 16384
    if rule == "v1-h100-h200":
        large = _is_h100_or_h200(gpu_name)
    else:
        large = is_large_gpu(gpu_name, gpu_memory_bytes, exclude_a100=rule != "v1-70gib")
    if large:
        return 1024, 16384 if offline else 8192
    return 256, 8192 if offline else 2048


def _v0_tokens(max_model_len: int, version_since: tuple[int, ...]) -> int:
    """V0 ``SchedulerConfig``: chunked prefill off → ``max(max_model_len, 2048)``; on (long context) →
    2048 (512 before 0.6.5)."""
    if max_model_len > V0_LONG_CONTEXT:
        return 2048 if version_since >= (0, 6, 4) else 512
    return max(max_model_len, 2048)


def profile_batch(
    rules: VersionRules,
    *,
    gpu_name: str | None,
    gpu_memory_bytes: int,
    max_model_len: int,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    offline: bool = False,
) -> ProfileBatch:
    """The profile batch: the flags when given, else the version's defaults for this GPU."""
    if rules.engine == "V0":
        seqs, tokens = 256, _v0_tokens(max_model_len, rules.since)
        rule = "V0 SchedulerConfig"
    else:
        seqs, tokens = _v1_defaults(rules.batch_rule, gpu_name, gpu_memory_bytes, offline)
        rule = f"{rules.label}, {'LLM' if offline else 'serve'}"
    return ProfileBatch(
        max_num_seqs=max_num_seqs or seqs,
        max_num_batched_tokens=max_num_batched_tokens or tokens,
        seqs_from="flag" if max_num_seqs else f"default ({rule})",
        tokens_from="flag" if max_num_batched_tokens else f"default ({rule})",
    )
