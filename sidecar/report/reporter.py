"""``kv-sidecar reporter``: the weekly report on a cron schedule, its summary to a webhook.

What: :func:`run_reporter` runs ``job`` (one report, :func:`sidecar.report.cli.produce`) at every
time of a five-field crontab line in an IANA time zone (default Mondays 06:00 UTC), until ``stop`` is
set (the CLI sets it on SIGTERM/SIGINT), then ``publish`` with the written report: the CLI gives
:func:`sidecar.report.cli.publish`, the delivery ``kv-sidecar report`` uses (the webhook with its
pending file, so a failed week is sent at the next run, ``--webhook-format`` and ``--keep-weeks``).

Why a scheduler of its own: installations without Kubernetes (a VM, a laptop) have no ``CronJob``;
the daemon already runs APScheduler 3.x, so the reporter uses the same library rather than cron.

Scheduling: APScheduler's ``CronTrigger.from_crontab`` (APScheduler 3.x docs, "cron" trigger), in
the given time zone, so "06:00" stays 06:00 local across a daylight-saving change. One job with
``coalesce=True`` and ``max_instances=1`` (a report never overlaps the previous one, and runs missed
while the machine slept are run once), and ``misfire_grace_time`` of :data:`MISFIRE_GRACE_S`
(3.x's default of 1 s would skip a Monday report whenever the process was busy at 06:00).

Stopping: SIGTERM/SIGINT end a report still reading its source within a fraction of a second
(:func:`sidecar.outbound.cancel_all`: its requests are abandoned and it writes nothing); a report
already writing its files finishes them.

Failures: a report that fails is logged on one line and the scheduler keeps going (the next
Monday still runs); a delivery that fails after its retries is logged, the files of that report,
already written, stay as they are, and its week waits in the pending file for the next run.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger

from .. import outbound

log = logging.getLogger("kv_sidecar.report")

DEFAULT_SCHEDULE = "0 6 * * mon"  # Mondays 06:00: last week's report on the desk before the week starts
#: A run this late (the machine slept, the process was busy) still happens.
MISFIRE_GRACE_S = 3600
JOB_ID = "report"


class Outcome(Protocol):
    """What a report run gives back (:class:`sidecar.report.cli.Outcome`)."""

    @property
    def summary_text(self) -> str: ...

    @property
    def paths(self) -> Sequence[Path]: ...


#: The run's outcome type, the same for ``job`` and ``publish``.
OutcomeT = TypeVar("OutcomeT", bound=Outcome)


def time_zone(name: str) -> ZoneInfo:
    """``--timezone``: an IANA name; raises ValueError naming the flag."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"--timezone: {name!r} is not a time zone; use an IANA name such as UTC or Europe/Paris"
        ) from None


def cron_trigger(schedule: str, timezone: str) -> CronTrigger:
    """``--schedule`` in ``--timezone`` as APScheduler's trigger; raises ValueError naming the flag."""
    tz = time_zone(timezone)
    try:
        return CronTrigger.from_crontab(schedule, timezone=tz)
    except ValueError as e:
        raise ValueError(
            f"--schedule: {schedule!r} is not a five-field crontab line ({e}); "
            f"e.g. '{DEFAULT_SCHEDULE}' for Mondays 06:00"
        ) from None


def next_run_times(schedule: str, timezone: str, now: datetime, n: int) -> list[datetime]:
    """The next ``n`` run times after ``now`` (aware datetimes in the schedule's zone), for a dry run."""
    trigger = cron_trigger(schedule, timezone)
    out: list[datetime] = []
    previous = None
    current = now
    while len(out) < n:
        fire = trigger.get_next_fire_time(previous, current)
        if fire is None:
            break
        out.append(fire)
        previous = fire
        current = fire
    return out


def run_once(job: Callable[[], OutcomeT], publish: Callable[[OutcomeT], None] | None = None) -> bool:
    """One scheduled run: the report, then ``publish`` with it (its delivery). True when both went well.

    Never raises (a scheduler job that raises is logged by APScheduler with a traceback and teaches
    nothing more): every failure is one log line.
    """
    try:
        outcome = job()
    except (Exception, SystemExit) as e:
        log.error("report failed: %s", _one_line(e))
        return False
    log.info("report written files=%s", ",".join(str(p) for p in outcome.paths))
    if publish is None:
        return True
    try:
        publish(outcome)
    except (Exception, SystemExit) as e:
        log.error("report not delivered: %s", _one_line(e))
        return False
    return True


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text or type(e).__name__


def run_reporter(
    schedule: str = DEFAULT_SCHEDULE,
    timezone: str = "UTC",
    *,
    job: Callable[[], OutcomeT],
    publish: Callable[[OutcomeT], None] | None = None,
    stop: threading.Event | None = None,
    run_now: bool = False,
    trigger: BaseTrigger | None = None,
) -> None:
    """Run ``job`` then ``publish`` on the schedule until ``stop`` is set (or SIGTERM/SIGINT when ``stop`` is None).

    ``schedule`` and ``timezone`` are checked before anything starts (ValueError naming
    ``--schedule``/``--timezone``). ``run_now`` also runs one report at start-up. ``trigger``
    replaces the schedule (tests use a trigger that fires every second; crontab has no seconds).
    """
    chosen = trigger if trigger is not None else cron_trigger(schedule, timezone)
    stop = stop if stop is not None else _stop_on_signals()
    scheduler = BackgroundScheduler(timezone=time_zone(timezone))
    scheduler.add_job(
        run_once,
        chosen,
        args=(job, publish),
        id=JOB_ID,
        coalesce=True,
        max_instances=1,
        misfire_grace_time=MISFIRE_GRACE_S,
    )
    if run_now:
        scheduler.add_job(run_once, args=(job, publish), id=JOB_ID + ":now")
    scheduler.start()
    first = scheduler.get_job(JOB_ID)
    log.info("reporter started schedule=%r timezone=%s next_run=%s", schedule, timezone, _when(first))
    try:
        stop.wait()
    finally:
        # A report still reading stops within a fraction of a second (its requests are abandoned, it fails
        # and writes nothing); one already writing its files finishes: they are never cut short.
        outbound.cancel_all()
        scheduler.shutdown(wait=True)
        outbound.CANCELLED.clear()  # a process that goes on (tests) sends again
        log.info("reporter stopped")


def _when(job: Any) -> str:
    fire = getattr(job, "next_run_time", None)
    return fire.isoformat() if fire is not None else "never"


def _stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT (only the main thread may install handlers)."""
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    return stop
