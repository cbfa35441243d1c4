"""Fetching a target's ``/metrics`` (the HTTP edge): limits, and one reason per failure.

Every failure is classified into a fixed set of reasons (:data:`sidecar.reasons.REASONS`, re-exported
here for the importers of the old path), all exported from the start at 0 so that a rate() over them
works before the first failure. The body is streamed and the download stops at the size limit; the
whole exchange (connect, headers, body) is bounded by the target's timeout, so a server that drips its
body slowly is a ``timeout``, not a hang.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass

import httpx

from . import __version__
from .config import TargetConfig, read_bearer_token

# re-exported: the old import path keeps working
from .reasons import REASONS as REASONS
from .reasons import ScrapeFailed as ScrapeFailed

ACCEPT = "text/plain;version=0.0.4;q=0.9,*/*;q=0.1"


@dataclass(frozen=True)
class Fetched:
    body: bytes | bytearray
    duration_s: float
    #: The simulator's ``X-Simulated-Time`` header, when present.
    simulated_time: float | None


def make_client(target: TargetConfig) -> httpx.AsyncHTTPTransport:
    """One httpx async transport per target: a keep-alive connection pool with the target's TLS settings.

    The transport, not ``httpx.AsyncClient``: a scrape needs none of the
    client's cookie jar, redirect handling or auth flows, and on a vLLM page
    they cost about a fifth of the CPU of a whole scrape-and-export cycle
    (``bench/scrape_cycle.py``). A redirect is therefore an ``http_4xx``:
    point ``targets[].url`` at the final URL.
    """
    verify: bool | ssl.SSLContext = True
    if target.tls_insecure_skip_verify:
        verify = False
    elif target.tls_ca_file:
        verify = ssl.create_default_context(cafile=target.tls_ca_file)
    return httpx.AsyncHTTPTransport(
        verify=verify, trust_env=False, limits=httpx.Limits(max_connections=2, max_keepalive_connections=1)
    )


def _redacted(text: str, target: TargetConfig) -> str:
    """``text`` without the target's bearer token: transport errors can quote request headers."""
    if target.bearer_token_file:
        try:
            text = text.replace(read_bearer_token(target.bearer_token_file), "<redacted>")
        except ValueError:
            pass  # no valid token: none was sent (reason token_file)
    return text


def _auth_headers(target: TargetConfig) -> dict[str, str]:
    if not target.bearer_token_file:
        return {}
    # Read at every scrape so a rotated token is picked up; never logged.
    try:
        token = read_bearer_token(target.bearer_token_file)
    except ValueError as e:
        raise ScrapeFailed("token_file", f"bearer_token_file: {e}") from None
    return {"Authorization": f"Bearer {token}"}


async def fetch(client: httpx.AsyncHTTPTransport, target: TargetConfig) -> Fetched:
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
        # h11/httpcore messages can quote request headers; the token is validated before it is sent,
        # and redacted here as well, so a detail can never carry it into a log.
        raise ScrapeFailed("refused", _redacted(f"{type(e).__name__}: {e}", target)[:200]) from None
    except OSError as e:  # a socket error httpx did not wrap
        raise ScrapeFailed("refused", f"{type(e).__name__}: {e}"[:200]) from None


async def _fetch(transport: httpx.AsyncHTTPTransport, target: TargetConfig, start: float) -> Fetched:
    headers = {"Accept": ACCEPT, "User-Agent": f"kv-cache-sidecar/{__version__}", **_auth_headers(target)}
    timeout = {
        "connect": target.timeout_s,
        "read": target.timeout_s,
        "write": target.timeout_s,
        "pool": target.timeout_s,
    }
    request = httpx.Request("GET", target.url, headers=headers, extensions={"timeout": timeout})
    response = await transport.handle_async_request(request)
    try:
        if response.status_code >= 500:
            raise ScrapeFailed("http_5xx", f"HTTP {response.status_code}")
        if response.status_code != 200:
            where = response.headers.get("location")
            if where and "?" in where:  # a signed or tokenised URL must not reach the log
                where = where.split("?", 1)[0] + "?<query>"
            raise ScrapeFailed(
                "http_4xx", f"HTTP {response.status_code}" + (f" (redirect to {where}: use that URL)" if where else "")
            )
        limit = target.body_size_limit_bytes
        declared = response.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise ScrapeFailed("too_large", f"Content-Length {declared} > limit {limit}")
        body = bytearray()  # grown in place: no second copy of a large page for a join
        size = 0
        async for chunk in response.stream:  # type: ignore[union-attr]
            size += len(chunk)
            if size > limit:
                raise ScrapeFailed("too_large", f"body exceeds the limit of {limit} bytes")
            body += chunk
        sim = response.headers.get("x-simulated-time")
        try:
            sim_time = float(sim) if sim is not None else None
        except ValueError:
            sim_time = None
        return Fetched(_decompress(response, body), time.perf_counter() - start, sim_time)
    finally:
        await response.aclose()


def _decompress(response: httpx.Response, body: bytearray) -> bytearray:
    """The body as sent. We never ask for compression (no Accept-Encoding), so a compressed answer
    comes from something in between; it is refused rather than inflated past the size limit."""
    encoding = response.headers.get("content-encoding", "identity").lower()
    if encoding in ("", "identity"):
        return body
    raise ScrapeFailed("invalid_text", f"unexpected Content-Encoding {encoding!r} (the sidecar asks for none)")
