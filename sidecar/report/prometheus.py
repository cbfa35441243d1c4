"""The report's source over the Prometheus HTTP API (and so Thanos, Mimir, VictoriaMetrics).

What: :class:`PrometheusSource` reads one period of the sidecar's series and fills a
:class:`~sidecar.report.data.Week`. Everything is reduced on the server; what comes back is one
point per pod and minute, or one number per pod (Prometheus docs, "HTTP API" and "Functions").

How the queries are cut, so that a thousand pods do not hurt Prometheus:

- **Pods** are found with one instant query at the period's end, ``count by (namespace, model_name,
  pod, instance, target, engine) (last_over_time(kvcache_usage_ratio{SEL}[<period>]))``. A pod is
  named by its ``pod`` label (Kubernetes), else ``instance``, else the sidecar's ``target``; every
  later query aggregates ``by (namespace, model_name, <that label>, engine)``, so a pod whose
  ``instance`` changed at a restart stays one pod (the per-step range queries leave that ``max by``
  to the client, :func:`_merged`: on the server it doubled their cost, and a pod almost always has
  one series).
- **Batches**: at most ``pods_per_query`` pods per query, selected by a regular expression on that
  label; **day chunks**: a range query covers at most one day at a 60 s step (1,440 points per
  series, far below Prometheus' 11,000); at most ``concurrency`` queries run at once.
- **Steps**: range queries evaluate each step at its *end minus 1 ms* over ``[60s]``, so that the
  window is the step's ``[start, start + 60 s)`` whether the Prometheus closes range selectors at
  both ends (2.x) or only at the right (3.x): a sample exactly on a minute belongs to the minute it
  starts, as in the embedded history. Per step the usage is ``max_over_time`` and ``avg_over_time``
  (the mean only for the pods whose figures Prometheus did not reduce, below), demand and waiting
  requests ``max_over_time``, capacities ``last_over_time``. The answers are most
  of the report's input (about 100 MB of JSON for a week of 64 pods): they are asked uncompressed
  (``Accept-Encoding: identity``; gzip cost Prometheus a third more CPU; a ``--header
  'Accept-Encoding: gzip'`` asks for it over a slow link) and each series' points are cut out of the
  compact JSON as bytes and read straight into ``array("d")`` (:func:`sidecar.prometheus_api.cut_values`), not built as
  Python lists first; an answer written with other spacing is parsed as plain JSON.
- **Counters** come back as their last raw value in each step (and the step before the period), and
  their increases are computed here: a rise is the difference, a drop is a restart and the increase
  is the new value (Prometheus' own reset rule). Not ``increase()``: it extrapolates to the window's
  edges (fractional preemptions) and, per one-minute window, misses the rise between the previous
  window's last sample and this one's first, i.e. it undercounts by about a scrape interval in 60 s.
  Increments made within the step before a reset are lost (a restart's last seconds).
- **The period's figures**, instant queries at the period's end minus 1 ms over the whole period (so
  over the samples of ``[start, end)``): the peak is ``max_over_time`` and p50/p95/p99 are
  ``quantile_over_time`` of the raw samples (a pod with several series, e.g. a new ``instance``
  after a restart, gets none, and the report takes them from the steps); the seconds above a
  threshold are ``count_over_time((usage > thr)[<day>:15s]) * 15`` summed over the period's days: a
  subquery, since PromQL cannot filter raw samples, whose 15 s instants each see the latest sample, so
  the result is the time spent above at 15 s resolution whatever the scrape interval. One subquery per
  day (5,760 points), not one per week (40,320): VictoriaMetrics refuses a subquery of more than its
  ``-search.maxPointsSubqueryPerTimeseries``/``-search.maxPointsPerTimeseries`` (30,000 by default,
  HTTP 422), and the days' instants are exactly the week's. Time waiting for KV is the same
  count over ``max without (reason) (kvcache_requests_waiting{reason=~"capacity|all"}) > 0``
  (counted per series first, and with the aggregation only for a pod with two series ever above 0:
  :meth:`_Reader._seconds_waiting`). The peak of running requests (for the advice) is
  ``max_over_time`` over the period. A series that ends without a staleness marker (backfilled
  data, a Prometheus restart) keeps its last value for the lookback delta (5 min by default) in
  these counts.
- **Info series** (``kvcache_server_info``, ``kvcache_model_info``): the label set present in the
  latest step, found with one range query at an hour's step over the period, and only for a pod
  with two label sets in that hour again at one-minute steps over that hour.
- **Per model**, when the recording rules of ``alerts/kvcache.rules.yaml`` are there and the selector
  names only ``namespace`` and ``model_name``: the same figures over
  ``namespace_model:kvcache_usage_ratio:max`` (the hottest pod, what the capacity dashboard shows)
  and ``namespace_model:kvcache_requests_waiting:bool``, used only when the recorded series is
  present in at least 99% of the minutes the model's pods report (rules deployed mid-week, or a rule
  group evaluated less often than every minute, fall back to the pods' steps).
- **Pages**: ``max_over_time(ALERTS{alertname=~"KVCacheAlmostFull|KVCacheFullSoon",
  alertstate="firing"}[60s])`` per step; consecutive firing steps are one page, from the start of
  the first to the end of the last (the rules are evaluated at least every minute).
- **The periods before** (``--compare-previous``): up to ``HISTORY_PERIODS`` (7) of them, one at a time,
  each the same discovery and then only the per-step series of ``PREVIOUS_FIELDS`` (the demand, about a
  tenth of a week's memory), reduced at once to each model's weekly peak (``model_peaks``): the growth
  is fitted over those peaks and this week's (:mod:`sidecar.report.growth`).

Failures: each is a :class:`ReportSourceError` with one line. The requests are
:class:`sidecar.prometheus_api.PrometheusClient`'s: each has ``timeout_s`` in all however slowly the
server sends, and is not sent again once that is spent (so a report ends within about its timeout when
Prometheus stalls); connection errors, 429 and 5xx answers are retried ``retries`` times with
exponential backoff; other 4xx are not; Prometheus' own error text is in the message with the token,
the URL's password and the ``--header`` values replaced by ``***``; an answer that is not what the
API documents is one line too. At most ``max_pods`` pods are read (:data:`MAX_PODS`); their series are
allocated as their data arrive, not when the discovery answer names them.
"""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Callable, Mapping, MutableSequence, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import httpx

