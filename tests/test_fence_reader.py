"""The fence reader turns a large batch of records into the same write events through the
native scanner as it does record by record through parse_fence, and the pipeline counts them
on the surfaces their flows classify to."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fastscan import _TRICKY
from test_netfilter import fence_lines

from alarm.collectors.kernel import fence as fence_module
from alarm.collectors.kernel.fastscan import native_available
from alarm.collectors.kernel.fence import FenceReader
from alarm.collectors.kernel.records import KernelRecord
from alarm.config import config_from_dict
from alarm.events import Batch
from alarm.pipeline import Pipeline

PFX = ("EGRESS_FENCE",)
CONFIG = {
    "surfaces": [
        {"name": "proxy", "match": {"dst": ["10.0.0.0/8", "2001:db8::/32"], "proto": ["tcp"]}},
        {"name": "dns", "match": {"dport": [53], "proto": ["udp"]}},
        {"name": "owned", "match": {"uid": [0, 1000], "out": ["eth+"]}},
    ]
}

pytestmark = pytest.mark.skipif(
    not native_available() and not os.environ.get("CI"),
    reason="alarm._fastscan not built here (no C compiler at install time)",
)


@st.composite
def records(draw: st.DrawFn) -> list[KernelRecord]:
    out = []
    for _ in range(draw(st.integers(0, 80))):
        kind = draw(st.sampled_from(["fence", "fence", "fence", "tricky", "other", "newline"]))
        msg = draw(fence_lines())[0]
        if kind == "tricky":
            pos = draw(st.integers(0, len(msg)))
            msg = msg[:pos] + draw(st.sampled_from(_TRICKY)) + msg[pos:]
        elif kind == "other":
            msg = draw(st.sampled_from(["usb 1-1: hi", "EGRESS_FENC x", "x EGRESS_FENCE IN="]))
        elif kind == "newline":
            msg = msg[:20] + "\n" + msg[20:]
        if draw(st.booleans()):
            msg = msg.rstrip(" ")
        out.append(KernelRecord(ts=0.0, message=msg, facility=0, trusted=draw(st.booleans())))
    return out


def counted(recs: list[KernelRecord], require_trusted: bool, batch: int) -> tuple:
    pipe = Pipeline(config_from_dict(CONFIG))
    fence_module.NATIVE_BATCH, saved = batch, fence_module.NATIVE_BATCH
    try:
        read = FenceReader(PFX, require_trusted, tick=1.0).read(recs)
    finally:
        fence_module.NATIVE_BATCH = saved
    pipe.apply("kernel", Batch(read.events), None)
    table = pipe.table
    surfaces = {
        key: (
            int(table.bytes_total[i]),
            int(table.events_total[i]),
            sorted(table.hitters[i].top(1000)),
        )
        for i, key in enumerate(table.keys)
    }
    return surfaces, read.parse_errors, read.forged


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recs=records(), require_trusted=st.booleans())
def test_native_batch_counts_as_record_by_record(recs, require_trusted) -> None:
    assert counted(recs, require_trusted, 1) == counted(recs, require_trusted, 10**9)


def test_native_batch_is_used_and_counts_every_byte() -> None:
    line = "EGRESS_FENCE IN= OUT=eth0 SRC=10.0.0.2 DST=10.1.2.3 LEN={} PROTO=TCP SPT=1 DPT=443 "
    recs = [KernelRecord(0.0, line.format(n), 0, trusted=True) for n in range(100, 200)]
    recs.append(KernelRecord(0.0, line.format(7), 8, trusted=False))  # user space wrote it
    surfaces, errors, forged = counted(recs, True, 1)
    assert surfaces[("egress", "proxy")][:2] == (sum(range(100, 200)), 100)
    assert surfaces[("egress", "proxy")][2] == [("10.1.2.3:443/TCP", sum(range(100, 200)))]
    assert (errors, forged) == (0, 1)


# --- the file source live: whole chunks through the native scanner -------------------------

_HOSTILE = (b"\x00", b"\xff", b"\xc3", b"\r", b"\x0b", b" LEN=99999999999 ", b"\xe2\x80\xa8")


@st.composite
def log_file(draw: st.DrawFn, fmt: str) -> bytes:
    from test_fastscan import tricky_text

    if fmt == "auto":  # a file mixing the forms, as "auto" allows
        parts = [
            draw(tricky_text(f))
            for f in draw(
                st.lists(st.sampled_from(["syslog", "kmsg", "dmesg"]), min_size=1, max_size=3)
            )
        ]
        text = "\n".join(parts)
    else:
        text = draw(tricky_text(fmt))
    stamps = draw(st.sampled_from(["", "2026-11-30T19:07:05.5+00:00", "Nov 30 19:07:05"]))
    if stamps and fmt in ("syslog", "auto"):
        text = text.replace("Nov 30 19:07:05", stamps)
    lines = [ln.encode("utf-8", "surrogateescape") for ln in text.split("\n")]
    for _ in range(draw(st.integers(0, 4))):
        i = draw(st.integers(0, len(lines) - 1))
        pos = draw(st.integers(0, len(lines[i])))
        if draw(st.integers(0, 4)) == 0:
            lines[i] = lines[i][:pos]
        else:
            lines[i] = lines[i][:pos] + draw(st.sampled_from(_HOSTILE)) + lines[i][pos:]
    lines += [b"", b"garbage"] if draw(st.booleans()) else []
    return b"\n".join(lines) + draw(st.sampled_from([b"\n", b""]))


def followed(path, fmt: str, chunks: bool, require_trusted: bool = False) -> tuple:
    """What the file source makes of a file: per-line (the line parser, then read) or in
    chunks through the native scanner."""
    import asyncio

    from alarm.collectors.kernel.fastscan import FlowScan
    from alarm.collectors.kernel.file import fence_chunk_reader, kernel_line_parser
    from alarm.collectors.kernel.tail import FileTailCollector

    reader = FenceReader(PFX, require_trusted, tick=1.0)
    boot_wall, year = 1_796_065_625.25, 2026
    tailer = FileTailCollector(
        "f", [str(path)], kernel_line_parser(fmt, boot_wall, year), reader=reader.read
    )
    if chunks:
        tailer.chunk_reader = fence_chunk_reader(reader, fmt, boot_wall, year)
        assert tailer.chunk_reader is not None
    batches = []

    async def emit(batch) -> None:
        batches.append(batch)

    async def drain() -> None:
        while await tailer.poll(emit):
            pass
        # the unterminated last line is flushed when the file is finished
        path.rename(str(path) + ".gone")
        while await tailer.poll(emit):
            pass
        await tailer.close()

    asyncio.run(drain())
    cells: dict = {}
    errors = forged = 0
    for b in batches:
        if b.read is None:
            continue
        errors += b.read.parse_errors
        forged += b.read.forged
        ev = b.read.events
        if ev is not None:
            scan: FlowScan = ev.subjects.scan
            for key, (n, p) in scan.flows().items():
                acc = cells.setdefault(key, [0, 0])
                acc[0] += n
                acc[1] += p
    last_ts = max((b.last_ts for b in batches), default=0.0)
    return cells, errors, forged, dict(tailer.totals), last_ts


@pytest.mark.parametrize("fmt", ["syslog", "kmsg", "dmesg", "auto"])
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_file_source_chunks_count_as_line_by_line(tmp_path_factory, fmt: str, data) -> None:
    content = data.draw(log_file(fmt))
    d = tmp_path_factory.mktemp("live")
    (d / "a.log").write_bytes(content)
    (d / "b.log").write_bytes(content)
    per_line = followed(d / "a.log", fmt, False)
    native = followed(d / "b.log", fmt, True)
    assert native == per_line


def test_file_source_reads_rfc3339_kern_log_natively(tmp_path) -> None:
    """Debian 12's kern.log is read in chunks by the scanner, nothing parsed line by line."""
    from alarm.collectors.kernel.file import fence_chunk_reader

    msg = "EGRESS_FENCE IN= OUT=eth0 SRC=10.0.0.2 DST=10.1.2.3 LEN=60 PROTO=TCP SPT=1 DPT=443 "
    log = tmp_path / "kern.log"
    log.write_text(
        "".join(
            f"2026-12-03T22:11:{i % 60:02d}.{i:06d}+00:00 h kernel: [ 5.0] {msg}\n"
            for i in range(500)
        )
    )
    reader = FenceReader(PFX, False, tick=1.0)
    parsed: list[int] = []

    def parse_lines(block: bytes) -> list[KernelRecord]:
        parsed.append(block.count(b"\n"))
        return []

    read_chunk = fence_chunk_reader(reader, "syslog", 0.0, 2026)
    assert read_chunk is not None
    read, last_ts = read_chunk(log.read_bytes(), parse_lines)
    assert int(read.events.nbytes.sum()) == 500 * 60 and sum(parsed) == 0
    assert last_ts == 1796335919.000479  # 22:11:59.000479, the newest stamp
    per_line = followed(log, "syslog", False)
    log2 = tmp_path / "kern2.log"
    log2.write_bytes((tmp_path / "kern.log.gone").read_bytes())
    native = followed(log2, "syslog", True)
    assert native == per_line
