"""``kv-sidecar capacity``: the KV capacity calculator (thin over the pure model).

Flags use vLLM's spellings (``vllm serve``). Values are parsed here rather
than by argparse ``type=`` so that every bad input gets one line naming the
flag and the fix, and exit code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from typing import Any

from .. import input_files as files
from .blocks import parse_version
from .budget import (
    ServingFlags,
    check_utilization,
    estimate_budget,
    exact_budget,
    gpu_name,
    parse_memory,
    weights_bytes,
)
from .config import load_model
from .dtypes import KV_CACHE_DTYPES, SERVED_DTYPES
from .engines import (
    ENGINES,
    TGI_BLOCK_SIZE,
    TGI_DEFAULT_ATTENTION,
    TRTLLM_DEFAULT_FREE_FRACTION,
    EngineCapacity,
    sglang_capacity,
    tgi_capacity,
    trtllm_capacity,
)
from .errors import CapacityError
from .explain import comparison_lines, explain_lines
from .layout import DEFAULT_MAX_NUM_BATCHED_TOKENS, KVLayout, kv_layout
from .profile_terms import DEFAULT_SAMPLER, SAMPLER_FACTORS
from .startup_log import LoggedProfile, parse_startup_log
from .table import RENDERERS, build_table
from .vllm_rules import default_gpu_memory_utilization
from .weights import DEFAULT_MXFP4_BACKEND, MXFP4_PADDING

#: Context lengths of the tables when none are given; those above the served ``max_model_len``
#: are dropped and ``max_model_len`` itself becomes the last column (a 4K model shows 4096 only).
DEFAULT_CONTEXTS = (4096, 16384, 32768)
DEFAULT_CONCURRENCY = "1,8,32"
#: ``--gpu-memory-utilization`` left out: vLLM's own default for ``--vllm-version`` (the newest without it),
#: :func:`~sidecar.capacity.vllm_rules.default_gpu_memory_utilization`: 0.92 from 0.20.0, 0.9 before.
DEFAULT_UTILIZATION = None

EPILOG = """\
examples:
  kv-sidecar capacity --model-config Llama-3.1-8B/config.json
  kv-sidecar capacity --model-config ./Qwen3-32B --gpu-memory H100-80GB -tp 2 --kv-cache-dtype fp8
  kv-sidecar capacity --model-config config.json --kv-cache-memory-bytes 6GiB --context-lengths 4096 --format json
  kv-sidecar capacity --model-config Llama-3.1-8B --gpu-memory H100-80GB --engine sglang --mem-fraction-static 0.88
  kv-sidecar capacity --model-config Llama-3.1-8B --gpu-memory H100-80GB --engine tgi --tgi-attention paged

