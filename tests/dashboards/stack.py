"""A real serving stack for the dashboard tests: simulated vLLM pods, their sidecars and Prometheus.

    kv-sidecar simulate  x 4     two models in two namespaces, two pods each (PODS below):
                                 one pod is redeployed with new settings, restarts and ramps
                                 past saturation (preempting), one restarts, two run steady
      <- kv-sidecar run  x 4     one sidecar per pod, scraping every second, with the bundled
                                 Llama-3.1-8B config.json and the simulator's memory numbers
                                 (as ``kv-sidecar demo`` does), so the capacity, forecast and
                                 advice gauges exist
      <- prometheus              Debian's binary, scraping every sidecar (job kv-cache-sidecar)
                                 and every simulator (job vllm) every second, with the static
                                 ``namespace``/``pod`` labels a kube-prometheus PodMonitor would
                                 give them, evaluating the *fast* variant of our rules

Everything listens on 127.0.0.1 on free ports, logs into the stack's directory and is stopped
when the ``running_stack`` context exits, also when a test fails. ``running_stack(..., pods=...)``
starts only some of the pods (a smaller, faster stack for tests that need little data).
``wait_for_signals`` blocks (bounded) until the stack shows what the dashboards draw: a firing
``KVCacheAlmostFull`` and a firing critical alert, the restarts, the configuration change,
preemptions, the advice gauges and several evaluations of the recording rules (or, given
``signals``, only those).
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from processes import Processes, free_port, http_get, http_status, kv_sidecar, prometheus_argv

from sidecar.artifacts.files import dump_yaml
from sidecar.artifacts.panels import PrometheusAPI, PrometheusError
from sidecar.generations import Generation
from sidecar.simulator import SCENARIOS, SimConfig

REPO = Path(__file__).resolve().parents[2]
BUNDLED_MODEL = REPO / "sidecar" / "data" / "llama-3.1-8b.config.json"

#: The generation the simulator speaks by default (vLLM 0.21+), then two older ones: V1 before the
#: rename of the cache metrics, and V0 (no engine label, no waiting-by-reason).
CURRENT = Generation.V1_CAPACITY_LABELS.value
GENERATIONS = (CURRENT, Generation.V1_GPU_NAMES.value, Generation.V0.value)

#: The job names: the rules' default ``alerts.sidecar_job``, and vLLM's own /metrics.
SIDECAR_JOB, VLLM_JOB = "kv-cache-sidecar", "vllm"


@dataclass(frozen=True)
class Pod:
    """One simulated vLLM pod: where it runs, what it serves and the workload it is driven by."""

    namespace: str
    name: str
    model_name: str
    scenario: str
    #: simulated seconds per wall-clock second
    speed: float
    seed: int
    #: the scenario drives it past the 0.8 warning for long enough that KVCacheAlmostFull fires
    saturates: bool = False
    #: first deployed with this --gpu-memory-utilization, then redeployed with the scenario's own
    #: (0.9): a configuration change
    first_gpu_memory_utilization: float | None = None

    @property
    def restarts(self) -> bool:
        return SCENARIOS[self.scenario].restart_at is not None


MODEL_A, MODEL_B = "llama-3.1-8b-chat", "llama-3.1-8b-batch"

#: vllm-a-0 has everything an on-call engineer looks for on one pod: it is redeployed with another
#: gpu_memory_utilization right after the start (a configuration change), then restart-mid-ramp at
#: 90x restarts vLLM after about 10 s and saturates it (preempting) after about 20 s of wall time;
#: KVCacheAlmostFull (warning; fast rules: 20 s) fires after about 40 s. vllm-b-0 restarts after 10 s.
PODS: tuple[Pod, ...] = (
    Pod(
        "team-a", "vllm-a-0", MODEL_A, "restart-mid-ramp", 90, seed=1, saturates=True, first_gpu_memory_utilization=0.85
    ),
    Pod("team-a", "vllm-a-1", MODEL_A, "steady", 30, seed=2),
    Pod("team-b", "vllm-b-0", MODEL_B, "restart", 30, seed=3),
    Pod("team-b", "vllm-b-1", MODEL_B, "steady-high", 30, seed=4),
)


@dataclass
class Stack:
    """A running stack; ``started``: the Unix time by which Prometheus had scraped every target once."""

    generation: str
    pods: tuple[Pod, ...]
    api: PrometheusAPI
    procs: Processes
    workdir: Path
    started: float = 0.0


def sidecar_config(pod: Pod, sim_port: int, port: int) -> dict[str, Any]:
    """The sidecar of one pod: ``kv-sidecar demo``'s settings (bundled model, the simulator's memory)."""
    sim = SimConfig()
    return {
        "targets": [{"url": f"http://127.0.0.1:{sim_port}/metrics", "clock": "simulated", "timeout": "800ms"}],
        "web": {"listen_address": f"127.0.0.1:{port}"},
        "scrape": {"interval": "1s"},
        "derive": {"window": "5m"},
        # The advice withholds a lower setting until a whole peak window has been watched (1h by
        # default, two minutes of wall time at 30x): shortened so the steady pods advise too.
        "forecast": {"peak_window": "10m"},
        "model": {
            "config": str(BUNDLED_MODEL),
            "gpu_memory": str(sim.gpu_memory_bytes),
            "weights_memory": sim.weights_bytes,
            "activation_memory": sim.activation_bytes,
            "non_torch_memory": sim.non_torch_bytes,
            "cudagraph_memory": 0,
        },
    }


def prometheus_config(rule_file: Path, pods: tuple[Pod, ...], ports: dict[str, tuple[int, int]]) -> dict[str, Any]:
    """Scrape each sidecar and each simulator every second, labelled like a PodMonitor would."""

    def job(name: str, which: int) -> dict[str, Any]:
        return {
            "job_name": name,
            "static_configs": [
                {
                    "targets": [f"127.0.0.1:{ports[p.name][which]}"],
                    "labels": {"namespace": p.namespace, "pod": p.name},
                }
                for p in pods
            ],
        }

    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rule_file)],
        "scrape_configs": [job(SIDECAR_JOB, 1), job(VLLM_JOB, 0)],
    }


def render_fast_rules(out: Path) -> Path:
    """``kv-sidecar rules render --variant fast`` into ``out``; the rule file's path."""
    res = subprocess.run(
        [*kv_sidecar(), "rules", "render", "--variant", "fast", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert res.returncode == 0, f"kv-sidecar rules render failed: {res.stderr}"
    return out / "kvcache.rules.yaml"


def _simulator_argv(pod: Pod, generation: str, port: int, gpu_memory_utilization: float | None) -> list[str]:
    argv = [
        *kv_sidecar(),
        "simulate",
        *("--host", "127.0.0.1", "--port", str(port)),
        *("--scenario", pod.scenario, "--speed", str(pod.speed), "--seed", str(pod.seed)),
        *("--model-name", pod.model_name, "--metrics-generation", generation),
    ]
    if gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
    return argv


def _start_pod(procs: Processes, workdir: Path, pod: Pod, generation: str, ports: tuple[int, int]) -> None:
    """The pod's simulator (its first deployment when it is redeployed later) and its sidecar."""
    sim_port, port = ports
    first = pod.first_gpu_memory_utilization
    name = f"simulator-{pod.name}" + ("-first-deployment" if first is not None else "")
    procs.start(name, _simulator_argv(pod, generation, sim_port, first))
    config = workdir / f"sidecar-{pod.name}.yaml"
    config.write_text(dump_yaml(sidecar_config(pod, sim_port, port)), encoding="utf-8")
    procs.start(f"sidecar-{pod.name}", [*kv_sidecar(), "run", "--config.file", str(config)])


def _redeploy(procs: Processes, pod: Pod, generation: str, ports: tuple[int, int], timeout: float = 20) -> None:
    """Once the sidecar has read the first deployment, replace it with one with the scenario's settings.

    A deploy that changes vLLM's flags: the sidecar counts the changed ``vllm:cache_config_info``
    (``kvcache_sidecar_config_changes_total``), which the dashboards' annotation shows.
    """
    sim_port, port = ports
    deadline = time.monotonic() + timeout
    while b"\nkvcache_usage_ratio{" not in http_get(f"http://127.0.0.1:{port}/metrics")[1]:
        procs.check_alive()
        assert time.monotonic() < deadline, f"sidecar-{pod.name} did not read its target within {timeout:.0f} s"
        time.sleep(0.2)
    procs.stop(f"simulator-{pod.name}-first-deployment")
    procs.start(f"simulator-{pod.name}", _simulator_argv(pod, generation, sim_port, None))


def _wait_ready(procs: Processes, ready: dict[str, str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while ready and time.monotonic() < deadline:
        procs.check_alive()
        ready = {name: url for name, url in ready.items() if http_status(url) != 200}
        time.sleep(0.2)
    assert not ready, f"not ready within {timeout:.0f} s: {sorted(ready)}\n{procs.logs(*ready)}"


def _wait_scraped(procs: Processes, api: PrometheusAPI, pods: tuple[Pod, ...], timeout: float) -> None:
    """Until Prometheus has scraped every target once (its first scrapes come seconds after /-/ready)."""
    deadline = time.monotonic() + timeout
    up: set[tuple[str, str]] = set()
    want = {(job, p.name) for job in (SIDECAR_JOB, VLLM_JOB) for p in pods}
    while up != want and time.monotonic() < deadline:
        procs.check_alive()
        time.sleep(0.2)
        up = {(s["metric"]["job"], s["metric"]["pod"]) for s in api.query("up == 1")}
    assert up == want, f"Prometheus did not scrape {sorted(want - up)} within {timeout:.0f} s"


def _ready_urls(api: PrometheusAPI, pods: tuple[Pod, ...], ports: dict[str, tuple[int, int]]) -> dict[str, str]:
    ready = {"prometheus": f"{api.url}/-/ready"}
    for pod in pods:
        sim_port, port = ports[pod.name]
        ready[f"simulator-{pod.name}"] = f"http://127.0.0.1:{sim_port}/health"
        ready[f"sidecar-{pod.name}"] = f"http://127.0.0.1:{port}/readyz"
    return ready


@contextlib.contextmanager
def running_stack(workdir: Path, prometheus: str, generation: str, pods: tuple[Pod, ...] = PODS) -> Iterator[Stack]:
    """Start ``pods`` (default: all four) speaking vLLM metric ``generation``, and Prometheus scraping
    them; stop every process on exit."""
    workdir.mkdir(parents=True, exist_ok=True)
    rule_file = render_fast_rules(workdir / "rules")
    ports = {p.name: (free_port(), free_port()) for p in pods}  # (simulator, sidecar)
    prom_port = free_port()
    prom_config = workdir / "prometheus.yaml"
    prom_config.write_text(dump_yaml(prometheus_config(rule_file, pods, ports)), encoding="utf-8")

    procs = Processes(workdir)
    api = PrometheusAPI(f"http://127.0.0.1:{prom_port}")
    try:
        for pod in pods:
            _start_pod(procs, workdir, pod, generation, ports[pod.name])
        procs.start("prometheus", prometheus_argv(prometheus, prom_config, workdir / "prom-data", prom_port))
        _wait_ready(procs, _ready_urls(api, pods, ports), timeout=40)
        _wait_scraped(procs, api, pods, timeout=20)
        started = time.time()
        for pod in pods:
            if pod.first_gpu_memory_utilization is not None:
                _redeploy(procs, pod, generation, ports[pod.name])
        yield Stack(generation, pods, api, procs, workdir, started=started)
    finally:
        procs.stop()
        api.close()


#: (what, PromQL, pods that must be in its result)
Signal = tuple[str, str, set[str]]


def _signals(stack: Stack) -> list[Signal]:
    """(what, PromQL, pods that must be in its result) for everything the dashboards draw."""
    pods = {p.name for p in stack.pods}
    saturated = {p.name for p in stack.pods if p.saturates}
    restarted = {p.name for p in stack.pods if p.restarts}
    redeployed = {p.name for p in stack.pods if p.first_gpu_memory_utilization is not None}
    return [
        ("every target up", "up == 1", pods),
        (
            # for 5 evaluations: a range query's steps must not all fall before the alert fired
            "KVCacheAlmostFull firing for 5 s",
            'count_over_time(ALERTS{alertname="KVCacheAlmostFull", alertstate="firing"}[1m]) >= 5',
            saturated,
        ),
        (
            # the "Firing alerts" panel shows the critical alerts first: one must have fired (on a slow
            # machine the warning alone can fire before the other signals are there)
            "a critical alert firing for 5 s",
            'count_over_time(ALERTS{alertname=~"KVCache.*", alertstate="firing", severity="critical"}[1m]) >= 5',
            saturated,
        ),
        ("preemptions", "increase(kvcache_preemptions_total[10m]) > 0", saturated),
        ("a vLLM restart", f'changes(process_start_time_seconds{{job="{VLLM_JOB}"}}[10m]) > 0', restarted),
        ("a configuration change", "increase(kvcache_sidecar_config_changes_total[10m]) > 0", redeployed),
        ("the advice gauges", "kvcache_suggested_gpu_memory_utilization", pods),
        ("the recommendation", "kvcache_recommendation_info", pods),
        # counted from forecast.window (10 simulated minutes) after each engine's start or restart, for a minute
        ("the burst headroom", "kvcache_burst_headroom_ratio", pods),
        (
            "10 evaluations of the recording rules",
            "count_over_time(namespace_model:kvcache_usage_ratio:max[10m]) >= 10",
            set(),
        ),
    ]


def _missing(api: PrometheusAPI, expr: str, pods: set[str]) -> str | None:
    """Why ``expr`` does not show ``pods`` yet (None when it does; any result when ``pods`` is empty)."""
    try:
        result = api.query(expr)
    except PrometheusError as e:
        return str(e)
    if not result:
        return "no result"
    missing = pods - {s["metric"].get("pod", "") for s in result}
    return f"no series for {sorted(missing)}" if missing else None


def wait_for_signals(stack: Stack, timeout: float = 120, signals: list[Signal] | None = None) -> float:
    """Block until every signal (default: ``_signals``) is there; seconds it took. Fails naming what is missing."""
    t0 = time.monotonic()
    pending = _signals(stack) if signals is None else list(signals)
    reasons: dict[str, str] = {}
    while pending and time.monotonic() - t0 < timeout:
        stack.procs.check_alive()
        still = []
        for what, expr, pods in pending:
            why = _missing(stack.api, expr, pods)
            if why:
                still.append((what, expr, pods))
                reasons[what] = f"{expr}: {why}"
            else:
                print(f"{stack.generation}: {what} after {time.monotonic() - t0:.0f} s")
        pending = still
        if pending:
            time.sleep(1)
    if pending:
        details = "\n".join(f"  {what}: {reasons[what]}" for what, _, _ in pending)
        raise AssertionError(
            f"the {stack.generation} stack did not show within {timeout:.0f} s:\n{details}\n"
            f"{stack.procs.logs(tail=10)}\n(logs and Prometheus' config in {stack.workdir})"
        )
    return time.monotonic() - t0
