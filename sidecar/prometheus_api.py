"""One client of the Prometheus HTTP API, for the weekly report and the dashboards' panel proof.

What: :class:`PrometheusClient` sends the three read requests both need (Prometheus docs, "HTTP API"):
an instant query (``/api/v1/query``), a range query (``/api/v1/query_range``) and a label's values
(``/api/v1/label/<name>/values``); the same requests work on Thanos, Mimir and VictoriaMetrics.
:mod:`sidecar.report.prometheus` builds the report's queries on it; :class:`sidecar.artifacts.panels.PrometheusAPI`
gives the dashboards' snapshot and tests Grafana's view of the answers (the JSON result lists).

How a request goes:

- **Queries are POSTed as a form** (the API accepts ``POST`` with ``Content-Type:
  application/x-www-form-urlencoded`` for both query endpoints): a selector of 50 pod names does not fit
  every proxy's URL limit. Label values are a ``GET`` (that endpoint has no ``POST``). Times are sent
  with millisecond precision, Prometheus' own resolution (it rounds them to milliseconds anyway).
- **Time**: each request has ``timeout_s`` in all, connect, TLS, request and whole answer included,
  however slowly the server sends (:func:`sidecar.outbound.client`'s deadline), and the server is given
  the same ``timeout`` parameter. A request that ran out of its time is not sent again, so a caller
  ends within about its timeout when the server stalls; :func:`sidecar.outbound.cancel_all` (SIGTERM)
  ends one in flight.
- **Retries**: connection errors, 429 and 5xx answers are sent again ``retries`` times with exponential
  backoff (0.5 s, doubling, at most 8 s); other 4xx are not (a parse error stays one).
- **Size**: an answer larger than ``max_body_bytes`` is refused while it arrives, before it is all in
  memory.
- **Errors** are one :class:`PrometheusError` of one line: the URL as it may be shown (no
  ``user:password@``), the path, and Prometheus' own ``errorType: error`` text (e.g. ``bad_data: parse
  error ...``), with the token, the URL's password and the extra header values replaced by ``***``
  (:func:`sidecar.outbound.scrubbed`). An answer that is not what the API documents (a label value that
  is not a string, a timestamp that is not a finite number) is one line too.
- **Range answers** are most of what the report reads (about 100 MB of JSON for a week of 64 pods):
  each series' points are cut out of the compact JSON as bytes and read straight into ``array("d")``
  (:func:`cut_values`, :func:`points_of`), not built as Python lists first; an answer written with
  other spacing is parsed as plain JSON. They are asked uncompressed (``Accept-Encoding: identity``:
  gzip cost Prometheus a third more CPU) unless the caller's headers ask for gzip.
- **Warnings** Prometheus returns beside a result (a partial answer from Thanos, say) are kept in
  :attr:`PrometheusClient.warnings`, scrubbed, at most 20 per answer.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from array import array
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Self

import httpx

from . import outbound
from .input_files import TOKEN_MAX_BYTES, FileProblem, read_text

#: Answers larger than this are refused (a day of 50 pods at one point a minute is a few MiB).
MAX_BODY_BYTES = 256 * 1024 * 1024
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 8.0
#: Prometheus refuses a range query of more than this many points per series
#: (``exceeded maximum resolution of 11,000 points per timeseries``).
MAX_POINTS_PER_SERIES = 11_000
#: An error text is cut to this many bytes of the body before it is scrubbed and shortened.
_ERROR_BODY_BYTES = 4096
#: How a range query's points start in the compact JSON Prometheus (Thanos, Mimir) writes.
_VALUES = b'"values":['

Labels = dict[str, str]
#: an instant query's series: labels and value
Vector = list[tuple[Labels, float]]
#: a range query's series: labels, timestamps, values (in time order)
Matrix = list[tuple[Labels, "array[float]", "array[float]"]]


class PrometheusError(Exception):
    """The server could not be reached or refused the request; the message is one line saying which and why.

    ``exit_code`` is what a command exits with: 1 unreachable, an HTTP error, a timeout, an answer that is
    not the API's; 2 bad arguments (the URL, the token or CA file).
    """

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(" ".join(message.split()))
        self.exit_code = exit_code


class _Transient(Exception):
    """A failure worth retrying (connection refused or reset)."""


class _TimedOut(Exception):
    """A request that used its whole time: not retried."""


class PrometheusClient:
    """The read endpoints of one Prometheus-compatible server, with a deadline, retries and a size limit.

    ``url``: the API's base (``http://prometheus:9090``, ``https://mimir/prometheus``), optionally with
    ``user:password@``; ``headers``: sent with every request (``X-Scope-OrgID`` for a tenant);
    ``bearer_token_file``: read by :meth:`read_token` (each report picks up a rotated token);
    ``timeout_hint``/``size_hint``: the setting an error for a timeout/an answer too large names as the
    one to change (the report's ``--timeout``/``--pods-per-query``);
    ``client``: an ``httpx.Client`` to send with (tests), else one with :mod:`sidecar.outbound`'s deadline.
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
        retries: int = 3,
        max_body_bytes: int = MAX_BODY_BYTES,
        timeout_hint: str = "",
        size_hint: str = "",
        client: httpx.Client | None = None,
    ) -> None:
        problem = outbound.url_problem(url or "")
        if problem is not None:
            raise PrometheusError(f"{outbound.shown_url(url or '')}: {problem}", 2)
        if retries < 0 or not timeout_s > 0:
            raise PrometheusError("retries must be >= 0 and the timeout > 0", 2)
        if ca_file and not Path(ca_file).is_file():
            raise PrometheusError(f"CA file {ca_file}: not a readable file", 2)
        self.url = url.rstrip("/")
        #: the URL as messages and reports show it: without user:password@
        self.shown = outbound.shown_url(self.url)
        #: what never goes into a message: the URL's user information, the header values, the token
        self._secrets = outbound.url_secrets(self.url) + [
            v for k, v in (headers or {}).items() if k.lower() != "accept-encoding" and len(v) >= 4
        ]
        own = {} if any(k.lower() == "accept-encoding" for k in headers or {}) else {"Accept-Encoding": "identity"}
        self.headers = {**own, **(headers or {})}
        self.bearer_token_file = bearer_token_file
        self.timeout_s = timeout_s
        self.retries = retries
        self.max_body_bytes = max_body_bytes
        self._timeout_hint = f" ({timeout_hint})" if timeout_hint else ""
        self._size_hint = f" ({size_hint})" if size_hint else ""
        verify: str | bool = ca_file if ca_file else not insecure_skip_verify
        self._deadline: outbound.DeadlineBackend | None = None
        if client is None:
            client, self._deadline = outbound.client(timeout_s, verify)
        self._client = client
        self._token: str | None = None
        #: how the backoff waits (tests count the waits instead)
        self.sleep: Callable[[float], None] = time.sleep
        #: requests made, attempts sent (retries included) and the server's warnings, since :meth:`reset_counts`
        self.queries = 0
        self.attempts = 0
        self.warnings: list[str] = []

    # --- credentials and counts ----------------------------------------------------------------

    def read_token(self) -> None:
        """Read the bearer token file (none: no ``Authorization`` header); raises :class:`PrometheusError` (2)."""
        if not self.bearer_token_file:
            self._token = None
            return
        try:
            token = read_text(self.bearer_token_file, max_bytes=TOKEN_MAX_BYTES, what="a token file").strip()
        except FileProblem as e:
            raise PrometheusError(f"bearer token file {self.bearer_token_file}: {e.reason}", 2) from None
        if not token:
            raise PrometheusError(f"bearer token file {self.bearer_token_file} is empty", 2)
        self._token = token
        self._secrets.append(token)

    def reset_counts(self) -> None:
        """Start counting queries, attempts and warnings afresh (one report's worth)."""
        self.queries = self.attempts = 0
        self.warnings = []

    # --- the three read endpoints --------------------------------------------------------------

    def instant(self, query: str, at: float) -> Vector:
        """``query`` evaluated at ``at`` (Unix seconds): each series' labels and value; the answer must be a vector."""
        data = self.data("/api/v1/query", {"query": query, "time": _ts(at)})
        if data.get("resultType") != "vector":
            raise PrometheusError(f"{self.shown}: expected a vector for {query[:60]!r}, got {data.get('resultType')}")
        try:
            return [(labels_of(r["metric"]), sample_of(r["value"])) for r in data["result"]]
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise PrometheusError(f"{self.shown}: malformed vector for {query[:60]!r}: {e}") from None

    def range(self, query: str, start: float, end: float, step_s: float = 60.0) -> Matrix:
        """``query`` at ``start``, ``start + step_s``, ... up to ``end``: each series' labels, times and values.

        At most :data:`MAX_POINTS_PER_SERIES` steps (a caller cuts a longer range in chunks).
        """
        points = int(round((end - start) / step_s)) + 1
        if points > MAX_POINTS_PER_SERIES:
            raise ValueError(f"{points:,} points per series exceed Prometheus' limit of {MAX_POINTS_PER_SERIES:,}")
        data = self.data("/api/v1/query_range", range_form(query, start, end, step_s), points=True)
        if data.get("resultType") != "matrix":
            raise PrometheusError(f"{self.shown}: expected a matrix for {query[:60]!r}, got {data.get('resultType')}")
        try:
            return [(labels_of(r["metric"]), *points_of(r["values"])) for r in data["result"]]
        except (KeyError, TypeError, ValueError) as e:
            raise PrometheusError(f"{self.shown}: malformed matrix for {query[:60]!r}: {e}") from None

    def label_values(self, label: str, match: str | None = None) -> list[str]:
        """Values of ``label``, on the series ``match`` selects when given."""
        params = {"match[]": match} if match else {}
        data = self.data(f"/api/v1/label/{label}/values", params, method="GET")
        if not isinstance(data, list) or not all(isinstance(v, str) for v in data):
            raise PrometheusError(f"{self.shown}: label values of {label!r} are not a list of strings")
        return data

    # --- one request ---------------------------------------------------------------------------

    def data(self, path: str, form: Mapping[str, str], *, method: str = "POST", points: bool = False) -> Any:
        """The ``data`` of the answer to ``form`` at ``path``, retried as the module says.

        A query endpoint's data is checked to hold a ``result`` list; with ``points`` (a range query)
        its series' ``values`` are the points cut out as bytes (:func:`points_of` reads them).
        """
        headers = dict(self.headers)
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        if path.startswith("/api/v1/query"):
            form = {**form, "timeout": f"{self.timeout_s:g}s"}
        self.queries += 1
        for attempt in range(self.retries + 1):
            self.attempts += 1
            try:
                status, body = self._send(method, path, form, headers)
            except _TimedOut as e:
                raise PrometheusError(str(e)) from None  # its whole time is spent: not sent again
            except _Transient as e:
                if attempt == self.retries:
                    raise PrometheusError(f"{e} {_after(attempt + 1)}") from None
            else:
                if status != 429 and status < 500:
                    return self._data(path, status, body, points)
                if attempt == self.retries:
                    raise PrometheusError(f"{self._http_error(path, status, body)} {_after(attempt + 1)}")
            self.sleep(min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**attempt))
            if outbound.CANCELLED.is_set():
                raise PrometheusError("stopped: the process is shutting down")
        raise AssertionError("unreachable")  # pragma: no cover

    def _send(self, method: str, path: str, form: Mapping[str, str], headers: Mapping[str, str]) -> tuple[int, bytes]:
        """(status, body) of one attempt, the body read up to :attr:`max_body_bytes`."""
        deadline = self._deadline.deadline(self.timeout_s) if self._deadline else contextlib.nullcontext()
        request: dict[str, Any] = {"data": dict(form)} if method == "POST" else {"params": dict(form)}
        try:
            with deadline, self._client.stream(method, self.url + path, headers=headers, **request) as response:
                chunks: list[bytes] = []
                size = 0
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > self.max_body_bytes:
                        raise PrometheusError(
                            f"{self.shown}{path}: the answer is larger than {_size(self.max_body_bytes)}; "
                            f"select fewer series per query{self._size_hint}"
                        )
                    chunks.append(chunk)
                return response.status_code, b"".join(chunks)
        except httpx.TimeoutException:
            raise _TimedOut(
                f"{self.shown}{path}: no whole answer within {self.timeout_s:g}s{self._timeout_hint}"
            ) from None
        except outbound.Cancelled:
            raise PrometheusError("stopped: the process is shutting down") from None
        except httpx.TransportError as e:
            detail = outbound.scrubbed(str(e), self._secrets)
            raise _Transient(f"cannot reach {self.shown}: {type(e).__name__}: {detail}") from None

    def _http_error(self, path: str, status: int, body: bytes) -> str:
        """``<url><path>: HTTP <status>: <errorType>: <error>`` (or the body's start when it is not the API's JSON)."""
        try:
            doc = json.loads(body)
            detail = f"{doc.get('errorType', 'error')}: {doc['error']}"
        except (ValueError, TypeError, KeyError, AttributeError):
            detail = body[:_ERROR_BODY_BYTES].decode("utf-8", "replace").strip() or "(empty body)"
        return f"{self.shown}{path}: HTTP {status}: {outbound.scrubbed(detail, self._secrets)}"

    def _data(self, path: str, status: int, body: bytes, points: bool) -> Any:
        if status != 200:
            raise PrometheusError(self._http_error(path, status, body))
        cut = cut_values(body) if points else None
        try:
            doc = json.loads(cut[0] if cut else body)
        except ValueError:
            raise PrometheusError(
                f"{self.shown}{path}: the answer is not JSON; is this a Prometheus API URL?"
            ) from None
        if not isinstance(doc, dict) or doc.get("status") not in ("success", "error"):
            raise PrometheusError(f"{self.shown}{path}: the answer is not Prometheus' API JSON")
        if doc["status"] == "error":
            said = outbound.scrubbed(f"{doc.get('errorType', 'error')}: {doc.get('error', '')}", self._secrets)
            raise PrometheusError(f"{self.shown}{path}: {said}")
        warnings = doc.get("warnings") or []
        self.warnings.extend(outbound.scrubbed(str(w), self._secrets) for w in warnings[:20] if w)
        data = doc.get("data")
        if not path.startswith("/api/v1/query"):
            return data
        if not isinstance(data, dict) or not isinstance(data.get("result"), list):
            raise PrometheusError(f"{self.shown}{path}: the answer has no result list")
        if cut:
            result = data["result"]
            if len(result) != len(cut[1]) or not all(isinstance(r, dict) and r.get("values") == [] for r in result):
                raise PrometheusError(f"{self.shown}{path}: malformed matrix")
            for r, raw in zip(result, cut[1], strict=True):
                r["values"] = raw
        return data

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _size(n: int) -> str:
    return f"{n >> 20:,} MiB" if n >= 1 << 20 else f"{n:,} bytes"


