"""The documentation's dashboard pictures from a realistic simulated day, by one command.

    python -m sidecar.artifacts.pictures --out docs/images      (``make pictures``)

A reader of ``docs/images/`` should see what a real day looks like, not a few minutes of a test
stack. So the pictures are drawn from one simulated day of a small fleet, replayed through the
sidecar's own code and stored in a real Prometheus:

1. **The day.** :data:`FLEET` is two models in two namespaces, two vLLM pods each, every pod on the
   simulator's ``diurnal-day`` scenario (trough at 02:00, peak at 14:00 at 110% of what one pod can
   hold) at its own share of that load and seed; vllm-a-0, the busiest, restarts at 10:30 (vLLM down
   20 s, its cache and counters lost) and preempts through the afternoon peak. Each pod is the
   simulator (:class:`sidecar.simulator.Simulator`) and its sidecar
   (:class:`sidecar.replay.Pipeline`: the daemon's read pipeline and ``Sidecar.record``, only the
   HTTP hop skipped), scraped every :data:`SCRAPE_INTERVAL_S` seconds of simulated time.
2. **Prometheus.** What a Prometheus would have scraped from both (vLLM's ``/metrics`` as job ``vllm``,
   the sidecar's as job ``kv-cache-sidecar``, with the ``namespace``/``pod``/``instance`` labels a
   PodMonitor gives, and ``up``) is written as OpenMetrics and backfilled with
   ``promtool tsdb create-blocks-from openmetrics``; the recording rules of ``kv-sidecar rules``
   are evaluated over it with ``promtool tsdb create-blocks-from rules`` (every
   :data:`RULE_INTERVAL_S` s). Prometheus writes ``ALERTS`` only while it evaluates alerting rules
   live, so each alerting rule's expression is queried over the day and its ``for:`` applied
   (``pending`` until it has held that long, then ``firing``), as the rule evaluator does, and
   those ``ALERTS`` samples are backfilled too.
3. **The pictures.** Every dashboard in ``dashboards/`` is drawn over the whole day by the
   snapshot (:func:`sidecar.artifacts.snapshot.render_dashboard`) into ``--out/<uid>.png``; the
   Pod dashboard shows vllm-a-0.

The day is a fixed date (:data:`DAY_START`) and the simulator is seeded, so a rerun draws the same
pictures. The pods and their sidecars start at 00:00, so the restart and configuration-change
annotations also mark the left edge of every chart, and the per-day windows of the Capacity
dashboard fill up over the day. Only the series the dashboards and the rules query are stored (about
210 MiB of OpenMetrics at a 30 s interval; every series would be a gigabyte).

Needs Debian's ``prometheus`` and ``promtool`` on the PATH and the ``dashboards`` extra (matplotlib).
It takes about 5 minutes of CPU (measured: 5 min 7 s user; 15 min of wall time on two cores shared
with other work), the pods simulated in parallel, one process each up to the CPUs available. With
``--work DIR`` the OpenMetrics and the TSDB are kept, and ``--work DIR --draw-only`` redraws from
them in under a minute after a dashboard's layout changed (a dashboard that queries a new series, or a
changed recording rule, needs the full run: only the series queried at the time were stored).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ..alert_params import RuleParams
from ..config import Config, load_config
from ..generations import Generation
from ..replay import Pipeline
from ..simulator import SCENARIOS, SimConfig, Simulator
from ..thresholds import Thresholds
from ..units import parse_duration
from .files import dump_yaml
from .panels import PrometheusAPI, queries
from .params import DASHBOARD_POD_UID
from .rules import build_rule_groups
from .snapshot import render_dashboard
from .snapshot.cli import load_dashboards

REPO = Path(__file__).resolve().parents[2]
BUNDLED_MODEL = REPO / "sidecar" / "data" / "llama-3.1-8b.config.json"

#: The simulated day: Tuesday 2026-11-24, 00:00 to 24:00 UTC (fixed, so that a rerun draws the same pictures).
DAY_START = 1_795_478_400
DAY_S = 86_400
#: kube-prometheus' default scrape interval for a PodMonitor.
SCRAPE_INTERVAL_S = 30
#: Prometheus' default ``evaluation_interval`` is 1 m.
RULE_INTERVAL_S = 60
#: The jobs: the rules' default ``alerts.sidecar_job``, and vLLM's own /metrics.
SIDECAR_JOB, VLLM_JOB = "kv-cache-sidecar", "vllm"
#: vLLM's metric generation the simulator speaks (vLLM 0.21+).
GENERATION = Generation.V1_CAPACITY_LABELS
#: The day's shape: trough (15% of saturation) at 02:00, peak (110%) at 14:00.
DAY_SCENARIO = "diurnal-day"


@dataclasses.dataclass(frozen=True)
class DayPod:
    """One vLLM pod of the simulated fleet and the load it gets."""

    namespace: str
    #: the StatefulSet that owns the pod (the ``workload`` label the PodMonitor's relabelling gives)
    workload: str
    name: str
    model_name: str
    #: share of the ``diurnal-day`` arrival rate this pod gets (1.0: its peak is 110% of what it holds)
    load: float
    seed: int
    #: the hour at which vLLM restarts (20 s down, its cache and counters lost); None: no restart
    restart_hour: float | None = None

    def simulator(self) -> Simulator:
        """The pod's simulated vLLM, its wall clock starting at :data:`DAY_START`."""
        day = SCENARIOS[DAY_SCENARIO]
        scenario = dataclasses.replace(
            day,
            name=f"{DAY_SCENARIO}-{self.name}",
            rate_points=tuple((t, rate * self.load) for t, rate in day.rate_points),
            restart_at=None if self.restart_hour is None else self.restart_hour * 3600,
        )
        config = dataclasses.replace(day.config, model_name=self.model_name, epoch=float(DAY_START))
        return Simulator(config, scenario=scenario, seed=self.seed)

    def target_labels(self, job: str) -> dict[str, str]:
        """The labels Prometheus adds to every series it scrapes from this pod's ``job``: those of
        ``deploy/base/podmonitor.yaml`` (``cluster`` is absent: one cluster)."""
        port = 8000 if job == VLLM_JOB else 9437
        return {
            "job": job,
            "instance": f"{self.name}:{port}",
            "namespace": self.namespace,
            "pod": self.name,
            "workload": self.workload,
        }


