"""``kv-sidecar report`` and ``kv-sidecar reporter``: the weekly capacity report, once or on a schedule.

``report`` reads one period of history (the Prometheus HTTP API, or the sidecar's own history file),
computes the figures (:mod:`sidecar.report.figures`, with the daemon's own sizing and advice
functions) and writes Markdown, HTML and JSON (:mod:`sidecar.report.render`). ``reporter`` runs the
same on a cron schedule and can post the summary to a Slack-compatible webhook
(:mod:`sidecar.report.reporter`).

Exit codes (one line on stderr for each failure, no traceback, no partial file):

0 the report was written;
1 the history could not be read (Prometheus unreachable, an HTTP error, a timeout) or the output
  folder cannot be written;
2 bad arguments or input files: the configuration, the selector, the period, a history file that is
  missing, corrupt, foreign or locked;
3 nothing to report: the selector matched no pod in the period;
4 the report was written but its summary could not be delivered to the webhook: the week is kept
  waiting next to the reports and sent at the next run (:func:`sidecar.report.deliver.deliver`).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from ..units import format_duration, parse_duration
from .formats import EXTRA_HINT, FORMATS
from .reporter import DEFAULT_SCHEDULE

if TYPE_CHECKING:  # imported where used: `kv-sidecar --help` does not load the figures and their models
    from ..config import ModelSettings
    from ..forecast.policy import AdviceSettings, ServedModel
    from ..thresholds import Thresholds
    from .data import ModelKey, Period, Week
    from .results import Report

DEFAULT_SINCE = "7d"
DEFAULT_OUT = "reports"
MAX_TIME_S = 2.0**40  # Unix seconds: the year 36812, far past any history


class ReportFailed(Exception):
    """A failure with its exit code; the message is the one line printed."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Options:
    """What one report is made from (the flags of ``report``, also what ``reporter`` runs each time)."""

    prometheus_url: str | None = None
    history: str | None = None
    since_s: float = 7 * 86400.0
    start: float | None = None  # --from; with end, replaces since
    end: float | None = None  # --to
    selector: str = ""
    out: Path = Path(DEFAULT_OUT)
    formats: tuple[str, ...] = FORMATS
    compare_previous: bool = False
    config_file: str | None = None
    bearer_token_file: str | None = None
    ca_file: str | None = None
    insecure_skip_verify: bool = False
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 30.0
    concurrency: int = 4
    pods_per_query: int = 50
    max_pods: int = 1000  # sidecar.report.prometheus.MAX_PODS
    report_url: str | None = None  # where --out is published: the summary links there


@dataclass(frozen=True)
class Outcome:
    """A written report: its figures, its files and the summary text a webhook posts."""

    report: Report
    paths: list[Path]
    summary_text: str


@dataclass(frozen=True)
class Delivery:
    """What happens to each written report, for ``report`` and ``reporter`` alike (:func:`publish`)."""

    webhook_url_file: Path | None = None  # None: nothing is posted
    webhook_format: str = "slack"  # sidecar.report.deliver.PAYLOAD_FORMATS
    keep_weeks: int | None = None  # None: every report is kept


