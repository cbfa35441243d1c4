"""``kv-sidecar capacity --explain``: the budget's terms the way vLLM's memory-profiling line prints them.

vLLM 0.10.2+ logs (``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``): "Desired GPU
memory utilization is (u, R GiB). Actual usage is W GiB for weight, A GiB for peak activation, N GiB
for non-torch memory, and G GiB for CUDAGraph memory." The explanation prints the same terms, A split
into the forward peak F and the sampler warm-up S, each with its source, so a planner can hold it
next to a start-up log; with ``--from-log`` each term's error against the log.
"""

from __future__ import annotations

from .budget import Budget, GiB
from .config import ModelSpec
from .startup_log import LoggedProfile

_SOURCES = {
    "weights": "weights.py: stored bytes per rank (quantized, padded)",
    "forward": "profile_terms.forward_bytes: MLP peak over max_num_batched_tokens",
    "sampler": "profile_terms.sampler_bytes: c x rows x vocab x 4 B",
    "non_torch": "profile_terms.non_torch_bytes: NCCL, cuBLAS, context by version",
    "cudagraph": "profile_terms.cudagraph_bytes: subtracted from vLLM 0.21",
}


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} GiB"


def explain_lines(budget: Budget, spec: ModelSpec) -> list[str]:
    """The terms, one per line, then the line vLLM would print."""
    b = budget
    lines = []
    if b.rules is not None and b.batch is not None:
        lines.append(
            f"rules: {b.rules.label} ({b.rules.source}); profile batch {b.batch.max_num_seqs} sequences"
            f" [{b.batch.seqs_from}], {b.batch.max_num_batched_tokens:,} tokens [{b.batch.tokens_from}];"
            f" sampler {b.sampler}"
        )
    if spec.defaulted:
        lines.append(f"config.json fields from {spec.model_type}'s class defaults: {', '.join(spec.defaulted)}")
    lines.append(
        f"total x util      {b.gpu_memory_bytes / GiB:.2f} GiB x {b.gpu_memory_utilization:.2f}"
        f" = {b.requested_bytes / GiB:.2f} GiB"
    )
    for name, value in b.term_bytes().items():
        measured = " (given)" if name in b.measured else ""
        lines.append(f"{name:<17} {value / GiB:8.2f} GiB   {_SOURCES[name]}{measured}")
    lines.append(f"activation A      {b.activation_bytes / GiB:8.2f} GiB   max(forward, sampler): one torch peak")
    lines.append(f"budget            {b.kv_budget_bytes / GiB:8.2f} GiB   total x util - W - A - N - G")
    lines.append(f"dominant overhead {b.dominant_overhead}")
    lines.append(
        f"as vLLM logs it: Desired GPU memory utilization is ({b.gpu_memory_utilization:.2f},"
        f" {b.requested_bytes / GiB:.2f} GiB). Actual usage is {b.weights_bytes / GiB:.2f} GiB for weight,"
        f" {b.activation_bytes / GiB:.2f} GiB for peak activation, {b.non_torch_bytes / GiB:.2f} GiB for"
        f" non-torch memory, and {b.cudagraph_bytes / GiB:.2f} GiB for CUDAGraph memory."
    )
    return lines


def comparison_lines(budget: Budget, logged: LoggedProfile) -> list[str]:
    """Each term estimated vs logged, and the error (estimate − log)."""
    b = budget
    rows: list[tuple[str, float, float | None]] = [
        (
            "total x util",
            b.requested_bytes / GiB,
            logged.total_gib * logged.utilization if logged.total_gib and logged.utilization else None,
        ),
        ("weights", b.weights_bytes / GiB, logged.weights_gib),
        ("activation", b.activation_bytes / GiB, logged.activation_gib),
        ("non_torch", b.non_torch_bytes / GiB, logged.non_torch_gib),
        ("cudagraph", b.cudagraph_bytes / GiB, logged.cudagraph_gib),
        ("budget", b.kv_budget_bytes / GiB, logged.kv_gib),
    ]
    out = [f"{'term':<14}{'estimated':>12}{'logged':>12}{'error':>10}"]
    for name, estimate, seen in rows:
        error = "-" if seen is None else f"{estimate - seen:+.2f}"
        out.append(f"{name:<14}{estimate:>8.2f} GiB{_gib(seen):>12}{error:>10}")
    if logged.cudagraph_gib is not None and b.cudagraph_bytes == 0:
        out.append("(the logged CUDA-graph figure is informational before vLLM 0.21: not subtracted)")
    return out