#: Two models, two pods each; the busiest pod restarts mid-morning and preempts at the peak.
FLEET: tuple[DayPod, ...] = (
    DayPod("team-a", "vllm-a", "vllm-a-0", "llama-3.1-8b-chat", load=1.0, seed=1, restart_hour=10.5),
    DayPod("team-a", "vllm-a", "vllm-a-1", "llama-3.1-8b-chat", load=0.8, seed=2),
    DayPod("team-b", "vllm-b", "vllm-b-0", "llama-3.1-8b-batch", load=0.6, seed=3),
    DayPod("team-b", "vllm-b", "vllm-b-1", "llama-3.1-8b-batch", load=0.45, seed=4),
)
#: The pod the Pod dashboard's picture shows.
PICTURED_POD = "vllm-a-0"


def sidecar_config(sim: SimConfig) -> Config:
    """The sidecar of one pod: the bundled Llama-3.1-8B config.json and the simulator's memory figures
    (as ``kv-sidecar demo`` gives them), the scrape interval of the day, every other setting its default."""
    flags: dict[tuple[str, str], object] = {
        ("scrape", "interval"): f"{SCRAPE_INTERVAL_S}s",
        ("model", "config"): str(BUNDLED_MODEL),
        ("model", "gpu_memory"): str(sim.gpu_memory_bytes),
        ("model", "weights_memory"): sim.weights_bytes,
        ("model", "activation_memory"): sim.activation_bytes,
        ("model", "non_torch_memory"): sim.non_torch_bytes,
        ("model", "cudagraph_memory"): 0,
    }
    return load_config(None, env={}, flags=flags)


