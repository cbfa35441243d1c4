"""``kv-sidecar report``'s delivery: the summary to a real local webhook (tests/report/test_reporter.py's
stub, a ThreadingHTTPServer), a failure and its retry, a failed week sent at the next run, ``--keep-weeks``
keeping exactly N weeks and nothing else, and ``--dry-run`` printing the body with the webhook's host only.
"""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from processes import kv_sidecar
from test_embedded import T0, _write
from test_reporter import SECRET, WebhookStub

from sidecar.report.data import Period
from sidecar.report.deliver import PENDING_FILE, DeliveryError, deliver, post_summary, read_pending
from sidecar.report.render import base_name
from sidecar.report.retention import WEEK_S, prune

pytestmark = pytest.mark.timeout(120)

FAST = functools.partial(post_summary, backoff_s=0.01)  # the retries' waits, not their number, made short
WEEK = (1_795_392_000.0, 1_795_996_800.0)  # 2026-11-23 to 2026-11-30 UTC
NEXT_WEEK = (WEEK[1], WEEK[1] + WEEK_S)


@pytest.fixture
def stub_factory():
    made: list[WebhookStub] = []

    def make(script: list[int]) -> WebhookStub:
        made.append(WebhookStub(script))
        return made[-1]

    yield make
    for stub in made:
        stub.stop()


def _url_file(tmp_path: Path, stub: WebhookStub) -> Path:
    f = tmp_path / "webhook-url"
    f.write_text(stub.url + "\n", encoding="utf-8")
    return f


def test_a_5xx_is_retried_and_the_week_is_delivered_once(tmp_path, stub_factory):
    stub = stub_factory([503, 200])
    out = tmp_path / "reports"
    out.mkdir()
    sent = deliver(
        out, _url_file(tmp_path, stub), "1. llama needs memory.", period=WEEK, link="https://w/r.html", post=FAST
    )
    assert sent == 1
    assert [body for _, body in stub.posts] == [{"text": "1. llama needs memory.\nFull report: <https://w/r.html>"}] * 2
    assert not (out / PENDING_FILE).exists()


def test_a_week_that_failed_is_sent_first_at_the_next_run(tmp_path, stub_factory):
    out = tmp_path / "reports"
    out.mkdir()
    down = stub_factory([500])
    with pytest.raises(DeliveryError, match="HTTP 500 after 4 attempts") as failed:
        deliver(out, _url_file(tmp_path, down), "week 1", period=WEEK, fmt="json", post=FAST)
    assert SECRET not in str(failed.value)
    assert len(down.posts) == 4
    assert [e["text"] for e in read_pending(out)] == ["week 1"]

    up = stub_factory([200])
    assert deliver(out, _url_file(tmp_path, up), "week 2", period=NEXT_WEEK, fmt="json", post=FAST) == 2
    assert [(b["summary"], b["period"]["start"]) for _, b in up.posts] == [("week 1", WEEK[0]), ("week 2", WEEK[1])]
    assert not (out / PENDING_FILE).exists() and read_pending(out) == []


def test_a_rerun_of_a_failed_week_replaces_it_and_a_bad_marker_is_left_alone(tmp_path, stub_factory):
    out = tmp_path / "reports"
    out.mkdir()
    down = stub_factory([404])  # not retried
    for text, minutes in (("first try", 0), ("rerun", 0), ("the Job's retry", 3)):
        with pytest.raises(DeliveryError, match="HTTP 404, not retried"):
            deliver(
                out, _url_file(tmp_path, down), text, period=(WEEK[0] + 60 * minutes, WEEK[1] + 60 * minutes), post=FAST
            )
    assert [e["text"] for e in read_pending(out)] == ["the Job's retry"]
    (out / PENDING_FILE).write_text("{not json", encoding="utf-8")
    with pytest.raises(DeliveryError, match="move it away"):
        deliver(out, _url_file(tmp_path, down), "week 2", period=NEXT_WEEK, post=FAST)
    assert (out / PENDING_FILE).read_text(encoding="utf-8") == "{not json"


