"""``kv-sidecar capacity``: the KV capacity calculator (thin over the pure model).

Flags use vLLM's spellings (``vllm serve``). Values are parsed here rather
than by argparse ``type=`` so that every bad input gets one line naming the
flag and the fix, and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from .blocks import parse_version
from .budget import check_utilization, estimate_budget, exact_budget, parse_memory, weights_bytes
from .config import load_model
from .dtypes import KV_CACHE_DTYPES, SERVED_DTYPES
from .errors import CapacityError
from .layout import DEFAULT_MAX_NUM_BATCHED_TOKENS, kv_layout
from .table import RENDERERS, build_table

#: Context lengths of the tables when none are given; those above the served ``max_model_len``
#: are dropped and ``max_model_len`` itself becomes the last column (a 4K model shows 4096 only).
DEFAULT_CONTEXTS = (4096, 16384, 32768)
DEFAULT_CONCURRENCY = "1,8,32"
#: vLLM's default for most of its history (a 2026 snapshot, 0.32, has 0.92).
DEFAULT_UTILIZATION = "0.9"

EPILOG = """\
examples:
  kv-sidecar capacity --model-config Llama-3.1-8B/config.json
  kv-sidecar capacity --model-config ./Qwen3-32B --gpu-memory H100-80GB -tp 2 --kv-cache-dtype fp8
  kv-sidecar capacity --model-config config.json --kv-cache-memory-bytes 6GiB --context-lengths 4096 --format json

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
        help="fraction of the GPU's TOTAL memory vLLM may use (default: %(default)s)",
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
        default=str(DEFAULT_MAX_NUM_BATCHED_TOKENS),
        metavar="N",
        help="per-step token budget; sets activation memory and sliding-window caps (default: %(default)s)",
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


def table_text(args: argparse.Namespace) -> str:
    """The rendered table for parsed arguments (raises CapacityError on bad input)."""
    spec = load_model(args.model_config)
    tp = _int(args.tensor_parallel_size, "--tensor-parallel-size")
    pp = _int(args.pipeline_parallel_size, "--pipeline-parallel-size")
    max_model_len = _optional_int(args.max_model_len, "--max-model-len")
    mbt = _int(args.max_num_batched_tokens, "--max-num-batched-tokens")
    contexts = _int_list(args.context_lengths, "--context-lengths") if args.context_lengths else None
    concurrency = _int_list(args.concurrency, "--concurrency")
    utilization = _fraction(args.gpu_memory_utilization, "--gpu-memory-utilization")
    version = args.vllm_version
    parse_version(version)
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
    budget = None
    if args.kv_cache_memory_bytes is not None:
        budget = exact_budget(_memory_flag(args.kv_cache_memory_bytes, "--kv-cache-memory-bytes"))
    elif gpu_memory is not None:
        budget = estimate_budget(
            spec,
            layout,
            gpu_memory_bytes=gpu_memory,
            gpu_memory_utilization=utilization,
            max_num_batched_tokens=mbt,
            vllm_version=version,
            weights=weights,
        )
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


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry: ``python -m sidecar.capacity.cli`` (same as ``kv-sidecar capacity``)."""
    parser = argparse.ArgumentParser(prog="kv-sidecar")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    command: Callable[[argparse.Namespace], int] = args.func
    return command(args)


if __name__ == "__main__":
    sys.exit(main())