# --- 1. the day, through the sidecar's code -----------------------------------------------------

#: One series' samples: (times in seconds, values).
Points = tuple["array[float]", "array[float]"]


class SeriesStore:
    """Scraped samples per series (``name{labels}`` as OpenMetrics writes it), each in time order."""

    def __init__(self, wanted: frozenset[str]) -> None:
        self.wanted = wanted
        self.series: dict[str, dict[str, Points]] = {}

    def add(self, name: str, labels: Mapping[str, str], t: float, value: float) -> None:
        """One sample; ignored when no dashboard or rule queries ``name``."""
        if name not in self.wanted:
            return
        text = name + "{" + ",".join(f'{k}="{_escape(labels[k])}"' for k in sorted(labels)) + "}"
        times, values = self.series.setdefault(name, {}).setdefault(text, (array("d"), array("d")))
        times.append(t)
        values.append(value)

    def add_page(self, body: str, target: Mapping[str, str], t: float) -> None:
        """Every sample of a Prometheus text page, with the scrape's target labels (which win, as with
        ``honor_labels: false``, Prometheus' default, a clash keeps the page's value as ``exported_<label>``)."""
        for family in text_string_to_metric_families(body):
            for s in family.samples:
                clashes = {f"exported_{k}": v for k, v in s.labels.items() if k in target}
                self.add(s.name, {**s.labels, **clashes, **target}, t, s.value)

    def merge(self, other: SeriesStore) -> None:
        for name, series in other.series.items():
            self.series.setdefault(name, {}).update(series)

    def write(self, f: Any) -> None:
        """OpenMetrics: each metric name its own family of type ``unknown`` (a backfill stores samples, the
        type is only metadata), its series sorted, each series' samples in time order; then ``# EOF``."""
        for name in sorted(self.series):
            f.write(f"# TYPE {name} unknown\n")
            for text, (times, values) in sorted(self.series[name].items()):
                f.writelines(f"{text} {_number(v)} {int(t)}\n" for t, v in zip(times, values, strict=True))
        f.write("# EOF\n")