from .. import outbound
from ..prometheus_api import Matrix, PrometheusClient, PrometheusError, Vector
from ..thresholds import Thresholds
from .data import (
    HISTORY_PERIODS,
    INCREASE,
    LAST,
    MAX,
    MEAN,
    PAGED_ALERTS,
    PREVIOUS_FIELDS,
    STEP_SERIES,
    ModelKey,
    Page,
    Period,
    PodSeries,
    StepSeries,
    Week,
    model_peaks,
    step_series,
)
from .data import steps as nan_steps
from .growth import WeeklyPeak
from .selector import Matcher, SelectorError, parse_selector, promql

#: The labels that can identify a pod's series; a pod is named by the first present of POD_NAME_LABELS.
ID_LABELS = ("namespace", "model_name", "workload", "cluster", "pod", "instance", "target", "engine")
POD_NAME_LABELS = ("pod", "instance", "target")
#: Range queries: one chunk is at most a day; steps are evaluated this much before their end.
CHUNK_S = 86_400.0
EDGE_S = 0.001
#: The resolution of the subqueries that count time above a threshold.
SUBQUERY_S = 15
#: The info series read for each pod, with their labels; their newest label set is found at this step first.
INFO_LABELS = {
    "kvcache_server_info": "block_size, kv_cache_memory_bytes",
    "kvcache_model_info": "architecture, attention, kv_dtype, tp, pp",
    "kvcache_gpu_memory_bytes": "gpu",
}
INFO_STEP_S = 3600.0
#: The most pods one report reads (``--max-pods``): each costs about 0.8 MB a week of series (twice
#: with ``--compare-previous``, whose periods are read one at a time), so a discovery answer naming
#: more is refused before any is allocated.
MAX_PODS = 1000
#: The share of a model's minutes its recorded series must cover for the per-model figures.
RULE_COVERAGE = 0.99
QUANTILES = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
MODEL_USAGE_RULE = "namespace_model:kvcache_usage_ratio:max"
MODEL_WAITING_RULE = "namespace_model:kvcache_requests_waiting:bool"
WAITING = step_series("waiting_max")
WAITING_REASONS = WAITING.only_matcher()

#: Each step's reduction of :data:`~sidecar.report.data.STEP_SERIES` as PromQL over the step's ``[60s]``;
#: a counter's (INCREASE) is its last value, turned into increases here (:func:`_increases`). Across a
#: pod's series the maximum is taken here (:func:`_merged`, as Prometheus' ``max by``): aggregating on the
#: server doubles its CPU time for these queries, and a pod has one series almost always (two across a
#: restart with a new instance).
OVER_TIME = {MAX: "max_over_time", MEAN: "avg_over_time", LAST: "last_over_time", INCREASE: "last_over_time"}
#: Step series not read per step for every pod: ``usage_mean`` only for the pods whose figures Prometheus
#: did not reduce (:meth:`_Reader._mean_jobs`); ``running_max`` not at all, its peak is one instant
#: query (``PodSeries.requests_running_peak``).
NOT_PER_STEP = ("usage_mean", "running_max")


#: Prometheus could not be read: the client's error (one line, ``exit_code`` 1 for the source, 2 for bad
#: arguments), also raised here for the report's own checks (the selector, ``--max-pods``); one class, so
#: the CLI catches one thing.
ReportSourceError = PrometheusError


@dataclass(frozen=True)
class _Pod:
    """One pod as found: its key in the Week and the label it is selected by."""

    model: ModelKey
    name: str
    engine: str
    label: str  # "pod", "instance" or "target"
    series: int  # label sets found for it (more than one: no raw-sample quantiles)

    @property
    def key(self) -> tuple[str, str, str, str, str, str]:
        m = self.model
        return (m.namespace, m.model_name, m.workload, m.cluster, self.name, self.engine)

    def labels(self) -> dict[str, str]:
        m = self.model
        own = {"namespace": m.namespace, "model_name": m.model_name, "workload": m.workload, "cluster": m.cluster}
        own[self.label] = self.name
        own["engine"] = self.engine
        return {k: v for k, v in own.items() if v}


@dataclass
class _Batch:
    """Pods selected by one regular expression on one label."""

    label: str
    pods: list[_Pod]
    by: str = field(init=False)
    matchers: str = field(init=False)

    def __post_init__(self) -> None:
        self.by = f"namespace, model_name, workload, cluster, {self.label}, engine"
        names = sorted({p.name for p in self.pods})
        own = [Matcher(self.label, "=~", "|".join(re.escape(n) for n in names)).promql()]
        # a pod named by its instance has no pod label, one named by its target neither of both
        own += [f'{label}=""' for label in POD_NAME_LABELS[: POD_NAME_LABELS.index(self.label)]]
        self.matchers = ", ".join(own)

    def key(self, labels: Mapping[str, str]) -> tuple[str, str, str, str, str, str]:
        return (
            labels.get("namespace", ""),
            labels.get("model_name", ""),
            labels.get("workload", ""),
            labels.get("cluster", ""),
            labels.get(self.label, ""),
            labels.get("engine", ""),
        )


