"""Arrival traces: real request arrivals and lengths, replayed instead of the synthetic generator.

A trace is a list of ``(arrival_s, prompt_tokens, output_tokens)`` in arrival order. Formats,
told apart by the first line:

- **Azure LLM inference trace** CSV, header ``TIMESTAMP,ContextTokens,GeneratedTokens``, the
  timestamp a date and time (``2023-11-16 18:17:03.9799600``) (Azure/AzurePublicDataset,
  ``AzureLLMInferenceDataset2023.md`` and ``AzureLLMInferenceDataset2024.md``);
- **Mooncake** JSONL, one object per line with ``timestamp`` (milliseconds), ``input_length`` and
  ``output_length`` (kvcache-ai/Mooncake, ``FAST25-release/README.md``, "Trace Format"), and
  ``hash_ids``, one id per 512-token block of the prompt (see below);
- **plain** CSV with the header ``arrival_s,prompt_tokens,output_tokens``, or JSONL with those keys
  (and ``hash_ids`` if wanted, as Mooncake's).

**Prefix sharing.** Mooncake's ``hash_ids`` are "remapped prefix block hashes. The block size is 512
tokens. Identical hash IDs indicate reusable prefix KV cache blocks" (``FAST25-release/README.md`` at
commit ``3b5a594``); the paper's appendix A.2 ("Hash ID", ``FAST25-release/Mooncake-FAST25.pdf``)
says how: token blocks of 512 are hashed "into prefix hash values that include both the current and
all preceding blocks", then "mapped to globally unique IDs". That is vLLM's chaining
(``hash_block_tokens(parent_block_hash, block tokens)``, ``vllm/v1/core/kv_cache_utils.py``) at
another block size, so the simulator caches and hits a trace's prompts block by block
(:meth:`~sidecar.simulator.engine.RequestSpec.block_keys`). Every request of the two public traces has
``ceil(input_length / 512)`` ids, the last one for a partial block; a line that does not is refused.
:func:`prefix_reuse` gives the hit ratio the trace itself implies.

Arrival times are made relative to the first request. A file that cannot be used raises
:class:`TraceError`, one line naming the file, the line and the fix; nothing is replayed from a
file with a bad line (docs/simulator.md, "Replaying a trace").

:class:`TraceWorkload` serves a trace the way :class:`~sidecar.simulator.scenarios.Workload`
serves a scenario (``next_time``, ``pop``, ``on_finish``), with an offset into the trace, a time
compression (``speed``) and an optional loop.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

from ..input_files import FileProblem, read_text
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
#: Tokens per ``hash_ids`` block (Mooncake ``FAST25-release/README.md``: "The block size is 512 tokens").
HASH_BLOCK_TOKENS = 512


class TraceError(ValueError):
    """A trace file that cannot be replayed: ``FILE:LINE: what is wrong (the fix)``."""


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    #: One id per ``HASH_BLOCK_TOKENS`` block of the prompt, chained (empty: the trace gives none).
    hash_ids: tuple[int, ...] = ()


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

    @property
    def has_hash_ids(self) -> bool:
        """True when the trace tells which prompt blocks requests share (Mooncake's ``hash_ids``)."""
        return any(r.hash_ids for r in self.requests)

    def window(self, start_s: float, end_s: float) -> ArrivalTrace:
        """The requests arriving in ``[start_s, end_s)``, times relative to ``start_s``."""
        kept = tuple(
            dataclasses.replace(r, arrival_s=r.arrival_s - start_s)
            for r in self.requests
            if start_s <= r.arrival_s < end_s
        )
        if not kept:
            raise TraceError(f"{self.name}: no request arrives between {start_s:g} s and {end_s:g} s")
        return ArrivalTrace(self.name, kept, self.format)

    def without_hash_ids(self) -> ArrivalTrace:
        """The same arrivals and lengths with no prefix sharing (every prompt new content)."""
        return ArrivalTrace(self.name, tuple(dataclasses.replace(r, hash_ids=()) for r in self.requests), self.format)


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
    for lineno, row_format, arrival, prompt, output, hashes in rows:
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
        requests.append(TraceRequest(arrival - t0, prompt, output, hashes))
    if not requests:
        raise TraceError(f"{name}: a header but no request (give one request per line)")
    return ArrivalTrace(name, tuple(requests), fmt)


#: line number, format, arrival s, prompt tokens, output tokens, hash ids
Row = tuple[int, str, float, int, int, tuple[int, ...]]


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
            fmt, arrival = "mooncake", _number(t, "timestamp", name, lineno) / 1000.0
        elif all(k in obj for k in PLAIN_COLUMNS):
            t, p, o = (obj[k] for k in PLAIN_COLUMNS)
            fmt, arrival = "plain", _number(t, "arrival_s", name, lineno)
        else:
            raise TraceError(
                f"{name}:{lineno}: missing keys; give {', '.join(PLAIN_COLUMNS)} "
                f"(or Mooncake's {', '.join(MOONCAKE_KEYS)})"
            )
        prompt, output = _lengths(p, o, name, lineno)
        yield lineno, fmt, arrival, prompt, output, _hash_ids(obj.get("hash_ids"), prompt, name, lineno)


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
        yield lineno, fmt, arrival, *_lengths(p, o, name, lineno), ()


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


def _hash_ids(value: object, prompt_tokens: int, name: str, lineno: int) -> tuple[int, ...]:
    """``hash_ids``: absent, or a list of ``ceil(prompt_tokens / 512)`` non-negative integers."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in value):
        raise TraceError(f"{name}:{lineno}: hash_ids must be a list of integers, one per 512-token block")
    blocks = -(-prompt_tokens // HASH_BLOCK_TOKENS)
    if len(value) != blocks:
        raise TraceError(
            f"{name}:{lineno}: {len(value)} hash_ids for {prompt_tokens} prompt tokens; Mooncake gives one per "
            f"{HASH_BLOCK_TOKENS}-token block, {blocks} here (a trace hashed at another block size cannot be replayed)"
        )
    if any(h < 0 for h in value):
        raise TraceError(f"{name}:{lineno}: hash_ids holds a negative id")
    return tuple(value)


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

    With ``hash_ids`` each request carries the hashes of its prompt's leading blocks that another
    replayed request also holds (:func:`shared_prefixes`); each lap of a loop is new content.
    """

    def __init__(
        self, trace: ArrivalTrace, max_model_len: int, *, speed: float = 1.0, offset_s: float = 0.0, loop: bool = False
    ) -> None:
        problems = TracePlay(trace, speed, offset_s, loop).problems()
        if problems:
            raise ValueError("; ".join(problems))
        self.requests = [r for r in trace.requests if r.arrival_s >= offset_s]
        self.shared = shared_prefixes(self.requests)
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
        r, hashes, lap = self.requests[self._i], self.shared[self._i], self._lap
        self._i += 1
        if self._i >= len(self.requests) and self.loop:
            self._i, self._lap = 0, self._lap + 1
        self.sent += 1
        prompt = max(1, min(r.prompt_tokens, self.max_model_len - 1))
        output = max(1, min(r.output_tokens, self.max_model_len - prompt))
        return RequestSpec(
            arrival=t,
            prompt_tokens=prompt,
            output_tokens=output,
            max_tokens=output,
            block_hashes=hashes,
            hash_block_tokens=HASH_BLOCK_TOKENS if hashes else 0,
            hash_lap=lap,
        )

    def on_finish(self, t: float, client: int) -> None:
        """Open loop: a finish sends nothing."""


def shared_prefixes(requests: Sequence[TraceRequest]) -> list[tuple[int, ...]]:
    """Per request, its leading ``hash_ids`` that another of ``requests`` also holds.

    Only those blocks can ever be hit, so only those get a cache key; the rest of the prompt is
    cached as the request's private blocks, which sit at the same place in the free queue (a request
    frees its tail first) and count the same. Mooncake's ids are chained, so a shared id's whole
    prefix is shared too and the cut loses nothing; it keeps the cache's keys to the reused content
    (an hour of the conversation trace: 24% of its distinct blocks).
    """
    holders = Counter(h for r in requests for h in set(r.hash_ids))
    out = []
    for r in requests:
        n = 0
        while n < len(r.hash_ids) and holders[r.hash_ids[n]] > 1:
            n += 1
        out.append(r.hash_ids[:n])
    return out


@dataclass(frozen=True)
class PrefixReuse:
    """The prefix-cache hits a trace's ``hash_ids`` imply, for a cache that never evicts.

    A block is a hit when an earlier request held its hash id, and it is in the leading run of such
    blocks (a prefix cache hits leading blocks only; in Mooncake's traces every seen block is in it).
    ``seen_tokens`` counts a hit partial last block by its own tokens.
    """

    requests: int
    blocks: int
    seen_blocks: int
    prompt_tokens: int
    seen_tokens: int

    @property
    def block_ratio(self) -> float:
        """Share of prompt blocks whose hash an earlier request held (the paper's "cache ratio")."""
        return self.seen_blocks / self.blocks if self.blocks else 0.0

    @property
    def token_ratio(self) -> float:
        """The same in tokens: what ``prefix_cache_hits_total ÷ prefix_cache_queries_total`` would read."""
        return self.seen_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def prefix_reuse(requests: Sequence[TraceRequest]) -> PrefixReuse:
    """The reuse ``requests`` (in arrival order) imply with an unbounded cache (:class:`PrefixReuse`)."""
    seen: set[int] = set()
    blocks = seen_blocks = prompt = seen_tokens = 0
    for r in requests:
        k = 0
        while k < len(r.hash_ids) and r.hash_ids[k] in seen:
            k += 1
        blocks += len(r.hash_ids)
        seen_blocks += k
        prompt += r.prompt_tokens
        seen_tokens += min(k * HASH_BLOCK_TOKENS, r.prompt_tokens)
        seen.update(r.hash_ids)
    return PrefixReuse(len(requests), blocks, seen_blocks, prompt, seen_tokens)


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
