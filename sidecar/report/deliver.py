"""The report's summary to a Slack-compatible webhook, retried, with the URL kept secret.

What: :func:`post_summary` reads the webhook URL from a file and posts ``{"text": ...}`` to it, the
payload of Slack's incoming webhooks (Slack API docs, "Sending messages using incoming webhooks"),
which Mattermost, Rocket.Chat and Microsoft Teams' Slack-compatible connectors accept too.

Why a file: a webhook URL is a credential (whoever holds it can post to the channel), so it is read
from a file (a Kubernetes Secret mounted as one, say) at each delivery, never taken on the command
line, and never logged or put in an error message: only its host is.

Retries: a 5xx answer, a 429 (rate limited: Slack's ``Retry-After`` is honoured up to
:data:`MAX_RETRY_AFTER_S`), a timeout or a connection error is retried, ``attempts`` times in all,
waiting ``backoff_s × 2^(n − 1)`` after the ``n``-th failure. Any other answer (a 4xx: a revoked or
mistyped URL) is not retried. The last failure raises :class:`DeliveryError`, whose message is one
line; the report files already written are never touched here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from ..files import TOKEN_MAX_BYTES, FileProblem, read_text

log = logging.getLogger("kv_sidecar.report")

#: Seconds one POST may take (connect, send and read each).
TIMEOUT_S = 10.0
#: A ``Retry-After`` longer than this is cut to it: the reporter must not sleep for hours.
MAX_RETRY_AFTER_S = 60.0


class DeliveryError(Exception):
    """The summary could not be delivered; the message is one line naming the host, never the URL."""


def read_webhook_url(path: Path) -> str:
    """The URL in ``path`` (surrounding whitespace stripped); raises :class:`DeliveryError`."""
    try:
        url = read_text(str(path), max_bytes=TOKEN_MAX_BYTES, what="a file holding the webhook's URL").strip()
    except FileProblem as e:
        raise DeliveryError(f"--webhook-url-file {path}: cannot read it ({e.reason})") from None
    parts = urlsplit(url)
    if not url or parts.scheme not in ("http", "https") or not parts.hostname:
        raise DeliveryError(
            f"--webhook-url-file {path}: does not hold an http(s) URL; write the webhook's URL alone on one line"
        )
    return url


def webhook_host(url: str) -> str:
    """What may be logged of a webhook URL: its host."""
    return urlsplit(url).hostname or "?"


def post_summary(
    webhook_url_file: Path,
    text: str,
    *,
    attempts: int = 4,
    backoff_s: float = 1.0,
    client: httpx.Client | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Post ``{"text": text}`` to the webhook of ``webhook_url_file``; raises :class:`DeliveryError`."""
    if attempts < 1:
        raise ValueError("attempts: at least 1")
    url = read_webhook_url(Path(webhook_url_file))
    host = webhook_host(url)
    # httpx logs every request's full URL at INFO: the secret would land in the log.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger("httpx").level))
    own = client is None
    http = client if client is not None else httpx.Client(timeout=TIMEOUT_S, follow_redirects=False)
    try:
        for attempt in range(1, attempts + 1):
            failure, retry_after = _attempt(http, url, text)
            if failure is None:
                log.info("report summary delivered host=%s attempt=%d", host, attempt)
                return
            if retry_after is None:  # an answer that no retry can change
                raise DeliveryError(f"webhook at {host}: {failure}, not retried; check the URL in {webhook_url_file}")
            if attempt == attempts:
                raise DeliveryError(f"webhook at {host}: {failure} after {attempts} attempts")
            wait = max(backoff_s * 2 ** (attempt - 1), retry_after)
            log.warning(
                "report summary not delivered host=%s attempt=%d reason=%r retry_in=%.1fs", host, attempt, failure, wait
            )
            sleep(wait)
    finally:
        if own:
            http.close()


def _attempt(http: httpx.Client, url: str, text: str) -> tuple[str | None, float | None]:
    """One POST: (None, None) on success, else (why, seconds to wait at least) — None when not retryable."""
    try:
        answer = http.post(url, json={"text": text})
    except httpx.TimeoutException:
        return "timed out", 0.0
    except httpx.TransportError as e:  # refused, reset, DNS: the message may hold the URL, so only the kind
        return f"connection failed ({type(e).__name__})", 0.0
    if answer.is_success:
        return None, None
    why = f"HTTP {answer.status_code}"
    if answer.status_code == 429:
        return why, _retry_after(answer)
    if answer.status_code >= 500:
        return why, 0.0
    return why, None


def _retry_after(answer: httpx.Response) -> float:
    """Seconds of a ``Retry-After: N`` header (an HTTP date or nonsense: 0), at most :data:`MAX_RETRY_AFTER_S`."""
    try:
        return min(MAX_RETRY_AFTER_S, max(0.0, float(answer.headers.get("retry-after", "0"))))
    except ValueError:
        return 0.0