def _reports(out: Path, weeks: int) -> list[str]:
    """``weeks`` weekly reports as the CronJob leaves them (ends drifting by a minute), with their images."""
    names = []
    for k in range(weeks):
        end = WEEK[1] + k * WEEK_S + 60 * (k % 2)
        base = base_name(Period(end - WEEK_S, end))
        for suffix in (".md", ".html", ".json"):
            (out / f"{base}{suffix}").write_text("report", encoding="utf-8")
        (out / f"{base}-images").mkdir()
        (out / f"{base}-images" / "llama-usage.png").write_bytes(b"png")
        names.append(base)
    return names


def test_keep_weeks_keeps_exactly_n_weeks_and_touches_nothing_else(tmp_path):
    out = tmp_path / "reports"
    out.mkdir()
    bases = _reports(out, 15)
    foreign = ["README.md", PENDING_FILE, ".kvcache-report-x.html.tmp", "kvcache-report-notes.md"]
    for name in foreign:
        (out / name).write_text("theirs", encoding="utf-8")
    (out / f"{bases[0]}-images" / "notes.txt").write_text("theirs", encoding="utf-8")

    removed = prune(out, 13)
    left = sorted(p.name for p in out.iterdir())
    kept = sorted(n for b in bases[2:] for n in (f"{b}.md", f"{b}.html", f"{b}.json", f"{b}-images"))
    assert left == sorted([*kept, *foreign, f"{bases[0]}-images"])
    assert [p.name for p in (out / f"{bases[0]}-images").iterdir()] == ["notes.txt"]  # its PNG gone, not their file
    assert not (out / f"{bases[1]}-images").exists()
    assert len(removed) == 2 * 4 + 1  # two weeks' 3 documents and PNG, and the one emptied folder
    assert prune(out, 13) == []  # a second run removes nothing more


def _report(tmp_path: Path, history: Path, *args: str, end: float = T0 + 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*kv_sidecar(), "report", "--history", str(history), "--from", str(T0), "--to", str(end), *args],
        capture_output=True,
        text=True,
        timeout=90,
    )


def test_the_cli_exits_4_keeps_the_files_and_sends_the_week_at_the_next_run(tmp_path, stub_factory):
    history = tmp_path / "h.sqlite"
    _write(history)
    out = tmp_path / "reports"
    common = ("--out", str(out), "--format", "json", "--webhook-format", "json", "--keep-weeks", "2")
    down = stub_factory([403])
    failed = _report(tmp_path, history, *common, "--webhook-url-file", str(_url_file(tmp_path, down)), end=T0 + 300)
    assert failed.returncode == 4, failed.stderr
    assert "HTTP 403" in failed.stderr and "sent at the next run" in failed.stderr
    assert SECRET not in failed.stderr + failed.stdout
    assert len(list(out.glob("kvcache-report-*.json"))) == 1 and (out / PENDING_FILE).exists()

    up = stub_factory([200])
    ok = _report(tmp_path, history, *common, "--webhook-url-file", str(_url_file(tmp_path, up)))
    assert ok.returncode == 0, ok.stderr
    assert [b["period"]["end"] for _, b in up.posts] == [T0 + 300, T0 + 600]  # the failed week first
    assert all(b["summary"].startswith("KV-cache report") and b["link"] is None for _, b in up.posts)
    assert not (out / PENDING_FILE).exists()


def test_an_absent_webhook_file_posts_nothing_and_says_so(tmp_path):
    history = tmp_path / "h.sqlite"
    _write(history)
    proc = _report(
        tmp_path, history, "--out", str(tmp_path / "o"), "--format", "json", "--webhook-url-file", "/nope/url"
    )
    assert proc.returncode == 0, proc.stderr
    assert "--webhook-url-file /nope/url: absent, the summary is not posted" in proc.stderr


def test_dry_run_prints_the_body_and_the_host_only_and_writes_nothing(tmp_path, stub_factory):
    history = tmp_path / "h.sqlite"
    _write(history)
    stub = stub_factory([200])
    out = tmp_path / "reports"
    proc = _report(
        tmp_path,
        history,
        *("--out", str(out), "--format", "html", "--report-url", "https://wiki.example.com/kv/"),
        *("--webhook-url-file", str(_url_file(tmp_path, stub)), "--dry-run"),
    )
    assert proc.returncode == 0, proc.stderr
    head, _, body = proc.stdout.partition("\n")
    assert head == "would POST (slack) to the webhook at 127.0.0.1:"
    text = json.loads(body)["text"]
    assert text.startswith("KV-cache report ") and "Report:" not in text
    assert text.endswith(f"Full report: <https://wiki.example.com/kv/{base_name(Period(T0, T0 + 600))}.html>")
    assert SECRET not in proc.stdout + proc.stderr and "/services/" not in proc.stdout
    assert stub.posts == [] and not out.exists()


