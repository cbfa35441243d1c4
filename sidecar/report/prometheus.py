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
  compact JSON as bytes and read straight into ``array("d")`` (:func:`_cut_values`), not built as
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
- **The period before** (``--compare-previous``): the same discovery, then only the per-step series of
  ``PREVIOUS_FIELDS`` (the demand: the week-over-week growth is its peak), about a tenth of a week's memory.

Failures: each is a :class:`ReportSourceError` with one line. Each request has ``timeout_s`` in all,
connect, TLS, request and whole answer included, however slowly the server sends
(:mod:`sidecar.outbound`), and Prometheus is given the same ``timeout``; a request that ran out of it
is not sent again (so a report ends within about its timeout when Prometheus stalls). Connection
errors, 429 and 5xx answers are retried ``retries`` times with exponential backoff (0.5 s, doubling,
at most 8 s); other 4xx are not. A server's text in a message (Prometheus' own error, e.g. a
``bad_data`` parse error) has the token, the URL's password and the ``--header`` values replaced by
``***`` and is one line of at most 200 characters (:func:`sidecar.outbound.scrubbed`). An answer that
is not what the API documents (a label value that is not a string, a timestamp that is not a finite
number) is one line too. At most ``max_pods`` pods are read (:data:`MAX_PODS`); their series are
allocated as their data arrive, not when the discovery answer names them.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
from array import array
from collections.abc import Callable, Mapping, MutableSequence, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from .. import outbound
from ..artifacts.params import Thresholds
from ..files import TOKEN_MAX_BYTES, FileProblem, read_text
from .data import MAX_POINTS_PER_SERIES, PAGED_ALERTS, PREVIOUS_FIELDS, ModelKey, Page, Period, PodSeries, Week
from .data import steps as nan_steps
from .selector import Matcher, SelectorError, parse_selector, promql

#: The labels that can identify a pod's series; a pod is named by the first present of POD_NAME_LABELS.
ID_LABELS = ("namespace", "model_name", "pod", "instance", "target", "engine")
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
}
INFO_STEP_S = 3600.0
#: Answers larger than this are refused (a week of 50 pods is a few MiB).
MAX_BODY_BYTES = 256 * 1024 * 1024
#: The most pods one report reads (``--max-pods``): each costs about 0.8 MB a week of series (twice
#: with ``--compare-previous``), so a discovery answer naming more is refused before any is allocated.
MAX_PODS = 1000
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 8.0
#: The share of a model's minutes its recorded series must cover for the per-model figures.
RULE_COVERAGE = 0.99
QUANTILES = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
MODEL_USAGE_RULE = "namespace_model:kvcache_usage_ratio:max"
MODEL_WAITING_RULE = "namespace_model:kvcache_requests_waiting:bool"
WAITING_REASONS = 'reason=~"capacity|all"'

#: (PodSeries field, metric, per-step reduction); across a pod's series the maximum, taken here
#: (:func:`_merged`, as Prometheus' ``max by``): aggregating on the server doubles its CPU time for
#: these queries, and a pod has one series almost always (two across a restart with a new instance).
#: ``usage_mean`` is read only for the pods whose figures Prometheus did not reduce (:meth:`_Reader._mean_jobs`).
_STEP_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("usage_max", "kvcache_usage_ratio", "max_over_time"),
    ("demand_max", "kvcache_demand_tokens", "max_over_time"),
    ("capacity_tokens", "kvcache_capacity_tokens", "last_over_time"),
)
_STEP_COUNTERS: tuple[tuple[str, str], ...] = (
    ("preemptions", "kvcache_preemptions_total"),
    ("prefix_queries", "kvcache_prefix_cache_queries_tokens_total"),
    ("prefix_hits", "kvcache_prefix_cache_hits_tokens_total"),
)


class ReportSourceError(Exception):
    """Prometheus could not be read; the message is one line, ``exit_code`` what the CLI exits with.

    1: unreachable, an HTTP error, a timeout, an answer that is not Prometheus'; 2: bad arguments
    (the URL, the selector, the token or CA file).
    """

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(" ".join(message.split()))
        self.exit_code = exit_code


