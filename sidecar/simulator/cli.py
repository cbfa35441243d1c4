"""``kv-sidecar simulate``: serve the simulator on vLLM's port with vLLM's /metrics (``--engine``: another engine's)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from ..generations import GENERATIONS, Generation
from .config import SimConfig
from .engines import DEFAULT_ENGINE, ENGINE_KINDS
from .scenarios import SCENARIOS
from .server import SimServer
from .simulation import Simulator, SimulatorConfigError, pool_for_peak
from .trace import TraceError, TracePlay, load_trace

#: How the start-up line names each engine.
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM", "tgi": "TGI", "llamacpp": "llama.cpp"}

#: CLI flag -> SimConfig field, for the flags that override the scenario's server.
CONFIG_FLAGS = {
    "model_name": str,
    "engines": int,
    "block_size": int,
    "kv_bytes_per_token": int,
    "gpu_memory_bytes": int,
    "weights_bytes": int,
    "activation_bytes": int,
    "non_torch_bytes": int,
    "gpu_memory_utilization": float,
    "kv_cache_memory_bytes": int,
    "num_gpu_blocks_override": int,
    "max_num_seqs": int,
    "max_num_batched_tokens": int,
    "max_model_len": int,
    "enable_prefix_caching": bool,
    "step_base_seconds": float,
    "step_seconds_per_token": float,
}


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "simulate",
        help="serve a simulated vLLM /metrics (paged-KV model, named scenarios)",
        description="Impersonate a vLLM server: /metrics in vLLM's exact text format from a "
        "paged-KV engine model driven by a named scenario, and /health. Every "
        "response carries X-Simulated-Time (test/replay use only).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind")
    p.add_argument("--port", type=int, default=8000, help="port to bind (0 = any free port)")
    p.add_argument("--scenario", default="steady", help="workload; --list-scenarios shows them")
    p.add_argument("--list-scenarios", action="store_true", help="print the scenarios and exit")
    p.add_argument("--seed", type=int, default=0, help="random seed (same seed, same run)")
    p.add_argument("--speed", type=float, default=1.0, help="simulated seconds per wall-clock second")
    p.add_argument(
        "--engine",
        default=DEFAULT_ENGINE,
        choices=ENGINE_KINDS,
        help="which inference engine's metrics to serve (its names, labels and metrics path; "
        "the same simulated KV cache behind each)",
    )
    p.add_argument(
        "--metrics-generation",
        default=Generation.V1_CAPACITY_LABELS.value,
        choices=GENERATIONS,
        help="which vLLM release's metric names to serve (--engine vllm)",
    )
    t = p.add_argument_group("trace (arrivals and lengths from a real trace; see docs/simulator.md)")
    t.add_argument(
        "--trace",
        metavar="FILE",
        help="replay this trace instead of the scenario's arrivals: Azure CSV (TIMESTAMP,ContextTokens,"
        "GeneratedTokens), Mooncake JSONL (timestamp ms, input_length, output_length), or CSV/JSONL of "
        "arrival_s,prompt_tokens,output_tokens",
    )
    t.add_argument("--trace-speed", type=float, default=1.0, help="trace seconds per simulated second")
    t.add_argument("--trace-offset", type=float, default=0.0, help="start this many trace seconds in")
    t.add_argument("--trace-loop", action="store_true", help="start the trace again when it ends")
    t.add_argument(
        "--trace-without-hash-ids",
        action="store_true",
        help="ignore the trace's hash_ids (Mooncake): no prompt shares a prefix with another",
    )
    t.add_argument(
        "--trace-peak-usage",
        type=float,
        help="size the KV pool so that the trace's peaks reach this usage (above 1: it preempts at its peaks)",
    )
    g = p.add_argument_group("server (defaults: the scenario's server; see docs/simulator.md)")
    g.add_argument("--model-name", help="served model name (model_name label)")
    g.add_argument("--engines", type=int, help="data-parallel engines behind the endpoint")
    g.add_argument("--block-size", type=int, help="tokens per KV block")
    g.add_argument("--kv-bytes-per-token", type=int, help="KV bytes per token, all layers")
    g.add_argument("--gpu-memory-bytes", type=int, help="GPU memory per engine")
    g.add_argument("--weights-bytes", type=int, help="model weights per GPU")
    g.add_argument("--activation-bytes", type=int, help="peak activation memory")
    g.add_argument("--non-torch-bytes", type=int, help="non-torch memory (CUDA context, graphs)")
    g.add_argument("--gpu-memory-utilization", type=float, help="vLLM --gpu-memory-utilization")
    g.add_argument(
        "--kv-cache-memory-bytes", type=int, help="vLLM --kv-cache-memory-bytes (utilization is then ignored)"
    )
    g.add_argument("--num-gpu-blocks-override", type=int, help="vLLM --num-gpu-blocks-override")
    g.add_argument("--max-num-seqs", type=int, help="vLLM --max-num-seqs")
    g.add_argument("--max-num-batched-tokens", type=int, help="vLLM --max-num-batched-tokens")
    g.add_argument("--max-model-len", type=int, help="vLLM --max-model-len")
    g.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="vLLM --enable-prefix-caching",
    )
    g.add_argument("--step-base-seconds", type=float, help="engine step time: fixed part")
    g.add_argument("--step-seconds-per-token", type=float, help="engine step time: per scheduled token")
    p.set_defaults(func=run)
    return p


def build_simulator(args: argparse.Namespace) -> Simulator:
    """Scenario's server with the flags given on top. Raises SimulatorConfigError."""
    problems = []
    scenario = SCENARIOS.get(args.scenario)
    if scenario is None:
        problems.append(f"--scenario: unknown scenario {args.scenario!r}; choose one of: {', '.join(SCENARIOS)}")
        scenario = SCENARIOS["steady"]  # still check the other flags
    changes = {f: getattr(args, f) for f in CONFIG_FLAGS if getattr(args, f, None) is not None}
    if "kv_cache_memory_bytes" not in changes and "gpu_memory_utilization" in changes:
        changes["kv_cache_memory_bytes"] = None  # an explicit utilization means "from memory"
    config: SimConfig = scenario.config.replace(**changes)
    if not args.speed > 0:
        problems.append(f"--speed: must be > 0, got {args.speed}")
    if not 0 <= args.port <= 65535:
        problems.append(f"--port: must be 0-65535, got {args.port}")
    problems += config.problems()
    if problems:
        raise SimulatorConfigError(problems)
    if getattr(args, "trace", None):
        return _trace_simulator(args, config, scenario.restart_at)
    if getattr(args, "trace_peak_usage", None) is not None:
        raise SimulatorConfigError(["--trace-peak-usage: needs --trace FILE"])
    return Simulator(config, scenario, args.seed)