def _number(v: float) -> str:
    """A sample value as OpenMetrics writes it: ``NaN``, ``+Inf``, ``-Inf``, else Python's shortest exact form."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def simulate_pod(pod: DayPod, wanted: frozenset[str]) -> SeriesStore:
    """One pod's day: vLLM's page and the sidecar's page at every scrape, as Prometheus would store them.

    While vLLM restarts its page is not served (``up`` 0 for job ``vllm``); the sidecar stays up and
    counts the failed scrape, as the daemon does.
    """
    # The bundled config's theoretical capacity differs from the simulator's on purpose (a 40 GB GPU
    # with other reservations): the sidecar says so once per pod; not news here.
    logging.getLogger("kv_sidecar").setLevel(logging.ERROR)
    sim = pod.simulator()
    pipeline = Pipeline(sidecar_config(sim.config), pod.model_name)
    store = SeriesStore(wanted)
    vllm, sidecar = pod.target_labels(VLLM_JOB), pod.target_labels(SIDECAR_JOB)
    for offset in range(SCRAPE_INTERVAL_S, DAY_S + 1, SCRAPE_INTERVAL_S):
        sim.advance_to(float(offset))
        t = float(DAY_START + offset)
        if sim.up:
            body = sim.render(GENERATION)
            store.add_page(body, vllm, t)
            pipeline.ingest(t, pipeline.read(body.encode()))
        else:
            pipeline.ingest(t, None)
        store.add("up", vllm, t, 1.0 if sim.up else 0.0)
        for family in pipeline.sidecar.registry.collect():
            for s in family.samples:
                store.add(s.name, {**s.labels, **sidecar}, t, s.value)
        store.add("up", sidecar, t, 1.0)
    return store


def queried_names(dashboards: Iterable[Mapping[str, Any]], groups: Sequence[Mapping[str, Any]]) -> frozenset[str]:
    """Every word of every dashboard query and rule expression: a superset of the metric names they read."""
    exprs = [q.expr for d in dashboards for q in queries(d)]
    exprs += [str(rule["expr"]) for g in groups for rule in g["rules"]]
    return frozenset(w for e in exprs for w in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e))


def simulate_fleet(wanted: frozenset[str], processes: int) -> SeriesStore:
    """Every pod of :data:`FLEET`, ``processes`` at a time (the pods are independent)."""
    store = SeriesStore(wanted)
    with ProcessPoolExecutor(max_workers=processes) as pool:
        for part in pool.map(simulate_pod, FLEET, [wanted] * len(FLEET)):
            store.merge(part)
    return store


# --- 2. Prometheus: backfill, recording rules, ALERTS -------------------------------------------


def _run(argv: list[str], cwd: Path) -> None:
    """Run a tool; its output in the error when it fails."""
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")


def backfill(openmetrics: Path, data: Path) -> None:
    """``promtool tsdb create-blocks-from openmetrics``, one block for the day (promtool reads the file once
    per block, and its default is a block per 2 hours)."""
    argv = ["promtool", "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=24h"]
    _run([*argv, str(openmetrics), str(data)], openmetrics.parent)


@contextmanager
def prometheus(work: Path, data: Path) -> Iterator[str]:
    """A Prometheus serving ``data`` on a free local port (no scrapes, ten years of retention); its URL."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = work / "prometheus.yaml"
    config.write_text("global:\n  scrape_interval: 1m\n", encoding="utf-8")
    log = (work / "prometheus.log").open("ab")
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={data}",
            "--storage.tsdb.retention.time=10y",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not _ready(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prometheus did not start; see {work / 'prometheus.log'}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def record_rules(url: str, work: Path, data: Path, recording: Mapping[str, Any]) -> None:
    """The recording rules evaluated over the day (``promtool tsdb create-blocks-from rules``), moved into ``data``."""
    rules = work / "recording.yaml"
    rules.write_text(dump_yaml(recording), encoding="utf-8")
    out = work / "rules-data"
    _run(
        [
            *("promtool", "tsdb", "create-blocks-from", "rules", "--url", url),
            *("--start", str(DAY_START), "--end", str(DAY_START + DAY_S)),
            *("--eval-interval", f"{RULE_INTERVAL_S}s", "--output-dir", str(out), str(rules)),
        ],
        work,
    )
    for block in out.iterdir():
        shutil.move(str(block), data / block.name)


def alerts(api: PrometheusAPI, alerting: Sequence[Mapping[str, Any]]) -> SeriesStore:
    """``ALERTS`` as Prometheus' rule evaluator would have written it every :data:`RULE_INTERVAL_S` s.

    At each evaluation an alerting rule's expression returns the series that hold; a series is
    ``pending`` from its first evaluation until it has held for the rule's ``for:``, then ``firing``
    while it holds. Its ``ALERTS`` labels are the result's labels, the rule's ``labels``, ``alertname``
    and ``alertstate`` (Prometheus ``rules/alerting.go``).
    """
    store = SeriesStore(frozenset({"ALERTS"}))
    for rule in alerting:
        hold = parse_duration(str(rule.get("for") or "0s"))
        result = api.query_range(str(rule["expr"]), DAY_START, DAY_START + DAY_S, RULE_INTERVAL_S)
        for series in result:
            labels = {k: v for k, v in series["metric"].items() if k != "__name__"}
            labels |= {**rule.get("labels", {}), "alertname": rule["alert"]}
            since: float | None = None
            previous: float | None = None
            for t, _ in series["values"]:
                t = float(t)
                if previous is None or t - previous > RULE_INTERVAL_S * 1.5:
                    since = t  # a new run: it holds again after a gap
                previous = t
                state = "firing" if t - (since or t) >= hold else "pending"
                store.add("ALERTS", {**labels, "alertstate": state}, t, 1.0)
    return store


# --- 3. the pictures ----------------------------------------------------------------------------


def draw(url: str, dashboards: Sequence[dict[str, Any]], out: Path) -> list[str]:
    """Every dashboard over the day into ``out/<uid>.png``; one summary line per picture."""
    lines = []
    with PrometheusAPI(url, timeout=60) as api:
        for dashboard in dashboards:
            values = {"pod": PICTURED_POD} if dashboard["uid"] == DASHBOARD_POD_UID else {}
            path = out / f"{dashboard['uid']}.png"
            snap = render_dashboard(dashboard, api, values, DAY_START, DAY_START + DAY_S, path)
            lines.append(f"wrote {path} ({snap.summary()}) in {snap.seconds:.1f}s")
    return lines


def make_pictures(out: Path, dashboards_dir: Path, work: Path, processes: int) -> list[str]:
    """The whole pipeline in ``work``; the summary lines of the pictures written to ``out``."""
    dashboards = load_dashboards(dashboards_dir)
    groups = build_rule_groups(Thresholds(), RuleParams())["groups"]
    recording = {"groups": [g for g in groups if all("record" in r for r in g["rules"])]}
    alerting = [r for g in groups for r in g["rules"] if "alert" in r]
    began = time.monotonic()
    store = simulate_fleet(queried_names(dashboards, groups), processes)
    openmetrics = work / "day.om"
    with openmetrics.open("w", encoding="utf-8") as f:
        store.write(f)
    lines = [f"simulated {len(FLEET)} pods for a day in {time.monotonic() - began:.0f}s ({_size(openmetrics)})"]
    data = work / "data"
    backfill(openmetrics, data)
    with prometheus(work, data) as url:
        record_rules(url, work, data, recording)
    with prometheus(work, data) as url:
        with PrometheusAPI(url, timeout=60) as api:
            fired = alerts(api, alerting)
    with (work / "alerts.om").open("w", encoding="utf-8") as f:
        fired.write(f)
    backfill(work / "alerts.om", data)
    with prometheus(work, data) as url:
        lines += draw(url, dashboards, out)
    return lines


def _size(path: Path) -> str:
    return f"{path.stat().st_size / 2**20:.0f} MiB of OpenMetrics"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sidecar.artifacts.pictures",
        description="Draw the dashboards' pictures from a simulated day stored in a real Prometheus.",
    )
    parser.add_argument("--out", default="docs/images", help="where <uid>.png is written (default: docs/images)")
    parser.add_argument("--dashboards", default="dashboards", help="dashboard JSON folder (default: dashboards)")
    parser.add_argument("--work", default=None, help="keep the OpenMetrics and the TSDB here (default: a temp folder)")
    parser.add_argument(
        "--processes", type=int, default=None, help="pods simulated at once (default: the CPUs available)"
    )
    parser.add_argument(
        "--draw-only",
        action="store_true",
        help="only draw, from the TSDB a previous run kept in --work (seconds, for a changed dashboard)",
    )
    args = parser.parse_args(argv)
    missing = [tool for tool in ("prometheus", "promtool") if shutil.which(tool) is None]
    if missing:
        print(
            f"pictures: {' and '.join(missing)} not found on PATH (Debian: apt-get install prometheus)", file=sys.stderr
        )
        return 2
    if args.work and (Path(args.work) / "data").exists() != args.draw_only:
        problem = "holds a TSDB: add --draw-only, or remove it" if not args.draw_only else "holds no TSDB (data/)"
        print(f"pictures: --work {args.work} {problem}", file=sys.stderr)
        return 2
    if args.draw_only and not args.work:
        print("pictures: --draw-only needs the --work folder of a previous run", file=sys.stderr)
        return 2
    processes = args.processes or max(1, min(len(FLEET), len(os.sched_getaffinity(0))))
    with tempfile.TemporaryDirectory(prefix="kv-sidecar-pictures-") as tmp:
        work = Path(args.work) if args.work else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if args.draw_only:
            with prometheus(work, work / "data") as url:
                lines = draw(url, load_dashboards(Path(args.dashboards)), Path(args.out))
        else:
            lines = make_pictures(Path(args.out), Path(args.dashboards), work, processes)
        for line in lines:
            print(line, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
