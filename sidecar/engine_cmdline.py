"""vLLM's command line -> the few serving settings the capacity model needs (pure: no I/O).

vLLM exports neither its tensor- nor its pipeline-parallel size in ``/metrics`` (0.32), and the Downward
API does not show one container's arguments to another. With ``shareProcessNamespace: true`` the sidecar
sees vLLM's processes, and ``/proc/<pid>/cmdline`` is readable by any user of the PID namespace
(:mod:`sidecar.process_discovery`, the edge, reads it). This module reads such a command line as vLLM
does:

* the program: ``vllm serve [MODEL] ...`` (``vllm/entrypoints/cli/serve.py``), ``python -m
  vllm.entrypoints.cli.main serve ...`` and ``python -m vllm.entrypoints.openai.api_server --model
  MODEL ...`` (:func:`invocation`); anything else is not a vLLM API server;
* the options of :data:`OPTIONS`, with the spellings ``vllm/engine/arg_utils.py``
  (``EngineArgs.add_cli_args``) gives them: ``--tensor-parallel-size``/``-tp``,
  ``--pipeline-parallel-size``/``-pp``, ``--data-parallel-size``/``-dp``, ``--quantization``/``-q``,
  ``--gpu-memory-utilization``/``--device-memory-utilization``; ``--flag value`` and ``--flag=value``;
  underscores read as hyphens (``FlexibleArgumentParser.parse_args`` in ``vllm/utils/argparse_utils.py``
  does the same); the last occurrence wins, as in argparse;
* ``--config FILE``: vLLM's YAML file of options. ``FlexibleArgumentParser._pull_args_from_config``
  inserts its options *before* the command line's, so the command line wins over the file; the caller
  reads the file (:func:`config_file_args` turns its mapping into options the same way
  ``load_config_file`` does) and :func:`parse` applies that order;
* the sizes vLLM reads with ``human_readable_int`` (``--max-num-batched-tokens 8k``,
  ``--kv-cache-memory-bytes 4G``) and ``human_readable_int_or_auto`` (``--max-model-len 32K``, ``auto``, -1).

Nothing else is kept. A command line also carries ``--api-key``, tokens and URLs with credentials: an
option not in :data:`OPTIONS` is skipped without being stored, a problem names the option, never its
value, and :func:`parse` returns only the typed fields of :class:`EngineArgs`.
(``tests/test_process_discovery.py`` checks that a secret given on the command line appears in no log
line, gauge or error.) Unambiguous prefixes of a long option (argparse's ``allow_abbrev``) are not
followed, except ``--kv-cache-memory``, which vLLM's own start-up log advises: a command line that
abbreviates ``--tensor-parallel-size`` reads as vLLM's default there.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: ``python -m MODULE`` entry points of vLLM's OpenAI-compatible server (0.32: ``vllm/entrypoints/``)
API_SERVER_MODULES = ("vllm.entrypoints.openai.api_server",)
#: ``python -m MODULE serve``: the ``vllm`` console script's module
CLI_MODULES = ("vllm.entrypoints.cli.main",)
#: the port vLLM listens on without ``--port`` (``vllm/entrypoints/openai/cli_args.py``, ``make_arg_parser``)
DEFAULT_PORT = 8000

#: dest -> (kind, option strings), as ``vllm/engine/arg_utils.py`` and the server's parser spell them.
#: kind: int, size (``human_readable_int``), len (``human_readable_int_or_auto``), float, text, names
#: (``nargs="+"``), flag (``BooleanOptionalAction``: ``--x`` / ``--no-x``).
OPTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "model": ("text", ("--model",)),
    "served_model_name": ("names", ("--served-model-name",)),
    "tensor_parallel_size": ("int", ("--tensor-parallel-size", "-tp")),
    "pipeline_parallel_size": ("int", ("--pipeline-parallel-size", "-pp")),
    "data_parallel_size": ("int", ("--data-parallel-size", "-dp")),
    "gpu_memory_utilization": ("float", ("--gpu-memory-utilization", "--device-memory-utilization")),
    "max_model_len": ("len", ("--max-model-len",)),
    "kv_cache_dtype": ("text", ("--kv-cache-dtype",)),
    "max_num_seqs": ("int", ("--max-num-seqs",)),
    "max_num_batched_tokens": ("size", ("--max-num-batched-tokens",)),
    "enforce_eager": ("flag", ("--enforce-eager",)),
    # ``--kv-cache-memory``: an argparse abbreviation vLLM's own start-up log advises (gpu_worker.py)
    "kv_cache_memory_bytes": ("size", ("--kv-cache-memory-bytes", "--kv-cache-memory")),
    "dtype": ("text", ("--dtype",)),
    "quantization": ("text", ("--quantization", "-q")),
    "port": ("int", ("--port",)),
}
_BY_OPTION = {opt: dest for dest, (_, opts) in OPTIONS.items() for opt in opts}
_FLAGS = {f"--no-{opts[0][2:]}": dest for dest, (kind, opts) in OPTIONS.items() if kind == "flag"}
_CONFIG = "--config"
_HUMAN = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


@dataclass(frozen=True)
class Invocation:
    """A vLLM API server's command line, split: the options after the program (``args``), whether it
    is ``vllm serve`` (a positional model), and the ``--config`` file it names (None: none)."""

    args: tuple[str, ...]
    serve: bool
    config_file: str | None


@dataclass(frozen=True)
class EngineArgs:
    """The serving settings read from a command line (None: not on it, so vLLM's default or the page)."""

    model: str | None = None
    served_model_name: tuple[str, ...] | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    data_parallel_size: int | None = None
    gpu_memory_utilization: float | None = None
    #: None also for ``auto``/-1 (vLLM fits it to memory: the page's figure says what it chose)
    max_model_len: int | None = None
    kv_cache_dtype: str | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enforce_eager: bool | None = None
    kv_cache_memory_bytes: int | None = None
    dtype: str | None = None
    quantization: str | None = None
    port: int | None = None
    #: options whose value could not be read: the option's name and why, never the value
    problems: tuple[str, ...] = field(default=())

    @property
    def listen_port(self) -> int:
        """The port the server listens on (vLLM's default without ``--port``)."""
        return self.port or DEFAULT_PORT

    @property
    def served_names(self) -> tuple[str, ...]:
        """The names vLLM serves the model as: ``--served-model-name``, else the model as given."""
        return self.served_model_name or ((self.model,) if self.model else ())


def _python_module(argv: Sequence[str]) -> tuple[str, int] | None:
    """``python [opts] -m MODULE ...`` -> (MODULE, index after it); None for anything else."""
    for i, arg in enumerate(argv[1:], start=1):
        if arg == "-m" and i + 1 < len(argv):
            return argv[i + 1], i + 2
        if arg.startswith("-m") and len(arg) > 2:
            return arg[2:], i + 1
        if not arg.startswith("-") or arg in ("-c", "-"):
            return None  # a script or -c: not a module
    return None


def _basename(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def invocation(argv: Sequence[str]) -> Invocation | None:
    """The vLLM API server ``argv`` runs (the process's ``/proc/<pid>/cmdline``), else None.

    ``vllm serve``, ``python /path/to/vllm serve``, ``python -m vllm.entrypoints.cli.main serve`` and
    ``python -m vllm.entrypoints.openai.api_server``; vLLM's engine-core and worker processes rename
    themselves (``VLLM::EngineCore``, ``set_process_title`` in ``vllm/utils/system_utils.py``) and are not
    servers; nor is ``vllm bench`` or ``vllm chat``."""
    if not argv:
        return None
    start: int | None = None
    serve = False
    program = _basename(argv[0])
    if program == "vllm":
        start, serve = 1, True
    elif program.startswith("python"):
        module = _python_module(argv)
        if module is not None and module[0] in API_SERVER_MODULES:
            start = module[1]
        elif module is not None and module[0] in CLI_MODULES:
            start, serve = module[1], True
        elif module is None and len(argv) > 1 and _basename(argv[1]) == "vllm":
            start, serve = 2, True
    if start is None:
        return None
    if serve:
        if start >= len(argv) or argv[start] != "serve":
            return None
        start += 1
    args = tuple(argv[start:])
    return Invocation(args, serve, _config_file(args))


def _config_file(args: Sequence[str]) -> str | None:
    """The ``--config FILE`` of ``args`` (vLLM accepts one), else None."""
    for i, arg in enumerate(args):
        if arg == _CONFIG and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(_CONFIG + "="):
            return arg[len(_CONFIG) + 1 :]
    return None


def config_file_args(config: Mapping[str, Any]) -> list[str]:
    """vLLM's YAML config file (its mapping) as the options vLLM makes of it, only for :data:`OPTIONS`
    (``FlexibleArgumentParser.load_config_file``: ``key: value`` -> ``--key value``, ``true`` -> ``--key``,
    a list -> ``--key a b``); other keys are skipped unread."""
    out: list[str] = []
    for key, value in config.items():
        option = _normal("--" + str(key))
        dest = _BY_OPTION.get(option, _FLAGS.get(option))
        if dest is None:
            continue
        if isinstance(value, bool):
            if value:
                out.append(option)
            elif OPTIONS[dest][0] == "flag":
                out.append(f"--no-{option[2:]}")
        elif isinstance(value, list):
            out += [option, *(str(v) for v in value)] if value else []
        elif isinstance(value, dict):
            out += [option, json.dumps(value)]
        elif value is not None:
            out += [option, str(value)]
    return out


def _normal(option: str) -> str:
    """``--tensor_parallel_size`` -> ``--tensor-parallel-size`` (vLLM: up to the first ``.``)."""
    if not option.startswith("--"):
        return option
    head, dot, tail = option[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + tail


def _scan(args: Sequence[str]) -> tuple[dict[str, list[str]], list[str]]:
    """The raw values of :data:`OPTIONS` in ``args`` (last one last) and problems; nothing else kept."""
    raw: dict[str, list[str]] = {}
    problems: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not arg.startswith("-"):
            continue
        option, eq, inline = arg.partition("=")
        option = _normal(option)
        if option in _FLAGS:
            raw[_FLAGS[option]] = ["false"]
            continue
        dest = _BY_OPTION.get(option)
        if dest is None:
            continue  # not ours: neither the option nor its value is kept
        kind = OPTIONS[dest][0]
        if kind == "flag":
            raw[dest] = ["true"]
        elif eq:
            raw[dest] = [inline]
        elif kind == "names":
            values = []
            while i < len(args) and not args[i].startswith("-"):
                values.append(args[i])
                i += 1
            raw[dest] = values
        elif i < len(args):
            raw[dest] = [args[i]]
            i += 1
        else:
            problems.append(f"{option}: no value")
    return raw, problems


def human_readable_int(text: str) -> int:
    """vLLM's ``human_readable_int`` (``vllm/utils/argparse_utils.py``): ``8k`` = 8000, ``8K`` = 8192,
    ``25.6k`` = 25600; a binary suffix takes no decimals. ValueError otherwise."""
    text = text.strip()
    match = _HUMAN.fullmatch(text)
    if match is None:
        return int(text)
    number, suffix = match.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    return int(number) * _BINARY[suffix]


def _value(kind: str, values: list[str]) -> Any:
    """One option's raw value(s) typed by its kind; ValueError when it does not read."""
    text = values[-1] if values else ""
    if kind == "int":
        return int(text)
    if kind == "size":
        return human_readable_int(text)
    if kind == "len":
        if text.strip() == "-1" or text.strip().lower() == "auto":
            return None
        return human_readable_int(text)
    if kind == "float":
        return float(text)
    if kind == "flag":
        return text == "true"
    if kind == "names":
        if not values:
            raise ValueError("no value")
        return tuple(values)
    return text


def parse(inv: Invocation, config: Mapping[str, Any] | None = None) -> EngineArgs:
    """The settings of a vLLM server's command line, its ``--config`` file's mapping (read by the
    caller; None: none or not readable) under it: the command line wins, as in vLLM."""
    args = list(inv.args)
    positional = args[0] if inv.serve and args and not args[0].startswith("-") else None
    raw, problems = _scan((config_file_args(config) if config else []) + args)
    values: dict[str, Any] = {}
    for dest, found in raw.items():
        try:
            values[dest] = _value(OPTIONS[dest][0], found)
        except ValueError:
            problems.append(f"{OPTIONS[dest][1][0]}: not a valid {OPTIONS[dest][0]}")
    if positional is not None:  # `vllm serve MODEL`: the positional wins over --model (serve.py)
        values["model"] = positional
    return EngineArgs(**values, problems=tuple(problems))


def parse_argv(argv: Sequence[str], config: Mapping[str, Any] | None = None) -> EngineArgs | None:
    """:func:`parse` of :func:`invocation`; None when ``argv`` is not a vLLM API server."""
    inv = invocation(argv)
    return None if inv is None else parse(inv, config)


def split_cmdline(raw: bytes) -> list[str]:
    """``/proc/<pid>/cmdline`` bytes -> argv (NUL-separated, a trailing NUL; undecodable bytes replaced)."""
    text = raw.decode("utf-8", errors="replace")
    parts = text.split("\0")
    if parts and parts[-1] == "":
        parts.pop()
    return parts
