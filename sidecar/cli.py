"""``kv-sidecar``: the command-line entry point.

Subcommands: ``run`` (the daemon), ``check-config``, ``demo`` (simulator +
sidecar), ``simulate``, ``capacity``, ``rules``, ``dashboards`` (render, push,
snapshot), ``docs``. Exit codes: 0 ok,
2 bad configuration or input (every problem printed, nothing served).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import signal
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from . import __version__
from .config import Config, ConfigError, load_config, print_config_errors
from .logs import setup_logging
from .setting_parsers import Duration
from .settings import (
    DEFAULT_AUTO_RELOAD_INTERVAL,
    DEFAULT_TARGET,
    FILE_FLAGS,
    SETTINGS,
    TARGETS_ENV,
    TARGETS_FLAG,
    add_flag,
)

if TYPE_CHECKING:
    from .webconfig import WebConfig

    #: what ``add_subparsers()`` returns (only annotations name it: Python 3.11 cannot subscript it at run time)
    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]

#: flag dest -> (config section, key), for every setting the settings table gives a flag
RUN_FLAGS: dict[str, tuple[str, str]] = {s.dest: (s.section, s.key) for s in SETTINGS if s.run_flag}


def add_run_flags(p: argparse.ArgumentParser) -> None:
    """The daemon's flags; each wins over the config file and the KV_SIDECAR_* environment.

    Generated from the settings table: one flag per setting that has one, its help ending with the
    table's default.
    """
    for f in FILE_FLAGS:
        p.add_argument(f.flag, dest=f.dest, metavar=f.metavar, help=f.help)
    p.add_argument(
        TARGETS_FLAG,
        action="append",
        metavar="URL",
        help=f"target /metrics URL, repeatable; env {TARGETS_ENV} (comma-separated) (default: {DEFAULT_TARGET})",
    )
    for s in SETTINGS:
        if s.run_flag:
            add_flag(p, s, s.default_text())


def config_from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Config:
    """The configuration ``kv-sidecar run`` was given: file, environment (``env``, default: this process's)
    and its flags.

    Validated exactly as ``check-config`` validates (``sidecar.config.build_config``), but for one
    thing: a ``model.config`` that names no file yet is not an error here (vLLM may still be
    downloading the model; the capacity layer warns and waits for it).
    """
    return load_config(
        getattr(args, "config_file", None),
        env=env,
        flags=_run_flags(args),
        flag_targets=getattr(args, "target", None),
        model_missing_ok=True,
    )


def _stop_before_serving(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _early_signals() -> None:
    """Until the daemon installs its own handlers: SIGHUP (a reload) never stops the process, and
    SIGTERM/SIGINT stop it cleanly with exit 0 (not 143, nor a KeyboardInterrupt traceback)."""
    try:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, _stop_before_serving)
        signal.signal(signal.SIGINT, _stop_before_serving)
    except ValueError:  # not the main thread (tests calling main())
        pass


def _ignore_signals() -> None:
    """Once the daemon has stopped: SIGTERM, SIGINT and SIGHUP are ignored for the last instants of the exit.

    Ignored, not handled: the interpreter resets a Python handler to the default action while it
    finalizes, and a SIGTERM landing then would end the process with 143 instead of the stop's code.
    """
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        try:
            signal.signal(sig, signal.SIG_IGN)
        except ValueError:  # not the main thread (tests calling main())
            pass


def _run_flags(args: argparse.Namespace) -> dict[tuple[str, str], object]:
    return {RUN_FLAGS[dest]: getattr(args, dest) for dest in RUN_FLAGS if getattr(args, dest, None) is not None}


def cmd_run(args: argparse.Namespace) -> int:
    """``kv-sidecar run``. Bad flags or environment (the pod spec: fixed only by a new rollout) exit 2
    before serving. A bad ``--config.file`` (a ConfigMap, edited under running pods) or web configuration
    never stops the sidecar: it says what is wrong and waits for the fix (docs/kubernetes.md, "Never gate
    vLLM"), so a ConfigMap edit can never keep the next vLLM pod from becoming Ready."""
    _early_signals()
    from .webconfig import load_web_config  # deferred: TLS and bcrypt are needed only here

    env = dict(os.environ)  # a reload reads the file again with the environment and flags of the start
    web_file: str | None = getattr(args, "web_config_file", None)
    interval_text = getattr(args, "config_auto_reload_interval", None) or DEFAULT_AUTO_RELOAD_INTERVAL
    try:
        interval = Duration(zero_ok=True)(interval_text)
        builtin = load_config(
            None, env=env, flags=_run_flags(args), flag_targets=getattr(args, "target", None), model_missing_ok=True
        )
    except ValueError as e:
        print(f"kv-sidecar: --config.auto-reload-interval: {e}", file=sys.stderr)
        return 2
    except ConfigError as e:  # the flags or the environment: a new rollout is the only fix
        print_config_errors(e, None)
        return 2
    setup_logging(builtin.log_level, builtin.log_format)
    load = functools.partial(config_from_args, args, env)
    load_web = functools.partial(load_web_config, web_file)
    config = web = None
    while config is None or web is None:
        config, web = _try_start(load, load_web, args)
        if web is None:  # TLS or basic auth that cannot be honoured: nothing is served until it can
            _wait(interval or START_RETRY_S)
        elif config is None:
            config = _serve_builtin(builtin, web, load, interval or START_RETRY_S)
            if config is None:
                return 0  # stopped (SIGTERM) while waiting for a good file
    return _serve(args, config, web, env, interval)


#: How often a configuration that could not be used at start is read again when the watch is off.
START_RETRY_S = 5.0
#: The problems last printed at start, so that a file read again every few seconds is reported once.
_last_start_problem: list[str] = []


def _try_start(
    load: Callable[[], Config], load_web: Callable[[], WebConfig], args: argparse.Namespace
) -> tuple[Config | None, WebConfig | None]:
    """Both files, each as it reads now; a problem is printed once, until it changes."""
    config = web = None
    problems = []
    try:
        config = load()
    except ConfigError as e:
        problems.append((e, getattr(args, "config_file", None)))
    try:
        web = load_web()
    except ConfigError as e:
        problems.append((e, getattr(args, "web_config_file", None)))
    text = [f"{error.source}: {p}" for error, _ in problems for p in error.problems]
    if problems and text != _last_start_problem:
        _last_start_problem[:] = text
        for error, path in problems:
            print_config_errors(error, path)
        print(
            "kv-sidecar: not stopping: "
            + ("serving the built-in configuration" if web is not None else "nothing is served")
            + " until the file is fixed (read again every few seconds)",
            file=sys.stderr,
        )
    return config, web


def _wait(seconds: float) -> None:
    import time

    time.sleep(seconds)


def _serve_builtin(builtin: Config, web: WebConfig, load: Callable[[], Config], interval: float) -> Config | None:
    """Serve ``builtin`` (flags, environment and defaults: vLLM on 127.0.0.1:8000) with
    ``kvcache_sidecar_config_last_reload_successful`` 0 until ``load`` succeeds; its Config then, or None
    when stopped first."""
    from .daemon import serve
    from .layers import build_extenders
    from .reload import Sources

    fixed: list[Config] = []

    async def main() -> None:
        stop = asyncio.Event()

        async def watch() -> None:
            while not stop.is_set():
                await asyncio.sleep(interval)
                try:
                    fixed.append(await asyncio.to_thread(load))
                except ConfigError as e:
                    text = [f"{e.source}: {p}" for p in e.problems]
                    if text != _last_start_problem:
                        _last_start_problem[:] = text
                        print_config_errors(e, None)
                    continue
                stop.set()

        task = asyncio.create_task(watch())
        try:
            await serve(
                builtin,
                build_extenders(builtin),
                stop=stop,
                sources=Sources(load=load, load_web=lambda: web),
                web=web,
                refused_at_start=True,
            )
        finally:
            task.cancel()

    try:
        asyncio.run(main())
    except OSError as e:  # as `run` with a good file: the port is the pod spec's (a flag) or taken
        print(f"kv-sidecar: cannot listen on {builtin.listen_address}: {e.strerror or e}", file=sys.stderr)
        raise SystemExit(1) from None
    finally:
        _ignore_signals()
        _early_signals()
    if fixed:
        print("kv-sidecar: the configuration file is fixed; serving it", file=sys.stderr)
    return fixed[0] if fixed else None


def _serve(args: argparse.Namespace, config: Config, web: WebConfig, env: Mapping[str, str], interval: float) -> int:
    # Deferred: the layers (httpx, the capacity model) and the daemon (apscheduler) would add ~120 ms
    # to every `kv-sidecar --help` and to the subcommands that never serve.
    from .daemon import serve
    from .layers import build_extenders
    from .reload import Sources
    from .webconfig import load_web_config

    web_file: str | None = getattr(args, "web_config_file", None)
    sources = Sources(
        load=lambda: config_from_args(args, env),
        load_web=lambda: load_web_config(web_file),
        watched=tuple(p for p in (getattr(args, "config_file", None), web_file) if p),
        watch_interval_s=interval,
    )
    setup_logging(config.log_level, config.log_format)  # first: the layers may log (a model not there yet)
    extenders = build_extenders(config)
    try:
        asyncio.run(serve(config, extenders, sources=sources, web=web, build_layers=build_extenders))
    except OSError as e:  # e.g. the listen port is taken
        print(f"kv-sidecar: cannot listen on {config.listen_address}: {e.strerror or e}", file=sys.stderr)
        return 1
    finally:
        _ignore_signals()  # the loop's handlers are gone once it closed: a late signal must not change the exit code
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    from .webconfig import load_web_config  # deferred: TLS and bcrypt are needed only with --web.config.file

    failed = False
    try:
        # The file alone, whatever this shell exports; a model.config not there yet passes, as `run` waits for it.
        config = load_config(args.file, env={}, flags={}, model_missing_ok=True)
    except ConfigError as e:
        print_config_errors(e, args.file)
        failed = True
    if args.web_config_file:
        try:
            web = load_web_config(args.web_config_file)
        except ConfigError as e:
            print_config_errors(e, args.web_config_file)
            failed = True
    if failed:
        return 2
    print(f"{args.file}: ok ({len(config.targets)} target{'s' if len(config.targets) != 1 else ''})")
    waiting = model_waiting(config.model.config)
    if waiting:
        print(f"{args.file}: note: {waiting}")
    if args.web_config_file:
        auth = f"basic auth for {len(web.users)} user{'s' if len(web.users) != 1 else ''}" if web.users else "no auth"
        print(f"{args.web_config_file}: ok ({web.scheme}, {auth})")
    return 0


def model_waiting(path: str | None) -> str | None:
    """What ``run`` would wait for at start: a ``model.config`` not there yet, or a hub cache (the model
    vLLM names); None when the file is there or none is set."""
    if path is None:
        return None
    from .model_discovery import is_hub_cache, locate

    if is_hub_cache(path):
        return f"model.config: {path} is a Hugging Face hub cache; the model is the one vLLM serves"
    found = locate(path, None)
    if found.path is None:
        return f"model.config: {found.detail}; `run` serves and waits for it (kvcache_model_config_loaded)"
    return None


def cmd_docs(args: argparse.Namespace) -> int:
    from .artifacts.docs import markdown_table  # deferred: only this subcommand needs the generators

    sys.stdout.write(markdown_table())
    return 0


def _add_own(sub: SubParsers) -> None:
    """``run``, ``check-config`` and ``docs``: this module's own."""
    run = sub.add_parser(
        "run",
        help="run the sidecar daemon",
        description="Scrape the inference server's /metrics and export KV-capacity gauges.",
    )
    add_run_flags(run)
    run.set_defaults(func=cmd_run)
    check = sub.add_parser("check-config", help="validate a configuration file and exit (2 when invalid)")
    check.add_argument("file", metavar="FILE", help="the YAML file `kv-sidecar run --config.file` would read")
    check.add_argument(
        "--web.config.file",
        dest="web_config_file",
        metavar="FILE",
        help="also validate this web configuration (TLS files loaded, bcrypt hashes checked), as `run` would",
    )
    check.set_defaults(func=cmd_check_config)
    docs = sub.add_parser(
        "docs",
        help="print the metric table (Markdown) docs/metrics.md carries",
        description="Print every exported metric with its type, unit, labels, meaning and "
        "what to do when it moves, as the Markdown table of docs/metrics.md.",
    )
    docs.set_defaults(func=cmd_docs)


# Each of the others lives in its own module, imported when its parser is built: `kv-sidecar run` loads the
# daemon's code only, never the simulator's, the report's or the dashboards'.
def _add_demo(sub: SubParsers) -> None:
    from . import demo

    demo.add_parser(sub)


def _add_simulate(sub: SubParsers) -> None:
    from .simulator import cli

    cli.add_parser(sub)


def _add_capacity(sub: SubParsers) -> None:
    from .capacity import cli

    cli.add_parser(sub)


def _add_rules(sub: SubParsers) -> None:
    from .artifacts import cli

    cli.add_parser(sub)


def _add_dashboards(sub: SubParsers) -> None:
    from .artifacts import dashboards_cli

    dashboards_cli.add_parser(sub)


def _add_report(sub: SubParsers) -> None:
    from .report import cli

    cli.add_parser(sub)


#: Every subcommand, in ``kv-sidecar --help`` order: the names a module adds, and the function adding them.
SUBCOMMANDS: tuple[tuple[tuple[str, ...], Callable[[SubParsers], None]], ...] = (
    (("run", "check-config", "docs"), _add_own),
    (("demo",), _add_demo),
    (("simulate",), _add_simulate),
    (("capacity",), _add_capacity),
    (("rules",), _add_rules),
    (("dashboards",), _add_dashboards),
    (("report", "reporter"), _add_report),
)


#: Where the optional subcommands' dependencies come from (pyproject.toml's extras).
EXTRAS_HINT = "pip install 'kv-cache-sidecar[dashboards,report]' (the daemon's image leaves them out)"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``kv-sidecar``; with ``command`` (a known subcommand), only that one's.

    ``kv-sidecar run ...`` builds the daemon's parser alone, so the daemon never imports the other
    subcommands' modules; ``--help``, no command or an unknown one builds them all (argparse then lists
    every choice). A subcommand whose optional dependencies are not installed is left out of the list.
    """
    parser = argparse.ArgumentParser(
        prog="kv-sidecar",
        description="KV-cache capacity monitor for LLM inference servers (vLLM, SGLang, TensorRT-LLM, TGI, llama.cpp).",
    )
    parser.add_argument("--version", action="version", version=f"kv-cache-sidecar {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = [add for names, add in SUBCOMMANDS if command in names]
    for add in chosen or [add for _, add in SUBCOMMANDS]:
        try:
            add(sub)
        except ImportError as e:
            if not (e.name or "").startswith(("grafana", "matplotlib")):
                raise
            if chosen:  # exit 2, with the usage: the command needs an extra this build does not have
                parser.error(f"{command} needs {e.name}, which this build does not have: {EXTRAS_HINT}")
            # an optional extra not installed in this build: that subcommand is not offered
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
