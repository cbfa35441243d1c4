"""Read the memory profile out of a vLLM start-up log (V0 and V1 formats).

The lines, by version (``docs/capacity.md``, "--explain and --from-log"):

* V0 0.6.4: ``Memory profiling results: total_gpu_memory=T GiB ... peak_torch_memory=P GiB ...
  non_torch_memory=N GiB kv_cache_size=K GiB gpu_memory_utilization=u`` (P includes the weights).
* V0 0.6.6–0.10 (``vllm/worker/worker.py`` ``determine_num_available_blocks``): ``the current vLLM
  instance can use total_gpu_memory (T GiB) x gpu_memory_utilization (u) = R GiB`` and ``model weights
  take W GiB; non_torch_memory takes N GiB; PyTorch activation peak memory takes A GiB; the rest of the
  memory reserved for KV Cache is K GiB.``; 0.6.5 printed the same as a ``name  value`` table.
* V1 (``vllm/v1/worker/gpu_worker.py``): ``Available KV cache memory: K GiB``; from 0.10.2 ``Free memory
  on device (F/T GiB) on startup. Desired GPU memory utilization is (u, R GiB). Actual usage is W GiB for
  weight, A GiB for peak activation, N GiB for non-torch memory, and G GiB for CUDAGraph memory.``
* both: ``Model loading took X GiB`` / ``Loading model weights took X GB`` (GiB), the engine line
  ``Initializing a V1 LLM engine (v0.9.1) with config: ... tensor_parallel_size=2 ...``.

vLLM sizes the cache by the smallest budget over the ranks, so with one line per rank the smallest wins.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .errors import CapacityError

_NUM = r"(-?\d+(?:\.\d+)?)"

_PATTERNS: dict[str, re.Pattern[str]] = {
    "total": re.compile(r"total_gpu_memory \(" + _NUM + r" ?GiB\) x gpu_memory_utilization \(" + _NUM + r"\)"),
    "v0_terms": re.compile(
        r"model weights take " + _NUM + r" ?GiB; non_torch_memory takes " + _NUM + r" ?GiB; PyTorch activation peak"
        r" memory takes " + _NUM + r" ?GiB; the rest of the memory reserved for KV Cache is " + _NUM + r" ?GiB"
    ),
    "v1_usage": re.compile(
        r"Free memory on device \(" + _NUM + r"/" + _NUM + r" GiB\) on startup\. Desired GPU memory utilization is"
        r" \(" + _NUM + r", " + _NUM + r" GiB\)\. Actual usage is " + _NUM + r" GiB for weight, " + _NUM + r" GiB for"
        r" peak activation, " + _NUM + r" GiB for non-torch memory, and " + _NUM + r" GiB for CUDAGraph memory"
    ),
    "v064": re.compile(
        r"Memory profiling results: total_gpu_memory=" + _NUM + r"GiB .*?peak_torch_memory=" + _NUM + r"GiB .*?"
        r"non_torch_memory=" + _NUM + r"GiB kv_cache_size=" + _NUM + r"GiB gpu_memory_utilization=" + _NUM
    ),
    "available": re.compile(r"Available KV cache memory: " + _NUM + r" GiB"),
    "weights": re.compile(r"(?:Model loading took|Loading model weights took) " + _NUM + r" ?Gi?B"),
    "tokens": re.compile(r"GPU KV cache size: ([\d,]+) tokens"),
    "engine": re.compile(r"Initializing an? (V[01] )?LLM engine \(v([^)\s]+)\)"),
    "version": re.compile(r"vLLM API server version (\S+)"),
    "tp": re.compile(r"tensor_parallel_size=(\d+)"),
    "max_len": re.compile(r"max_seq_len=(\d+)"),
    "eager": re.compile(r"enforce_eager=(True|False)"),
}
#: 0.6.5's table: ``total_gpu_memory      79.22GiB``
_TABLE = {
    "total_gpu_memory": "total",
    "gpu_memory_utilization": "util",
    "model weights take": "weights",
    "non_torch_memory": "non_torch",
    "PyTorch activation peak memory": "activation",
    "available_kv_cache_memory": "kv",
}
_TABLE_LINE = re.compile(r"\] (" + "|".join(map(re.escape, _TABLE)) + r")\s+" + _NUM)


@dataclass
class LoggedProfile:
    """What a start-up log says of the memory profile (GiB; None where the log does not say)."""

    version: str | None = None
    engine: str | None = None
    tensor_parallel_size: int | None = None
    max_model_len: int | None = None
    enforce_eager: bool | None = None
    sampler: str | None = None
    total_gib: float | None = None
    utilization: float | None = None
    weights_gib: float | None = None
    activation_gib: float | None = None
    non_torch_gib: float | None = None
    cudagraph_gib: float | None = None
    kv_gib: float | None = None
    kv_tokens: int | None = None
    #: 0.6.4's torch peak, weights included
    torch_peak_gib: float | None = None
    #: every budget the log printed (one per rank)
    budgets: list[float] = field(default_factory=list)


def _header(text: str, out: LoggedProfile) -> None:
    if m := _PATTERNS["engine"].search(text):
        out.engine = (m.group(1) or "").strip() or None
        out.version = m.group(2)
    if out.version is None and (m := _PATTERNS["version"].search(text)):
        out.version = m.group(1)
    if m := _PATTERNS["tp"].search(text):
        out.tensor_parallel_size = int(m.group(1))
    if m := _PATTERNS["max_len"].search(text):
        out.max_model_len = int(m.group(1))
    if m := _PATTERNS["eager"].search(text):
        out.enforce_eager = m.group(1) == "True"
    if "Using FlashInfer for top-p & top-k sampling" in text:
        out.sampler = "flashinfer"
    elif "Falling back to the PyTorch-native implementation" in text:
        out.sampler = "native"


def _terms(text: str, out: LoggedProfile) -> None:
    for m in _PATTERNS["total"].finditer(text):
        out.total_gib, out.utilization = float(m.group(1)), float(m.group(2))
    for m in _PATTERNS["v0_terms"].finditer(text):
        w, n, a, k = map(float, m.groups())
        out.weights_gib, out.non_torch_gib, out.activation_gib = w, n, a
        out.budgets.append(k)
    for m in _PATTERNS["v1_usage"].finditer(text):
        _, total, util, _, w, a, n, g = map(float, m.groups())
        out.total_gib, out.utilization = total, util
        out.weights_gib, out.activation_gib, out.non_torch_gib, out.cudagraph_gib = w, a, n, g
    for m in _PATTERNS["v064"].finditer(text):
        total, peak, n, k, util = map(float, m.groups())
        out.total_gib, out.utilization, out.non_torch_gib = total, util, n
        out.torch_peak_gib = peak  # 0.6.4 logs the torch peak with the weights in it
        out.budgets.append(k)
    for m in _TABLE_LINE.finditer(text):
        name, value = _TABLE[m.group(1)], float(m.group(2))
        if name == "kv":
            out.budgets.append(value)
        elif name == "util":
            out.utilization = value
        else:
            setattr(out, f"{name}_gib", value)
    out.budgets += [float(m.group(1)) for m in _PATTERNS["available"].finditer(text)]
    loaded = _PATTERNS["weights"].search(text)
    if out.weights_gib is None and loaded:
        out.weights_gib = float(loaded.group(1))
    if out.torch_peak_gib is not None and out.weights_gib is not None:
        out.activation_gib = round(out.torch_peak_gib - out.weights_gib, 2)
    tokens = [int(m.group(1).replace(",", "")) for m in _PATTERNS["tokens"].finditer(text)]
    if tokens:
        out.kv_tokens = min(tokens)


def parse_startup_log(text: str) -> LoggedProfile:
    """The memory profile a vLLM start-up log reports; CapacityError when it has no budget line."""
    out = LoggedProfile()
    _header(text, out)
    _terms(text, out)
    if out.budgets:
        out.kv_gib = min(out.budgets)
    if out.kv_gib is None and out.weights_gib is None:
        raise CapacityError(
            "--from-log: no memory profile found (expected vLLM's 'Available KV cache memory' or 'model weights"
            " take' lines; V1 logs need the INFO level)"
        )
    return out
