"""Kernel log record headers: kmsg, dmesg, syslog (RFC3164 and RFC3339), journald JSON."""

from __future__ import annotations

import calendar
import json
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from alarm.collectors.kernel.formats import (
    civil_to_epoch,
    detect_format,
    parse_dmesg_line,
    parse_journal_json,
    parse_kmsg_record,
    parse_syslog_line,
)

DATA = Path(__file__).resolve().parent / "data/kernel-fence"
KMSG = (DATA / "kmsg-records.txt").read_text().splitlines()
DMESG = (DATA / "dmesg-lines.txt").read_text().splitlines()


def test_kmsg_real_records() -> None:
    first = parse_kmsg_record(KMSG[0], boot_wall=1_700_000_000.0)
    assert first.facility == 0 and first.seq == 433499 and first.trusted
    assert first.ts == pytest.approx(1_700_000_000.0 + 340.614047)
    assert first.message.startswith("EGRESS_FENCE IN= OUT=lo SRC=127.0.0.1 ")
    assert first.message.endswith("DPT=9998 LEN=72 ")
    info = parse_kmsg_record(KMSG[3].encode())  # PRI 6: facility 0, level info
    assert info.facility == 0 and info.trusted and info.message.startswith("EGRESS_FENCE: IN=")
    assert [parse_kmsg_record(line).seq for line in KMSG] == [
        433499, 434347, 434348, 434349, 434350, 434351, 434352, 434354
    ]  # fmt: skip


def test_kmsg_user_written_record_is_not_trusted() -> None:
    rec = parse_kmsg_record("12,99,5,-;EGRESS_FENCE IN= OUT=lo SRC=1.2.3.4 DST=1.2.3.4 LEN=9 ")
    assert rec.facility == 1 and not rec.trusted


def test_kmsg_continuation_lines_and_escapes() -> None:
    raw = b"6,339,5140900,-,caller=T1;usb 1-1: \\x1b[0mhi\n SUBSYSTEM=usb\n DEVICE=c189:1\n"
    rec = parse_kmsg_record(raw, 10.0)
    assert rec.message == "usb 1-1: \\x1b[0mhi"
    assert rec.seq == 339 and rec.ts == pytest.approx(15.1409)
    assert parse_kmsg_record(b"4,1,2,c;x\xff").message == "x\ufffd"


@pytest.mark.parametrize(
    "line",
    ["", "garbage", "4,1;x", "a,1,2,-;x", "4,1,2,-x", " 4,1,2,-;x", "4,-1,2,-;x", "4,1_0,2,-;x"],
)
def test_kmsg_malformed_header(line: str) -> None:
    with pytest.raises(ValueError):
        parse_kmsg_record(line)


def test_dmesg_real_lines_and_raw_form() -> None:
    recs = [parse_dmesg_line(line) for line in DMESG]
    assert [r.ts for r in recs] == [455.929995, 456.951191, 456.953745]
    assert all(not r.trusted and r.facility is None for r in recs)
    assert recs[2].message.startswith(
        "EGRESS_FENCE IN= OUT=lo SRC=127.0.0.1 DST=127.0.0.1 LEN=1228 "
    )
    raw = parse_dmesg_line("<4>" + DMESG[0])
    assert raw.facility == 0 and not raw.trusted and raw.message == recs[0].message
    user = parse_dmesg_line("<14>[    1.000000] hello\n")
    assert user.facility == 1 and user.message == "hello"
    caller = parse_dmesg_line("[    0.250000] [    T1] hello")
    assert caller.message == "hello" and caller.ts == 0.25


@pytest.mark.parametrize("line", ["", "hello", "[abc] x", "<x>[ 1.0] y", "[ 1] z"])
def test_dmesg_malformed(line: str) -> None:
    with pytest.raises(ValueError):
        parse_dmesg_line(line)


def test_syslog_rfc3164_with_and_without_uptime() -> None:
    rec = parse_syslog_line(
        "Nov 30 19:07:05 host kernel: [  455.93] EGRESS_FENCE IN= OUT=lo ", 2026
    )
    assert rec is not None
    assert rec.ts == calendar.timegm((2026, 11, 30, 19, 7, 5, 0, 0, 0))  # taken as UTC
    assert rec.message == "EGRESS_FENCE IN= OUT=lo " and not rec.trusted and rec.facility is None
    rec = parse_syslog_line("Mar  3 01:02:03 h kernel: EGRESS_FENCE x\n", 2024)
    assert rec is not None and rec.message == "EGRESS_FENCE x"
    assert rec.ts == calendar.timegm((2024, 3, 3, 1, 2, 3, 0, 0, 0))