class PrometheusSource:
    """Read one period (and the one before it) from a Prometheus-compatible HTTP API.

    The requests go through :class:`sidecar.prometheus_api.PrometheusClient` (:attr:`api`): its deadline,
    retries, size limit and error messages are the report's.
    """

    def __init__(
        self,
        url: str,
        *,
        bearer_token_file: str | None = None,
        ca_file: str | None = None,
        insecure_skip_verify: bool = False,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 30.0,
        concurrency: int = 4,
        pods_per_query: int = 50,
        retries: int = 3,
        max_pods: int = MAX_PODS,
        client: httpx.Client | None = None,
    ) -> None:
        problem = outbound.url_problem(url or "")
        if problem is not None:
            raise ReportSourceError(f"{outbound.shown_url(url or '')}: {problem}", 2)
        if concurrency < 1 or pods_per_query < 1 or retries < 0 or not timeout_s > 0 or max_pods < 1:
            raise ReportSourceError(
                "concurrency, pods per query and --max-pods must be >= 1, retries >= 0, the timeout > 0", 2
            )
        self.api = PrometheusClient(
            url,
            bearer_token_file=bearer_token_file,
            ca_file=ca_file,
            insecure_skip_verify=insecure_skip_verify,
            headers=headers,
            timeout_s=timeout_s,
            retries=retries,
            timeout_hint="--timeout",
            size_hint="--pods-per-query",
            client=client,
        )
        self.max_pods = max_pods
        self.concurrency = concurrency
        self.pods_per_query = pods_per_query

    @property
    def shown(self) -> str:
        """The URL as messages and the report show it: without user:password@."""
        return self.api.shown

    @property
    def queries(self) -> int:
        """Queries the last :meth:`load` sent (retries not counted)."""
        return self.api.queries

    @property
    def attempts(self) -> int:
        """Requests the last :meth:`load` sent, retries included."""
        return self.api.attempts

    @property
    def warnings(self) -> list[str]:
        """Prometheus' warnings beside the last :meth:`load`'s answers (a partial answer, say)."""
        return self.api.warnings

    # --- one load ------------------------------------------------------------------------------

    def load(
        self,
        period: Period,
        selector: str | tuple[Matcher, ...] = "",
        compare_previous: bool = False,
        *,
        thresholds: Thresholds | None = None,
    ) -> Week:
        """Every pod the selector matches in ``period`` (and, asked, its models' peaks in the 7 periods before it).

        ``selector``: a PromQL label-matcher set (``{namespace="prod"}``), ``""``, or matchers already
        parsed by :func:`~sidecar.report.selector.parse_selector`; ``thresholds``: the warning and
        watermark the seconds above are counted against (default: the defaults).
        """
        if isinstance(selector, str):
            try:
                matchers = parse_selector(selector)
            except SelectorError as e:
                raise ReportSourceError(f"selector: {e}", 2) from None
        else:
            matchers = selector
        if period.step_s != 60.0:
            raise ReportSourceError(f"the Prometheus source reads 60 s steps, the period asks {period.step_s:g}s", 2)
        self.api.read_token()  # once per load: a rotated token is picked up by the next report
        self.api.reset_counts()
        th = thresholds or Thresholds()
        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="report-prometheus") as pool:
            reader = _Reader(self, pool, promql(matchers), matchers, th)
            week = reader.week(period)
            if compare_previous:
                week.history = reader.history(period)
        return week

    def close(self) -> None:
        self.api.close()


def _duration(seconds: float) -> str:
    return f"{int(seconds)}s"


