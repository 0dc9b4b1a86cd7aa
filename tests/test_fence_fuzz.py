"""The native fence scanner and the Python per-record parser, fuzzed against each other.

Real EGRESS_FENCE records (tests/data/kernel-fence) are mutated the ways hostile or broken
input looks (bytes flipped, lines cut short, fields dropped, repeated and reordered, NULs in
addresses and numbers, huge numbers, bytes that are not UTF-8) and put under every record
header the project reads (RFC 3164 and RFC 3339 kern.log, dmesg, /dev/kmsg, journalctl JSON).
The same input then goes through each native path and its Python twin, which must agree
exactly: the flows and bytes counted (each line has a tick of its own, so a cell is one line
accepted), the parse errors and the forged records.  A malformed record is a parse error,
never bytes, and neither path raises.

- the file source (``type: file``): whole chunks through ``scan_live`` (file.py's chunk
  reader) against the line parser and ``parse_fence`` one line at a time;
- the kmsg and journald sources: a batch of records through the native scanner
  (``FenceReader._native``) against ``parse_fence`` record by record;
- the backtest: ``scan_flows`` natively against its regex and ``json.loads`` path.

Deterministic: one seeded ``random.Random`` per case, and a failure names the case's seed
and the first line on which the paths disagree.  The disagreements the fuzz found are kept
at the end as named examples (``test_regression_*``), each with the one behaviour now.
"""

from __future__ import annotations

import functools
import json
import os
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from alarm.collectors.kernel import fence as fence_module
from alarm.collectors.kernel.fastscan import FlowScan, native_available, scan_flows
from alarm.collectors.kernel.fence import FenceRead, FenceReader
from alarm.collectors.kernel.file import fence_chunk_reader, kernel_line_parser
from alarm.collectors.kernel.journald import parse_journal_chunk
from alarm.collectors.kernel.kmsg import parse_chunk
from alarm.collectors.kernel.records import KernelRecord

pytestmark = pytest.mark.skipif(
    not native_available() and not os.environ.get("CI"),
    reason="alarm._fastscan not built here (no C compiler at install time)",
)

DATA = Path(__file__).resolve().parent / "data" / "kernel-fence"
PFX = ("EGRESS_FENCE", "EGRESS_FENCE:")
YEAR = 2026
# 2026-12-01T01:00:00.25Z: kmsg and dmesg lines land an hour after the syslog lines' own
# stamps (2026-12-01T00:00:SS, RFC 3339 zones move those by whole hours), so that no two
# lines of a case share a tick and a cell is one line accepted.
BOOT_WALL = 1_796_086_800.25
TICK = 1.0
CASES = 1000  # per path and header style; each case a chunk of 1 to 12 lines


def real_messages() -> list[bytes]:
    """The messages of the recorded kernel records, as the kernel printed them."""
    out = []
    for line in (DATA / "kmsg-records.txt").read_bytes().splitlines():
        out.append(line.split(b";", 1)[1])
    for line in (DATA / "dmesg-lines.txt").read_bytes().splitlines():
        out.append(line.split(b"] ", 1)[1])
    return [m for m in out if m.startswith(b"EGRESS_FENCE")]


MESSAGES = real_messages()

# --- mutations ------------------------------------------------------------------------------

_NUMBER = re.compile(rb"(?<==)\d+")
_ADDRESS = re.compile(rb"(?<=SRC=)\S+|(?<=DST=)\S+")
_HOSTILE = (
    b"\x00",
    b"\xff",
    b"\xc3",  # a UTF-8 lead byte alone
    b"\xed\xb2\x80",  # a UTF-16 surrogate, encoded
    b"\xe2\x80\xa8",  # U+2028
    b"\xc2\xa0",  # U+00A0, a space to str.split
    b"\x1c",  # a separator to str.split, not to re.ASCII
    b"\t",
    b"\r",
    b"\x0b",
    b"\\",
    b'"',
    b" ",
    b"  ",
    b"=",
    b"\xc3\xa9",
)
_HUGE = (
    b"4294967296",
    b"18446744073709551616",
    b"99999999999",
    b"1" * 30,
    b"0" * 12 + b"1",
    b"65536",
    b"100000",
    b"-1",
    b"1e3",
    b"0x10",
)
_FIELDS = (
    b"LEN=1 ",
    b"PROTO=TCP ",
    b"SPT=1 DPT=2 ",
    b"UID=7 GID=7 ",
    b"SRC=10.0.0.1 ",
    b"DST=::1 ",
    b"IN= ",
    b"OUT=eth0 ",
    b"MARK=0x1 ",
    b"EGRESS_FENCE ",
)


