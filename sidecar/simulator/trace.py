"""Arrival traces: real request arrivals and lengths, replayed instead of the synthetic generator.

A trace is a list of ``(arrival_s, prompt_tokens, output_tokens)`` in arrival order. Formats,
told apart by the first line:

- **Azure LLM inference trace** CSV, header ``TIMESTAMP,ContextTokens,GeneratedTokens``, the
  timestamp a date and time (``2023-11-16 18:17:03.9799600``) (Azure/AzurePublicDataset,
  ``AzureLLMInferenceDataset2023.md`` and ``AzureLLMInferenceDataset2024.md``);
- **Mooncake** JSONL, one object per line with ``timestamp`` (milliseconds), ``input_length`` and
  ``output_length`` (kvcache-ai/Mooncake, ``FAST25-release/README.md``, "Trace Format");
- **plain** CSV with the header ``arrival_s,prompt_tokens,output_tokens``, or JSONL with those keys.

Arrival times are made relative to the first request. A file that cannot be used raises
:class:`TraceError`, one line naming the file, the line and the fix; nothing is replayed from a
file with a bad line (docs/simulator.md, "Replaying a trace").

:class:`TraceWorkload` serves a trace the way :class:`~sidecar.simulator.scenarios.Workload`
serves a scenario (``next_time``, ``pop``, ``on_finish``), with an offset into the trace, a time
compression (``speed``) and an optional loop.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from ..files import FileProblem, read_text
from .config import SimConfig
from .engine import RequestSpec
from .scenarios import Scenario

#: Largest trace file read (a week of the Azure 2024 trace is about 1 GB: cut it first).
MAX_TRACE_BYTES = 256 << 20
#: Most requests one trace may hold (the Azure 2023 conversation hour holds 19,366).
MAX_TRACE_REQUESTS = 2_000_000
#: Longest prompt or output a trace line may give, tokens (no served model reaches 10M).
MAX_TRACE_TOKENS = 10_000_000

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
PLAIN_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")


class TraceError(ValueError):
    """A trace file that cannot be replayed: ``FILE:LINE: what is wrong (the fix)``."""


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class ArrivalTrace:
    """Requests in arrival order, times relative to the first arrival (seconds)."""

    name: str
    requests: tuple[TraceRequest, ...]
    #: "azure", "mooncake" or "plain"
    format: str

    @property
    def duration_s(self) -> float:
        return self.requests[-1].arrival_s

    def window(self, start_s: float, end_s: float) -> ArrivalTrace:
        """The requests arriving in ``[start_s, end_s)``, times relative to ``start_s``."""
        kept = tuple(
            TraceRequest(r.arrival_s - start_s, r.prompt_tokens, r.output_tokens)
            for r in self.requests
            if start_s <= r.arrival_s < end_s
        )
        if not kept:
            raise TraceError(f"{self.name}: no request arrives between {start_s:g} s and {end_s:g} s")
        return ArrivalTrace(self.name, kept, self.format)


def load_trace(path: str, *, max_bytes: int = MAX_TRACE_BYTES, max_requests: int = MAX_TRACE_REQUESTS) -> ArrivalTrace:
    """Read and check the trace file ``path``; :class:`TraceError` names the line of the first problem."""
    try:
        text = read_text(path, max_bytes=max_bytes, what="a trace file")
    except FileProblem as e:
        raise TraceError(str(e)) from None
    return parse_trace(text, path, max_requests=max_requests)


def parse_trace(text: str, name: str, *, max_requests: int = MAX_TRACE_REQUESTS) -> ArrivalTrace:
    """The trace in ``text`` (any of the module's formats); ``name`` prefixes every error."""
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None:
        raise TraceError(f"{name}: the file is empty (give a trace: {', '.join(PLAIN_COLUMNS)} per line)")
    head = lines[first].lstrip()
    rows = _jsonl(lines, name) if head.startswith("{") else _csv(lines, first, name)
    requests: list[TraceRequest] = []
    fmt = ""
    t0 = previous = None
    for lineno, row_format, arrival, prompt, output in rows:
        fmt = row_format
        if len(requests) >= max_requests:
            raise TraceError(
                f"{name}:{lineno}: more than {max_requests:,} requests (cut the trace to the hours you replay)"
            )
        if previous is not None and arrival < previous:
            raise TraceError(
                f"{name}:{lineno}: arrival {arrival:g} s is earlier than the line before ({previous:g} s); "
                "sort the trace by arrival time"
            )
        previous = arrival
        t0 = arrival if t0 is None else t0
        requests.append(TraceRequest(arrival - t0, prompt, output))
    if not requests:
        raise TraceError(f"{name}: a header but no request (give one request per line)")
    return ArrivalTrace(name, tuple(requests), fmt)


Row = tuple[int, str, float, int, int]  # line number, format, arrival s, prompt tokens, output tokens


def _jsonl(lines: list[str], name: str) -> Iterator[Row]:
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        lineno = i + 1
        try:
            obj = json.loads(line)
        except ValueError as e:  # JSONDecodeError, or an integer too long to convert
            why = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
            raise TraceError(f"{name}:{lineno}: not a JSON object ({why}); one request per line") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{name}:{lineno}: not a JSON object; one request per line")
        if all(k in obj for k in MOONCAKE_KEYS):
            t, p, o = (obj[k] for k in MOONCAKE_KEYS)
            yield lineno, "mooncake", _number(t, "timestamp", name, lineno) / 1000.0, *_lengths(p, o, name, lineno)
        elif all(k in obj for k in PLAIN_COLUMNS):
            t, p, o = (obj[k] for k in PLAIN_COLUMNS)
            yield lineno, "plain", _number(t, "arrival_s", name, lineno), *_lengths(p, o, name, lineno)
        else:
            raise TraceError(
                f"{name}:{lineno}: missing keys; give {', '.join(PLAIN_COLUMNS)} "
                f"(or Mooncake's {', '.join(MOONCAKE_KEYS)})"
            )


def _csv(lines: list[str], first: int, name: str) -> Iterator[Row]:
    header = [c.strip() for c in next(csv.reader([lines[first]]))]
    if all(c in header for c in AZURE_COLUMNS):
        fmt, columns = "azure", AZURE_COLUMNS
    elif all(c in header for c in PLAIN_COLUMNS):
        fmt, columns = "plain", PLAIN_COLUMNS
    else:
        raise TraceError(
            f"{name}:{first + 1}: missing columns; the header must name {','.join(PLAIN_COLUMNS)} "
            f"(or Azure's {','.join(AZURE_COLUMNS)}), got {','.join(header)!r}"
        )
    idx = [header.index(c) for c in columns]
    for i in range(first + 1, len(lines)):
        if not lines[i].strip():
            continue
        lineno = i + 1
        cells = next(csv.reader([lines[i]]))
        if len(cells) < len(header):
            raise TraceError(f"{name}:{lineno}: {len(cells)} columns, the header has {len(header)}")
        t, p, o = (cells[k].strip() for k in idx)
        arrival = _azure_time(t, name, lineno) if fmt == "azure" else _number(t, columns[0], name, lineno)
        yield lineno, fmt, arrival, *_lengths(p, o, name, lineno)


def _azure_time(text: str, name: str, lineno: int) -> float:
    """Azure's ``2023-11-16 18:17:03.9799600`` (seven fractional digits) as unix seconds (UTC)."""
    date, _, frac = text.partition(".")
    try:
        whole = datetime.fromisoformat(date + "+00:00").timestamp()
    except ValueError:
        raise TraceError(
            f"{name}:{lineno}: TIMESTAMP {text!r} is not a date and time (2023-11-16 18:17:03.98)"
        ) from None
    if frac and not frac.isdigit():
        raise TraceError(f"{name}:{lineno}: TIMESTAMP {text!r} is not a date and time (2023-11-16 18:17:03.98)")
    return whole + (int(frac) / 10 ** len(frac) if frac else 0.0)


def _number(value: object, column: str, name: str, lineno: int) -> float:
    try:
        x = float(value) if isinstance(value, (int, float, str)) and not isinstance(value, bool) else math.nan
    except ValueError:
        x = math.nan
    if not math.isfinite(x):
        raise TraceError(f"{name}:{lineno}: {column} {value!r} is not a number")
    if x < 0:
        raise TraceError(f"{name}:{lineno}: {column} {value!r} is negative")
    return x


def _lengths(prompt: object, output: object, name: str, lineno: int) -> tuple[int, int]:
    out = []
    for value, what in ((prompt, "prompt tokens"), (output, "output tokens")):
        x = _number(value, what, name, lineno)
        if x != int(x) or x > MAX_TRACE_TOKENS:
            raise TraceError(
                f"{name}:{lineno}: {what} {value!r} is not a whole number of tokens up to {MAX_TRACE_TOKENS:,}"
            )
        out.append(int(x))
    return out[0], out[1]


class TraceWorkload:
    """The requests of a trace, in arrival order, as the simulator's workload.

    Request ``r`` arrives at ``(r.arrival_s − offset_s) ÷ speed`` simulated seconds (requests
    before ``offset_s`` are skipped); with ``loop`` the trace starts again, from ``offset_s``,
    one mean inter-arrival gap after its last request. Prompts are cut to ``max_model_len − 1``
    tokens and outputs to what is left (vLLM refuses longer requests; here they are kept,
    shortened, so that the arrival pattern stays the trace's). A request with no output token
    generates one (a prefill-only request still holds its blocks for one step).
    """

    def __init__(
        self, trace: ArrivalTrace, max_model_len: int, *, speed: float = 1.0, offset_s: float = 0.0, loop: bool = False
    ) -> None:
        problems = TracePlay(trace, speed, offset_s, loop).problems()
        if problems:
            raise ValueError("; ".join(problems))
        self.requests = [r for r in trace.requests if r.arrival_s >= offset_s]
        self.offset_s = offset_s
        self.speed = speed
        self.loop = loop
        self.max_model_len = max_model_len
        span = self.requests[-1].arrival_s - offset_s
        self.period_s = span + (span / max(1, len(self.requests) - 1) if len(self.requests) > 1 else 1.0)
        self.sent = 0
        self._i = 0
        self._lap = 0

    def _arrival(self) -> float:
        if self._i >= len(self.requests):
            return math.inf
        r = self.requests[self._i]
        return (r.arrival_s - self.offset_s + self._lap * self.period_s) / self.speed

    def next_time(self) -> float:
        return self._arrival()

    def pop(self) -> RequestSpec:
        t = self._arrival()
        r = self.requests[self._i]
        self._i += 1
        if self._i >= len(self.requests) and self.loop:
            self._i, self._lap = 0, self._lap + 1
        self.sent += 1
        prompt = max(1, min(r.prompt_tokens, self.max_model_len - 1))
        output = max(1, min(r.output_tokens, self.max_model_len - prompt))
        return RequestSpec(arrival=t, prompt_tokens=prompt, output_tokens=output, max_tokens=output)

    def on_finish(self, t: float, client: int) -> None:
        """Open loop: a finish sends nothing."""


@dataclass(frozen=True)
class TracePlay:
    """How a trace is replayed: from ``offset_s`` into it, ``speed`` times faster, looped or not."""

    trace: ArrivalTrace
    speed: float = 1.0
    offset_s: float = 0.0
    loop: bool = False

    def problems(self) -> list[str]:
        out = []
        if not self.speed > 0:
            out.append(f"--trace-speed: must be > 0, got {self.speed:g}")
        if self.offset_s < 0 or (self.offset_s > 0 and self.offset_s >= self.trace.duration_s):
            out.append(
                f"--trace-offset: must be at least 0 and less than the trace's {self.trace.duration_s:g} s, "
                f"got {self.offset_s:g}"
            )
        return out

    @property
    def duration_s(self) -> float:
        """Simulated seconds one pass of the trace takes, from the offset."""
        return (self.trace.duration_s - self.offset_s) / self.speed

    def workload(self, max_model_len: int) -> TraceWorkload:
        return TraceWorkload(self.trace, max_model_len, speed=self.speed, offset_s=self.offset_s, loop=self.loop)

    def scenario(self, config: SimConfig, *, restart_at: float | None = None) -> Scenario:
        """A scenario naming the trace (its rate profile is the trace's mean rate: for display only)."""
        n = len(self.trace.requests)
        mean_rate = n / max(self.trace.duration_s, 1.0) * self.speed
        return Scenario(
            f"trace:{self.trace.name}",
            f"{n} requests of the {self.trace.format} trace {self.trace.name} from {self.offset_s:g} s, "
            f"{self.speed:g}x{', looped' if self.loop else ''}",
            self.duration_s,
            config=config,
            rate_points=((0.0, mean_rate),),
            restart_at=restart_at,
        )
