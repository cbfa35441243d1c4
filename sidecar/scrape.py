"""Fetching a target's ``/metrics`` (the HTTP edge): limits, and one reason per failure.

Every failure is classified into a fixed set of reasons (:data:`REASONS`), all
exported from the start at 0 so that a rate() over them works before the first
failure. The body is streamed and the download stops at the size limit; the
whole exchange (connect, headers, body) is bounded by the target's timeout,
so a server that drips its body slowly is a ``timeout``, not a hang.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from . import __version__
from .config import TargetConfig

#: Why a scrape failed; fixed so the error counter's cardinality is bounded.
REASONS: tuple[str, ...] = (
    "refused",            # connection refused, reset or unreachable
    "timeout",            # no complete answer within the target's timeout
    "http_4xx",
    "http_5xx",
    "too_large",          # body above targets[].body_size_limit
    "invalid_text",       # not UTF-8 exposition text, or the parser rejected it
    "empty",              # 200 with an empty body
    "no_engine_metrics",  # 200 with text, but no family of the target's engine
)

ACCEPT = "text/plain;version=0.0.4;q=0.9,*/*;q=0.1"


class ScrapeFailed(Exception):
    def __init__(self, reason: str, detail: str):
        assert reason in REASONS, reason
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


@dataclass(frozen=True)
class Fetched:
    body: bytes
    duration_s: float
    #: The simulator's ``X-Simulated-Time`` header, when present.
    simulated_time: float | None


def make_client(target: TargetConfig) -> httpx.AsyncClient:
    """One client per target (connection reuse; its own TLS settings)."""
    verify: bool | ssl.SSLContext = True
    if target.tls_insecure_skip_verify:
        verify = False
    elif target.tls_ca_file:
        verify = ssl.create_default_context(cafile=target.tls_ca_file)
    headers = {"Accept": ACCEPT, "User-Agent": f"kv-cache-sidecar/{__version__}"}
    return httpx.AsyncClient(verify=verify, headers=headers, follow_redirects=True,
                             timeout=httpx.Timeout(target.timeout_s),
                             limits=httpx.Limits(max_connections=2, max_keepalive_connections=1))


def _auth_headers(target: TargetConfig) -> dict[str, str]:
    if not target.bearer_token_file:
        return {}
    # Read at every scrape so a rotated token is picked up; never logged.
    token = Path(target.bearer_token_file).read_text(encoding="utf-8").strip()
    return {"Authorization": f"Bearer {token}"}


async def fetch(client: httpx.AsyncClient, target: TargetConfig) -> Fetched:
    """The body of ``target.url``; raises :class:`ScrapeFailed` with a reason."""
    start = time.perf_counter()
    try:
        async with asyncio.timeout(target.timeout_s):
            return await _fetch(client, target, start)
    except TimeoutError:
        raise ScrapeFailed("timeout", f"no complete answer within {target.timeout_s:g}s") from None
    except httpx.TimeoutException as e:
        raise ScrapeFailed("timeout", type(e).__name__) from None
    except httpx.TransportError as e:
        raise ScrapeFailed("refused", f"{type(e).__name__}: {e}"[:200]) from None
    except OSError as e:  # e.g. the bearer token file vanished
        raise ScrapeFailed("refused", f"{type(e).__name__}: {e}"[:200]) from None


async def _fetch(client: httpx.AsyncClient, target: TargetConfig, start: float) -> Fetched:
    async with client.stream("GET", target.url, headers=_auth_headers(target)) as response:
        if response.status_code >= 500:
            raise ScrapeFailed("http_5xx", f"HTTP {response.status_code}")
        if response.status_code != 200:  # redirects are followed; anything else is the client's fault
            raise ScrapeFailed("http_4xx", f"HTTP {response.status_code}")
        limit = target.body_size_limit_bytes
        declared = response.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise ScrapeFailed("too_large", f"Content-Length {declared} > limit {limit}")
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > limit:
                raise ScrapeFailed("too_large", f"body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
        sim = response.headers.get("x-simulated-time")
        try:
            sim_time = float(sim) if sim is not None else None
        except ValueError:
            sim_time = None
        return Fetched(b"".join(chunks), time.perf_counter() - start, sim_time)