def _flip(rng: random.Random, m: bytes) -> bytes:
    if not m:
        return m
    i = rng.randrange(len(m))
    return m[:i] + bytes([rng.randrange(256)]) + m[i + 1 :]


def _cut(rng: random.Random, m: bytes) -> bytes:
    return m[: rng.randrange(len(m) + 1)]


def _insert(rng: random.Random, m: bytes) -> bytes:
    i = rng.randrange(len(m) + 1)
    return m[:i] + rng.choice(_HOSTILE) + m[i:]


def _in_match(rng: random.Random, m: bytes, pattern: re.Pattern[bytes], what: bytes) -> bytes:
    spans = [x.span() for x in pattern.finditer(m)]
    if not spans:
        return _insert(rng, m)
    a, b = rng.choice(spans)
    i = rng.randint(a, b)
    return m[:i] + what + m[i:]


def _nul_in_address(rng: random.Random, m: bytes) -> bytes:
    return _in_match(rng, m, _ADDRESS, rng.choice([b"\x00", b"\x00x", b"\x00\x00", b"\xff"]))


def _nul_in_number(rng: random.Random, m: bytes) -> bytes:
    return _in_match(rng, m, _NUMBER, rng.choice([b"\x00", b"\x001", b"\xc3"]))


def _huge_number(rng: random.Random, m: bytes) -> bytes:
    spans = [x.span() for x in _NUMBER.finditer(m)]
    if not spans:
        return m
    a, b = rng.choice(spans)
    return m[:a] + rng.choice(_HUGE) + m[b:]


def _tokens(m: bytes) -> list[bytes]:
    return m.split(b" ")


def _drop_field(rng: random.Random, m: bytes) -> bytes:
    t = _tokens(m)
    if len(t) > 1:
        del t[rng.randrange(1, len(t))]
    return b" ".join(t)


def _repeat_field(rng: random.Random, m: bytes) -> bytes:
    t = _tokens(m)
    i = rng.randrange(1, len(t)) if len(t) > 1 else 0
    t.insert(rng.randrange(1, len(t) + 1), t[i])
    return b" ".join(t)


def _swap_fields(rng: random.Random, m: bytes) -> bytes:
    t = _tokens(m)
    if len(t) > 2:
        i, j = rng.randrange(1, len(t)), rng.randrange(1, len(t))
        t[i], t[j] = t[j], t[i]
    return b" ".join(t)


def _add_field(rng: random.Random, m: bytes) -> bytes:
    t = _tokens(m)
    t.insert(rng.randrange(1, len(t) + 1), rng.choice(_FIELDS).rstrip(b" "))
    return b" ".join(t)


def _strip(rng: random.Random, m: bytes) -> bytes:
    return m.rstrip(b" ")


def _prefix(rng: random.Random, m: bytes) -> bytes:
    head = rng.choice([b"EGRESS_FENCE: ", b"EGRESS_FENCE agent-7 ", b"EGRESS_FENC ", b"x "])
    return head + m.split(b" ", 1)[-1]


def _pad(rng: random.Random, m: bytes) -> bytes:
    """A run at the length limits of the layout's skipped parts (400, 1100 characters)."""
    i = rng.randrange(len(m) + 1)
    run = rng.choice([b"x", b"P", b" ", b"y "]) * rng.choice([399, 400, 401, 1099, 1100, 1101])
    return m[:i] + run + m[i:]


MUTATIONS: tuple[Callable[[random.Random, bytes], bytes], ...] = (
    _pad,
    _flip,
    _cut,
    _insert,
    _nul_in_address,
    _nul_in_number,
    _huge_number,
    _drop_field,
    _repeat_field,
    _swap_fields,
    _add_field,
    _strip,
    _prefix,
)


