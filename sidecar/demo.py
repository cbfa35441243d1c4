"""``kv-sidecar demo``: the built-in vLLM simulator and the sidecar together, on free ports.

What ``make run`` starts on a fresh clone with no vLLM around: a simulated
Llama-3-8B server (40 GiB GPU, gpu_memory_utilization 0.9, block 16) filling
its KV cache on a ramp at ``--speed`` times real time, and a sidecar scraping it
every second with the bundled Llama-3.1-8B config.json, so the capacity,
forecast and advice gauges appear too. The sidecar stamps samples with the
simulator's clock (``clock: simulated``), so forecasts read simulated minutes.
The sidecar keeps its history in ``.demo/history.sqlite`` (``--history``), so that
``kv-sidecar report --history .demo/history.sqlite`` has something to report after a few
minutes. ``kv-sidecar run`` keeps its production defaults (no history).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from importlib import resources
from pathlib import Path

from .artifacts.files import dump_yaml, write_atomically
from .config import ConfigError, build_config, print_config_errors
from .generations import Generation
from .logs import setup_logging
from .simulator import SCENARIOS, SimConfig, Simulator
from .simulator.server import SimServer

BUNDLED_MODEL = "llama-3.1-8b.config.json"
#: Where ``make run`` keeps the sidecar's history (relative to the working directory; git ignores it).
DEMO_HISTORY = ".demo/history.sqlite"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "demo",
        help="run the simulator and the sidecar together (what `make run` does)",
        description=__doc__.splitlines()[0],
    )
    p.add_argument(
        "--scenario",
        default="ramp-10m",
        help="simulator scenario (default: ramp-10m; `kv-sidecar simulate --list-scenarios` lists them)",
    )
    p.add_argument("--speed", type=float, default=10.0, help="simulated seconds per real second (default: 10)")
    p.add_argument("--seed", type=int, default=1, help="workload seed (default: 1)")
    p.add_argument("--host", default="127.0.0.1", help="address both listen on (default: 127.0.0.1)")
    p.add_argument("--simulator-port", type=int, default=0, help="simulator port (default: any free port)")
    p.add_argument("--sidecar-port", type=int, default=0, help="sidecar port (default: any free port)")
    p.add_argument(
        "--history",
        default=DEMO_HISTORY,
        help=f"the sidecar's history file, for `kv-sidecar report --history` (default: {DEMO_HISTORY}; '' = none)",
    )
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    # Deferred: every `kv-sidecar` command imports this module for its subcommand, and the daemon
    # (apscheduler) with the layers (capacity model, forecast) add some 45 ms to a start-up that
    # does not run the demo.
    from .daemon import serve
    from .history import HistoryError
    from .layers import build_extenders

    if args.scenario not in SCENARIOS:
        print(
            f"kv-sidecar demo: --scenario: {args.scenario!r} is not a scenario (one of: {', '.join(SCENARIOS)})",
            file=sys.stderr,
        )
        return 2
    if not args.speed > 0:
        print(f"kv-sidecar demo: --speed: must be positive, got {args.speed}", file=sys.stderr)
        return 2
    sim_config = SimConfig()
    try:
        server = SimServer(
            Simulator(sim_config, scenario=args.scenario, seed=args.seed),
            args.host,
            args.simulator_port,
            args.speed,
            Generation.V1_CAPACITY_LABELS,
        ).start()
    except OSError as e:
        print(f"kv-sidecar demo: --simulator-port: cannot listen: {e.strerror or e}", file=sys.stderr)
        return 2
    model = resources.files("sidecar") / "data" / BUNDLED_MODEL
    # The simulator's memory side, as an operator would copy it from vLLM's start-up log.
    model_section = {
        "config": str(model),
        "gpu_memory": f"{sim_config.gpu_memory_bytes}",
        "weights_memory": sim_config.weights_bytes,
        "activation_memory": sim_config.activation_bytes,
        "non_torch_memory": sim_config.non_torch_bytes,
        "cudagraph_memory": 0,
    }
    history: dict[str, str] = {}
    report_config = None
    if args.history:
        history = {"path": args.history}
        # What `kv-sidecar report --config.file` needs to size its advice: the model section, in a file
        # of the demo's own name beside the history (never a config.yaml someone else wrote).
        report_config = Path(args.history).with_name(Path(args.history).name + ".report-config.yaml")
        try:
            Path(args.history).parent.mkdir(parents=True, exist_ok=True)
            write_atomically(report_config, dump_yaml({"model": model_section}))
        except OSError as e:
            print(f"kv-sidecar demo: --history: cannot write beside {args.history}: {e.strerror or e}", file=sys.stderr)
            server.stop()
            return 2
    try:
        config = build_config(
            {
                "targets": [
                    {"name": "simulated-vllm", "url": f"{server.url}/metrics", "clock": "simulated", "timeout": "800ms"}
                ],
                "web": {"listen_address": f"{args.host}:{args.sidecar_port}"},
                "scrape": {"interval": "1s"},
                "derive": {"window": "5m"},
                "history": history,
                "model": model_section,
            },
            source="demo",
        )
        extenders = build_extenders(config)
    except ConfigError as e:  # pragma: no cover - the demo's own settings are tested
        print_config_errors(e)
        server.stop()
        return 2
    setup_logging("info", "logfmt")

    def listening(url: str) -> None:
        print(f"simulated vLLM ({args.scenario}, {args.speed:g}x real time): {server.url}/metrics", flush=True)
        print(f"kv-cache-sidecar:                  {url}", flush=True)
        print(
            'watch it fill:  watch -n2 "curl -s ' + url + " | grep -E "
            "'^kvcache_(usage_ratio|free_tokens|time_until_full|recommendation)'\"",
            flush=True,
        )
        if args.history:
            print(
                f"weekly report:   after a few minutes, kv-sidecar report --history {args.history} "
                f"--config.file {report_config} --since 1h --out {Path(args.history).parent / 'report'}",
                flush=True,
            )
        print("Ctrl-C stops both.", flush=True)

    try:
        asyncio.run(serve(config, extenders, on_listening=listening))
    except HistoryError as e:
        print(f"kv-sidecar demo: --history: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"kv-sidecar demo: --sidecar-port: cannot listen: {e.strerror or e}", file=sys.stderr)
        return 2
    finally:
        server.stop()
    return 0
