"""Logging set-up: one line per record on stderr, as logfmt (the default) or JSON (``log.format``).

Whatever Python itself would print to stderr goes through the same format: warnings, an exception that
escapes a thread (``threading.excepthook``), the main program (``sys.excepthook``) or a finaliser
(``sys.unraisablehook``). A traceback, when there is one, is the record's ``err`` field, on the same line.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from types import TracebackType


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


class LogfmtFormatter(logging.Formatter):
    """``ts=2026-01-01T00:00:00.000Z level=info logger=... msg="..."`` (``err="..."`` with a traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = (
            f"ts={ts}.{int(record.msecs):03d}Z level={record.levelname.lower()} logger={record.name} "
            f"msg={_quote(record.getMessage())}"
        )
        if record.exc_info:
            line += f" err={_quote(self.formatException(record.exc_info))}"
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (Unix seconds), ``level``, ``logger``, ``msg`` and ``err``."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": record.created,
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["err"] = self.formatException(record.exc_info)
        return json.dumps(out)


_python = logging.getLogger("kv_sidecar.python")


def _thread_exception(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    _python.error("uncaught %s in thread %s", args.exc_type.__name__, name, exc_info=args.exc_value)


def _main_exception(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    _python.critical("uncaught exception", exc_info=(kind, value, tb))


def _unraisable(unraisable: sys.UnraisableHookArgs) -> None:
    what = unraisable.err_msg or "Exception ignored in"
    _python.warning("%s: %r: %s", what, unraisable.object, unraisable.exc_value)


def setup_logging(level: str, fmt: str) -> None:
    """Route every logger, and whatever Python would print to stderr, to stderr at ``level`` in ``fmt``
    (``logfmt`` or ``json``); quiet chatty libraries."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)  # every byte of every scrape at debug
    logging.getLogger("asyncio").setLevel(logging.WARNING)
    logging.captureWarnings(True)
    threading.excepthook = _thread_exception
    sys.excepthook = _main_exception
    sys.unraisablehook = _unraisable