def _trace_simulator(args: argparse.Namespace, config: SimConfig, restart_at: float | None) -> Simulator:
    """The scenario's server (and restart) replaying ``--trace``; the pool sized by ``--trace-peak-usage``."""
    try:
        trace = load_trace(args.trace)
        if getattr(args, "trace_without_hash_ids", False):
            trace = trace.without_hash_ids()
        play = TracePlay(trace, args.trace_speed, args.trace_offset, args.trace_loop)
    except TraceError as e:
        raise SimulatorConfigError([f"--trace: {e}"]) from None
    problems = play.problems()
    peak = args.trace_peak_usage
    if peak is not None and not peak > 0:
        problems.append(f"--trace-peak-usage: must be > 0, got {peak:g}")
    if problems:
        raise SimulatorConfigError(problems)
    if peak is not None:
        config = pool_for_peak(play, config, peak)
    return Simulator(config, play.scenario(config, restart_at=restart_at), args.seed, play)


def run(args: argparse.Namespace) -> int:
    if args.list_scenarios:
        for name, s in SCENARIOS.items():
            print(f"{name:22s} {s.duration_s / 60:6.0f} min  {s.description}")
        return 0
    try:
        sim = build_simulator(args)
    except SimulatorConfigError as e:
        for problem in e.problems:
            print(f"kv-sidecar simulate: {problem}", file=sys.stderr)
        return 2
    try:
        server = SimServer(
            sim, args.host, args.port, args.speed, Generation(args.metrics_generation), engine=args.engine
        )
    except OSError as e:
        print(
            f"kv-sidecar simulate: --host/--port: cannot listen on {args.host}:{args.port}: "
            f"{e.strerror or e} (pick a free port, or --port 0 for any)",
            file=sys.stderr,
        )
        return 2
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    server.start()
    c = sim.config
    names = f"metrics generation {args.metrics_generation}" if args.engine == "vllm" else f"{args.engine} metrics"
    scenario = sim.scenario.name if args.trace else args.scenario
    print(
        f"simulated {ENGINE_NAMES.get(args.engine, args.engine)} ({scenario}, "
        f"seed {args.seed}, speed {args.speed}x, {c.engines} engine(s) x {c.num_blocks} blocks of {c.block_size} "
        f"tokens, {names}) serving {server.metrics_url}",
        flush=True,
    )
    try:
        while not stop.wait(0.2):
            pass
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