class _Reader:
    """The queries of one load, run on the pool."""

    def __init__(
        self, src: PrometheusSource, pool: ThreadPoolExecutor, sel: str, matchers: tuple[Matcher, ...], th: Thresholds
    ):
        self.src, self.pool, self.sel, self.th = src, pool, sel, th
        self.model_rules = all(m.label in ("namespace", "model_name") for m in matchers)

    def metric(self, name: str, *extra: str) -> str:
        """``name{<selector>, <extra>}``: the selector merged into every query."""
        parts = [p for p in (self.sel, *extra) if p]
        return f"{name}{{{', '.join(parts)}}}"

    def run(self, jobs: Sequence[Callable[[], Any]]) -> list[Any]:
        """Run ``jobs`` at most ``concurrency`` at a time; the first failure cancels the rest."""
        futures: list[Future[Any]] = [self.pool.submit(job) for job in jobs]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for f in futures:
            if f in done and f.exception() is not None:
                for other in futures:
                    other.cancel()
                raise f.exception()  # type: ignore[misc]
        return [f.result() for f in futures]

    def _discover(self, period: Period) -> tuple[list[_Pod], dict[Any, PodSeries]]:
        """The pods with usage in the period, each with its series all NaN (one shared array, :func:`_lazy`)."""
        found = self.src.api.instant(
            f"count by ({', '.join(ID_LABELS)}) "
            f"(last_over_time({self.metric('kvcache_usage_ratio')}[{_duration(period.seconds)}]))",
            period.end - EDGE_S,
        )
        pods = _pods(found)
        if len(pods) > self.src.max_pods:
            raise ReportSourceError(
                f"{len(pods):,} pods match, more than --max-pods {self.src.max_pods:,} (each costs about "
                f"{_POD_MB:g} MB of memory a week); narrow --selector (e.g. one namespace) or raise --max-pods "
                "with the memory limit",
                2,
            )
        empty = nan_steps(period)  # shared by every series until its first value arrives (_owned)
        return pods, {p.key: _lazy(period, p, empty) for p in pods}

    def history(self, period: Period) -> list[dict[ModelKey, WeeklyPeak]]:
        """The :data:`HISTORY_PERIODS` periods before ``period``, oldest first, each read and reduced to its
        models' peaks (:func:`model_peaks`) before the next is read; a period without data is left out."""
        peaks: list[dict[ModelKey, WeeklyPeak]] = []
        before = period
        for _ in range(HISTORY_PERIODS):
            before = before.previous()
            found = model_peaks(self.previous_week(before))
            if found:
                peaks.insert(0, found)
        return peaks

    def previous_week(self, period: Period) -> Week:
        """A period before: its pods and only the series read of it (PREVIOUS_FIELDS), for :func:`model_peaks`."""
        pods, series = self._discover(period)
        after: list[Callable[[], None]] = []
        batches = _batches(pods, self.src.pods_per_query)
        self.run([job for b in batches for job in self._step_jobs(b, period, series, after, PREVIOUS_FIELDS)])
        for finish in after:
            finish()
        ordered = sorted(series.values(), key=lambda p: (p.model, p.pod, p.engine))
        return Week(period=period, pods=ordered, pages=[], source=f"Prometheus {self.src.shown}")

    def week(self, period: Period) -> Week:
        pods, series = self._discover(period)
        batches = _batches(pods, self.src.pods_per_query)
        jobs: list[Callable[[], None]] = []
        after: list[Callable[[], None]] = []  # what combines the answers, once all are in
        for batch in batches:
            jobs += self._step_jobs(batch, period, series, after)
            jobs += self._figure_jobs(batch, period, series, after)
        pages: list[Page] = []
        presence: dict[ModelKey, set[int]] = {}
        if pods:
            jobs += self._page_jobs(period, pages, after)
            if self.model_rules:
                jobs += self._rule_presence_jobs(period, presence)
        self.run(jobs)
        for finish in after:
            finish()
        for pod in series.values():
            if pod.seconds_waiting is None and any(math.isfinite(v) for v in pod.waiting_max):
                pod.seconds_waiting = 0.0
        week = Week(
            period=period,
            pods=sorted(series.values(), key=lambda p: (p.model, p.pod, p.engine)),
            pages=sorted(pages, key=lambda p: (p.start, p.alertname, p.model, p.pod, p.end)),
            source=f"Prometheus {self.src.shown}",
        )
        if pods and self.model_rules:
            self._model_figures(week, presence)
        # The steps' means serve only for the percentiles and hours above Prometheus did not give: read
        # them for those pods alone (none, when the rules cover every model and each pod has one series).
        means = [p for p in pods if series[p.key].usage_quantiles is None or p.model not in week.model_usage_quantiles]
        if means:
            self.run(
                [job for b in _batches(means, self.src.pods_per_query) for job in self._mean_jobs(b, period, series)]
            )
        return week

    # --- per-step series -----------------------------------------------------------------------

    def _chunks(self, period: Period) -> list[tuple[float, float]]:
        out = []
        t = period.start
        while t < period.end:
            out.append((t, min(period.end, t + CHUNK_S)))
            t += CHUNK_S
        return out

    def _step_jobs(
        self,
        b: _Batch,
        period: Period,
        series: dict[Any, PodSeries],
        after: list[Callable[[], None]],
        only: tuple[str, ...] = (),
    ) -> list[Callable[[], None]]:
        """The batch's per-step series (:data:`~sidecar.report.data.STEP_SERIES` but :data:`NOT_PER_STEP`;
        with ``only``, just those), a query per series and day; ``after`` turns the counters' last values
        into increases."""
        jobs: list[Callable[[], None]] = []
        counter_before: dict[str, dict[Any, float]] = {}
        for s in STEP_SERIES:
            if s.field in NOT_PER_STEP or (only and s.field not in only):
                continue
            q = self.step_query(s, b)
            before = counter_before.setdefault(s.field, {}) if s.reduce == INCREASE else None
            for cs, ce in self._chunks(period):
                if before is not None:
                    jobs.append(_job(self._fill_lasts, q, b, period, series, s.field, before, cs, ce))
                elif s.ranked_by:
                    jobs.append(_job(self._fill_ranked, q, s, b, period, series, cs, ce))
                else:
                    jobs.append(_job(self._fill_steps, q, b, period, series, s.field, cs, ce))
        after.append(_job(_increases, counter_before, series, b))
        return jobs

    def step_query(self, s: StepSeries, b: _Batch) -> str:
        """The PromQL of one step series for a batch: ``<reduction>_over_time(<metric>{...}[60s])``."""
        return f"{OVER_TIME[s.reduce]}({self.metric(s.metric, s.only_matcher(), b.matchers)}[60s])"

    def _mean_jobs(self, b: _Batch, period: Period, series: dict[Any, PodSeries]) -> list[Callable[[], None]]:
        """The steps' mean usage (``avg by``: Prometheus' mean of a pod's series, one almost always)."""
        mean = step_series("usage_mean")
        q = f"avg by ({b.by}) ({self.step_query(mean, b)})"
        return [_job(self._fill_steps, q, b, period, series, mean.field, cs, ce) for cs, ce in self._chunks(period)]

    def _points(self, q: str, period: Period, cs: float, ce: float, before: bool = False) -> Matrix:
        """Series of ``q`` over the chunk's steps; with ``before``, also the step before the chunk."""
        first = cs if before else cs + period.step_s
        return self.src.api.range(q, first - EDGE_S, ce - EDGE_S)

    def _fill_steps(
        self, q: str, b: _Batch, period: Period, series: dict[Any, PodSeries], attr: str, cs: float, ce: float
    ) -> None:
        for key, parts in _grouped(self._points(q, period, cs, ce), b.key).items():
            pod = series.get(key)
            if pod is not None:
                _put(_owned(pod, attr), period, *_merged(parts))

    def _fill_ranked(
        self, q: str, s: StepSeries, b: _Batch, period: Period, series: dict[Any, PodSeries], cs: float, ce: float
    ) -> None:
        """A series ranked by a label (``budget``): the higher rank wins a step both fill."""
        assert s.ranked_by is not None
        label, ranks = s.ranked_by
        result = _grouped(self._points(q, period, cs, ce), lambda lb: (b.key(lb), lb.get(label, ranks[0])))
        for rank in ranks:
            for (key, of), parts in result.items():
                pod = series.get(key)
                if pod is not None and of == rank:
                    _put(_owned(pod, s.field), period, *_merged(parts))

    def _fill_lasts(
        self,
        q: str,
        b: _Batch,
        period: Period,
        series: dict[Any, PodSeries],
        attr: str,
        before: dict[Any, float],
        cs: float,
        ce: float,
    ) -> None:
        """The counter's last value in each step, in the pod's series (:func:`_increases` turns them into
        increases); the one in the step before the period in ``before``."""
        for key, parts in _grouped(self._points(q, period, cs, ce, before=True), b.key).items():
            pod = series.get(key)
            if pod is None:
                continue
            times, values = _merged(parts)
            _put(_owned(pod, attr), period, times, values)
            if times and _step_of(times[0], period) == -1 and math.isfinite(values[0]):
                before[key] = values[0]

    # --- the period's figures ------------------------------------------------------------------

    def _figure_jobs(
        self, b: _Batch, period: Period, series: dict[Any, PodSeries], after: list[Callable[[], None]]
    ) -> list[Callable[[], None]]:
        at, rng = period.end - EDGE_S, f"[{_duration(period.seconds)}]"
        usage = self.metric("kvcache_usage_ratio", b.matchers)
        reduced: dict[str, dict[Any, float]] = {}

        def collect(name: str, q: str) -> Callable[[], None]:
            def job() -> None:
                reduced[name] = {b.key(labels): v for labels, v in self.src.api.instant(q, at)}

            return job

        jobs = [collect("max", f"max by ({b.by}) (max_over_time({usage}{rng}))")]
        jobs += [collect(k, f"max by ({b.by}) (quantile_over_time({phi}, {usage}{rng}))") for k, phi in QUANTILES]
        for name, thr in (("warning", self.th.warning), ("watermark", self.th.watermark)):
            counted = f"sum by ({b.by}) (count_over_time(({usage} > {thr!r}){{sub}})) * {SUBQUERY_S}"
            jobs += self._daily(period, counted, b.key, reduced.setdefault(name, {}), after)
        waiting_counts: list[list[tuple[dict[str, str], float]]] = []
        raw_waiting = self.metric("kvcache_requests_waiting", WAITING_REASONS, b.matchers)
        for cs, ce in self._chunks(period):
            q = f"count_over_time(({raw_waiting} > 0)[{_duration(ce - cs)}:{SUBQUERY_S}s]) * {SUBQUERY_S}"
            jobs.append(_job(lambda q=q, ce=ce: waiting_counts.append(self.src.api.instant(q, ce - EDGE_S))))
        after.append(_job(self._seconds_waiting, b, period, waiting_counts, reduced))
        for metric in (
            "kvcache_gpu_memory_utilization",
            "kvcache_theoretical_bytes_per_token",
            "kvcache_gpu_memory_bytes",
        ):
            jobs.append(collect(metric, f"max by ({b.by}) (last_over_time({self.metric(metric, b.matchers)}{rng}))"))
        # the sidecars' own sizing, for models the report has no model.config for (figures.py)
        suggested = self.metric("kvcache_suggested_gpu_memory_utilization", b.matchers)
        jobs.append(collect("suggested_max", f"max by ({b.by}) (max_over_time({suggested}{rng}))"))
        fp8 = self.metric("kvcache_lever_capacity_tokens", 'lever="fp8_kv_cache"', b.matchers)
        jobs.append(collect("fp8_lever", f"max by ({b.by}) (max_over_time({fp8}{rng}))"))
        running = self.metric("kvcache_requests_running", b.matchers)
        jobs.append(collect("running", f"max by ({b.by}) (max_over_time({running}{rng}))"))
        # The newest label set of each info series: the last step it is present in. One range query per
        # series at an hour's step finds the hour; only a pod with two label sets in that hour needs that
        # hour at one-minute steps (``max_over_time(timestamp(...)[<period>:60s])`` would do it in one
        # instant query, but Prometheus 2.x evaluates that subquery in time growing with the square of its
        # range: two minutes, and a timeout, for 64 pods over a week).
        info: dict[str, dict[Any, dict[str, str]]] = {}
        for metric, labels in INFO_LABELS.items():
            newest = info.setdefault(metric, {})
            jobs.append(_job(self._newest_labels, b, period, metric, labels, newest))
        after.append(_job(_apply_figures, b, series, reduced, info))
        return jobs

    def _daily(
        self,
        period: Period,
        query: str,
        key: Callable[[dict[str, str]], Any],
        into: dict[Any, float],
        after: list[Callable[[], None]],
    ) -> list[Callable[[], None]]:
        """Jobs evaluating ``query`` (its ``{sub}`` the day's subquery range) at each day's end; ``after``
        sums the days into ``into`` by ``key``."""
        days: list[Vector] = []
        jobs = []
        for cs, ce in self._chunks(period):
            q = query.replace("{sub}", f"[{_duration(ce - cs)}:{SUBQUERY_S}s]")
            jobs.append(_job(lambda q=q, ce=ce: days.append(self.src.api.instant(q, ce - EDGE_S))))

        def total() -> None:
            for vector in days:
                for labels, v in vector:
                    into[key(labels)] = into.get(key(labels), 0.0) + v

        after.append(total)
        return jobs

    def _seconds_waiting(
        self,
        b: _Batch,
        period: Period,
        days: list[list[tuple[dict[str, str], float]]],
        reduced: dict[str, dict[Any, float]],
    ) -> None:
        """Per pod, the seconds with requests waiting for KV (any of its series with reason capacity or all).

        Counted per series and day first (``days``): ``max without (reason)`` inside the subquery makes it
        seven times dearer for Prometheus, and it changes nothing for a pod with at most one series ever
        above 0; the pods with more are counted again with it (run here, after the batch's other queries).
        """
        per_series: dict[Any, dict[tuple[tuple[str, str], ...], float]] = {}
        for vector in days:
            for labels, v in vector:
                mine = per_series.setdefault(b.key(labels), {})
                name = tuple(sorted(labels.items()))
                mine[name] = mine.get(name, 0.0) + v
        found = {key: next(iter(values.values())) for key, values in per_series.items() if len(values) == 1}
        several = [p for p in b.pods if len(per_series.get(p.key, ())) > 1]
        if several:
            again = _Batch(b.label, several)
            waiting = self.metric("kvcache_requests_waiting", WAITING_REASONS, again.matchers)
            for cs, ce in self._chunks(period):
                sub = f"[{_duration(ce - cs)}:{SUBQUERY_S}s]"
                q = f"sum by ({again.by}) (count_over_time((max without (reason) ({waiting}) > 0){sub})) * {SUBQUERY_S}"
                for labels, v in self.src.api.instant(q, ce - EDGE_S):
                    found[again.key(labels)] = found.get(again.key(labels), 0.0) + v
        reduced["waiting"] = found

    def _newest_labels(
        self, b: _Batch, period: Period, metric: str, labels: str, newest: dict[Any, dict[str, str]]
    ) -> None:
        """Each pod's label set of ``metric`` present in the latest step (ties: the first in the answer)."""
        coarse = INFO_STEP_S if period.seconds % INFO_STEP_S == 0 else period.step_s

        def last_seen(
            step_s: float, start: float, end: float
        ) -> tuple[dict[Any, list[dict[str, str]]], dict[Any, float]]:
            q = f"max by ({b.by}, {labels}) (last_over_time({self.metric(metric, b.matchers)}[{int(step_s)}s]))"
            latest: dict[Any, tuple[float, list[dict[str, str]]]] = {}
            for series_labels, times, _ in self.src.api.range(q, start + step_s - EDGE_S, end - EDGE_S, step_s):
                if not times:
                    continue
                key, t = b.key(series_labels), max(times)
                if key not in latest or t > latest[key][0]:
                    latest[key] = (t, [series_labels])
                elif t == latest[key][0]:
                    latest[key][1].append(series_labels)
            return {key: found for key, (t, found) in latest.items()}, {key: t for key, (t, _) in latest.items()}

        found, when = last_seen(coarse, period.start, period.end)
        tied = sorted({when[key] for key, sets in found.items() if len(sets) > 1 and coarse > period.step_s})
        for t in tied:  # the hour again, at the report's steps
            end = t + EDGE_S
            fine, _ = last_seen(period.step_s, end - coarse, end)
            found.update({key: sets for key, sets in fine.items() if when.get(key) == t and len(found[key]) > 1})
        newest.update({key: sets[0] for key, sets in found.items()})

    # --- pages ---------------------------------------------------------------------------------

    def _page_jobs(
        self, period: Period, pages: list[Page], after: list[Callable[[], None]]
    ) -> list[Callable[[], None]]:
        names = "|".join(PAGED_ALERTS)
        alerts = self.metric("ALERTS", f'alertname=~"{names}"', 'alertstate="firing"')
        q = f"max by (alertname, severity, {', '.join(ID_LABELS)}) (max_over_time({alerts}[60s]))"
        firing: dict[tuple[str, ...], set[int]] = {}

        def chunk(cs: float, ce: float) -> None:
            for labels, times, values in self._points(q, period, cs, ce):
                key = (
                    labels.get("alertname", ""),
                    labels.get("severity", ""),
                    labels.get("namespace", ""),
                    labels.get("model_name", ""),
                    labels.get("workload", ""),
                    labels.get("cluster", ""),
                    next((labels[k] for k in POD_NAME_LABELS if labels.get(k)), ""),
                )
                steps = firing.setdefault(key, set())
                pairs = zip(times, values, strict=True)
                steps.update(i for t, v in pairs if 0 <= (i := _step_of(t, period)) < period.steps and v > 0)

        after.append(lambda: pages.extend(_pages(firing, period)))
        return [_job(chunk, cs, ce) for cs, ce in self._chunks(period)]

    # --- per-model figures from the recording rules --------------------------------------------

    def _rule_presence_jobs(self, period: Period, presence: dict[ModelKey, set[int]]) -> list[Callable[[], None]]:
        q = f"max by (namespace, model_name) (count_over_time({self.metric(MODEL_USAGE_RULE)}[60s]))"

        def chunk(cs: float, ce: float) -> None:
            for labels, times, values in self._points(q, period, cs, ce):
                model = ModelKey(labels.get("namespace", ""), labels.get("model_name", ""))
                pairs = zip(times, values, strict=True)
                presence.setdefault(model, set()).update(_step_of(t, period) for t, v in pairs if v > 0)

        return [_job(chunk, cs, ce) for cs, ce in self._chunks(period)]

    def _model_figures(self, week: Week, presence: dict[ModelKey, set[int]]) -> None:
        """Figures over the recorded per-model series, for the models it covers."""
        covered = _covered_models(week, presence)
        if not covered:
            return
        period = week.period
        at, rng = period.end - EDGE_S, f"[{_duration(period.seconds)}]"
        usage, waiting = self.metric(MODEL_USAGE_RULE), self.metric(MODEL_WAITING_RULE)
        by = "max by (namespace, model_name)"
        queries = {"max": f"{by} (max_over_time({usage}{rng}))"}
        queries.update({k: f"{by} (quantile_over_time({phi}, {usage}{rng}))" for k, phi in QUANTILES})
        daily = {
            name: f"{by} (count_over_time(({usage} > {thr!r}){{sub}})) * {SUBQUERY_S}"
            for name, thr in (
                ("warning", self.th.warning),
                ("watermark", self.th.watermark),
            )
        }
        daily["waiting"] = f"{by} (count_over_time(({waiting} == 1){{sub}})) * {SUBQUERY_S}"
        queries["waiting_present"] = f"{by} (count_over_time({waiting}{rng}))"
        names = list(queries)
        results = self.run([_job(self.src.api.instant, queries[n], at) for n in names])

        def model_of(labels: Mapping[str, str]) -> ModelKey:
            return ModelKey(labels.get("namespace", ""), labels.get("model_name", ""))

        got = {n: {model_of(lb): v for lb, v in res} for n, res in zip(names, results, strict=True)}
        after: list[Callable[[], None]] = []
        jobs = [job for n, q in daily.items() for job in self._daily(period, q, model_of, got.setdefault(n, {}), after)]
        self.run(jobs)
        for finish in after:
            finish()
        for model in covered:
            if all(model in got[k] for k in ("max", "p50", "p95", "p99")):
                week.model_usage_quantiles[model] = {k: got[k][model] for k in ("max", "p50", "p95", "p99")}
                week.model_seconds_above[model] = {k: got[k].get(model, 0.0) for k in ("warning", "watermark")}
            if model in got["waiting_present"]:
                week.model_seconds_waiting[model] = got["waiting"].get(model, 0.0)