def test_a_receiver_that_drips_its_answer_is_cut_at_the_deadline(tmp_path, monkeypatch):
    """Each POST ends within TIMEOUT_S in all, however slowly the receiver sends (a 10,000-byte answer at
    10 bytes a second would take 17 minutes), and a stopping reporter does not abandon it."""
    from rawserver import RawServer, drip

    from sidecar import outbound
    from sidecar.report import deliver as deliver_module

    monkeypatch.setattr(deliver_module, "TIMEOUT_S", 1.0)
    monkeypatch.setattr(outbound, "CANCELLED", outbound.threading.Event())
    receiver = RawServer(drip(0.1, 10_000))
    url_file = tmp_path / "url"
    url_file.write_text(receiver.url + "/hook\n")
    try:
        outbound.cancel_all()  # as on SIGTERM: the delivery of a written report still runs to its deadline
        with pytest.raises(DeliveryError, match="timed out after 2 attempts"):
            post_summary(url_file, "week 48", attempts=2, backoff_s=0.0, sleep=lambda _s: None)
    finally:
        receiver.close()
    assert len(receiver.requests) == 2  # both attempts reached the receiver: none was cancelled


# --- kv-sidecar reporter: the same delivery as report ------------------------------------------


def _reporter(history: Path, out: Path, url_file: Path) -> subprocess.Popen[str]:
    """``kv-sidecar reporter`` writing one report at start-up (--run-now) of a fixed period, then waiting."""
    return subprocess.Popen(
        [
            *kv_sidecar(),
            "reporter",
            *("--history", str(history), "--from", str(T0), "--to", str(T0 + 600), "--run-now"),
            *("--out", str(out), "--format", "json", "--webhook-url-file", str(url_file)),
            *("--webhook-format", "json", "--keep-weeks", "2"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _until(done, proc: subprocess.Popen[str], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the reporter's run did not finish"
        time.sleep(0.1)


def _stop(proc: subprocess.Popen[str]) -> str:
    """SIGTERM, then the reporter's log (stderr); it must exit 0."""
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return err


def test_the_reporter_delivers_as_report_does_pending_week_format_and_retention(tmp_path, stub_factory):
    """`kv-sidecar reporter` goes through report's delivery: a failed week waits in the pending file and is
    sent by the next run, in --webhook-format json, and --keep-weeks removes the old reports."""
    history = tmp_path / "h.sqlite"
    _write(history)
    out = tmp_path / "reports"
    out.mkdir()
    old, recent = (base_name(Period(end - WEEK_S, end)) for end in (T0 - 3 * WEEK_S, T0 - WEEK_S + 600))
    for base in (old, recent):
        (out / f"{base}.json").write_text("{}", encoding="utf-8")

    down = stub_factory([403])
    proc = _reporter(history, out, _url_file(tmp_path, down))
    _until(lambda: bool(down.posts) and (out / PENDING_FILE).exists(), proc)
    log = _stop(proc)
    assert "report not delivered: webhook at 127.0.0.1: HTTP 403, not retried" in log
    assert "this week is sent at the next run" in log and SECRET not in log
    (waiting,) = read_pending(out)
    assert waiting["period"] == [T0, T0 + 600]
    this_week = base_name(Period(T0, T0 + 600))
    reports = sorted(p.name for p in out.glob("kvcache-report-*.json"))
    assert reports == sorted([f"{recent}.json", f"{this_week}.json"])  # the old one pruned

    up = stub_factory([200])
    proc = _reporter(history, out, _url_file(tmp_path, up))
    _until(lambda: bool(up.posts) and not (out / PENDING_FILE).exists(), proc)
    _stop(proc)
    ((_, body),) = up.posts  # the rerun of the waiting week replaced it: sent once
    assert set(body) == {"summary", "link", "period"} and body["period"] == {"start": T0, "end": T0 + 600}
    assert body["summary"].startswith("KV-cache report") and body["link"] is None
