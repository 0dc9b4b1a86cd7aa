"""Kernel log formats: one line (or journal entry) in, one ``KernelRecord`` out.

Pure functions, no I/O.  Each parser strips the record header and hands back the message text
exactly as the kernel printed it (kmsg escapes non-printable bytes as ``\\xNN``; those escapes
stay as text).  Only /dev/kmsg (facility 0) and journald (``_TRANSPORT=kernel``) can prove that
the kernel wrote a record; every other form is returned with ``trusted=False``.

Header problems raise ``ValueError``: the collector counts them as parse errors.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from alarm.collectors.kernel.records import KernelRecord
from alarm.jsontext import loads_json

FORMATS = ("kmsg", "dmesg", "syslog", "journal-json", "events-jsonl")

# PRI,SEQ,USEC,FLAGS[,caller=T1,...];MESSAGE -- see Documentation/ABI/testing/dev-kmsg.
_KMSG_RE = re.compile(r"(\d{1,10}),(\d{1,20}),(\d{1,20}),[^;,]*(?:,[^;]*)?;", re.ASCII)

# "[  455.929995] MSG", or "<4>[  455.929995] MSG" from ``dmesg -r``; an optional caller id
# ("[    T123] ", CONFIG_PRINTK_CALLER) is not part of the message.
_DMESG_RE = re.compile(
    r"(?:<(\d{1,10})>)?\[ *(\d{1,12}\.\d{1,9})\] ?(?:\[ *[TC]\d{1,10}\] )?", re.ASCII
)

# RFC3164 as rsyslog's default kern.log template writes it: "Nov  3 19:07:05 host kernel: ".
_SYSLOG_3164_RE = re.compile(
    r"([A-Z][a-z]{2}) ([ \d]?\d) (\d\d):(\d\d):(\d\d) (\S+) (\S+) ?", re.ASCII
)
# RFC3339 (rsyslog RSYSLOG_FileFormat): "2026-11-30T19:07:05.123456+00:00 host kernel: ".
_SYSLOG_3339_RE = re.compile(
    r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?) (\S+) (\S+) ?", re.ASCII
)
# The kernel's own uptime stamp that rsyslog's imklog leaves in front of the message.
_UPTIME_RE = re.compile(r"\[ *\d{1,12}\.\d{1,9}\] ?", re.ASCII)

# A journal entry's __REALTIME_TIMESTAMP (microseconds) is read below this: int64, as the
# event columns hold it (the native scanner reads 16 digits, up to 2**53, itself).
MAX_REALTIME_USEC = 1 << 63

_MONTH_NAMES = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
MONTHS: Mapping[str, int] = MappingProxyType({m: i for i, m in enumerate(_MONTH_NAMES, 1)})
# Days before the first of each month in a non-leap year (index 1..12).
_DAYS_BEFORE = (0, 0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334)


def civil_to_epoch(year: int, month: int, day: int, hh: int, mm: int, ss: int) -> float:
    """Unix seconds of a UTC calendar time.  Plain arithmetic: ``calendar.timegm`` costs a
    struct conversion per call, and bulk syslog parsing calls this once per distinct second."""
    if not (1 <= month <= 12 and 1 <= day <= 31 and hh < 24 and mm < 60 and ss < 61):
        raise ValueError(f"bad time {year}-{month}-{day} {hh}:{mm}:{ss}")
    y = year - 1
    days = 365 * y + y // 4 - y // 100 + y // 400 - 719162  # days from 0001-01-01 to 1970-01-01
    days += _DAYS_BEFORE[month] + day - 1
    if month > 2 and (year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)):
        days += 1
    return float(days * 86400 + hh * 3600 + mm * 60 + ss)


def _text(line: bytes | str) -> str:
    # Kernel text is ASCII plus \xNN escapes; records user space wrote may hold any bytes.
    return line.decode("utf-8", "replace") if isinstance(line, bytes | bytearray) else line


def parse_kmsg_record(line: bytes | str, boot_wall: float = 0.0) -> KernelRecord:
    """One /dev/kmsg record, ``PRI,SEQ,USEC,FLAGS[,...];MESSAGE``.  Continuation lines
    (``\\n KEY=VALUE`` device dictionary) are dropped.  ``trusted`` is facility == 0: user
    space can write to /dev/kmsg, but the kernel turns facility 0 into 1 (user) for it."""
    text = _text(line)
    m = _KMSG_RE.match(text)
    if m is None:
        raise ValueError(f"not a kmsg record: {text[:80]!r}")
    end = text.find("\n", m.end())
    message = text[m.end() :] if end < 0 else text[m.end() : end]
    facility = int(m[1]) >> 3
    return KernelRecord(
        ts=boot_wall + int(m[3]) / 1e6,
        message=message,
        facility=facility,
        seq=int(m[2]),
        trusted=facility == 0,
    )


def parse_dmesg_line(line: bytes | str) -> KernelRecord:
    """One ``dmesg`` line: ``[  455.929995] MSG`` (ts = seconds since boot) or the raw
    ``dmesg -r`` form ``<4>[  455.929995] MSG``.  Never trusted: dmesg text does not show
    whether the kernel or user space wrote the record, and ``<PRI>`` is just text here."""
    text = _text(line).rstrip("\r\n")
    m = _DMESG_RE.match(text)
    if m is None:
        raise ValueError(f"not a dmesg line: {text[:80]!r}")
    facility = None if m[1] is None else int(m[1]) >> 3
    return KernelRecord(ts=float(m[2]), message=text[m.end() :], facility=facility, trusted=False)


def syslog_time(stamp_month: str, day: str, hh: str, mm: str, ss: str, year: int) -> float:
    """An RFC3164 stamp as unix seconds.  RFC3164 has no zone: kern.log is taken to be
    written in UTC (set the host or rsyslog to UTC, or use the RFC3339 template)."""
    month = MONTHS.get(stamp_month)
    if month is None:
        raise ValueError(f"bad month {stamp_month!r}")
    return civil_to_epoch(year, month, int(day), int(hh), int(mm), int(ss))


def rfc3339_time(stamp: str) -> float:
    """``2026-11-30T19:07:05.123456+00:00`` as unix seconds (no zone: UTC)."""
    if stamp.endswith("Z"):
        stamp = stamp[:-1] + "+00:00"
    try:
        dt = datetime.fromisoformat(stamp)
    except ValueError as e:
        raise ValueError(f"bad RFC3339 time {stamp!r}") from e
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def parse_syslog_line(line: bytes | str, year: int) -> KernelRecord | None:
    """One kern.log line, RFC3164 (``Nov 30 19:07:05 host kernel: [  455.93] MSG``; ``year``
    supplies what the stamp lacks, time taken as UTC) or RFC3339 (``2026-11-30T19:07:05+00:00
    host kernel: MSG``).  Lines whose tag is not ``kernel:`` are not kernel records: None.
    The optional bracketed uptime is dropped from the message."""
    text = _text(line).rstrip("\r\n")
    m = _SYSLOG_3164_RE.match(text)
    if m is not None:
        if m[7] != "kernel:":
            return None
        ts = syslog_time(m[1], m[2], m[3], m[4], m[5], year)
    else:
        m = _SYSLOG_3339_RE.match(text)
        if m is None:
            raise ValueError(f"not a syslog line: {text[:80]!r}")
        if m[3] != "kernel:":
            return None
        ts = rfc3339_time(m[1])
    start = m.end()
    up = _UPTIME_RE.match(text, start)
    if up is not None:
        start = up.end()
    return KernelRecord(ts=ts, message=text[start:], facility=None, trusted=False)


def parse_journal_json(obj: dict[str, Any]) -> KernelRecord | None:
    """One ``journalctl -o json`` entry.  Non-kernel entries come back too (``trusted``
    False): the pipeline decides what they are.  None only when there is no message at all
    (journalctl prints ``null`` for fields it elides)."""
    if not isinstance(obj, dict):
        raise ValueError("journal entry is not an object")
    raw = obj.get("MESSAGE")
    if raw is None:
        return None
    if isinstance(raw, list):
        # journalctl emits non-UTF-8 fields as arrays of byte values.
        try:
            message = bytes(raw).decode("utf-8", "replace")
        except (TypeError, ValueError) as e:
            raise ValueError("MESSAGE array is not bytes") from e
    elif isinstance(raw, str):
        message = raw
    else:
        raise ValueError(f"MESSAGE of type {type(raw).__name__}")
    try:
        usec = int(obj["__REALTIME_TIMESTAMP"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError("missing or bad __REALTIME_TIMESTAMP") from e
    # journald's clock is an unsigned 64-bit count of microseconds, and its tick index must
    # fit the pipeline's int64 columns: a 40-digit stamp ended the read in an OverflowError.
    if not 0 <= usec < MAX_REALTIME_USEC:
        raise ValueError(f"__REALTIME_TIMESTAMP out of range: {str(usec)[:40]}")
    ts = usec / 1e6
    fac = obj.get("SYSLOG_FACILITY")
    facility = int(fac) if isinstance(fac, str) and fac.isascii() and fac.isdigit() else None
    return KernelRecord(
        ts=ts,
        message=message.rstrip("\n"),
        facility=facility,
        seq=None,
        # journald files what user space writes to /dev/kmsg under _TRANSPORT=kernel too
        # (with SYSLOG_FACILITY=1), so the proof is the same as on /dev/kmsg: facility 0.
        trusted=obj.get("_TRANSPORT") == "kernel" and facility == 0,
    )


def _line_format(line: str) -> str | None:
    if _KMSG_RE.match(line):
        return "kmsg"
    if _DMESG_RE.match(line):
        return "dmesg"
    if _SYSLOG_3164_RE.match(line) or _SYSLOG_3339_RE.match(line):
        return "syslog"
    if line.startswith("{"):
        try:
            obj = loads_json(line)
        except ValueError:
            return None
        if not isinstance(obj, dict):
            return None
        if "__REALTIME_TIMESTAMP" in obj or "__CURSOR" in obj:
            return "journal-json"
        if "ts" in obj and "surface" in obj and "bytes" in obj:
            return "events-jsonl"
    return None


def detect_format(sample_lines: list[str]) -> str:
    """The format of a file from its first lines: one of ``FORMATS`` by majority vote of the
    lines that look like any.  An empty sample is "syslog" (scanning it finds nothing either
    way); a sample no line of which is recognised raises ``ValueError``."""
    votes: dict[str, int] = {}
    seen = 0
    for line in sample_lines:
        line = line.strip("\r\n")
        if not line.strip():
            continue
        seen += 1
        fmt = _line_format(line)
        if fmt is not None:
            votes[fmt] = votes.get(fmt, 0) + 1
    if not votes:
        if seen:
            raise ValueError("unrecognised log format")
        return "syslog"
    return max(FORMATS, key=lambda f: votes.get(f, 0))