def _job(fn: Callable[..., Any], *args: Any) -> Callable[[], Any]:
    return lambda: fn(*args)


def _step_of(t: float, period: Period) -> int:
    """The step whose end (minus 1 ms) a range query's point ``t`` was evaluated at."""
    return int(round((t + EDGE_S - period.start) / period.step_s)) - 1


#: What a pod costs the report, measured (bench/report_memory.py: about 1 MB a pod with
#: --compare-previous, arrays, allocator and plots included; the message of --max-pods).
_POD_MB = 1.0
#: PodSeries fields holding per-step series (shared NaN until written).
_SERIES_FIELDS = tuple(s.field for s in STEP_SERIES)


def _lazy(period: Period, pod: _Pod, empty: array[float]) -> PodSeries:
    """A pod's series, each the shared all-NaN ``empty`` until :func:`_owned` gives it its own."""
    one_step = Period(period.start, period.start + period.step_s, period.step_s)  # allocates next to nothing
    series = PodSeries.empty(one_step, pod.model, pod.name, pod.engine, pod.labels())
    for name in _SERIES_FIELDS:
        setattr(series, name, empty)
    return series


def _owned(pod: PodSeries, name: str) -> MutableSequence[float]:
    """``pod``'s series ``name``, its own copy made at the first write (the memory follows the data)."""
    current: MutableSequence[float] = getattr(pod, name)
    for other in _SERIES_FIELDS:
        if other != name and getattr(pod, other) is current:
            break
    else:
        return current  # already its own
    mine = array("d", current)
    setattr(pod, name, mine)
    return mine


