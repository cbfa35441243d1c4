"""Replay a simulated vLLM through the daemon's own code, in simulated time.

Used by :mod:`sidecar.forecast_validation` (hence ``bench/forecast.py``) and
``tests/forecast_validation``. Each :meth:`Replay.step` renders the simulator's ``/metrics`` body
and runs what :meth:`sidecar.scrape_loop.Sidecar.scrape_once` runs after its HTTP fetch, with nothing
changed:

1. the read pipeline, :func:`sidecar.pipeline.read_page` (decode, the pre-filtered parse with the
   target's own :func:`~sidecar.pipeline.parser_for`, the vLLM adapter, the target's limits),
2. ``Sidecar.record`` (``state.ingest_success(..., extenders=build_extenders(config))``) with
   ``sample_time`` = the simulator's clock (what a ``clock: simulated`` target
   takes from the ``X-Simulated-Time`` header), so the capacity and forecast
   layers see exactly what the daemon would feed them.

While the simulator is down (a ``restart`` scenario) the daemon's fetch gets a
503: that is ``state.ingest_failure(state, "http_5xx")`` here too.

Gauges are read back from the :class:`~sidecar.scrape_loop.Sidecar`'s own
Prometheus registry (the exporter's ``collect()``), whose clock is the
simulated one so the staleness limit is applied in simulated seconds.

Only the HTTP hop is skipped; the tests in ``tests/forecast_validation`` run
the real hop (``kv-sidecar simulate`` + ``kv-sidecar run``) and show it gives
the same gauges.

    from sidecar.replay import Replay, replay_config
    r = Replay(Simulator(SimConfig(), scenario="ramp-10m", seed=1), replay_config(window="10m"))
    r.run_until(600.0, every=5.0, on_sample=lambda r: print(r.now, r.gauge("kvcache_usage_ratio")))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from .config import Config, load_config
from .generations import Generation
from .history import HistoryStore
from .layers import build_extenders
from .observation import EngineScrape
from .pipeline import parser_for, read_page
from .scrape_loop import Sidecar
from .simulator import Simulator
from .state import ingest_failure

#: The target URL of a replay: never contacted (the body comes from the simulator in-process).
REPLAY_URL = "http://127.0.0.1:9/metrics"
TARGET = "replay"


def replay_config(
    *,
    window: str | None = None,
    segment: str | None = None,
    min_samples: int | None = None,
    min_span: str | None = None,
    peak_window: str | None = None,
    interval: str | None = None,
    derive_window: str | None = None,
    model_config: str | None = None,
    gpu_memory: str | None = None,
    target_usage: float | None = None,
) -> Config:
    """A daemon configuration for one replayed target, built by the daemon's own loader.

    Every argument is the ``--<section>.<key>`` flag of ``kv-sidecar run`` of the
    same name; ``None`` keeps the built-in default, so a replay with no
    arguments runs the shipped defaults.
    """
    flags = {
        ("scrape", "interval"): interval,
        ("forecast", "window"): window,
        ("forecast", "segment"): segment,
        ("forecast", "min_samples"): min_samples,
        ("forecast", "min_span"): min_span,
        ("forecast", "peak_window"): peak_window,
        ("derive", "window"): derive_window,
        ("model", "config"): model_config,
        ("model", "gpu_memory"): gpu_memory,
        ("thresholds", "target_usage"): target_usage,
        # the page comes from the simulator in-process: there is no vLLM process to find in /proc
        ("model", "process_discovery"): False,
    }
    return load_config(
        None, env={}, flags=flags, flag_targets=[{"name": TARGET, "url": REPLAY_URL, "clock": "simulated"}]
    )


class Pipeline:
    """One in-process :class:`Sidecar` (with ``build_extenders(config)``) on a clock the caller sets.

    :meth:`read` is :func:`sidecar.pipeline.read_page`; :meth:`ingest` is the tail of
    ``Sidecar.scrape_once``: ``ingest_success`` with ``sample_time`` = wall time = the simulated time of the body, or
    ``ingest_failure(..., "http_5xx")`` when the server answered 503.
    """

    def __init__(self, config: Config, model_name: str, *, history: HistoryStore | None = None) -> None:
        """``history``: the embedded history the sidecar appends to (:meth:`Sidecar.record_history`)."""
        self.config = config
        self.now = 0.0
        # The exporter's staleness check reads this clock: simulated seconds, like the samples.
        self.sidecar = Sidecar(config, build_extenders(config), clock=lambda: self.now, history=history)
        self.state = self.sidecar.states[0]
        self.labels = {"target": self.state.target.name, "model_name": model_name, "engine": "0"}
        self._parser = parser_for(self.state.target)
        self._page: dict[tuple[str, tuple[tuple[str, str], ...]], float] | None = None

    def read(self, body: bytes) -> EngineScrape:
        """What ``Sidecar.scrape_once`` makes of a fetched body: the read pipeline, with this target's parser.

        One pipeline's read can feed others (the parse does not depend on the forecast settings),
        so that each page is parsed once.
        """
        return read_page(self.state.target, self._parser, body)

    def ingest(self, t: float, scrape: EngineScrape | None) -> None:
        """One scrape at simulated time ``t``; ``scrape`` None = the target was down (HTTP 503)."""
        self.now = t
        self._page = None
        if scrape is None:
            ingest_failure(self.state, "http_5xx", duration_s=0.0)
            return
        self.sidecar.record(self.state, scrape, sample_time=t, wall_time=t, duration_s=0.0)

    def page(self) -> Mapping[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of the Sidecar's registry (one ``collect()``, as one Prometheus scrape)."""
        if self._page is None:
            self._page = {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for family in self.sidecar.registry.collect()
                for s in family.samples
            }
        return self._page

    def gauge(self, name: str, **extra: str) -> float | None:
        """One sample of the replayed engine, ``None`` when not published (as ``get_sample_value``)."""
        labels = {**self.labels, **extra}
        return self.page().get((name, tuple(sorted(labels.items()))))


class Replay:
    """One simulator feeding one :class:`Pipeline`, both on the simulated clock."""

    def __init__(self, sim: Simulator, config: Config, generation: Generation = Generation.V1_CAPACITY_LABELS) -> None:
        self.sim = sim
        self.config = config
        self.generation = generation
        self.pipeline = Pipeline(config, sim.config.model_name)
        self.sidecar = self.pipeline.sidecar

    @property
    def now(self) -> float:
        return self.sim.now

    def scrape(self) -> EngineScrape | None:
        """The simulator's page at its current time as the daemon parses it; None while it is down."""
        if not self.sim.up:
            return None
        return self.pipeline.read(self.sim.render(self.generation).encode())

    def step(self) -> bool:
        """Scrape the simulator once at its current time; False when it was down (a 503)."""
        scrape = self.scrape()
        self.pipeline.ingest(self.sim.now, scrape)
        return scrape is not None

    def run_until(self, end_s: float, *, every: float = 5.0, on_sample: Callable[[Replay], None] | None = None) -> None:
        """Advance and scrape every ``every`` simulated seconds up to ``end_s`` (inclusive)."""
        start, n = self.sim.now, 0
        while True:
            n += 1
            t = start + n * every
            if t > end_s + 1e-9:
                break
            self.sim.advance_to(t)
            self.step()
            if on_sample is not None:
                on_sample(self)

    def gauge(self, name: str, **extra: str) -> float | None:
        return self.pipeline.gauge(name, **extra)
