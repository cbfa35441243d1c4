"""The calculator's table: one plain dict, rendered as text, Markdown or JSON.

Pure: takes a resolved model, layout and (optional) budget, returns data or
text. The tables of docs/capacity.md ("Worked examples") are the rows ``context × concurrency`` of
``kv_memory``; the budget section answers "how many requests fit".
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .blocks import (
    logged_capacity_tokens,
    max_concurrency,
    num_blocks,
    request_kv_bytes,
    usable_concurrency,
)
from .budget import Budget, GiB, MeasuredMemory
from .config import ModelSpec
from .inverse import inflection_context_length, required_utilization
from .layout import KVLayout


def build_table(
    spec: ModelSpec,
    layout: KVLayout,
    *,
    weights: int,
    context_lengths: list[int],
    concurrency: list[int],
    budget: Budget | None = None,
    vllm_version: str | None = None,
    gpu_memory_bytes: int | None = None,
    overrides: MeasuredMemory | None = None,
    weights_given: bool = False,
) -> dict[str, Any]:
    """Everything the calculator prints, as JSON-ready data (bytes as integers)."""
    rows = []
    for ctx in context_lengths:
        per_request = request_kv_bytes(layout, ctx)
        for n in concurrency:
            row: dict[str, Any] = {
                "context_tokens": ctx,
                "concurrency": n,
                "kv_bytes": per_request * n,
                "kv_gib": per_request * n / GiB,
                "kv_over_weights": per_request * n / weights if weights else None,
            }
            if gpu_memory_bytes:
                row["required_gpu_memory_utilization"] = required_utilization(
                    spec,
                    layout,
                    gpu_memory_bytes=gpu_memory_bytes,
                    vllm_version=vllm_version,
                    max_num_batched_tokens=layout.max_num_batched_tokens,
                    weights=weights,
                    concurrency=n,
                    request_tokens=ctx,
                    **(overrides or {}),
                )
            rows.append(row)
    out: dict[str, Any] = {
        "model_config": spec.source,
        "architecture": spec.architecture,
        "model_type": spec.model_type,
        "attention": layout.attention,
        "layers": layout.layers,
        "layers_per_rank": layout.layers_per_rank,
        "layer_counts": dict(layout.layer_counts),
        "kv_heads": layout.kv_heads,
        "kv_heads_per_rank": layout.kv_heads_per_rank,
        "head_dim": layout.head_dim,
        "tensor_parallel_size": layout.tp,
        "pipeline_parallel_size": layout.pp,
        "served_dtype": layout.served_dtype,
        "kv_dtype": layout.kv_dtype,
        "device": layout.device,
        "block_size": layout.block_size,
        "page_size_bytes": layout.page_size_bytes,
        "group_size": layout.group_size,
        "num_groups": layout.num_groups,
        "is_hybrid": layout.is_hybrid,
        "hybrid_kv_cache_manager": layout.hybrid_kv_cache_manager,
        "max_model_len": layout.max_model_len,
        "max_num_batched_tokens": layout.max_num_batched_tokens,
        "bytes_per_token": layout.bytes_per_token,
        "bytes_per_token_all_layers": layout.bytes_per_token_all_layers,
        "per_request_state_bytes": layout.per_request_state_bytes,
        "defaulted_fields": list(spec.defaulted),
        "weights_bytes": weights,
        "weights_source": (
            "given" if weights_given else "safetensors-index" if spec.safetensors_total_bytes else "config-shapes"
        ),
        "inflection_context_length": inflection_context_length(layout, weights) if weights else None,
        "kv_memory": rows,
        "vllm_version": vllm_version or "latest",
    }
    if budget is not None:
        blocks = num_blocks(layout, budget.kv_budget_bytes)
        out.update(
            budget=budget.as_dict(),
            kv_budget_bytes=budget.kv_budget_bytes,
            num_blocks=blocks,
            capacity_tokens=blocks * layout.block_size,
            usable_tokens=max(0, blocks - 1) * layout.block_size,
            logged_capacity_tokens=logged_capacity_tokens(layout, blocks, version=vllm_version),
            max_concurrency=max_concurrency(layout, blocks, layout.max_model_len, version=vllm_version),
            concurrency_by_context=[
                {
                    "context_tokens": ctx,
                    "max_concurrency": max_concurrency(layout, blocks, ctx, version=vllm_version),
                    "usable_concurrency": usable_concurrency(layout, blocks, ctx, version=vllm_version),
                }
                for ctx in context_lengths
            ],
        )
    return out


def render_json(table: dict[str, Any]) -> str:
    return json.dumps(table, indent=2, sort_keys=False)


def _gib(n: float) -> str:
    return f"{n / GiB:,.2f} GiB"


def _size(n: float) -> str:
    """GiB, or MiB below 1 GiB (a CPU test pool of 6 MiB would read 0.01 GiB)."""
    return _gib(n) if n >= GiB else f"{n / (1 << 20):,.2f} MiB"


def _summary_lines(r: dict[str, Any]) -> list[str]:
    lines = [
        f"Model          {r['architecture']} ({r['model_type']}): {r['attention']}, {r['layers']} layers,"
        f" {r['kv_heads']} KV heads x head_dim {r['head_dim']}",
        f"Serving        dtype {r['served_dtype']}, KV cache {r['kv_dtype']}, TP {r['tensor_parallel_size']},"
        f" PP {r['pipeline_parallel_size']}, block size {r['block_size']}, max_model_len {r['max_model_len']:,}",
        f"KV per token   {r['bytes_per_token']:,} B ({r['bytes_per_token'] / 1024:,.1f} KiB) per rank"
        f" ({r['kv_heads_per_rank']} KV head(s) x {r['layers_per_rank']} layers on the rank)",
    ]
    if r["is_hybrid"]:
        counts = ", ".join(f"{v} {k}" for k, v in r["layer_counts"].items())
        lines.append(
            f"Hybrid         {counts}; all layers as full: {r['bytes_per_token_all_layers']:,} B/token;"
            f" bounded per request: {r['per_request_state_bytes']:,} B;"
            f" {r['num_groups']} KV groups of {r['group_size']}"
        )
    if r.get("defaulted_fields"):
        lines.append(
            f"Defaults       config.json leaves out {', '.join(r['defaulted_fields'])}:"
            f" {r['model_type']}'s class defaults, as transformers fills them"
        )
    source = "--weights-memory" if r["weights_source"] == "given" else r["weights_source"]
    lines.append(f"Weights        {_gib(r['weights_bytes'])} per rank (from {source})")
    if r["inflection_context_length"]:
        lines.append(
            f"Inflection     KV exceeds the weights from {r['inflection_context_length']:,}"
            " tokens of context (1 request)"
        )
    return lines


def _grid(r: dict[str, Any]) -> tuple[list[int], list[int], dict[tuple[int, int], dict[str, Any]]]:
    ctxs = sorted({row["context_tokens"] for row in r["kv_memory"]})
    concs = sorted({row["concurrency"] for row in r["kv_memory"]})
    cells = {(row["context_tokens"], row["concurrency"]): row for row in r["kv_memory"]}
    return ctxs, concs, cells


def _budget_lines(r: dict[str, Any]) -> list[str]:
    if "budget" not in r:
        return ["(no budget: give --gpu-memory or --kv-cache-memory-bytes for blocks, tokens and concurrency)"]
    b = r["budget"]
    if b["source"] == "exact":
        head = f"Budget (given)  {_size(b['kv_budget_bytes'])} of KV cache (--kv-cache-memory-bytes)"
    else:
        head = (
            f"Budget (estimated)  {_gib(b['gpu_memory_bytes'])} x {b['gpu_memory_utilization']:.2f} ="
            f" {_gib(b['requested_bytes'])} - weights {_gib(b['weights_bytes'])} - activation"
            f" {_gib(b['activation_bytes'])} - non-torch {_gib(b['non_torch_bytes'])} - CUDA graphs"
            f" {_gib(b['cudagraph_bytes'])} = {_gib(b['kv_budget_bytes'])} for KV"
        )
        if b.get("max_num_seqs"):
            head += (
                f"\n                    activation = max(forward {_gib(b['forward_bytes'])} over"
                f" {b['max_num_batched_tokens']:,} tokens, sampler {_gib(b['sampler_bytes'])} over"
                f" {min(b['max_num_seqs'], b['max_num_batched_tokens']):,} sequences); rules {b['rules']}"
                " (--explain for each term's source)"
            )
    lines = [
        head,
        f"Blocks          {r['num_blocks']:,} x {r['block_size']} tokens = {r['capacity_tokens']:,} tokens"
        f" ({r['usable_tokens']:,} usable after the null block)",
        f"vLLM {r['vllm_version']} prints  KV cache size: {r['logged_capacity_tokens']:,} tokens,"
        f" Maximum concurrency for {r['max_model_len']:,} tokens per request: {r['max_concurrency']:.2f}x",
    ]
    return lines


def render_table(r: dict[str, Any]) -> str:
    lines = _summary_lines(r)
    ctxs, concs, cells = _grid(r)
    lines += ["", "KV cache memory per rank (GiB; x weights)"]
    lines.append(f"{'context':>10}" + "".join(f"{'x' + str(n):>22}" for n in concs))
    for ctx in ctxs:
        row = f"{ctx:>10,}"
        for n in concs:
            c = cells[(ctx, n)]
            ratio = f" ({c['kv_over_weights']:.2f}x)" if c["kv_over_weights"] is not None else ""
            row += f"{c['kv_gib']:>12,.2f}{ratio:>10}"
        lines.append(row)
    if any("required_gpu_memory_utilization" in c for c in cells.values()):
        lines += ["", "gpu_memory_utilization needed (> 1 = does not fit)"]
        lines.append(f"{'context':>10}" + "".join(f"{'x' + str(n):>10}" for n in concs))
        for ctx in ctxs:
            needed = (cells[(ctx, n)]["required_gpu_memory_utilization"] for n in concs)
            lines.append(f"{ctx:>10,}" + "".join(f"{u:>10.3f}" for u in needed))
    lines += [""] + _budget_lines(r)
    if "concurrency_by_context" in r:
        lines += [
            "",
            f"{'context':>10}{'max concurrency':>18}{'usable':>9}"
            "   (vLLM's count; usable = whole requests after the null block)",
        ]
        for c in r["concurrency_by_context"]:
            lines.append(f"{c['context_tokens']:>10,}{c['max_concurrency']:>17.2f}x{c['usable_concurrency']:>9,}")
    return "\n".join(lines) + "\n"


def render_markdown(r: dict[str, Any]) -> str:
    lines = [f"- {line}" for line in _summary_lines(r)]
    ctxs, concs, cells = _grid(r)
    lines += ["", "| concurrency | context (tokens) | KV cache (GiB) | KV / weights |", "|---:|---:|---:|---:|"]
    for n in concs:
        for ctx in ctxs:
            c = cells[(ctx, n)]
            ratio = f"{c['kv_over_weights']:.2f}" if c["kv_over_weights"] is not None else "-"
            lines.append(f"| {n} | {ctx:,} | {c['kv_gib']:,.2f} | {ratio} |")
    lines += [""] + [f"- {line}" for line in _budget_lines(r)]
    if "concurrency_by_context" in r:
        lines += ["", "| context (tokens) | max concurrency | usable requests |", "|---:|---:|---:|"]
        for c in r["concurrency_by_context"]:
            lines.append(f"| {c['context_tokens']:,} | {c['max_concurrency']:.2f}x | {c['usable_concurrency']:,} |")
    return "\n".join(lines) + "\n"


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "table": render_table,
    "markdown": render_markdown,
    "json": lambda r: render_json(r) + "\n",
}