def message(rng: random.Random) -> bytes:
    """A real record's message, left as it was or mutated one to three times."""
    m = rng.choice(MESSAGES)
    if rng.random() < 0.25:
        return m
    for _ in range(rng.randint(1, 3)):
        m = rng.choice(MUTATIONS)(rng, m)
    return m


# --- record headers, one second of their own per line ------------------------------------

_MONTH_DAY = b"Dec  1"  # BOOT_WALL's day; RFC 3164 has no year (YEAR supplies it)


def _rfc3164(rng: random.Random, i: int) -> bytes:
    stamp = b"%s 00:%02d:%02d" % (_MONTH_DAY, i // 60, i % 60)
    if rng.random() < 0.05:
        stamp = rng.choice([b"Dec 32 00:00:00", b"Foo  1 00:00:00", b"Dec  1 24:00:00"])
    up = rng.choice([b"", b"", b"[  455.929995] ", b"[455.9]"])
    tag = b"kernel:" if rng.random() < 0.9 else b"sshd[1]:"
    return b"%s host %s %s" % (stamp, tag, up)


def _rfc3339(rng: random.Random, i: int) -> bytes:
    frac = rng.choice([b"", b".5", b".123456", b".123456789"])
    zone = rng.choice([b"+00:00", b"Z", b"", b"+01:00", b"-0530"])
    stamp = b"2026-12-01T%02d:%02d:%02d%s%s" % (i // 3600, (i // 60) % 60, i % 60, frac, zone)
    if rng.random() < 0.05:
        stamp = rng.choice([b"2026-02-30T00:00:00Z", b"2026-12-01T00:00:60Z", b"2026-12-01T0"])
    up = rng.choice([b"", b"[  455.929995] "])
    tag = b"kernel:" if rng.random() < 0.9 else b"sshd[1]:"
    return b"%s host %s %s" % (stamp, tag, up)


def _dmesg(rng: random.Random, i: int) -> bytes:
    raw = rng.choice([b"", b"", b"<4>", b"<12>"])
    caller = rng.choice([b"", b"", b"[T1234] ", b"[ C1] "])
    return b"%s[%5d.%06d] %s" % (raw, i, rng.randrange(10**6), caller)


def _kmsg(rng: random.Random, i: int) -> bytes:
    pri = rng.choice([4, 4, 4, 6, 0, 12, 14, 8])
    flags = rng.choice([b"-", b"-", b"c", b"-,caller=T1"])
    return b"%d,%d,%d,%s;" % (pri, 1000 + i, i * 10**6 + rng.randrange(10**6), flags)


HEADERS: dict[str, Callable[[random.Random, int], bytes]] = {
    "rfc3164": _rfc3164,
    "rfc3339": _rfc3339,
    "dmesg": _dmesg,
    "kmsg": _kmsg,
}
# The file source's format for each header style.
FILE_FORMAT = {"rfc3164": "syslog", "rfc3339": "syslog", "dmesg": "dmesg", "kmsg": "kmsg"}


def text_lines(rng: random.Random, style: str) -> list[bytes]:
    """Up to 12 log lines: fence records (mostly mutated), other kernel lines, junk."""
    out = []
    for i in range(rng.randint(1, 12)):
        head = HEADERS[rng.choice(list(HEADERS))] if style == "auto" else HEADERS[style]
        r = rng.random()
        if r < 0.85:
            line = head(rng, i) + message(rng)
        elif r < 0.92:
            line = head(rng, i) + b"usb 1-1: new high-speed USB device"
        elif r < 0.96:
            line = _cut(rng, head(rng, i) + message(rng))  # the header itself cut short
        else:
            line = rng.choice([b"", b"garbage", b" SUBSYSTEM=net", b"\x00", b"\xff\xfe"])
        out.append(line)
    return out


def journal_lines(rng: random.Random) -> list[bytes]:
    """``journalctl -o json`` entries of the messages, in the ways journalctl writes them
    (a message that is not UTF-8 as an array of byte values) and ways it does not."""
    out = []
    for i in range(rng.randint(1, 12)):
        msg = message(rng)
        entry: dict[str, object] = {
            "__CURSOR": f"s=ab;i={i}",
            "__REALTIME_TIMESTAMP": str(int(BOOT_WALL + i) * 10**6 + rng.randrange(10**6)),
            "_TRANSPORT": rng.choice(["kernel", "kernel", "kernel", "syslog", "driver"]),
            "SYSLOG_FACILITY": rng.choice(["0", "0", "0", "1", "00", "", None]),
            "MESSAGE": None,
        }
        try:
            entry["MESSAGE"] = msg.decode()
        except UnicodeDecodeError:
            if rng.random() < 0.7:
                entry["MESSAGE"] = list(msg)
            else:  # a lone surrogate, as JSON can write and json.loads reads
                entry["MESSAGE"] = msg.decode("utf-8", "surrogateescape")
        r = rng.random()
        if r < 0.03:
            entry["MESSAGE"] = None
        elif r < 0.06:
            del entry["__REALTIME_TIMESTAMP"]
        elif r < 0.09:
            entry["__REALTIME_TIMESTAMP"] = rng.choice([10**20, "x", "1" * 40, "-5"])
        keys = list(entry)
        if rng.random() < 0.3:
            rng.shuffle(keys)
        sep = rng.choice([(", ", " : "), (",", ":")])
        body = sep[0].join(
            json.dumps(k) + sep[1] + json.dumps(entry[k], ensure_ascii=rng.random() < 0.5)
            for k in keys
        )
        line = ("{" + body + "}").encode("utf-8", "surrogatepass")
        r = rng.random()
        if r < 0.05:
            line = _cut(rng, line)
        elif r < 0.1:
            line = _flip(rng, line)
        elif r < 0.12:
            line = rng.choice([b"", b"[1]", b"{broken", b"{}", b'{"MESSAGE": 5}'])
        out.append(line)
    return out


# --- the paths --------------------------------------------------------------------------


@dataclass
class Counted:
    """What a path made of the input: cells ``(tick, dst, proto, dpt, out, uid, prefix) ->
    [bytes, records]``, parse errors (header and fence), forged records, and where the
    source tells it, the newest record time (its watermark)."""

    flows: dict
    parse_errors: int
    forged: int
    last_ts: float = 0.0

    @staticmethod
    def of(read: FenceRead, header_errors: int = 0, last_ts: float = 0.0) -> Counted:
        flows = {} if read.events is None else read.events.subjects.scan.flows()
        return Counted(flows, read.parse_errors + header_errors, read.forged, last_ts)


def _per_record(reader: FenceReader, records: list[KernelRecord]) -> FenceRead:
    fence_module.NATIVE_BATCH, saved = 1 << 62, fence_module.NATIVE_BATCH
    try:
        return reader.read(records)
    finally:
        fence_module.NATIVE_BATCH = saved


def _native_records(reader: FenceReader, records: list[KernelRecord]) -> FenceRead:
    fence_module.NATIVE_BATCH, saved = 1, fence_module.NATIVE_BATCH
    try:
        return reader.read(records)
    finally:
        fence_module.NATIVE_BATCH = saved


class LineParser:
    """The file tailer's per-line step (tail.FileTailCollector._parse): a header the line
    parser refuses is a parse error; nothing else may escape it.  ``last_ts``: the newest
    record time, the source's watermark."""

    def __init__(self, fmt: str):
        self.parse = kernel_line_parser(fmt, BOOT_WALL, YEAR)
        self.errors = 0
        self.last_ts = 0.0

    def __call__(self, block: bytes) -> list[KernelRecord]:
        out = []
        for raw in block.split(b"\n")[:-1]:
            try:
                rec = self.parse(raw.decode("utf-8", "replace"))
            except ValueError:
                self.errors += 1
                continue
            if rec is not None:
                out.append(rec)
                self.last_ts = max(self.last_ts, rec.ts)
        return out


def file_source(data: bytes, fmt: str, trusted: bool, native: bool) -> Counted:
    reader = FenceReader(PFX, trusted, TICK)
    lines = LineParser(fmt)
    if native:
        read_chunk = fence_chunk_reader(reader, fmt, BOOT_WALL, YEAR)
        assert read_chunk is not None
        read, last_ts = read_chunk(data, lines)
        last_ts = max(last_ts, lines.last_ts)
    else:
        read = _per_record(reader, lines(data))
        last_ts = lines.last_ts
    return Counted.of(read, lines.errors, last_ts)


def record_source(records: list[KernelRecord], native: bool) -> Counted:
    reader = FenceReader(PFX, True, TICK)
    read = (_native_records if native else _per_record)(reader, records)
    return Counted.of(read)


def backtest(data: bytes, fmt: str, native: bool) -> Counted:
    scan: FlowScan = scan_flows(data, fmt, PFX, TICK, YEAR, boot_wall=BOOT_WALL, native=native)
    assert scan.native == native
    return Counted(scan.flows(), scan.parse_errors, scan.forged)


def agree(name: str, run: Callable[..., Counted], *args: object) -> Counted:
    """``run(*args, native)`` both ways: the counts must be equal, and neither may raise."""
    got, want = run(*args, True), run(*args, False)
    assert got == want, f"{name}: native {got} != per-record {want}"
    return got


def _explain(lines: list[bytes], run: Callable[..., Counted]) -> str:
    """The first line on which the paths disagree alone (or the chunk), for the message."""
    for line in lines:
        try:
            a, b = run(line + b"\n", native=True), run(line + b"\n", native=False)
        except Exception as exc:  # reported: the assertion fails anyway
            return f"line {line!r} raised {exc!r}"
        if a != b:
            return f"line {line!r}: native {a} != per-record {b}"
    return f"only together: {lines!r}"


def fuzz(seed: str, lines: list[bytes], run: Callable[..., Counted]) -> None:
    """``run(chunk, native=...)`` of the lines both ways: equal counts, and no raise."""
    data = b"".join(line + b"\n" for line in lines)
    try:
        same = run(data, native=True) == run(data, native=False)
    except Exception:  # a raise is a disagreement too: _explain says where
        same = False
    assert same, f"case {seed!r}: {_explain(lines, run)}"


STYLES = ["rfc3164", "rfc3339", "dmesg", "kmsg", "auto"]


@pytest.mark.parametrize("style", STYLES)
def test_file_source_chunks_agree_with_line_by_line(style: str) -> None:
    """``type: file``: chunks through scan_live against the line parser and parse_fence."""
    fmt = FILE_FORMAT.get(style, "auto")
    for case in range(CASES):
        seed = f"file-{style}-{case}"
        rng = random.Random(seed)
        trusted = style == "kmsg" and rng.random() < 0.5  # kmsg dumps: facility can prove
        fuzz(seed, text_lines(rng, style), functools.partial(file_source, fmt=fmt, trusted=trusted))


@pytest.mark.parametrize("source", ["kmsg", "journald"])
def test_source_batches_agree_with_record_by_record(source: str) -> None:
    """The kmsg and journald sources: a batch of records through the native scanner against
    ``parse_fence`` one record at a time (kernel origin required)."""
    for case in range(CASES):
        seed = f"records-{source}-{case}"
        rng = random.Random(seed)
        if source == "kmsg":
            lines = text_lines(rng, "kmsg")

            def run(data: bytes, native: bool) -> Counted:
                chunk = parse_chunk(data, BOOT_WALL, None)
                read = record_source(chunk.records, native)
                return Counted(read.flows, read.parse_errors + chunk.parse_errors, read.forged)

        else:
            lines = journal_lines(rng)

            def run(data: bytes, native: bool) -> Counted:
                chunk = parse_journal_chunk(data)
                read = record_source(chunk.records, native)
                return Counted(read.flows, read.parse_errors + chunk.parse_errors, read.forged)

        fuzz(seed, lines, run)


@pytest.mark.parametrize("style", [*STYLES[:4], "journal"])
def test_backtest_scan_agrees_with_the_regex_and_json_path(style: str) -> None:
    """The backtest: scan_flows in C against its regex (and json.loads) path."""
    fmt = "journal-json" if style == "journal" else FILE_FORMAT[style]
    for case in range(CASES):
        seed = f"backtest-{style}-{case}"
        rng = random.Random(seed)
        lines = journal_lines(rng) if style == "journal" else text_lines(rng, style)
        fuzz(seed, lines, functools.partial(backtest, fmt=fmt))


def test_the_fuzz_reaches_what_it_compares() -> None:
    """Enough of the mutated lines are still fence records, and enough are malformed, for
    the agreement to mean something (the mutations do not all miss or all break)."""
    accepted = errors = 0
    for case in range(200):
        rng = random.Random(f"reach-{case}")
        data = b"".join(line + b"\n" for line in text_lines(rng, "rfc3164"))
        got = file_source(data, "syslog", False, True)
        accepted += sum(n for _, n in got.flows.values())
        errors += got.parse_errors
    assert accepted > 500 and errors > 300, (accepted, errors)


# --- regressions: disagreements the fuzz found, one behaviour now -------------------------

FENCE = "EGRESS_FENCE IN= OUT=eth0 SRC=10.0.0.2 DST={dst} LEN=60 PROTO=UDP SPT=1 DPT=53 LEN=40 "


def _all_paths(message: bytes) -> list[tuple[str, Counted]]:
    """One fence message through every path, each checked against its twin."""
    out = []
    kmsg = b"4,1,1000000,-;" + message + b"\n"
    for name, data, fmt in (
        ("rfc3164", b"Dec  1 00:00:01 h kernel: " + message + b"\n", "syslog"),
        ("rfc3339", b"2026-12-01T00:00:01Z h kernel: " + message + b"\n", "syslog"),
        ("dmesg", b"[    1.000000] " + message + b"\n", "dmesg"),
        ("kmsg", kmsg, "kmsg"),
    ):
        out.append(
            (
                f"file-{name}",
                agree(name, file_source, data, fmt, False),
            )
        )
        out.append(
            (
                f"backtest-{name}",
                agree(name, backtest, data, fmt),
            )
        )
    records = parse_chunk(kmsg * 40, BOOT_WALL, None).records  # a batch the scanner takes
    out.append(
        (
            "records",
            agree("records", record_source, records),
        )
    )
    return out


@pytest.mark.parametrize(
    "dst",
    [b"10.0.0.1\x00x", b"10.0.0.1\x00", b"2001:db8::1\x00", b"10.0\x00.0.1", b"\x0010.0.0.1"],
)
def test_regression_nul_inside_an_address_is_malformed_on_every_path(dst: bytes) -> None:
    # Issue 28: inet_pton stops at a NUL, so the native scanner read "10.0.0.1\0x" as
    # 10.0.0.1 where ipaddress (the per-record path) refuses the record.  Fixed in 085740f;
    # kept here for every path that has a native twin.
    message = FENCE.encode().replace(b"{dst}", dst)
    for name, got in _all_paths(message):
        expect = 40 if name == "records" else 1
        assert (got.flows, got.parse_errors) == ({}, expect), name
    src = message.replace(b"SRC=10.0.0.2", b"SRC=10.0.0.2\x00")
    src = src.replace(b"{dst}", b"10.0.0.3")
    for name, got in _all_paths(src.replace(dst, b"10.0.0.3")):
        assert got.flows == {} and got.parse_errors >= 1, name


def _journal(message: object, ts: object = "1796086801000000", raw: bool = False) -> bytes:
    entry = {
        "__REALTIME_TIMESTAMP": ts,
        "_TRANSPORT": "kernel",
        "SYSLOG_FACILITY": "0",
        "MESSAGE": message,
    }
    if raw:  # as the bytes are, control characters included (json.dumps would escape them)
        return b'{"__REALTIME_TIMESTAMP": "%s", "_TRANSPORT": "kernel", ' % str(ts).encode() + (
            b'"SYSLOG_FACILITY": "0", "MESSAGE": "' + str(message).encode() + b'"}\n'
        )
    return json.dumps(entry).encode() + b"\n"


def _journal_paths(data: bytes) -> tuple[Counted, Counted]:
    """(the journald source's batch, the backtest's scan) of a journal export, each checked
    against its twin."""

    def source(native: bool) -> Counted:
        chunk = parse_journal_chunk(data)
        read = record_source(chunk.records, native)
        return Counted(read.flows, read.parse_errors + chunk.parse_errors, read.forged)

    return (
        agree("journald", source),
        agree("backtest", backtest, data, "journal-json"),
    )


def test_regression_lone_surrogate_in_a_journal_message() -> None:
    # A JSON "\udc80" escape is a lone surrogate in the message: the native batch encoded
    # the records as UTF-8 and raised UnicodeEncodeError, losing the whole batch, where the
    # per-record path reads the record.  Now such a record goes the per-record way.
    good = FENCE.format(dst="10.0.0.9")
    odd_proto = good.replace("PROTO=UDP", "PROTO=UDP\udc80")
    odd_dst = good.replace("DST=10.0.0.9", "DST=10.0.0.9\udc80")
    data = _journal(good) * 40 + _journal(odd_proto) + _journal(odd_dst)
    for got in _journal_paths(data):
        assert got.parse_errors == 1  # the address; the protocol is free text
        assert sum(b for b, _ in got.flows.values()) == 41 * 60
        assert {k[2] for k in got.flows} == {"UDP", "UDP\udc80"}


def test_regression_journal_timestamp_out_of_range() -> None:
    # A 40-digit __REALTIME_TIMESTAMP ended the read in OverflowError (its tick does not fit
    # int64) on both paths, and beside ordinary entries the native batch dropped the record
    # without a count.  journald's clock is 64-bit: past it, the entry is a parse error.
    good = _journal(FENCE.format(dst="10.0.0.9"))
    for ts in ("1" * 40, str(1 << 63), "-5"):
        data = good * 40 + _journal(FENCE.format(dst="10.0.0.8"), ts=ts)
        for got in _journal_paths(data):
            assert got.parse_errors == 1 and got.forged == 0, ts
            assert sum(b for b, _ in got.flows.values()) == 40 * 60, ts
    edge = good * 40 + _journal(FENCE.format(dst="10.0.0.8"), ts=str((1 << 63) - 1))
    for got in _journal_paths(edge):
        assert (got.parse_errors, len(got.flows)) == (0, 2)


def test_regression_records_far_apart_in_one_batch_are_all_counted() -> None:
    # The native batch writes each record as a kmsg line stamped in microseconds after the
    # batch's first record.  A journal entry stamped 10**33 s (now refused: see above) beside
    # ordinary ones made a stamp of 40 digits, which neither the scanner nor its regex reads,
    # and the record was dropped: neither bytes, nor forged, nor an error.  Now a record
    # whose stamp the scanner would not read itself (10**15 us and up) goes the per-record
    # way, whatever made its time.
    message = FENCE.format(dst="10.0.0.9")
    records = [KernelRecord(1000.0 + i, message, 0, i, True) for i in range(40)]
    for far in (1e9, 1e14, 1e15, 9e12):
        for trusted in (True, False):
            batch = [*records, KernelRecord(far, message, 0 if trusted else 1, 99, trusted)]
            got = agree(str(far), record_source, batch)
            counted = sum(n for _, n in got.flows.values())
            assert (counted, got.forged, got.parse_errors) == (40 + trusted, 1 - trusted, 0)


def test_regression_tab_inside_a_journal_string_is_malformed() -> None:
    # json.loads refuses a raw tab inside a string (a control character, RFC 8259), so the
    # entry is a parse error on the regex path; the native scanner, which allows tabs
    # between tokens, read it as traffic.  Now it hands such a line back.
    for message in (FENCE.format(dst="10.0.0.9") + "\t", FENCE.format(dst="10.0.0.9\t")):
        data = _journal(message, raw=True)
        got = agree("tab", backtest, data, "journal-json")
        assert (got.flows, got.parse_errors) == ({}, 1)
    # Between tokens a tab is whitespace: read, by both.
    spaced = _journal(FENCE.format(dst="10.0.0.9")).replace(b", ", b",\t")
    got = agree("whitespace", backtest, spaced, "journal-json")
    assert (sum(b for b, _ in got.flows.values()), got.parse_errors) == (60, 0)