def parse_time(text: str, flag: str) -> float:
    """``--from``/``--to``: RFC 3339 (``2026-11-23T00:00:00Z``), a date (UTC midnight) or Unix seconds."""
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if not (math.isfinite(seconds) and 0 <= seconds < MAX_TIME_S):
            raise ReportFailed(f"{flag}: {text!r} is not a time after 1970 and before the year 36812", 2)
        return seconds
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ReportFailed(
            f"{flag}: {text!r} is not a time; write 2026-11-23, 2026-11-23T06:00:00Z or Unix seconds", 2
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def period_of(options: Options, now: float) -> Period:
    """The period to report: ``--from``/``--to``, else ``--since`` up to the end of the current minute."""
    from .data import STEP_S, Period

    if options.start is not None or options.end is not None:
        if options.start is None or options.end is None:
            raise ReportFailed("--from and --to: give both, or neither (then --since)", 2)
        start = -(-options.start // STEP_S) * STEP_S  # up to a whole minute
        end = options.end // STEP_S * STEP_S
        if end <= start:
            raise ReportFailed("--from/--to: the period is empty; --to must be at least a minute after --from", 2)
        return Period(start, end)
    if options.since_s < STEP_S:
        raise ReportFailed(f"--since: at least {format_duration(STEP_S)}", 2)
    # up to the end of the current minute, so that the minute in progress (all of a short demo) is in
    return Period.ending(math.ceil(now / STEP_S) * STEP_S, options.since_s)


def _settings(options: Options) -> tuple[Thresholds, AdviceSettings, ModelSettings]:
    """Thresholds, advice settings and the configured model from ``--config.file`` (defaults without)."""
    from ..config import ConfigError, load_config
    from ..forecast.policy import AdviceSettings

    try:
        config = load_config(options.config_file, env={}, flags={})
    except ConfigError as e:
        where = options.config_file or "defaults"
        raise ReportFailed(f"--config.file {where}: " + "; ".join(e.problems), 2) from None
    fc = config.forecast
    advice = AdviceSettings(
        target_usage=config.thresholds.target_usage,
        utilization_min=fc.utilization_min,
        utilization_max=fc.utilization_max,
        peak_window_s=fc.peak_window_s,
    )
    return config.thresholds, advice, config.model


def served_models(model_settings: ModelSettings, week: Week) -> dict[ModelKey, ServedModel]:
    """What ``model.config`` says of each model whose pods it describes (bytes per token must agree).

    A report may cover many models while a configuration describes one: the configured model is
    applied to the models whose ``kvcache_theoretical_bytes_per_token`` (exported by a sidecar
    configured with the same file) equals its own, and to no other.
    """
    if model_settings.config is None:
        return {}
    from ..layers.capacity import CapacityLayer
    from ..model_source import refresh_models

    layer = CapacityLayer(model_settings)
    refresh_models([layer], None)
    served: dict[ModelKey, ServedModel] = {}
    for pod in week.pods:
        if pod.model in served or pod.bytes_per_token is None:
            continue
        layout = layer.layout(block_size=pod.block_size or None, kv_dtype=None, max_model_len=None)
        if abs(layout.bytes_per_token - pod.bytes_per_token) > 0.5:
            continue
        served[pod.model] = layer.served_model(layout)
    return served


def load_week(options: Options, period: Period, thresholds: Thresholds) -> Week:
    """Read the period from the chosen source; failures become :class:`ReportFailed`."""
    from ..history import HistoryError
    from .selector import SelectorError, parse_selector

    try:
        matchers = parse_selector(options.selector)
    except SelectorError as e:
        raise ReportFailed(f"--selector: {e}", 2) from None
    if options.history:
        from .embedded import HistorySource

        try:
            return HistorySource(options.history).load(period, matchers, options.compare_previous)
        except HistoryError as e:
            raise ReportFailed(f"--history: {e}", 2) from None
    from .prometheus import PrometheusSource, ReportSourceError

    try:
        source = PrometheusSource(
            options.prometheus_url or "",
            bearer_token_file=options.bearer_token_file,
            ca_file=options.ca_file,
            insecure_skip_verify=options.insecure_skip_verify,
            headers=options.headers,
            timeout_s=options.timeout_s,
            concurrency=options.concurrency,
            pods_per_query=options.pods_per_query,
            max_pods=options.max_pods,
        )
        try:
            return source.load(period, matchers, options.compare_previous, thresholds=thresholds)
        finally:
            source.close()
    except ReportSourceError as e:
        raise ReportFailed(f"--prometheus-url: {e}", e.exit_code) from None


def produce(options: Options, now: float | None = None) -> Outcome:
    """One report, end to end; raises :class:`ReportFailed` with the exit code."""
    from . import figures

    now = time.time() if now is None else now
    period = period_of(options, now)
    thresholds, advice, model_settings = _settings(options)
    week = load_week(options, period, thresholds)
    if not week.pods:
        where = f" matching {options.selector}" if options.selector else ""
        raise ReportFailed(
            f"no KV-cache series{where} between {_iso(period.start)} and {_iso(period.end)} in {week.source}; "
            "check the selector and the period (is the sidecar scraped there?)",
            3,
        )
    report = figures.compute(
        week,
        thresholds=thresholds,
        advice=advice,
        served=served_models(model_settings, week),
        generated_at=now,
    )
    del week  # the figures hold what the plots and documents need: the rest of the series can go
    from .render import PlotsUnavailable, ReportWriteError, write_report

    try:
        paths = write_report(report, options.out, options.formats)
    except ReportWriteError as e:
        raise ReportFailed(f"--out: {e}", 1) from None
    except PlotsUnavailable as e:
        raise ReportFailed(str(e), 1) from None
    except ImportError as e:  # matplotlib, for the plots; nothing was written
        raise ReportFailed(f"the report's plots need {e.name}: {EXTRA_HINT}", 1) from None
    return Outcome(report, paths, summary_text(report, paths, options.report_url))


def summary_text(report: Report, paths: Sequence[Path], report_url: str | None = None) -> str:
    """The few lines a chat message carries: the period, the models that need action, the files (their
    URLs under ``report_url`` when the output folder is published there, else their local paths)."""
    head = f"KV-cache report {_iso(report.period.start)} to {_iso(report.period.end)} ({report.source})"
    lines = [head]
    if report.summary:
        lines += [f"{i}. {sentence}" for i, sentence in enumerate(report.summary, 1)]
    else:
        lines.append("Nothing to change this week.")
    pages = [p for p in paths if p.suffix in (".html", ".md")]
    if report_url:
        from ..outbound import shown_url  # printed and posted: never its user:password@

        lines += [f"Report: {shown_url(report_url).rstrip('/')}/{quote(p.name)}" for p in pages]
    else:
        lines += [f"Report: {p}" for p in pages]
    return "\n".join(lines)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M UTC")


def publish(outcome: Outcome, options: Options, delivery: Delivery) -> None:
    """After a report is written, one path for ``report`` and ``reporter``: post its summary to the webhook
    with every week still waiting, oldest first (:func:`sidecar.report.deliver.deliver`: the week is recorded
    in the pending file first, so a failure loses no week), then remove the reports older than
    ``--keep-weeks`` (:func:`sidecar.report.retention.prune`).

    Raises :class:`ReportFailed`: 4 when the delivery failed (the week waits for the next run), 1 when an
    old report cannot be removed; both are tried whatever the other did.
    """
    problems: list[ReportFailed] = []
    if delivery.webhook_url_file is not None:
        from .deliver import DeliveryError, deliver

        text, link = chat_message(outcome, options.report_url)
        period = (outcome.report.period.start, outcome.report.period.end)
        try:
            deliver(options.out, delivery.webhook_url_file, text, period=period, link=link, fmt=delivery.webhook_format)
        except DeliveryError as e:
            problems.append(ReportFailed(f"{e}; the report files are kept and this week is sent at the next run", 4))
    if delivery.keep_weeks is not None:
        from .retention import prune

        try:
            prune(options.out, delivery.keep_weeks)
        except OSError as e:
            problems.append(ReportFailed(f"--keep-weeks: cannot remove an old report ({e.strerror})", 1))
    if problems:
        raise ReportFailed("; ".join(str(p) for p in problems), problems[0].code)


# ----------------------------------------------------------------------------- flags


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _formats(text: str) -> tuple[str, ...]:
    wanted = tuple(dict.fromkeys(f.strip() for f in text.split(",") if f.strip()))
    bad = [f for f in wanted if f not in FORMATS]
    if bad or not wanted:
        raise argparse.ArgumentTypeError(f"{text!r}: a comma-separated list of {', '.join(FORMATS)}")
    return wanted


def _url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or not text.isascii() or " " in text:
        raise argparse.ArgumentTypeError(f"{text!r}: an http(s) URL, e.g. https://reports.example.com/kvcache")
    return text


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip() or not text.isascii() or any(c in text for c in "\r\n"):
        raise argparse.ArgumentTypeError(f"{text!r}: write 'Name: value' in ASCII (e.g. 'X-Scope-OrgID: tenant-1')")
    return name.strip(), value.strip()


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of at least 1")
    return value


def add_report_flags(p: argparse.ArgumentParser) -> None:
    """The flags of one report (``reporter`` takes the same)."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prometheus-url", metavar="URL", help="Prometheus (or Thanos, Mimir, VictoriaMetrics) base URL")
    src.add_argument("--history", metavar="PATH", help="the sidecar's history file (history.path)")
    p.add_argument(
        "--since",
        type=_duration,
        default=_duration(DEFAULT_SINCE),
        metavar="DURATION",
        help=f"the period: this long, ending now (default: {DEFAULT_SINCE})",
    )
    p.add_argument("--from", dest="start", metavar="TIME", help="the period's start (RFC 3339, a date or Unix time)")
    p.add_argument("--to", dest="end", metavar="TIME", help="the period's end (with --from)")
    p.add_argument(
        "--selector", default="", metavar="MATCHERS", help="PromQL label matchers, e.g. '{namespace=\"prod\"}'"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path(DEFAULT_OUT),
        metavar="DIR",
        help=f"folder for the report files (default: {DEFAULT_OUT})",
    )
    p.add_argument(
        "--format",
        dest="formats",
        type=_formats,
        default=FORMATS,
        metavar="LIST",
        help="comma-separated: md, html, json (default: all)",
    )
    p.add_argument(
        "--compare-previous",
        action="store_true",
        help="read the 7 periods before too, one at a time: growth fitted over up to 8 weeks, with its "
        "uncertainty and the weeks until full",
    )
    p.add_argument(
        "--config.file",
        dest="config_file",
        metavar="FILE",
        help="the sidecar's configuration: thresholds, forecast bounds, model (for the advice)",
    )
    p.add_argument(
        "--report-url",
        type=_url,
        metavar="URL",
        help="the URL the --out folder is published at: the summary links to the report there, not to local paths",
    )
    prom = p.add_argument_group("Prometheus API")
    prom.add_argument("--bearer-token-file", metavar="FILE", help="send 'Authorization: Bearer <the file>'")
    prom.add_argument("--ca-file", metavar="FILE", help="CA bundle to verify the server's certificate")
    prom.add_argument("--insecure-skip-verify", action="store_true", help="do not verify TLS certificates")
    prom.add_argument(
        "--header",
        dest="headers",
        type=_header,
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="an extra header on every request (repeatable), e.g. 'X-Scope-OrgID: tenant-1'",
    )
    prom.add_argument(
        "--timeout",
        type=_duration,
        default=30.0,
        metavar="DURATION",
        help="per request, all included however slowly the server answers; not retried (default: 30s)",
    )
    prom.add_argument(
        "--concurrency", type=_positive_int, default=4, metavar="N", help="queries in flight at once (default: 4)"
    )
    prom.add_argument(
        "--pods-per-query",
        type=_positive_int,
        default=50,
        metavar="N",
        help="pods in one query's selector (default: 50)",
    )
    prom.add_argument(
        "--max-pods",
        type=_positive_int,
        default=1000,
        metavar="N",
        help="refuse a report of more pods (about 1 MB each a week, --compare-previous included; default: 1000)",
    )


def options_from_args(args: argparse.Namespace) -> Options:
    return Options(
        prometheus_url=args.prometheus_url,
        history=args.history,
        since_s=args.since,
        start=None if args.start is None else parse_time(args.start, "--from"),
        end=None if args.end is None else parse_time(args.end, "--to"),
        selector=args.selector,
        out=args.out,
        formats=args.formats,
        compare_previous=args.compare_previous,
        config_file=args.config_file,
        bearer_token_file=args.bearer_token_file,
        ca_file=args.ca_file,
        insecure_skip_verify=args.insecure_skip_verify,
        headers=dict(args.headers),
        timeout_s=args.timeout,
        concurrency=args.concurrency,
        pods_per_query=args.pods_per_query,
        max_pods=args.max_pods,
        report_url=args.report_url,
    )


def cmd_report(args: argparse.Namespace) -> int:
    try:
        options = options_from_args(args)
        delivery = delivery_from_args(args, "report")
        if args.dry_run:  # the report is computed and written where nobody reads it: only the payload is shown
            with tempfile.TemporaryDirectory(prefix="kv-sidecar-report-") as scratch:
                outcome = produce(replace(options, out=Path(scratch)))
                return _print_dry_run(args, delivery, outcome)
        outcome = produce(options)
    except ReportFailed as e:
        print(f"kv-sidecar report: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print("kv-sidecar report: interrupted; no report file was left half-written", file=sys.stderr)
        return 130
    print(outcome.summary_text)
    try:
        publish(outcome, options, delivery)
    except ReportFailed as e:
        print(f"kv-sidecar report: {e}", file=sys.stderr)
        return e.code
    return 0


def delivery_from_args(args: argparse.Namespace, command: str) -> Delivery:
    """The delivery flags; ``--webhook-url-file`` checked as :func:`_webhook_file` says."""
    return Delivery(
        webhook_url_file=_webhook_file(args.webhook_url_file, command),
        webhook_format=args.webhook_format,
        keep_weeks=args.keep_weeks,
    )


def _webhook_file(text: str | None, command: str) -> Path | None:
    """``--webhook-url-file``: None without it, or when the file is absent (an optional Secret not created:
    said on stderr); a file that is there must hold a URL (exit 2). It is read again at each delivery."""
    from .deliver import DeliveryError, read_webhook_url

    if text is None:
        return None
    path = Path(text)
    if not path.exists():
        print(f"kv-sidecar {command}: --webhook-url-file {text}: absent, the summary is not posted", file=sys.stderr)
        return None
    try:
        read_webhook_url(path)
    except DeliveryError as e:
        raise ReportFailed(str(e), 2) from None
    return path


def chat_message(outcome: Outcome, report_url: str | None) -> tuple[str, str]:
    """What a chat webhook gets: the summary's lines (no local paths) and the link to the report under
    ``--report-url`` (the HTML page, else the Markdown; empty without it)."""
    text = summary_text(outcome.report, [])
    pages = sorted((p for p in outcome.paths if p.suffix in (".html", ".md")), key=lambda p: p.suffix != ".html")
    from ..outbound import shown_url  # posted to a chat: never its user:password@

    link = f"{shown_url(report_url).rstrip('/')}/{quote(pages[0].name)}" if report_url and pages else ""
    return text, link


def _print_dry_run(args: argparse.Namespace, delivery: Delivery, outcome: Outcome) -> int:
    from .deliver import dry_run_text

    text, link = chat_message(outcome, args.report_url)
    period = (outcome.report.period.start, outcome.report.period.end)
    print(dry_run_text(delivery.webhook_url_file, text, period=period, link=link, fmt=delivery.webhook_format))
    if delivery.keep_weeks is not None:
        print(f"would keep the reports of the last {delivery.keep_weeks} weeks in {args.out}")
    return 0


#: Run times a dry run prints.
DRY_RUN_TIMES = 5


def cmd_reporter(args: argparse.Namespace) -> int:
    """Run :func:`produce` then :func:`publish` (as ``report`` does) on a cron schedule until SIGTERM/SIGINT;
    a failed run is logged, never fatal."""
    from ..logs import setup_logging
    from .reporter import next_run_times, run_reporter

    try:
        options = options_from_args(args)
        _settings(options)  # a bad --config.file stops the start, not the first Monday
        delivery = delivery_from_args(args, "reporter")
        if args.dry_run:
            runs = next_run_times(args.schedule, args.timezone, datetime.now(UTC), DRY_RUN_TIMES)
    except ReportFailed as e:
        print(f"kv-sidecar reporter: {e}", file=sys.stderr)
        return e.code
    except ValueError as e:  # a schedule or time zone APScheduler cannot read
        print(f"kv-sidecar reporter: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        from ..outbound import shown_url

        source = shown_url(options.prometheus_url) if options.prometheus_url else options.history
        print(f"would write {', '.join(options.formats)} reports from {source} into {options.out} at:")
        print("\n".join(f"  {t.isoformat()}" for t in runs))
        if delivery.webhook_url_file is not None:
            from .deliver import read_webhook_url, webhook_host

            host = webhook_host(read_webhook_url(delivery.webhook_url_file))
            print(f"and post each summary ({delivery.webhook_format}) to the webhook at {host}")
        if delivery.keep_weeks is not None:
            print(f"keeping the reports of the last {delivery.keep_weeks} weeks")
        return 0
    setup_logging(args.log_level, "logfmt")
    try:
        run_reporter(
            schedule=args.schedule,
            timezone=args.timezone,
            job=lambda: produce(options),
            publish=lambda outcome: publish(outcome, options, delivery),
            run_now=args.run_now,
        )
    except ValueError as e:  # a schedule or time zone APScheduler cannot read
        print(f"kv-sidecar reporter: {e}", file=sys.stderr)
        return 2
    return 0


def _add_delivery_flags(p: argparse.ArgumentParser) -> None:
    from .deliver import PAYLOAD_FORMATS

    d = p.add_argument_group("delivery and retention")
    d.add_argument(
        "--webhook-url-file",
        metavar="FILE",
        help="post the summary (with its --report-url link) to the webhook whose URL this file holds; "
        "an absent file posts nothing. A week whose delivery failed is sent at the next run (report: exit 4)",
    )
    d.add_argument(
        "--webhook-format",
        choices=PAYLOAD_FORMATS,
        default="slack",
        help='the body: Slack\'s {"text"} (Mattermost, Rocket.Chat, Teams too) or a JSON object with summary, link '
        "and period (default: slack)",
    )
    d.add_argument(
        "--keep-weeks",
        type=_positive_int,
        metavar="N",
        help="after writing, remove the report files in --out older than N weeks (default: keep all)",
    )


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``report`` and ``reporter``."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "report",
        help="write the weekly KV-cache capacity report (Markdown, HTML, JSON)",
        description="What the KV cache went through over a period and what to change, from Prometheus or the "
        "sidecar's history. Exit codes: 0 written, 1 source or output failure, 2 bad input, 3 no data.",
    )
    add_report_flags(p)
    _add_delivery_flags(p)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="compute the report, write nothing, send nothing: print the body that would be posted",
    )
    p.set_defaults(func=cmd_report)

    r: argparse.ArgumentParser = subparsers.add_parser(
        "reporter",
        help="write the report on a cron schedule (default: Mondays 06:00) and post its summary",
        description="Run `kv-sidecar report` on a cron schedule, for installations without Kubernetes (there, the "
        "CronJob runs `report`). A failed run is logged and the next one still happens.",
    )
    add_report_flags(r)
    r.add_argument(
        "--schedule",
        default=DEFAULT_SCHEDULE,
        metavar="CRON",
        help=f"five-field crontab line (default: '{DEFAULT_SCHEDULE}')",
    )
    r.add_argument("--timezone", default="UTC", metavar="TZ", help="IANA time zone of the schedule (default: UTC)")
    _add_delivery_flags(r)
    r.add_argument("--run-now", action="store_true", help="also write one report at start-up")
    r.add_argument(
        "--dry-run",
        action="store_true",
        help=f"check the flags, print the next {DRY_RUN_TIMES} run times and exit",
    )
    r.add_argument("--log.level", dest="log_level", default="info", choices=("debug", "info", "warning", "error"))
    r.set_defaults(func=cmd_reporter)
    return p
