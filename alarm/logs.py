"""Log lines: one ``capalarm`` logger tree, timestamps in UTC with their zone (RFC 3339), and
the formats the Prometheus tools offer (``--log.format logfmt|json``) besides the plain one.

Plain stays the default because people read it on a terminal and scripts already grep it;
logfmt and JSON are for log shippers, which need one record per line whatever a message holds
(a newline in a registry's error text must not start a forged line of its own)."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import TextIO

from alarm.sanitize import sanitize

# Every logger is this one or a child of it (logging.getLogger("capalarm.http")), so that a
# log shipper can select capalarm's lines by name (tests/test_logs.py checks every module).
FORMATS = ("plain", "logfmt", "json")
LEVELS = ("debug", "info", "warning", "error")
# Prometheus' flags say "warn"; Python's level names are upper case.
_LEVEL_ALIASES = {"warn": "warning"}


def level_name(value: str) -> str:
    """``--log.level``'s value, any case, ``warn`` for ``warning``; ValueError otherwise."""
    v = value.strip().lower()
    v = _LEVEL_ALIASES.get(v, v)
    if v not in LEVELS:
        raise ValueError(value)
    return v


def rfc3339(created: float) -> str:
    """``2024-05-01T12:00:00.123Z``: UTC, milliseconds, the zone said."""
    stamp = datetime.fromtimestamp(created, UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z"


def _level(record: logging.LogRecord) -> str:
    return "warn" if record.levelno == logging.WARNING else record.levelname.lower()


class PlainFormatter(logging.Formatter):
    """``2024-05-01T12:00:00.123Z INFO capalarm.http: message`` (the old layout, in UTC)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return rfc3339(record.created)


def _fields(record: logging.LogRecord, formatter: logging.Formatter) -> dict[str, str]:
    out = {
        "ts": rfc3339(record.created),
        "level": _level(record),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    if record.exc_info:
        out["exc"] = formatter.formatException(record.exc_info)
    return out


def _logfmt_value(value: str) -> str:
    if value and not any(c in value for c in ' ="\\') and value.isprintable():
        return value
    escaped = (
        value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    )
    return f'"{escaped}"'


class LogfmtFormatter(logging.Formatter):
    """``ts=... level=info logger=capalarm.http msg="..."``, one line per record."""

    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{k}={_logfmt_value(v)}" for k, v in _fields(record, self).items())


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg (and exc with a traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record, self), ensure_ascii=False)


def formatter(fmt: str) -> logging.Formatter:
    if fmt == "json":
        return JsonFormatter()
    if fmt == "logfmt":
        return LogfmtFormatter()
    return PlainFormatter()


def setup(level: str, fmt: str, stream: TextIO | None = None) -> None:
    """One handler on the root logger (libraries' warnings, aiohttp's, are shown the same
    way), replacing any an earlier call installed."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter(fmt))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


def error_text(exc: BaseException, limit: int = 200) -> str:
    """``KeyError: 'size'``: the class and what the exception says, on one line and bounded
    (a server's text can be anything), for logs and health where the class alone tells an
    operator nothing."""
    what = str(exc)
    text = f"{type(exc).__name__}: {what}" if what else type(exc).__name__
    return sanitize(" ".join(text.split()), limit)