def _put(steps: MutableSequence[float], period: Period, times: array[float], values: array[float]) -> None:
    """Each finite value in its step (points outside the period are dropped).

    A series without gaps over the chunk (the usual case) is one slice assignment.
    """
    n = len(values)
    if not n:
        return
    first = _step_of(times[0], period)
    if _step_of(times[-1], period) - first == n - 1:  # one point a step: point k is step first + k
        lo, hi = max(0, -first), min(n, len(steps) - first)
        if lo >= hi:
            return
        inside = values[lo:hi]
        if math.isfinite(sum(inside)):  # no NaN or infinity among them
            steps[first + lo : first + hi] = inside
            return
    for t, v in zip(times, values, strict=True):
        i = _step_of(t, period)
        if 0 <= i < len(steps) and math.isfinite(v):
            steps[i] = v


def _grouped(
    matrix: Matrix, key: Callable[[dict[str, str]], Any]
) -> dict[Any, list[tuple[array[float], array[float]]]]:
    """The series of a range query by ``key`` of their labels, in the answer's order."""
    out: dict[Any, list[tuple[array[float], array[float]]]] = {}
    for labels, times, values in matrix:
        out.setdefault(key(labels), []).append((times, values))
    return out


def _merged(parts: Sequence[tuple[array[float], array[float]]]) -> tuple[array[float], array[float]]:
    """Several series as one, as Prometheus' ``max by`` does: the largest value at each time, NaN ignored."""
    if len(parts) == 1:
        return parts[0]
    best: dict[float, float] = {}
    for times, values in parts:
        for t, v in zip(times, values, strict=True):
            if v == v and (t not in best or v > best[t]):  # v == v: not NaN
                best[t] = v
    ordered = sorted(best)
    return array("d", ordered), array("d", (best[t] for t in ordered))


