"""The edge that finds the scraped vLLM's process and learns its serving settings from its command line.

With ``shareProcessNamespace: true`` on the pod (Kubernetes, "Share Process Namespace between Containers
in a Pod"; ``deploy/components/process-discovery/``) the sidecar sees vLLM's processes in ``/proc``.
``/proc/<pid>/cmdline`` and ``/proc/<pid>/stat`` are readable by every user of the PID namespace (mode
0444); ``environ`` is not, and is never read. Without a shared namespace ``/proc`` shows the sidecar's own
processes only, and nothing is found: discovery is harmless there (``model.process_discovery``, on by
default).

:class:`ProcessDiscovery` (one per target) does, at most once per ``retry_s`` of sample time:

1. list ``/proc`` (at most :data:`MAX_PROCESSES` entries); per process read ``stat`` (parent pid, start
   time) and, once per (pid, start time), ``cmdline`` (at most :data:`MAX_CMDLINE_BYTES`: a longer one
   is skipped, never parsed cut); an entry that vanished or cannot be read is skipped;
2. keep the vLLM API servers (:func:`sidecar.engine_cmdline.invocation`), minus those whose parent is
   one (vLLM's engine core and workers rename themselves ``VLLM::EngineCore``; a forked child that did
   not still has its parent's command line);
3. read each one's ``--config`` YAML file through vLLM's own root and working directory
   (``/proc/<pid>/root``, ``/proc/<pid>/cwd``), bounded as every YAML input; unreadable: the command line
   alone, and a problem said;
4. pick the one listening on the target's port (``--port``, else vLLM's 8000); several: ambiguous, none
   learnt. A target that is not on this host's loopback (``127.0.0.1``, ``::1``, ``localhost``) is not a
   process of this pod: nothing is looked for.

The process is parsed again only when it changes (a restart: new pid or start time). Only the fields of
:class:`~sidecar.engine_cmdline.EngineArgs` are kept and logged; the rest of the command line (``--api-key``
and the like) is never stored, logged or exported.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

from . import engine_cmdline as cmdline
from .input_files import YAML_MAX_BYTES, FileProblem, read_yaml

log = logging.getLogger("kv_sidecar.layers")

PROC = "/proc"
#: the longest command line read; Linux allows up to ARG_MAX (2 MiB by default): a vLLM command line with
#: JSON options is a few KiB, so a longer one is skipped, never parsed cut
MAX_CMDLINE_BYTES = 128 * 1024
#: the most ``/proc`` entries looked at per poll (a pod has a few dozen; a node's PID namespace thousands)
MAX_PROCESSES = 32768
#: ``/proc/<pid>/stat`` is one line of about 300 bytes
_MAX_STAT_BYTES = 4096

FOUND = "found"
NONE = "none"
AMBIGUOUS = "ambiguous"
REMOTE = "remote"
LOOPBACK = ("127.0.0.1", "::1", "localhost")


@dataclass(frozen=True)
class Server:
    """One vLLM API server process: its pid, parent, start time (clock ticks after boot) and settings."""

    pid: int
    ppid: int
    start: int
    args: cmdline.EngineArgs


@dataclass(frozen=True)
class Discovery:
    """What a poll found: ``status`` (found, none, ambiguous, remote), the server when found, a detail."""

    status: str
    server: Server | None = None
    detail: str = ""


def read_bounded(path: str, max_bytes: int) -> bytes | None:
    """At most ``max_bytes`` of ``path``; None when it cannot be read or holds more (never blocks)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return None if size > max_bytes else b"".join(chunks)


def parse_stat(raw: bytes) -> tuple[int, int] | None:
    """``/proc/<pid>/stat`` -> (parent pid, start time in ticks), or None, also for a zombie (state Z,
    X: exited, not yet reaped). The command name (field 2) is in parentheses and may hold spaces and
    parentheses: the fields after the last ``)`` are read (proc(5): state, ppid, ..., starttime is
    field 22)."""
    text = raw.decode("ascii", errors="replace")
    _, paren, rest = text.rpartition(")")
    fields = rest.split()
    if not paren or len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    try:
        return int(fields[1]), int(fields[19])
    except ValueError:
        return None


def _pids(proc: str, limit: int) -> Iterator[int]:
    try:
        with os.scandir(proc) as entries:
            for n, entry in enumerate(entries):
                if n >= limit:
                    return
                if entry.name.isdigit():
                    yield int(entry.name)
    except OSError:
        return


def target_port(url: str) -> int | None:
    """The port of a loopback target URL (its scheme's default when none); None when not on loopback."""
    parts = urlsplit(url)
    if (parts.hostname or "") not in LOOPBACK:
        return None
    try:
        return parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None