@dataclass(frozen=True)
class _Pod:
    """One pod as found: its key in the Week and the label it is selected by."""

    model: ModelKey
    name: str
    engine: str
    label: str  # "pod", "instance" or "target"
    series: int  # label sets found for it (more than one: no raw-sample quantiles)

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.model.namespace, self.model.model_name, self.name, self.engine)

    def labels(self) -> dict[str, str]:
        own = {"namespace": self.model.namespace, "model_name": self.model.model_name, self.label: self.name}
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
        self.by = f"namespace, model_name, {self.label}, engine"
        names = sorted({p.name for p in self.pods})
        own = [Matcher(self.label, "=~", "|".join(re.escape(n) for n in names)).promql()]
        # a pod named by its instance has no pod label, one named by its target neither of both
        own += [f'{label}=""' for label in POD_NAME_LABELS[: POD_NAME_LABELS.index(self.label)]]
        self.matchers = ", ".join(own)

    def key(self, labels: Mapping[str, str]) -> tuple[str, str, str, str]:
        return (
            labels.get("namespace", ""),
            labels.get("model_name", ""),
            labels.get(self.label, ""),
            labels.get("engine", ""),
        )


_Vector = list[tuple[dict[str, str], float]]
#: a range query's series: labels, timestamps, values (in time order)
_Matrix = list[tuple[dict[str, str], "array[float]", "array[float]"]]
#: How a range query's points start in the compact JSON Prometheus (Thanos, Mimir) writes.
_VALUES = b'"values":['