units: 80GiB = 80 x 2^30 bytes; 80GB = 80 x 10^9 bytes; a GPU name (H100-80GB) = the total memory vLLM sees.
"""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``capacity`` on the top-level CLI's subparsers."""
    p = subparsers.add_parser(
        "capacity",
        help="theoretical KV-cache capacity of a model under vLLM, from its config.json",
        description=(
            "Bytes per token, KV memory per context x concurrency, and (given GPU memory or a KV budget) "
            "vLLM's num_gpu_blocks, KV cache tokens and maximum concurrency."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    a = p.add_argument
    a("--model-config", required=True, metavar="PATH", help="config.json, or a model directory holding it")
    a("--gpu-memory", metavar="SIZE|GPU", help="per-GPU memory: 80GiB, 80GB (10^9) or a GPU name such as H100-80GB")
    a(
        "--gpu-memory-utilization",
        default=DEFAULT_UTILIZATION,
        metavar="FRACTION",
        help="fraction of the GPU's TOTAL memory vLLM may use (default: vLLM's own for --vllm-version: 0.92 from "
        "0.20.0, 0.9 before; the newest's without --vllm-version)",
    )
    a(
        "--tensor-parallel-size",
        "-tp",
        "--tp",
        dest="tensor_parallel_size",
        default="1",
        metavar="N",
        help="tensor parallel size (default: %(default)s)",
    )
    a(
        "--pipeline-parallel-size",
        "-pp",
        "--pp",
        dest="pipeline_parallel_size",
        default="1",
        metavar="N",
        help="pipeline parallel size (default: %(default)s)",
    )
    a(
        "--dtype",
        default="auto",
        metavar="DTYPE",
        help=f"weights dtype, one of {', '.join(SERVED_DTYPES)}"
        " (default: auto = config dtype, float32 served as bfloat16)",
    )
    a(
        "--kv-cache-dtype",
        default="auto",
        metavar="DTYPE",
        help=f"KV cache dtype, one of {', '.join(KV_CACHE_DTYPES)} (default: %(default)s = the served dtype)",
    )
    a("--block-size", metavar="N", help="tokens per block (default: 16 on GPU, 64 for MLA models, 128 on CPU)")
    a("--max-model-len", metavar="N", help="max tokens per request (default: the model's max_position_embeddings)")
    a(
        "--max-num-batched-tokens",
        metavar="N",
        help="per-step token budget: the profile's forward peak and sliding-window caps"
        " (default: the vLLM version's default for the GPU)",
    )
    a(
        "--max-num-seqs",
        metavar="N",
        help="requests per step: the profile's sampler warm-up (default: by version and GPU)",
    )
    a("--enforce-eager", action="store_true", help="no CUDA graphs (vLLM >= 0.21 then subtracts none)")
    a(
        "--sampler",
        default=DEFAULT_SAMPLER,
        choices=sorted(SAMPLER_FACTORS),
        help="vLLM's top-k/top-p implementation in the profile (default: %(default)s, the largest)",
    )
    a(
        "--mxfp4-backend",
        default=DEFAULT_MXFP4_BACKEND,
        choices=sorted(MXFP4_PADDING),
        help="MXFP4 MoE kernel, which sets the experts' padding (default: %(default)s, the largest)",
    )
    a("--vllm-engine", choices=("V0", "V1"), help="V0 for VLLM_USE_V1=0 (up to 0.10); default: the version's")
    a("--explain", action="store_true", help="print the budget's terms as vLLM's memory-profiling line does")
    a(
        "--from-log",
        metavar="FILE",
        help="a vLLM start-up log: take its version, TP, GPU memory and utilization, and show each term's error",
    )
    a("--kv-cache-memory-bytes", metavar="SIZE", help="KV budget per GPU (vLLM then ignores the utilization)")
    a(
        "--weights-memory",
        metavar="SIZE",
        help='measured weights per GPU (vLLM\'s "Model loading took X GiB"), instead of the estimate'
        " from config.json (the sidecar's model.weights_memory)",
    )
    a(
        "--context-lengths",
        metavar="N,N,...",
        help="context lengths for the tables (default: "
        + ",".join(map(str, DEFAULT_CONTEXTS))
        + ", up to max_model_len)",
    )
    a(
        "--concurrency",
        default=DEFAULT_CONCURRENCY,
        metavar="N,N,...",
        help="concurrent requests for the tables (default: %(default)s)",
    )
    a("--format", default="table", choices=sorted(RENDERERS), help="output format (default: %(default)s)")
    a(
        "--device",
        default="cuda",
        choices=("cuda", "cpu"),
        help="vLLM platform: block size and hybrid rules (default: %(default)s)",
    )
    a("--vllm-version", metavar="X.Y.Z", help="apply this vLLM version's counting rules (default: the newest)")
    a(
        "--engine",
        default="vllm",
        choices=ENGINES,
        help="the inference server whose arithmetic to apply (default: %(default)s); the others need --gpu-memory",
    )
    a(
        "--mem-fraction-static",
        metavar="FRACTION",
        help="SGLang: weights + KV as a share of the GPU's TOTAL memory (required with --engine sglang)",
    )
    a(
        "--free-gpu-memory-fraction",
        default=str(TRTLLM_DEFAULT_FREE_FRACTION),
        metavar="FRACTION",
        help="TensorRT-LLM: the KV cache's share of the memory FREE after the weights (default: %(default)s)",
    )
    a(
        "--tokens-per-block",
        default="32",
        metavar="N",
        help="TensorRT-LLM: tokens per KV block (KvCacheConfig.tokens_per_block, default: %(default)s)",
    )
    a(
        "--tgi-attention",
        default=TGI_DEFAULT_ATTENTION,
        choices=sorted(TGI_BLOCK_SIZE),
        help="TGI: the attention backend TGI logs at start-up, which sets its block size (default: %(default)s)",
    )
    p.set_defaults(func=run)
    return p


def _optional_int(value: str | None, flag: str) -> int | None:
    """A whole-number flag that may be left out (None)."""
    return None if value is None else _int(value, flag)


def _int(value: str, flag: str) -> int:
    """A whole-number flag, at least 1 (``1_000`` and ``1,000`` accepted)."""
    text = str(value).replace("_", "").replace(",", "")
    if not (text.isascii() and text.lstrip("+-").isdigit()) or len(text) > 20:  # int() reads "٨" and 5,000 digits
        raise CapacityError(f"{flag}: {value!r} is not a whole number (write it with the digits 0-9)")
    number = int(text)
    if number < 1:
        raise CapacityError(f"{flag}: must be at least 1, got {number}")
    return number


def _int_list(value: str, flag: str) -> list[int]:
    items = [v.strip() for v in str(value).split(",") if v.strip()]
    if not items:
        raise CapacityError(f"{flag}: give a comma-separated list such as 4096,16384")
    parsed = []
    for item in items:
        digits = item.lower().removesuffix("k")
        if not (digits.isascii() and digits.isdigit()) or len(digits) > 12:
            raise CapacityError(f"{flag}: {item!r} is not a whole number (write 4096 or 4k)")
        number = int(digits) * (1024 if item.lower().endswith("k") else 1)
        if number < 1:
            raise CapacityError(f"{flag}: {item!r} must be at least 1")
        parsed.append(number)
    return parsed


def _fraction(value: str, flag: str) -> float:
    try:
        if not str(value).isascii():
            raise ValueError  # float("٠.٩") is 0.9
        number = float(value)
    except ValueError:
        raise CapacityError(f"{flag}: {value!r} is not a number between 0 and 1") from None
    return check_utilization(number)


def _share(value: str, flag: str) -> float:
    """A memory share flag of another engine: a number above 0 and at most 1, or one line naming the flag."""
    try:
        if not str(value).isascii():
            raise ValueError
        number = float(value)
    except ValueError:
        raise CapacityError(f"{flag}: {value!r} is not a number between 0 and 1") from None
    if not 0 < number <= 1:
        raise CapacityError(f"{flag}: must be above 0 and at most 1, got {number!r}")
    return number


def run(args: argparse.Namespace) -> int:
    """Compute and print the table; 0 on success, 2 on bad input (one line per problem on stderr)."""
    try:
        text = table_text(args)
    except CapacityError as exc:
        for problem in exc.problems:
            print(f"kv-sidecar capacity: error: {problem}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


def default_context_lengths(max_model_len: int) -> list[int]:
    """:data:`DEFAULT_CONTEXTS` up to ``max_model_len``, which ends the list when it is shorter."""
    if max_model_len >= DEFAULT_CONTEXTS[-1]:
        return list(DEFAULT_CONTEXTS)
    return [c for c in DEFAULT_CONTEXTS if c < max_model_len] + [max_model_len]


def _memory_flag(raw: str, flag: str) -> int:
    """A memory size flag (bytes, 6GiB, 6GB), or one line naming the flag."""
    try:
        return parse_memory(raw)
    except CapacityError:
        raise CapacityError(f"{flag}: {raw!r} is not a size (write 6442450944, 6GiB or 6GB)") from None


def _read_log(path: str | None) -> LoggedProfile | None:
    if path is None:
        return None
    try:
        text = files.read_text(path, max_bytes=64 << 20, what="a vLLM start-up log")
    except files.FileProblem as exc:
        raise CapacityError(*(f"--from-log: {path}: {problem}" for problem in exc.problems)) from None
    return parse_startup_log(text)


def _apply_log(args: argparse.Namespace, logged: LoggedProfile | None) -> None:
    """Fill the flags the user left at their defaults from what the log states."""
    if logged is None:
        return
    if args.vllm_version is None and logged.version:
        args.vllm_version = logged.version
    if args.vllm_engine is None and logged.engine:
        args.vllm_engine = logged.engine
    if args.tensor_parallel_size == "1" and logged.tensor_parallel_size:
        args.tensor_parallel_size = str(logged.tensor_parallel_size)
    if args.max_model_len is None and logged.max_model_len:
        args.max_model_len = str(logged.max_model_len)
    if logged.enforce_eager:
        args.enforce_eager = True
    if args.sampler == DEFAULT_SAMPLER and logged.sampler:
        args.sampler = logged.sampler
    if args.gpu_memory is None and logged.total_gib:
        args.gpu_memory = f"{logged.total_gib}GiB"
    if args.gpu_memory_utilization is DEFAULT_UTILIZATION and logged.utilization:
        args.gpu_memory_utilization = str(logged.utilization)


def table_text(args: argparse.Namespace) -> str:
    """The rendered table for parsed arguments (raises CapacityError on bad input)."""
    spec = load_model(args.model_config)
    logged = _read_log(args.from_log)
    _apply_log(args, logged)
    tp = _int(args.tensor_parallel_size, "--tensor-parallel-size")
    pp = _int(args.pipeline_parallel_size, "--pipeline-parallel-size")
    max_model_len = _optional_int(args.max_model_len, "--max-model-len")
    mbt_flag = _optional_int(args.max_num_batched_tokens, "--max-num-batched-tokens")
    mbt = mbt_flag or DEFAULT_MAX_NUM_BATCHED_TOKENS
    contexts = _int_list(args.context_lengths, "--context-lengths") if args.context_lengths else None
    concurrency = _int_list(args.concurrency, "--concurrency")
    version = args.vllm_version
    parse_version(version)
    given = args.gpu_memory_utilization
    default = default_gpu_memory_utilization(version)
    utilization = default if given is DEFAULT_UTILIZATION else _fraction(given, "--gpu-memory-utilization")
    layout = kv_layout(
        spec,
        tp=tp,
        pp=pp,
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        block_size=_optional_int(args.block_size, "--block-size"),
        device=args.device,
        max_model_len=max_model_len,
        max_num_batched_tokens=mbt,
    )
    if contexts is None:
        contexts = default_context_lengths(layout.max_model_len)
    too_long = [c for c in contexts if c > layout.max_model_len]
    if too_long:
        fix = (
            "lower it, or raise --max-model-len up to the model's max_position_embeddings"
            if max_model_len is not None
            else "lower it: that is the model's own limit"
        )
        raise CapacityError(
            f"--context-lengths: {too_long[0]:,} is above max_model_len {layout.max_model_len:,} ({fix})"
        )
    if args.weights_memory is not None:
        weights = _memory_flag(args.weights_memory, "--weights-memory")
    else:
        weights = weights_bytes(spec, tp=tp, pp=pp, dtype=layout.served_dtype)
    gpu_memory = parse_memory(args.gpu_memory) if args.gpu_memory else None
    if args.engine != "vllm":
        return engine_text(
            args.engine,
            layout,
            gpu_memory_bytes=gpu_memory,
            weights_bytes=weights,
            mem_fraction_static=None
            if args.mem_fraction_static is None
            else _share(args.mem_fraction_static, "--mem-fraction-static"),
            free_gpu_memory_fraction=_share(args.free_gpu_memory_fraction, "--free-gpu-memory-fraction"),
            tokens_per_block=_int(args.tokens_per_block, "--tokens-per-block"),
            tgi_attention=args.tgi_attention,
            output=args.format,
        )
    budget = None
    if args.kv_cache_memory_bytes is not None:
        budget = exact_budget(_memory_flag(args.kv_cache_memory_bytes, "--kv-cache-memory-bytes"))
    elif gpu_memory is not None:
        flags = ServingFlags(
            vllm_version=version,
            engine=args.vllm_engine,
            gpu_name=gpu_name(args.gpu_memory),
            max_num_seqs=_optional_int(args.max_num_seqs, "--max-num-seqs"),
            max_num_batched_tokens=mbt_flag,
            enforce_eager=args.enforce_eager,
            sampler=args.sampler,
            mxfp4_backend=args.mxfp4_backend,
        )
        budget = estimate_budget(
            spec,
            layout,
            gpu_memory_bytes=gpu_memory,
            gpu_memory_utilization=utilization,
            weights=weights if args.weights_memory is not None else None,
            flags=flags,
        )
        if args.explain or logged is not None:
            lines = explain_lines(budget, spec)
            if logged is not None:
                lines += [""] + comparison_lines(budget, logged)
            return "\n".join(lines) + "\n"
    elif args.explain or logged is not None:
        raise CapacityError("--explain: give --gpu-memory (a size or a GPU name such as H100-80GB)")
    table = build_table(
        spec,
        layout,
        weights=weights,
        context_lengths=contexts,
        concurrency=concurrency,
        budget=budget,
        vllm_version=version,
        gpu_memory_bytes=gpu_memory,
        weights_given=args.weights_memory is not None,
    )
    return RENDERERS[args.format](table)


def engine_capacity(
    engine: str,
    layout: KVLayout,
    *,
    gpu_memory_bytes: int | None,
    weights_bytes: int,
    mem_fraction_static: float | None,
    free_gpu_memory_fraction: float,
    tokens_per_block: int,
    tgi_attention: str,
) -> EngineCapacity:
    """``engine``'s capacity for one GPU: free memory after the weights = total − weights (per rank)."""
    if gpu_memory_bytes is None:
        raise CapacityError(f"--engine {engine}: give --gpu-memory (a size or a GPU name such as H100-80GB)")
    free = gpu_memory_bytes - weights_bytes
    if free <= 0:
        raise CapacityError(
            f"--gpu-memory: {gpu_memory_bytes:,} bytes do not hold the weights ({weights_bytes:,} bytes per GPU)"
        )
    if engine == "sglang":
        if mem_fraction_static is None:
            raise CapacityError("--engine sglang: give --mem-fraction-static (SGLang's value, as it logs it)")
        return sglang_capacity(
            layout, total_bytes=gpu_memory_bytes, free_after_weights_bytes=free, mem_fraction_static=mem_fraction_static
        )
    if engine == "trtllm":
        return trtllm_capacity(
            layout,
            free_after_weights_bytes=free,
            free_gpu_memory_fraction=free_gpu_memory_fraction,
            tokens_per_block=tokens_per_block,
        )
    return tgi_capacity(layout, total_bytes=gpu_memory_bytes, free_after_warmup_bytes=free, attention=tgi_attention)


def engine_text(engine: str, layout: KVLayout, *, output: str, **memory: Any) -> str:
    """The capacity of ``engine`` as text (``--format table``/``markdown``) or JSON."""
    cap = engine_capacity(engine, layout, **memory)
    if output == "json":
        return json.dumps(dataclasses.asdict(cap), indent=2) + "\n"
    lines = [
        f"engine: {cap.engine}",
        f"KV bytes per token (per GPU): {cap.bytes_per_token:,}",
        f"KV budget (per GPU): {cap.kv_budget_bytes:,} bytes ({cap.kv_budget_bytes / (1 << 30):.2f} GiB)",
        f"blocks: {cap.num_blocks:,} of {cap.block_size:,} tokens",
        f"capacity: {cap.capacity_tokens:,} tokens",
        f"memory lever: {cap.lever} = {cap.lever_value:g}",
        f"note: {cap.caveat}",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry: ``python -m sidecar.capacity.cli`` (same as ``kv-sidecar capacity``)."""
    parser = argparse.ArgumentParser(prog="kv-sidecar")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    command: Callable[[argparse.Namespace], int] = args.func
    return command(args)


if __name__ == "__main__":
    sys.exit(main())