class ProcessDiscovery:
    """Finds the vLLM server of one target in ``/proc`` and keeps its settings until it changes."""

    def __init__(self, url: str, *, retry_s: float = 15.0, proc: str = PROC, max_processes: int = MAX_PROCESSES):
        self.url = url
        self.port = target_port(url)
        self.retry_s = retry_s
        self.proc = proc
        self.max_processes = max_processes
        self._next_try = -math.inf
        #: pid -> (start time, the server or None for a process that is not one): parsed once per process
        self._seen: dict[int, tuple[int, Server | None]] = {}
        self.last = Discovery(REMOTE if self.port is None else NONE)
        self._said_none = False  # the first "not found" is said once, at info (no shared namespace: normal)

    def poll(self, now: float | None) -> Discovery:
        """Look again (at most once per ``retry_s`` of sample time ``now``; None = now), log a change."""
        if now is not None and now < self._next_try:
            return self.last
        self._next_try = -math.inf if now is None else now + self.retry_s
        found = self.look() if self.port is not None else self.last
        self._say(found)
        self.last = found
        return found

    def look(self) -> Discovery:
        """One scan of ``/proc`` for the server on :attr:`port`."""
        servers = self.servers()
        pids = {s.pid for s in servers}
        top = [s for s in servers if s.ppid not in pids]  # a server's children with its command line
        here = [s for s in top if s.args.listen_port == self.port]
        if len(here) == 1:
            return Discovery(FOUND, here[0])
        if len(here) > 1:
            return Discovery(
                AMBIGUOUS, detail=f"{len(here)} vLLM servers listen on port {self.port} (pids {_pids_of(here)})"
            )
        return Discovery(
            NONE,
            detail=f"no vLLM server on port {self.port} among {len(top)} seen"
            + (f" (pids {_pids_of(top)})" if top else " (is shareProcessNamespace set on the pod?)"),
        )

    def servers(self) -> list[Server]:
        """Every vLLM API server process ``/proc`` shows now (cached per pid and start time)."""
        alive: dict[int, tuple[int, Server | None]] = {}
        for pid in _pids(self.proc, self.max_processes):
            raw = read_bounded(f"{self.proc}/{pid}/stat", _MAX_STAT_BYTES)
            stat = parse_stat(raw) if raw is not None else None
            if stat is None:
                continue  # gone between the listing and the read, or unreadable
            ppid, start = stat
            known = self._seen.get(pid)
            if known is not None and known[0] == start:
                alive[pid] = known
                continue
            readable, server = self._read(pid, ppid, start)
            if readable:
                alive[pid] = (start, server)
        self._seen = alive
        return [s for _, s in alive.values() if s is not None]

    def _read(self, pid: int, ppid: int, start: int) -> tuple[bool, Server | None]:
        """(whether the command line could be read, the server ``pid`` runs or None when it runs something
        else); one that could not (gone, unreadable, too long) is looked at again next time."""
        raw = read_bounded(f"{self.proc}/{pid}/cmdline", MAX_CMDLINE_BYTES)
        if raw is None:
            return False, None
        inv = cmdline.invocation(cmdline.split_cmdline(raw))
        if inv is None:
            return True, None
        config, problem = self._config_file(pid, inv.config_file)
        args = cmdline.parse(inv, config)
        if problem:
            args = _with_problem(args, problem)
        return True, Server(pid, ppid, start, args)

    def _config_file(self, pid: int, path: str | None) -> tuple[dict[str, Any] | None, str | None]:
        """vLLM's ``--config`` file as vLLM sees it (through its root, or its working directory for a
        relative path); (None, problem) when it cannot be read. The path is not said (it came from the
        command line)."""
        if path is None:
            return None, None
        seen_from = f"{self.proc}/{pid}/root{path}" if path.startswith("/") else f"{self.proc}/{pid}/cwd/{path}"
        try:
            data = read_yaml(seen_from, max_bytes=YAML_MAX_BYTES, what="vLLM's --config file")
        except (FileProblem, OSError):
            return None, "--config: the file could not be read (its options are vLLM's defaults here)"
        if not isinstance(data, dict):
            return None, "--config: not a mapping of options"
        return data, None

    def _say(self, found: Discovery) -> None:
        """Log a change of what is found (a new server, a restart, a loss, an ambiguity) once, and the
        first "not found" once, at info (a pod without a shared PID namespace: the normal case)."""
        last, first_none = self.last, found.status == NONE and not self._said_none
        self._said_none = self._said_none or found.status == NONE
        if found.status == last.status and _identity(found.server) == _identity(last.server) and not first_none:
            if found.status != AMBIGUOUS or found.detail == last.detail:
                return
        if found.server is not None:
            s = found.server
            log.info(
                "vLLM's command line read pid=%d port=%d %s%s",
                s.pid,
                s.args.listen_port,
                describe(s.args),
                "".join(f" problem={p!r}" for p in s.args.problems),
            )
        elif found.status == AMBIGUOUS:
            log.warning("vLLM's command line not used: %s; the model.* settings apply", found.detail)
        elif last.server is not None:
            log.warning("vLLM's process is gone (%s); the model.* settings apply until it is back", found.detail)
        elif first_none:
            log.info("vLLM's command line not read: %s; the model.* settings apply", found.detail)


def _identity(server: Server | None) -> tuple[int, int] | None:
    return None if server is None else (server.pid, server.start)


def _pids_of(servers: list[Server]) -> str:
    return ", ".join(str(s.pid) for s in sorted(servers, key=lambda s: s.pid))


def _with_problem(args: cmdline.EngineArgs, problem: str) -> cmdline.EngineArgs:
    return replace(args, problems=(*args.problems, problem))


#: the settings :func:`describe` shows (the typed fields; never the rest of the command line)
SHOWN = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "max_model_len",
    "gpu_memory_utilization",
    "kv_cache_memory_bytes",
    "kv_cache_dtype",
    "dtype",
    "quantization",
    "max_num_seqs",
    "max_num_batched_tokens",
    "enforce_eager",
)


def describe(args: cmdline.EngineArgs) -> str:
    """The learnt settings as logfmt pairs (only those on the command line)."""
    pairs = [f"{name}={getattr(args, name)}" for name in SHOWN if getattr(args, name) is not None]
    return " ".join(pairs) or "(no capacity setting on it: vLLM's defaults)"