class PrometheusSource:
    """Read one period (and the one before it) from a Prometheus-compatible HTTP API."""

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
        if ca_file and not Path(ca_file).is_file():
            raise ReportSourceError(f"CA file {ca_file}: not a readable file", 2)
        self.url = url.rstrip("/")
        #: the URL as messages and the report show it: without user:password@
        self.shown = shown_url(self.url)
        #: what never goes into a message: the URL's user information, the --header values, the token
        self._secrets = outbound.url_secrets(self.url) + [
            v for k, v in (headers or {}).items() if k.lower() != "accept-encoding" and len(v) >= 4
        ]
        self.max_pods = max_pods
        self.bearer_token_file = bearer_token_file
        # Answers uncompressed unless the caller asks otherwise (a header 'Accept-Encoding: gzip' for a slow
        # link): gzip makes Prometheus spend a third more CPU on these answers (a week of 64 pods: ~100 MB).
        own = {} if any(k.lower() == "accept-encoding" for k in headers or {}) else {"Accept-Encoding": "identity"}
        self.headers = {**own, **(headers or {})}
        self.timeout_s = timeout_s
        self.concurrency = concurrency
        self.pods_per_query = pods_per_query
        self.retries = retries
        verify: str | bool = ca_file if ca_file else not insecure_skip_verify
        self._deadline: outbound.DeadlineBackend | None = None
        if client is None:
            client, self._deadline = outbound.client(timeout_s, verify)
        self._client = client
        self._token: str | None = None
        self._sleep: Callable[[float], None] = time.sleep
        #: what the last load() did: queries sent, attempts, Prometheus' warnings
        self.queries = 0
        self.attempts = 0
        self.warnings: list[str] = []

    # --- the HTTP edge -------------------------------------------------------------------------

    def _read_token(self) -> None:
        """The bearer token, read once per load (a rotated token is picked up by the next report)."""
        if not self.bearer_token_file:
            self._token = None
            return
        try:
            token = read_text(self.bearer_token_file, max_bytes=TOKEN_MAX_BYTES, what="a token file").strip()
        except FileProblem as e:
            raise ReportSourceError(f"bearer token file {self.bearer_token_file}: {e.reason}", 2) from None
        if not token:
            raise ReportSourceError(f"bearer token file {self.bearer_token_file} is empty", 2)
        self._token = token
        self._secrets.append(token)

    def _post(self, path: str, form: Mapping[str, str]) -> Any:
        """POST ``form`` to ``path`` with retries; the ``data`` of Prometheus' answer."""
        headers = dict(self.headers)
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        self.queries += 1
        for attempt in range(self.retries + 1):
            self.attempts += 1
            try:
                status, body = self._send(path, form, headers)
            except _TimedOut as e:
                raise ReportSourceError(str(e)) from None  # its whole time is spent: not sent again
            except _Transient as e:
                if attempt == self.retries:
                    raise ReportSourceError(f"{e} (after {attempt + 1} attempts)") from None
            else:
                if status == 429 or status >= 500:
                    if attempt == self.retries:
                        raise ReportSourceError(
                            f"{self._http_error(path, status, body)} (after {attempt + 1} attempts)"
                        )
                else:
                    return self._data(path, status, body)
            self._sleep(min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**attempt))
            if outbound.CANCELLED.is_set():
                raise ReportSourceError("stopped: the process is shutting down")
        raise AssertionError("unreachable")  # pragma: no cover

    def _send(self, path: str, form: Mapping[str, str], headers: Mapping[str, str]) -> tuple[int, bytes]:
        deadline = self._deadline.deadline(self.timeout_s) if self._deadline else contextlib.nullcontext()
        try:
            with deadline, self._client.stream("POST", self.url + path, data=dict(form), headers=headers) as response:
                chunks: list[bytes] = []
                size = 0
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > MAX_BODY_BYTES:
                        raise ReportSourceError(
                            f"{self.shown}{path}: the answer is larger than {MAX_BODY_BYTES >> 20} MiB; "
                            "select fewer pods per query"
                        )
                    chunks.append(chunk)
                return response.status_code, b"".join(chunks)
        except httpx.TimeoutException:
            raise _TimedOut(f"{self.shown}{path}: no whole answer within {self.timeout_s:g}s (--timeout)") from None
        except outbound.Cancelled:
            raise ReportSourceError("stopped: the process is shutting down") from None
        except httpx.TransportError as e:
            detail = outbound.scrubbed(str(e), self._secrets)
            raise _Transient(f"cannot reach {self.shown}: {type(e).__name__}: {detail}") from None

    def _http_error(self, path: str, status: int, body: bytes) -> str:
        try:
            doc = json.loads(body)
            detail = f"{doc.get('errorType', 'error')}: {doc['error']}"
        except (ValueError, TypeError, KeyError, AttributeError):
            detail = body[:4096].decode("utf-8", "replace").strip() or "(empty body)"
        return f"{self.shown}{path}: HTTP {status}: {outbound.scrubbed(detail, self._secrets)}"

    def _data(self, path: str, status: int, body: bytes) -> Any:
        if status != 200:
            raise ReportSourceError(self._http_error(path, status, body))
        # A range query's points are most of its answer: cut out as bytes, parsed by _points_of.
        cut = _cut_values(body) if path.endswith("query_range") else None
        try:
            doc = json.loads(cut[0] if cut else body)
        except ValueError:
            raise ReportSourceError(
                f"{self.shown}{path}: the answer is not JSON; is this a Prometheus API URL?"
            ) from None
        if not isinstance(doc, dict) or doc.get("status") not in ("success", "error"):
            raise ReportSourceError(f"{self.shown}{path}: the answer is not Prometheus' API JSON")
        if doc["status"] == "error":
            said = outbound.scrubbed(f"{doc.get('errorType', 'error')}: {doc.get('error', '')}", self._secrets)
            raise ReportSourceError(f"{self.shown}{path}: {said}")
        warnings = doc.get("warnings") or []
        self.warnings.extend(outbound.scrubbed(str(w), self._secrets) for w in warnings[:20] if w)
        data = doc.get("data")
        if not isinstance(data, dict) or not isinstance(data.get("result"), list):
            raise ReportSourceError(f"{self.shown}{path}: the answer has no result list")
        if cut:
            result = data["result"]
            if len(result) != len(cut[1]) or not all(isinstance(r, dict) and r.get("values") == [] for r in result):
                raise ReportSourceError(f"{self.shown}{path}: malformed matrix")
            for r, points in zip(result, cut[1], strict=True):
                r["values"] = points
        return data

    def _instant(self, query: str, at: float) -> _Vector:
        data = self._post("/api/v1/query", {"query": query, "time": _ts(at), "timeout": f"{self.timeout_s:g}s"})
        if data.get("resultType") != "vector":
            raise ReportSourceError(f"{self.shown}: expected a vector for {query[:60]!r}, got {data.get('resultType')}")
        try:
            return [(_labels(r["metric"]), _sample(r["value"])) for r in data["result"]]
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise ReportSourceError(f"{self.shown}: malformed vector for {query[:60]!r}: {e}") from None

    def _range(self, query: str, start: float, end: float, step_s: float = 60.0) -> _Matrix:
        points = int(round((end - start) / step_s)) + 1
        assert points <= MAX_POINTS_PER_SERIES, f"{points} points per series exceed Prometheus' limit"
        form = {"query": query, "start": _ts(start), "end": _ts(end), "step": f"{step_s:g}"}
        form["timeout"] = f"{self.timeout_s:g}s"
        # VictoriaMetrics rounds start down to a multiple of the step (for its cache) unless told not to; that
        # would move every window by the 1 ms edge (Prometheus ignores the parameter)
        form["nocache"] = "1"
        data = self._post("/api/v1/query_range", form)
        if data.get("resultType") != "matrix":
            raise ReportSourceError(f"{self.shown}: expected a matrix for {query[:60]!r}, got {data.get('resultType')}")
        try:
            return [(_labels(r["metric"]), *_points_of(r["values"])) for r in data["result"]]
        except (KeyError, TypeError, ValueError) as e:
            raise ReportSourceError(f"{self.shown}: malformed matrix for {query[:60]!r}: {e}") from None

    # --- one load ------------------------------------------------------------------------------

    def load(
        self,
        period: Period,
        selector: str | tuple[Matcher, ...] = "",
        compare_previous: bool = False,
        *,
        thresholds: Thresholds | None = None,
    ) -> Week:
        """Every pod the selector matches in ``period`` (and, asked, the period before it).

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
        self._read_token()
        self.queries = self.attempts = 0
        self.warnings = []
        th = thresholds or Thresholds()
        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="report-prometheus") as pool:
            reader = _Reader(self, pool, promql(matchers), matchers, th)
            week = reader.week(period)
            if compare_previous:
                previous = reader.previous_week(period.previous())
                week.previous = previous if previous.pods else None
        return week

    def close(self) -> None:
        self._client.close()


def shown_url(url: str) -> str:
    """What may be printed of a URL: without a ``user:password@`` (:func:`sidecar.outbound.shown_url`)."""
    return outbound.shown_url(url)


def _labels(metric: Any) -> dict[str, str]:
    """A series' labels; ValueError unless a mapping of strings to strings (the API's documented form)."""
    if not isinstance(metric, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metric.items()):
        raise ValueError("labels must be a mapping of strings to strings")
    return metric


def _sample(value: Any) -> float:
    """The value of an instant vector's ``[<time>, "<value>"]``; ValueError for a time that is not finite."""
    if not isinstance(value, list) or len(value) != 2 or not math.isfinite(float(value[0])):
        raise ValueError("a sample is [<finite time>, <value>]")
    return float(value[1])


