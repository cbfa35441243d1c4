"""``kv-sidecar``: the command-line entry point.

Subcommands: ``run`` (the daemon), ``check-config``, ``demo`` (simulator +
sidecar), ``simulate``, ``capacity``, ``rules``, ``docs``. Exit codes: 0 ok,
2 bad configuration or input (every problem printed, nothing served).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import sys
import time

from . import __version__
from .config import DEFAULT_LISTEN, DEFAULT_TARGET, ConfigError, load_config

#: flag dest -> (config section, key)
RUN_FLAGS: dict[str, tuple[str, str]] = {
    "web_listen_address": ("web", "listen_address"),
    "scrape_interval": ("scrape", "interval"),
    "scrape_staleness": ("scrape", "staleness"),
    "derive_window": ("derive", "window"),
    "log_level": ("log", "level"),
    "log_format": ("log", "format"),
    "model_config": ("model", "config"),
    "model_dtype": ("model", "dtype"),
    "model_tensor_parallel_size": ("model", "tensor_parallel_size"),
    "model_pipeline_parallel_size": ("model", "pipeline_parallel_size"),
    "model_gpu_memory": ("model", "gpu_memory"),
    "thresholds_watermark": ("thresholds", "watermark"),
    "forecast_window": ("forecast", "window"),
}

#: Subcommands contributed by other modules: module path with an ``add_parser(subparsers)``.
PLUGGED = ("sidecar.demo", "sidecar.simulator.cli", "sidecar.capacity.cli", "sidecar.rules")


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


class _LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = (f"ts={ts}.{int(record.msecs):03d}Z level={record.levelname.lower()} logger={record.name} "
                f"msg={_quote(record.getMessage())}")
        if record.exc_info:
            line += f" err={_quote(self.formatException(record.exc_info))}"
        return line


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": record.created, "level": record.levelname.lower(), "logger": record.name,
               "msg": record.getMessage()}
        if record.exc_info:
            out["err"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if fmt == "json" else _LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)


def add_run_flags(p: argparse.ArgumentParser) -> None:
    """The daemon's flags; each wins over the config file and the KV_SIDECAR_* environment."""
    p.add_argument("--config.file", dest="config_file", metavar="FILE",
                   help="YAML configuration (example: deploy/examples/sidecar.yaml)")
    p.add_argument("--target", action="append", metavar="URL",
                   help=f"target /metrics URL, repeatable; env KV_SIDECAR_TARGET (comma-separated) "
                        f"(default: {DEFAULT_TARGET})")
    p.add_argument("--web.listen-address", dest="web_listen_address", metavar="HOST:PORT",
                   help=f"where the sidecar serves /metrics, /healthz, /readyz (default: {DEFAULT_LISTEN})")
    p.add_argument("--scrape.interval", dest="scrape_interval", metavar="DURATION",
                   help="how often each target is scraped (default: 5s)")
    p.add_argument("--scrape.staleness", dest="scrape_staleness", metavar="DURATION",
                   help="derived gauges vanish when the last good scrape is older (default: max(3 x interval, 60s))")
    p.add_argument("--derive.window", dest="derive_window", metavar="DURATION",
                   help="window of the hit-ratio and preemption-rate gauges (default: 5m)")
    p.add_argument("--model.config", dest="model_config", metavar="PATH",
                   help="the served model's config.json or model directory (default: none)")
    p.add_argument("--model.dtype", dest="model_dtype", metavar="DTYPE",
                   help="vLLM's --dtype (default: auto = config dtype, float32 served as bfloat16)")
    p.add_argument("--model.tensor-parallel-size", dest="model_tensor_parallel_size", metavar="N",
                   help="vLLM's --tensor-parallel-size (default: 1)")
    p.add_argument("--model.pipeline-parallel-size", dest="model_pipeline_parallel_size", metavar="N",
                   help="vLLM's --pipeline-parallel-size (default: 1)")
    p.add_argument("--model.gpu-memory", dest="model_gpu_memory", metavar="SIZE|GPU",
                   help="GPU memory per rank: 80GiB, 80GB or a GPU name such as H100-80GB (default: none)")
    p.add_argument("--thresholds.watermark", dest="thresholds_watermark", metavar="FRACTION",
                   help="usage watermark for headroom and paging (default: 0.9)")
    p.add_argument("--forecast.window", dest="forecast_window", metavar="DURATION",
                   help="window of the fill-rate trend (default: 10m)")
    p.add_argument("--log.level", dest="log_level", choices=("debug", "info", "warning", "error"),
                   help="log level (default: info)")
    p.add_argument("--log.format", dest="log_format", choices=("logfmt", "json"),
                   help="log format (default: logfmt)")


def config_from_args(args: argparse.Namespace):
    flags = {RUN_FLAGS[dest]: getattr(args, dest) for dest in RUN_FLAGS if getattr(args, dest, None) is not None}
    return load_config(getattr(args, "config_file", None), flags=flags, flag_targets=getattr(args, "target", None))


def print_config_errors(e: ConfigError, file: str | None = None) -> None:
    """Every problem on its own line, after the file it is in (``file`` when the error does not say)."""
    source = file if e.source == "config" and file else e.source
    print(f"kv-sidecar: invalid configuration ({len(e.problems)} problem{'s' if len(e.problems) > 1 else ''}):",
          file=sys.stderr)
    for p in e.problems:
        print(f"  {source}: {p}", file=sys.stderr)


def extenders_for(config):
    """The layers that add gauges when their inputs are configured (capacity model, forecast)."""
    from .layers import build_extenders
    return build_extenders(config)


def cmd_run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
        extenders = extenders_for(config)
    except ConfigError as e:
        print_config_errors(e, getattr(args, "config_file", None))
        return 2
    setup_logging(config.log_level, config.log_format)
    from .daemon import serve
    try:
        asyncio.run(serve(config, extenders))
    except OSError as e:  # e.g. the listen port is taken
        print(f"kv-sidecar: cannot listen on {config.listen_address}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.file, env={}, flags={})  # the file alone, whatever this shell exports
        extenders_for(config)
    except ConfigError as e:
        print_config_errors(e, args.file)
        return 2
    print(f"{args.file}: ok ({len(config.targets)} target{'s' if len(config.targets) != 1 else ''})")
    return 0


def cmd_docs(args: argparse.Namespace) -> int:
    from .metrics import markdown_table
    sys.stdout.write(markdown_table())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kv-sidecar", description="KV-cache capacity monitor for vLLM.")
    parser.add_argument("--version", action="version", version=f"kv-cache-sidecar {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = sub.add_parser("run", help="run the sidecar daemon",
                         description="Scrape the inference server's /metrics and export KV-capacity gauges.")
    add_run_flags(run)
    run.set_defaults(func=cmd_run)
    check = sub.add_parser("check-config", help="validate a configuration file and exit (2 when invalid)")
    check.add_argument("file", metavar="FILE", help="the YAML file `kv-sidecar run --config.file` would read")
    check.set_defaults(func=cmd_check_config)
    docs = sub.add_parser("docs", help="print the metric table (Markdown) the README carries",
                          description="Print every exported metric with its type, unit, labels, meaning and "
                                      "what to do when it moves, as the Markdown table of the README.")
    docs.set_defaults(func=cmd_docs)
    for module in PLUGGED:
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            if e.name and (e.name == module or module.startswith(e.name)):
                continue  # that part is not installed in this build
            raise
        mod.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