def test_syslog_rfc3339() -> None:
    rec = parse_syslog_line("2026-11-30T19:07:05.123456+00:00 host kernel: EGRESS_FENCE x", 1999)
    assert rec is not None and rec.message == "EGRESS_FENCE x"
    assert rec.ts == pytest.approx(calendar.timegm((2026, 11, 30, 19, 7, 5, 0, 0, 0)) + 0.123456)
    rec = parse_syslog_line("2026-11-30T20:07:05+01:00 host kernel: [ 1.5] y", 1999)
    assert rec is not None and rec.message == "y"
    assert rec.ts == calendar.timegm((2026, 11, 30, 19, 7, 5, 0, 0, 0))


def test_syslog_non_kernel_tags_are_not_kernel_records() -> None:
    assert parse_syslog_line("Nov 30 19:07:05 host sshd[12]: EGRESS_FENCE IN= OUT=lo", 2026) is None
    assert parse_syslog_line("2026-11-30T19:07:05Z host app: kernel: EGRESS_FENCE", 2026) is None


@pytest.mark.parametrize(
    "line", ["", "nonsense", "Foo 30 19:07:05 host kernel: x", "Nov 99 19:07:05 host kernel: x"]
)
def test_syslog_malformed(line: str) -> None:
    with pytest.raises(ValueError):
        parse_syslog_line(line, 2026)


@given(st.datetimes(min_value=datetime(1971, 1, 1)))
def test_civil_to_epoch_matches_timegm(dt: datetime) -> None:
    t = dt.timetuple()
    assert civil_to_epoch(
        t.tm_year, t.tm_mon, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec
    ) == calendar.timegm(t)


def test_journal_json() -> None:
    entry = {
        "__REALTIME_TIMESTAMP": "1764529625123456",
        "MESSAGE": "EGRESS_FENCE IN= OUT=lo SRC=127.0.0.1 DST=127.0.0.1 LEN=92 ",
        "SYSLOG_FACILITY": "0",
        "_TRANSPORT": "kernel",
        "__CURSOR": "s=abc",
    }
    rec = parse_journal_json(entry)
    assert rec is not None and rec.trusted and rec.facility == 0 and rec.seq is None
    assert rec.ts == pytest.approx(1764529625.123456) and rec.message == entry["MESSAGE"]
    user = parse_journal_json({**entry, "_TRANSPORT": "syslog", "SYSLOG_FACILITY": "1"})
    assert user is not None and not user.trusted and user.facility == 1
    # A user-space write to /dev/kmsg: journald files it under the kernel transport.
    injected = parse_journal_json({**entry, "SYSLOG_FACILITY": "1"})
    assert injected is not None and not injected.trusted
    binary = parse_journal_json({**entry, "MESSAGE": [69, 71, 255, 10]})
    assert binary is not None and binary.message == "EG\ufffd"
    assert parse_journal_json({**entry, "MESSAGE": None}) is None
    with pytest.raises(ValueError):
        parse_journal_json({"MESSAGE": "x"})
    with pytest.raises(ValueError):
        parse_journal_json({**entry, "MESSAGE": [1000]})


def test_detect_format() -> None:
    assert detect_format(KMSG) == "kmsg"
    assert detect_format(DMESG) == "dmesg"
    assert detect_format(["<4>" + line for line in DMESG]) == "dmesg"
    syslog = ["Nov 30 19:07:05 host kernel: [  455.93] x", "Nov 30 19:07:06 host sshd[1]: y"]
    assert detect_format(syslog) == "syslog"
    assert detect_format(["2026-11-30T19:07:05.123456+00:00 host kernel: x"]) == "syslog"
    journal = json.dumps({"__REALTIME_TIMESTAMP": "1", "MESSAGE": "x", "_TRANSPORT": "kernel"})
    assert detect_format([journal, journal]) == "journal-json"
    events = json.dumps({"ts": 1.0, "surface": "wiki", "bytes": 10})
    assert detect_format([events, "", events]) == "events-jsonl"
    assert detect_format([]) == "syslog"
    with pytest.raises(ValueError):
        detect_format(["what is this", "{not json"])