class _Transient(Exception):
    """A failure worth retrying (connection refused or reset)."""


class _TimedOut(Exception):
    """A request that used its whole time: not retried."""


def _ts(t: float) -> str:
    return f"{t:.3f}"


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
        found = self.src._instant(
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

    def previous_week(self, period: Period) -> Week:
        """The period before: its pods and only the series the figures read of it (PREVIOUS_FIELDS)."""
        pods, series = self._discover(period)
        window = "[60s]"
        jobs = [
            _job(self._fill_steps, f"{fn}({self.metric(metric, b.matchers)}{window})", b, period, series, attr, cs, ce)
            for b in _batches(pods, self.src.pods_per_query)
            for attr, metric, fn in _STEP_GAUGES
            if attr in PREVIOUS_FIELDS
            for cs, ce in self._chunks(period)
        ]
        self.run(jobs)
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
        self, b: _Batch, period: Period, series: dict[Any, PodSeries], after: list[Callable[[], None]]
    ) -> list[Callable[[], None]]:
        jobs: list[Callable[[], None]] = []
        window = "[60s]"
        queries: list[tuple[str, str]] = [
            (attr, f"{fn}({self.metric(metric, b.matchers)}{window})") for attr, metric, fn in _STEP_GAUGES
        ]
        waiting = self.metric("kvcache_requests_waiting", WAITING_REASONS, b.matchers)
        queries.append(("waiting_max", f"max_over_time({waiting}{window})"))
        for cs, ce in self._chunks(period):
            for attr, q in queries:
                jobs.append(_job(self._fill_steps, q, b, period, series, attr, cs, ce))
            theoretical = self.metric("kvcache_theoretical_capacity_tokens", b.matchers)
            q = f"last_over_time({theoretical}{window})"
            jobs.append(_job(self._fill_theoretical, q, b, period, series, cs, ce))
        counter_before: dict[str, dict[Any, float]] = {}
        for attr, metric in _STEP_COUNTERS:
            before = counter_before.setdefault(attr, {})
            q = f"last_over_time({self.metric(metric, b.matchers)}{window})"
            for cs, ce in self._chunks(period):
                jobs.append(_job(self._fill_lasts, q, b, period, series, attr, before, cs, ce))
        after.append(_job(_increases, counter_before, series, b))
        return jobs

    def _mean_jobs(self, b: _Batch, period: Period, series: dict[Any, PodSeries]) -> list[Callable[[], None]]:
        """The steps' mean usage (``avg by``: Prometheus' mean of a pod's series, one almost always)."""
        q = f"avg by ({b.by}) (avg_over_time({self.metric('kvcache_usage_ratio', b.matchers)}[60s]))"
        return [_job(self._fill_steps, q, b, period, series, "usage_mean", cs, ce) for cs, ce in self._chunks(period)]

    def _points(self, q: str, period: Period, cs: float, ce: float, before: bool = False) -> _Matrix:
        """Series of ``q`` over the chunk's steps; with ``before``, also the step before the chunk."""
        first = cs if before else cs + period.step_s
        return self.src._range(q, first - EDGE_S, ce - EDGE_S)

    def _fill_steps(
        self, q: str, b: _Batch, period: Period, series: dict[Any, PodSeries], attr: str, cs: float, ce: float
    ) -> None:
        for key, parts in _grouped(self._points(q, period, cs, ce), b.key).items():
            pod = series.get(key)
            if pod is not None:
                _put(_owned(pod, attr), period, *_merged(parts))

    def _fill_theoretical(
        self, q: str, b: _Batch, period: Period, series: dict[Any, PodSeries], cs: float, ce: float
    ) -> None:
        """budget="exact" where it exists, else "estimated"."""
        result = _grouped(self._points(q, period, cs, ce), lambda lb: (b.key(lb), lb.get("budget", "estimated")))
        for budget in ("estimated", "exact"):
            for (key, of), parts in result.items():
                pod = series.get(key)
                if pod is not None and of == budget:
                    _put(_owned(pod, "theoretical_capacity_tokens"), period, *_merged(parts))

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
                reduced[name] = {b.key(labels): v for labels, v in self.src._instant(q, at)}

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
            jobs.append(_job(lambda q=q, ce=ce: waiting_counts.append(self.src._instant(q, ce - EDGE_S))))
        after.append(_job(self._seconds_waiting, b, period, waiting_counts, reduced))
        for metric in ("kvcache_gpu_memory_utilization", "kvcache_theoretical_bytes_per_token"):
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
        days: list[_Vector] = []
        jobs = []
        for cs, ce in self._chunks(period):
            q = query.replace("{sub}", f"[{_duration(ce - cs)}:{SUBQUERY_S}s]")
            jobs.append(_job(lambda q=q, ce=ce: days.append(self.src._instant(q, ce - EDGE_S))))

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
                for labels, v in self.src._instant(q, ce - EDGE_S):
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
            for series_labels, times, _ in self.src._range(q, start + step_s - EDGE_S, end - EDGE_S, step_s):
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
        results = self.run([_job(self.src._instant, queries[n], at) for n in names])

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
_SERIES_FIELDS = (
    "usage_max",
    "usage_mean",
    "demand_max",
    "capacity_tokens",
    "theoretical_capacity_tokens",
    "preemptions",
    "prefix_queries",
    "prefix_hits",
    "waiting_max",
    "running_max",
)


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
    matrix: _Matrix, key: Callable[[dict[str, str]], Any]
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


