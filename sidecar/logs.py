"""Logging set-up: one line per record on stderr, as logfmt (the default) or JSON (``log.format``)."""

from __future__ import annotations

import json
import logging
import sys
import time


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


def setup_logging(level: str, fmt: str) -> None:
    """Route every logger to stderr at ``level`` in ``fmt`` (``logfmt`` or ``json``); quiet chatty libraries."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