def _after(attempts: int) -> str:
    return "(after 1 attempt)" if attempts == 1 else f"(after {attempts} attempts)"


def range_form(query: str, start: float, end: float, step_s: float) -> dict[str, str]:
    """The form of a range query. ``nocache=1``: VictoriaMetrics rounds ``start`` down to a multiple of
    the step (for its cache) unless told not to, which would move every window a caller placed on purpose
    (the report's steps end 1 ms early); Prometheus ignores the parameter."""
    return {"query": query, "start": _ts(start), "end": _ts(end), "step": _seconds(step_s), "nocache": "1"}


def _ts(t: float) -> str:
    """A time as the API takes it: Unix seconds with milliseconds (Prometheus' resolution)."""
    return f"{t:.3f}"


def _seconds(s: float) -> str:
    """A step in seconds, without trailing zeros (``60``, ``0.5``)."""
    return f"{s:.3f}".rstrip("0").rstrip(".")


def labels_of(metric: Any) -> Labels:
    """A series' labels; ValueError unless a mapping of strings to strings (the API's documented form)."""
    if not isinstance(metric, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metric.items()):
        raise ValueError("labels must be a mapping of strings to strings")
    return metric


def sample_of(value: Any) -> float:
    """The value of an instant vector's ``[<time>, "<value>"]``; ValueError for a time that is not finite."""
    if not isinstance(value, list) or len(value) != 2 or not math.isfinite(float(value[0])):
        raise ValueError("a sample is [<finite time>, <value>]")
    return float(value[1])


def cut_values(body: bytes) -> tuple[bytes, list[bytes]] | None:
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


def points_of(values: Any) -> tuple[array[float], array[float]]:
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
