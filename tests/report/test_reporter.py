"""``kv-sidecar reporter``'s pieces: the webhook delivery (a real local HTTP server) and the schedule.

The webhook stub answers each POST with the next status of its script and records what it got;
the URL holds a secret path segment that must never appear in a log line or an error message.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from apscheduler.triggers.cron import CronTrigger

from sidecar.report.deliver import DeliveryError, post_summary, read_webhook_url
from sidecar.report.reporter import cron_trigger, next_run_times, run_once, run_reporter

pytestmark = pytest.mark.timeout(60)

SECRET = "T0SECRET/B0SECRET/xoxSECRETtoken"


class WebhookStub(ThreadingHTTPServer):
    """Answers POSTs with the statuses of ``script`` in turn (the last one repeats); records the bodies."""

    daemon_threads = True

    def __init__(self, script: list[int], delay_s: float = 0.0, headers: dict[str, str] | None = None) -> None:
        self.script = list(script)
        self.delay_s = delay_s
        self.headers = headers or {}
        self.posts: list[tuple[str, dict]] = []
        super().__init__(("127.0.0.1", 0), _Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/services/{SECRET}"

    def next_status(self) -> int:
        return self.script.pop(0) if len(self.script) > 1 else self.script[0]

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        server: WebhookStub = self.server  # type: ignore[assignment]
        server.posts.append((self.path, json.loads(body)))
        status = server.next_status()
        if server.delay_s and len(server.posts) == 1:
            time.sleep(server.delay_s)  # only the first answer is late
        reply = b"ok" if status == 200 else b"error"
        self.send_response(status)
        for k, v in server.headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        try:
            self.wfile.write(reply)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def stub_factory():
    made: list[WebhookStub] = []

    def make(script: list[int], **kw) -> WebhookStub:
        s = WebhookStub(script, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()


def _url_file(tmp_path: Path, url: str) -> Path:
    f = tmp_path / "webhook-url"
    f.write_text(f"  {url}\n", encoding="utf-8")  # a Secret's file often ends with a newline
    return f


def _no_secret(caplog: pytest.LogCaptureFixture, *texts: str) -> None:
    for text in (caplog.text, *texts):
        assert "SECRET" not in text


@pytest.fixture(autouse=True)
def _debug_logs(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.DEBUG)


def test_posts_the_summary_as_slack_json(tmp_path, stub_factory, caplog):
    stub = stub_factory([200])
    post_summary(_url_file(tmp_path, stub.url), "KV-cache report\n1. llama needs more KV", backoff_s=0.01)
    assert stub.posts == [(f"/services/{SECRET}", {"text": "KV-cache report\n1. llama needs more KV"})]
    assert "host=127.0.0.1" in caplog.text
    _no_secret(caplog)


def test_retries_a_5xx_then_succeeds(tmp_path, stub_factory, caplog):
    stub = stub_factory([500, 503, 200])
    waits: list[float] = []
    post_summary(_url_file(tmp_path, stub.url), "hello", backoff_s=0.5, sleep=waits.append)
    assert len(stub.posts) == 3
    assert waits == [0.5, 1.0]  # backoff_s × 2^(n − 1)
    _no_secret(caplog)


def test_429_waits_its_retry_after(tmp_path, stub_factory):
    stub = stub_factory([429, 200], headers={"Retry-After": "3"})
    waits: list[float] = []
    post_summary(_url_file(tmp_path, stub.url), "hello", backoff_s=0.1, sleep=waits.append)
    assert waits == [3.0] and len(stub.posts) == 2


def test_always_500_raises_one_line_without_the_url(tmp_path, stub_factory, caplog):
    stub = stub_factory([500])
    with pytest.raises(DeliveryError) as e:
        post_summary(_url_file(tmp_path, stub.url), "hello", attempts=3, backoff_s=0.0)
    assert len(stub.posts) == 3
    message = str(e.value)
    assert message == "webhook at 127.0.0.1: HTTP 500 after 3 attempts"
    _no_secret(caplog, message)


def test_a_4xx_is_not_retried(tmp_path, stub_factory, caplog):
    stub = stub_factory([404])
    with pytest.raises(DeliveryError, match=r"HTTP 404, not retried"):
        post_summary(_url_file(tmp_path, stub.url), "hello", backoff_s=0.0)
    assert len(stub.posts) == 1
    _no_secret(caplog)


def test_a_timeout_is_retried(tmp_path, stub_factory, caplog):
    stub = stub_factory([200], delay_s=1.0)
    with httpx.Client(timeout=0.2) as client:
        post_summary(_url_file(tmp_path, stub.url), "hello", backoff_s=0.0, client=client)
    assert len(stub.posts) == 2
    assert "timed out" in caplog.text
    _no_secret(caplog)


def test_connection_refused_is_retried_then_reported(tmp_path, caplog):
    stub = WebhookStub([200])
    url = stub.url
    stub.stop()  # nothing listens there any more
    with pytest.raises(DeliveryError, match=r"connection failed \(ConnectError\) after 2 attempts") as e:
        post_summary(_url_file(tmp_path, url), "hello", attempts=2, backoff_s=0.0)
    _no_secret(caplog, str(e.value))


@pytest.mark.parametrize("content", ["", "\n", "not a url", "ftp://example.com/x"])
def test_a_file_without_an_http_url_is_refused(tmp_path, content):
    f = tmp_path / "url"
    f.write_text(content)
    with pytest.raises(DeliveryError, match="does not hold an http"):
        read_webhook_url(f)


def test_a_missing_file_is_one_line(tmp_path):
    with pytest.raises(DeliveryError, match=r"cannot read it \(No such file or directory\)"):
        read_webhook_url(tmp_path / "absent")


# --- one run ---------------------------------------------------------------------------------


@dataclass
class FakeOutcome:
    summary_text: str
    paths: list[Path] = field(default_factory=list)


def _written_report(tmp_path: Path) -> FakeOutcome:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    page = out / "report.html"
    page.write_text("<html>report</html>")
    return FakeOutcome("summary", [page])


def test_a_failed_delivery_keeps_the_files(tmp_path, stub_factory, caplog):
    stub = stub_factory([500])
    outcome = _written_report(tmp_path)
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in outcome.paths}
    url_file = _url_file(tmp_path, stub.url)
    ok = run_once(lambda: outcome, lambda o: post_summary(url_file, o.summary_text, attempts=2, backoff_s=0.0))
    assert ok is False and len(stub.posts) == 2
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in outcome.paths} == before
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [e.getMessage() for e in errors] == ["report not delivered: webhook at 127.0.0.1: HTTP 500 after 2 attempts"]
    _no_secret(caplog)


def test_a_failed_report_is_one_log_line_and_not_delivered(tmp_path, stub_factory, caplog):
    stub = stub_factory([200])

    def job():
        raise RuntimeError("Prometheus at http://prom:9090 answered 503\nafter 4 attempts")

    url_file = _url_file(tmp_path, stub.url)
    assert run_once(job, lambda o: post_summary(url_file, o.summary_text)) is False
    assert stub.posts == []
    (error,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert error.getMessage() == "report failed: Prometheus at http://prom:9090 answered 503 after 4 attempts"


# --- the schedule ----------------------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["0 6 * * fun", "0 6 * *", "61 6 * * mon", "* * * * * *"])
def test_a_bad_schedule_names_the_flag(schedule):
    with pytest.raises(ValueError, match=r"^--schedule: ") as e:
        cron_trigger(schedule, "UTC")
    assert "\n" not in str(e.value)


def test_a_bad_timezone_names_the_flag():
    with pytest.raises(ValueError, match=r"^--timezone: 'Europe/Pariss' is not a time zone"):
        cron_trigger("0 6 * * mon", "Europe/Pariss")
    with pytest.raises(ValueError, match=r"^--timezone: "):
        run_reporter("0 6 * * mon", "Mars/Olympus", job=lambda: FakeOutcome("x"), stop=threading.Event())


def test_mondays_0600_paris_stay_at_0600_across_the_dst_change():
    """Summer time ends on Sunday 2026-10-25 in Europe: 06:00 Paris is 04:00 UTC before, 05:00 after."""
    runs = next_run_times("0 6 * * mon", "Europe/Paris", datetime(2026, 10, 14, 12, 0, tzinfo=UTC), 4)
    assert [r.strftime("%Y-%m-%d %H:%M %a") for r in runs] == [
        "2026-10-19 06:00 Mon",
        "2026-10-26 06:00 Mon",
        "2026-11-02 06:00 Mon",
        "2026-11-09 06:00 Mon",
    ]
    assert [r.astimezone(UTC).hour for r in runs] == [4, 5, 5, 5]


def test_the_default_schedule_is_mondays_at_six_utc():
    (run,) = next_run_times("0 6 * * mon", "UTC", datetime(2026, 12, 1, 23, 0, tzinfo=UTC), 1)
    assert run == datetime(2026, 12, 7, 6, 0, tzinfo=UTC)


def test_run_reporter_runs_the_job_survives_a_failure_and_stops(tmp_path, stub_factory, caplog):
    """A trigger firing every second: a failing run, then successful ones (each delivered), then stop."""
    stub = stub_factory([200])
    stop = threading.Event()
    calls: list[float] = []
    outcome = _written_report(tmp_path)
    url_file = _url_file(tmp_path, stub.url)

    def job():
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise RuntimeError("the first report fails")
        if len(calls) == 3:
            stop.set()
        return outcome

    thread = threading.Thread(
        target=run_reporter,
        kwargs={
            "job": job,
            "publish": lambda o: post_summary(url_file, o.summary_text),
            "stop": stop,
            "trigger": CronTrigger(second="*"),
        },
    )
    thread.start()
    thread.join(timeout=20)
    assert not thread.is_alive(), "run_reporter did not stop when stop was set"
    assert len(calls) == 3
    assert [body for _, body in stub.posts] == [{"text": "summary"}, {"text": "summary"}]
    assert "report failed: the first report fails" in caplog.text
    assert "reporter stopped" in caplog.text
    _no_secret(caplog)


def test_run_now_runs_one_report_at_start(tmp_path):
    stop = threading.Event()
    calls: list[int] = []

    def job():
        calls.append(1)
        stop.set()
        return FakeOutcome("x")

    thread = threading.Thread(target=run_reporter, kwargs={"job": job, "stop": stop, "run_now": True})
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive() and calls == [1]  # the Monday schedule itself would not have run yet


def test_generic_json_carries_the_link_and_period_and_is_retried(tmp_path, stub_factory, caplog):
    """The generic JSON body for a receiver of one's own: a failure first, then the same body again."""
    stub = stub_factory([503, 200])
    waits: list[float] = []
    link = "https://reports.example/kvcache-report-2026-11-23_2026-11-30.html"
    post_summary(
        _url_file(tmp_path, stub.url), "1. llama", fmt="json", link=link, period=(1.0, 2.0), sleep=waits.append
    )
    want = {"summary": "1. llama", "link": link, "period": {"start": 1.0, "end": 2.0}}
    assert [body for _, body in stub.posts] == [want, want] and waits == [1.0]
    _no_secret(caplog)


def test_slack_text_ends_with_the_link(tmp_path, stub_factory):
    stub = stub_factory([200])
    post_summary(_url_file(tmp_path, stub.url), "1. llama", link="https://r.example/x.html")
    assert stub.posts[0][1] == {"text": "1. llama\nFull report: <https://r.example/x.html>"}