def _increases(before: dict[str, dict[Any, float]], series: dict[Any, PodSeries], b: _Batch) -> None:
    """The batch's counter series from last values to per-step increases, in place; a drop is a reset
    (the increase is the new value).

    The first value seen after nothing (a pod that starts in the period) adds nothing: there is no
    earlier value to rise from (as in the embedded history). The series hold finite values or NaN.
    """
    for attr, first_values in before.items():
        for p in b.pods:
            out: MutableSequence[float] = getattr(series[p.key], attr)
            prev = first_values.get(p.key, math.nan)
            for i, v in enumerate(out):
                if v != v:  # NaN: no sample in the step
                    continue
                out[i] = 0.0 if prev != prev else (v - prev if v >= prev else v)
                prev = v


def _apply_figures(
    b: _Batch,
    series: dict[Any, PodSeries],
    reduced: dict[str, dict[Any, float]],
    info: dict[str, dict[Any, dict[str, str]]],
) -> None:
    for p in b.pods:
        pod = series[p.key]
        figures = {k: reduced[k].get(p.key) for k in ("max", "p50", "p95", "p99")}
        if p.series == 1 and all(v is not None for v in figures.values()):
            pod.usage_quantiles = {k: float(v) for k, v in figures.items() if v is not None}
        pod.seconds_above = {k: reduced[k].get(p.key, 0.0) for k in ("warning", "watermark")}
        if p.key in reduced["waiting"]:
            pod.seconds_waiting = reduced["waiting"][p.key]
        pod.gpu_memory_utilization = reduced["kvcache_gpu_memory_utilization"].get(p.key)
        pod.bytes_per_token = reduced["kvcache_theoretical_bytes_per_token"].get(p.key)
        pod.requests_running_peak = reduced["running"].get(p.key)
        pod.suggested_gpu_memory_utilization_max = reduced["suggested_max"].get(p.key)
        pod.fp8_lever_capacity_tokens = reduced["fp8_lever"].get(p.key)
        pod.gpu_memory_bytes = reduced["kvcache_gpu_memory_bytes"].get(p.key)
    for metric, newest in info.items():
        for key, labels in newest.items():
            if key not in series:
                continue
            pod = series[key]
            if metric == "kvcache_server_info":
                pod.block_size = _int(labels.get("block_size"))
                kv_bytes = _int(labels.get("kv_cache_memory_bytes"))
                pod.kv_cache_memory_bytes = float(kv_bytes) if kv_bytes else None
            elif metric == "kvcache_gpu_memory_bytes":
                pod.gpu_name = labels.get("gpu", "")
            else:
                pod.model_info = {k: v for k, v in labels.items() if k not in ID_LABELS and v}


