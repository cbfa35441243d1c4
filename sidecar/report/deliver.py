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

Never a lost week: :func:`deliver` first records the week in a small marker file next to the reports
(:data:`PENDING_FILE`, JSON, replaced atomically), then posts every week the marker holds, oldest
first, removing each from it once delivered. A week whose delivery failed stays in the marker and is
posted, before the new one, at the next run; a rerun of the same week (the Job's retry, minutes later)
replaces its entry. Why a marker and not a re-read of old reports: it carries exactly the text that
would have been sent, and costs no query.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from .. import outbound
from ..atomic_write import write_atomically
from ..input_files import TOKEN_MAX_BYTES, FileProblem, read_text

log = logging.getLogger("kv_sidecar.report")

#: Seconds one POST may take in all (connect, send and read together, however slowly the receiver
#: answers): :func:`sidecar.outbound.client`'s deadline, without its cancellation on SIGTERM (made for
#: reading Prometheus), which would abort the delivery of a report already written: ``kv-sidecar
#: reporter`` finishes that on its way out, within ``attempts`` × this plus the back-off.
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


#: The bodies a webhook can take: Slack's ``{"text": ...}``, or a generic JSON object for a receiver of
#: one's own (a chat bridge, an automation), which gets the link and the period as fields of their own.
PAYLOAD_FORMATS = ("slack", "json")


def payload(
    text: str, *, fmt: str = "slack", link: str = "", period: tuple[float, float] | None = None
) -> dict[str, Any]:
    """The JSON body for ``fmt``: Slack's text with the link on its last line, or the fields apart."""
    if fmt not in PAYLOAD_FORMATS:
        raise ValueError(f"fmt: one of {PAYLOAD_FORMATS}, got {fmt!r}")
    if fmt == "slack":
        return {"text": f"{text}\nFull report: <{link}>" if link else text}
    body: dict[str, Any] = {"summary": text, "link": link or None}
    if period is not None:
        body["period"] = {"start": period[0], "end": period[1]}
    return body


def post_summary(
    webhook_url_file: Path,
    text: str,
    *,
    fmt: str = "slack",
    link: str = "",
    period: tuple[float, float] | None = None,
    attempts: int = 4,
    backoff_s: float = 1.0,
    client: httpx.Client | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Post the summary (:func:`payload`) to the webhook of ``webhook_url_file``; raises :class:`DeliveryError`."""
    if attempts < 1:
        raise ValueError("attempts: at least 1")
    body = payload(text, fmt=fmt, link=link, period=period)
    url = read_webhook_url(Path(webhook_url_file))
    host = webhook_host(url)
    # httpx logs every request's full URL at INFO: the secret would land in the log.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger("httpx").level))
    own = client is None
    if client is not None:
        http, deadline = client, None
    else:  # each POST ends within TIMEOUT_S in all, even against a receiver that drips its answer
        http, backend = outbound.client(TIMEOUT_S, cancellable=False, follow_redirects=False)
        deadline = backend.deadline
    try:
        for attempt in range(1, attempts + 1):
            with deadline(TIMEOUT_S) if deadline is not None else contextlib.nullcontext():
                failure, retry_after = _attempt(http, url, body)
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


def _attempt(http: httpx.Client, url: str, body: dict[str, Any]) -> tuple[str | None, float | None]:
    """One POST: (None, None) on success, else (why, seconds to wait at least) — None when not retryable."""
    try:
        answer = http.post(url, json=body)
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


# ----------------------------------------------------------------------------- never a lost week

#: The weeks not yet delivered, next to the reports in ``--out`` (a dot file: never taken for a report).
PENDING_FILE = ".kvcache-report-pending.json"


def read_pending(out_dir: Path) -> list[dict[str, Any]]:
    """The weeks waiting in ``out_dir``'s marker, oldest first (none without a marker).

    Raises :class:`DeliveryError` when the marker cannot be read: it is left as it is, never overwritten.
    """
    path = Path(out_dir) / PENDING_FILE
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:
        raise DeliveryError(
            f"{path}: cannot read the weeks waiting for delivery ({type(e).__name__}); move it away"
        ) from None
    if not isinstance(entries, list) or not all(_is_entry(e) for e in entries):
        raise DeliveryError(f"{path}: not a list of weeks waiting for delivery; move it away")
    return entries


def _is_entry(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("text"), str)
        and isinstance(entry.get("link"), str)
        and isinstance(entry.get("period"), list)
        and len(entry["period"]) == 2
        and all(isinstance(t, int | float) for t in entry["period"])
    )


def _write_pending(out_dir: Path, entries: list[dict[str, Any]]) -> None:
    """Replace the marker atomically (a temporary file renamed over it); remove it when nothing waits."""
    path = Path(out_dir) / PENDING_FILE
    if not entries:
        path.unlink(missing_ok=True)
        return
    write_atomically(path, json.dumps(entries, indent=1), mode=0o600)


def deliver(
    out_dir: Path,
    webhook_url_file: Path,
    text: str,
    *,
    period: tuple[float, float],
    link: str = "",
    fmt: str = "slack",
    post: Callable[..., None] = post_summary,
) -> int:
    """Record this week, then post every waiting week (oldest first); the number delivered.

    Raises :class:`DeliveryError` at the first week that fails: it and the later ones stay recorded.
    """
    entries = [e for e in read_pending(out_dir) if not _same_week(e["period"], period)]
    entries.append({"text": text, "link": link, "period": list(period)})
    entries.sort(key=lambda e: e["period"][1])
    _write_pending(out_dir, entries)
    sent = 0
    while entries:
        first = entries[0]
        start, end = first["period"]
        post(webhook_url_file, first["text"], fmt=fmt, link=first["link"], period=(start, end))
        entries = entries[1:]
        _write_pending(out_dir, entries)
        sent += 1
    return sent


def _same_week(waiting: list[float], period: tuple[float, float]) -> bool:
    """A waiting entry that this period replaces: one ending in its second half (the same week run again, by
    the Job's retry minutes later or by hand), not the week before, which ends where this one starts."""
    start, end = period
    return start + (end - start) / 2 < waiting[1] <= end


def dry_run_text(webhook_url_file: Path | None, text: str, *, period: tuple[float, float], link: str, fmt: str) -> str:
    """What :func:`deliver` would send, for ``--dry-run``: the webhook's host only, and the JSON body."""
    where = f"the webhook at {webhook_host(read_webhook_url(webhook_url_file))}" if webhook_url_file else "no webhook"
    body = json.dumps(payload(text, fmt=fmt, link=link, period=period), indent=2, ensure_ascii=False)
    return f"would POST ({fmt}) to {where}:\n{body}"