def _cut_values(body: bytes) -> tuple[bytes, list[bytes]] | None:
    """A range query's answer with each ``"values":[...]`` emptied, and the points cut out, in order.

    Prometheus, Thanos and Mimir write compact JSON; points are ``[<time>,"<value>"]`` with no
    bracket in them, so a series' points end at the first ``]]``, and ``"values":[`` cannot occur
    inside a JSON string (its quotes would be escaped). None when the answer is not written that way
    (any other spacing): it is then parsed as JSON throughout.
    """
    parts = body.split(_VALUES)
    if len(parts) == 1:
        return None
    kept, cut = [parts[0]], []
    for part in parts[1:]:
        end = 0 if part.startswith(b"]") else part.find(b"]]") + 1
        if end == 0 and not part.startswith(b"]"):
            return None
        cut.append(part[:end])
        kept.append(_VALUES + part[end:])
    return b"".join(kept), cut


def _points_of(values: Any) -> tuple[array[float], array[float]]:
    """Timestamps and values of a series' points: cut-out bytes, or the JSON list ``[[t, "v"], ...]``.

    Raises ValueError or TypeError when they are not numbers in pairs.
    """
    if isinstance(values, bytes):
        tokens = values.translate(None, b'[]"').split(b",") if values else []
        if len(tokens) % 2:
            raise ValueError("points come in pairs")
        times, numbers = array("d", map(float, tokens[0::2])), array("d", map(float, tokens[1::2]))
    elif not isinstance(values, list):
        raise TypeError("points are a list")
    else:
        times = array("d", (float(t) for t, _ in values))
        numbers = array("d", (float(v) for _, v in values))
    if not math.isfinite(sum(times)):
        raise ValueError("a point's time is not a finite number")
    return times, numbers


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
    for metric, newest in info.items():
        for key, labels in newest.items():
            if key not in series:
                continue
            pod = series[key]
            if metric == "kvcache_server_info":
                pod.block_size = _int(labels.get("block_size"))
                kv_bytes = _int(labels.get("kv_cache_memory_bytes"))
                pod.kv_cache_memory_bytes = float(kv_bytes) if kv_bytes else None
            else:
                pod.model_info = {k: v for k, v in labels.items() if k not in ID_LABELS and v}


def _int(text: str | None) -> int | None:
    try:
        return int(float(text)) if text else None
    except ValueError:
        return None


def _pods(found: _Vector) -> list[_Pod]:
    """The pods of the discovery query, each named by its first present name label."""
    counts: dict[tuple[ModelKey, str, str, str], int] = {}
    for labels, _ in found:
        label = next((k for k in POD_NAME_LABELS if labels.get(k)), None)
        if label is None:
            continue
        model = ModelKey(labels.get("namespace", ""), labels.get("model_name", ""))
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
    for (alertname, severity, namespace, model_name, pod), steps in firing.items():
        model = ModelKey(namespace, model_name)
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