def _int(text: str | None) -> int | None:
    try:
        return int(float(text)) if text else None
    except ValueError:
        return None


def _pods(found: Vector) -> list[_Pod]:
    """The pods of the discovery query, each named by its first present name label."""
    counts: dict[tuple[ModelKey, str, str, str], int] = {}
    for labels, _ in found:
        label = next((k for k in POD_NAME_LABELS if labels.get(k)), None)
        if label is None:
            continue
        model = ModelKey.of(labels)
        key = (model, labels[label], labels.get("engine", ""), label)
        counts[key] = counts.get(key, 0) + 1
    return [_Pod(m, name, engine, label, n) for (m, name, engine, label), n in sorted(counts.items())]


def _batches(pods: Sequence[_Pod], size: int) -> list[_Batch]:
    """At most ``size`` pod names per batch, each batch selecting by one label."""
    out: list[_Batch] = []
    for label in POD_NAME_LABELS:
        names = sorted({p.name for p in pods if p.label == label})
        for i in range(0, len(names), size):
            chosen = set(names[i : i + size])
            out.append(_Batch(label, [p for p in pods if p.label == label and p.name in chosen]))
    return out


def _pages(firing: dict[tuple[str, ...], set[int]], period: Period) -> list[Page]:
    """Runs of consecutive firing steps, one page each: from the start of the first to the end of the last."""
    out: list[Page] = []
    for (alertname, severity, namespace, model_name, workload, cluster, pod), steps in firing.items():
        model = ModelKey(namespace, model_name, workload, cluster)
        ordered = sorted(steps)
        first = 0
        for k in range(1, len(ordered) + 1):
            if k == len(ordered) or ordered[k] != ordered[k - 1] + 1:
                start, end = period.time(ordered[first]), period.time(ordered[k - 1] + 1)
                out.append(Page(alertname, severity, model, pod, start, end))
                first = k
    return out


def _covered_models(week: Week, presence: dict[ModelKey, set[int]]) -> list[ModelKey]:
    """Models whose recorded usage series is present in >= RULE_COVERAGE of the minutes their pods report."""
    reported: dict[ModelKey, set[int]] = {}
    for pod in week.pods:
        reported.setdefault(pod.model, set()).update(i for i, v in enumerate(pod.usage_max) if math.isfinite(v))
    out = []
    for model, steps in sorted(reported.items()):
        if steps and len(steps & presence.get(model, set())) >= RULE_COVERAGE * len(steps):
            out.append(model)
    return out
