"""The bulk scanner agrees with kernel_formats + parse_fence, line for line."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_netfilter import fence_lines

from alarm.fastscan import ScanResult, iter_chunks, scan_text
from alarm.kernel_formats import parse_dmesg_line, parse_kmsg_record, parse_syslog_line
from alarm.netfilter import FenceParseError, parse_fence

DATA = Path(__file__).parents[2] / "shared/data/kernel-fence"
PFX = ("EGRESS_FENCE",)
YEAR = 2026


def reference(text: str, fmt: str, prefixes: tuple[str, ...], year: int = YEAR) -> ScanResult:
    """The same scan, one line at a time through the per-record parsers."""
    out = ScanResult()
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    out.lines = len(lines)
    for line in lines:
        try:
            if fmt == "kmsg":
                rec = parse_kmsg_record(line)
            elif fmt == "dmesg":
                rec = parse_dmesg_line(line)
            else:
                rec = parse_syslog_line(line, year)
        except ValueError:
            continue
        if rec is None:
            continue
        try:
            fence = parse_fence(rec.message, prefixes)
        except FenceParseError:
            out.parse_errors += 1
            continue
        if fence is None:
            continue
        if fmt == "kmsg" and not rec.trusted:
            out.forged += 1
            continue
        out.rows.append(
            (
                rec.ts,
                fence.log_prefix,
                fence.out_if,
                fence.dst,
                fence.length,
                fence.proto,
                fence.dpt,
                fence.uid,
                fmt == "kmsg",
            )
        )
    return out


def assert_same(text: str, fmt: str, prefixes: tuple[str, ...] = PFX) -> ScanResult:
    got = scan_text(text, fmt, prefixes, YEAR)
    want = reference(text, fmt, prefixes)
    assert got.rows == want.rows
    assert (got.lines, got.parse_errors, got.forged) == (want.lines, want.parse_errors, want.forged)
    return got


def test_real_kmsg_records() -> None:
    text = (DATA / "kmsg-records.txt").read_text()
    got = assert_same(text, "kmsg")
    assert len(got.rows) == 8 and got.forged == 0 and got.parse_errors == 0
    assert got.rows[0] == (
        340.614047,
        "EGRESS_FENCE",
        "lo",
        "127.0.0.1",
        92,
        "UDP",
        9998,
        None,
        True,
    )
    assert got.rows[3][1] == "EGRESS_FENCE:" and got.rows[3][7] == 0
    assert got.rows[4][3] == "::1"
    assert scan_text(text, "kmsg", PFX, boot_wall=1000.0).rows[0][0] == pytest.approx(1340.614047)


def test_real_dmesg_lines() -> None:
    text = (DATA / "dmesg-lines.txt").read_text()
    got = assert_same(text, "dmesg")
    assert [r[4] for r in got.rows] == [104, 104, 1228] and not any(r[8] for r in got.rows)
    raw = "".join("<4>" + line + "\n" for line in text.splitlines())
    assert assert_same(raw, "dmesg").rows == got.rows


def test_forged_kmsg_records_are_counted_not_rowed() -> None:
    real = (DATA / "kmsg-records.txt").read_text().splitlines()
    forged = "12" + real[0][1:]  # PRI 12: facility 1 (user), what a /dev/kmsg write becomes
    text = (
        "\n".join([real[0], forged, " SUBSYSTEM=net", "6,1,2,-;not a fence line", real[1]]) + "\n"
    )
    got = assert_same(text, "kmsg")
    assert (len(got.rows), got.forged, got.lines) == (2, 1, 5)


def test_syslog_mixed_lines() -> None:
    fence = "EGRESS_FENCE IN= OUT=eth0 SRC=10.0.0.1 DST=2001:0db8:0000:0000:0000:0000:0000:0001 LEN=60 TC=0 HOPLIMIT=64 FLOWLBL=1 PROTO=TCP SPT=1 DPT=443 WINDOW=1 RES=0x00 SYN URGP=0 UID=5 GID=5 "
    text = "\n".join(
        [
            f"Nov 30 19:07:05 h kernel: [  455.929995] {fence}",
            f"Nov  3 01:00:00 h kernel: {fence.rstrip()}",  # no uptime, trailing space stripped
            f"Nov 3 01:00:00 h kernel: {fence}",  # single-space day
            f"2026-11-30T19:07:05.250000+01:00 h kernel: {fence}",
            f"Nov 30 19:07:05 h sshd[1]: {fence}",  # not the kernel
            "Nov 30 19:07:05 h kernel: [  455.929995] EGRESS_FENCE IN= OUT=eth0 SRC=10.0.0.1 DST=",
            "Nov 30 19:07:05 h kernel: EGRESS_FENCE IN= OUT=eth0 SRC=10.0.0.1 DST=10.0.0.999 LEN=5 ",
            "Nov 30 19:07:05 h kernel: usb 1-1: new device",
            "garbage line",
            "",
            f"Nov 30 19:07:06 h kernel: {fence}",
        ]
    )  # no final newline
    got = assert_same(text, "syslog")
    assert len(got.rows) == 5 and got.parse_errors == 2 and got.lines == 11
    assert got.rows[0][3] == "2001:db8::1" and got.rows[0][6] == 443 and got.rows[0][7] == 5
    assert got.rows[3][0] == pytest.approx(
        time.mktime((2026, 11, 30, 18, 7, 5, 0, 0, 0)) - time.timezone + 0.25
    )


def test_bad_stamp_on_a_fence_line_is_a_parse_error() -> None:
    # kernel_formats refuses the header; the bulk scan counts the lost fence line.
    got = scan_text(
        "Foo 30 19:07:05 h kernel: EGRESS_FENCE IN= OUT=e SRC=1.1.1.1 DST=1.1.1.1 LEN=1 \n",
        "syslog",
        PFX,
    )
    assert got.rows == [] and got.parse_errors == 1


def test_prefixes_longest_wins_and_others_ignored() -> None:
    line = "Nov 30 19:07:05 h kernel: {} IN= OUT=eth0 SRC=10.0.0.1 DST=10.0.0.2 LEN=40 PROTO=47 \n"
    text = line.format("FENCE_B team") + line.format("FENCE_A") + line.format("OTHER")
    got = assert_same(text, "syslog", ("FENCE_A", "FENCE_B", "FENCE_B team"))
    assert [r[1] for r in got.rows] == ["FENCE_B team", "FENCE_A"]


def test_unknown_format() -> None:
    with pytest.raises(ValueError):
        scan_text("x\n", "events-jsonl", PFX)
    assert scan_text("", "syslog", PFX) == ScanResult()


def test_journal_json_path() -> None:
    import json

    msg = (
        "EGRESS_FENCE IN= OUT=lo SRC=127.0.0.1 DST=127.0.0.1 LEN=92 PROTO=UDP SPT=1 DPT=53 LEN=72 "
    )
    entry = {
        "__REALTIME_TIMESTAMP": "1764529625000000",
        "MESSAGE": msg,
        "_TRANSPORT": "kernel",
        "SYSLOG_FACILITY": "0",
    }
    text = "\n".join(
        [
            json.dumps(entry),
            json.dumps({**entry, "_TRANSPORT": "syslog"}),
            "{broken",
            json.dumps({**entry, "MESSAGE": "x"}),
        ]
    )
    got = scan_text(text, "journal-json", PFX)
    assert got.rows == [
        (1764529625.0, "EGRESS_FENCE", "lo", "127.0.0.1", 92, "UDP", 53, None, True)
    ]
    assert (got.forged, got.parse_errors, got.lines) == (1, 1, 4)


def test_iter_chunks_ends_on_line_boundaries(tmp_path: Path) -> None:
    lines = [f"line {i} " + "x" * (i % 50) for i in range(3000)]
    path = tmp_path / "k.log"
    path.write_text("\n".join(lines))  # no final newline
    chunks = list(iter_chunks(str(path), chunk_bytes=1000))
    assert len(chunks) > 10
    assert all(c.endswith("\n") for c in chunks[:-1])
    assert "".join(chunks).split("\n") == lines
    # A line longer than a chunk is carried whole.
    path.write_text("a" * 5000 + "\nb\n")
    chunks = list(iter_chunks(str(path), chunk_bytes=1000))
    assert "".join(chunks) == "a" * 5000 + "\nb\n" and all(c.endswith("\n") for c in chunks)


# --- hypothesis: agreement on generated kernel lines, clean and mutated ------------------

_junk = st.text(
    st.characters(blacklist_characters="\n\r", blacklist_categories=("Cs",)), max_size=12
)


@st.composite
def log_text(draw: st.DrawFn, fmt: str) -> str:
    out = []
    for i in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["fence", "fence", "fence", "mutated", "other"]))
        if kind == "other":
            msg = draw(
                st.sampled_from(
                    ["usb 1-1: hi", "EGRESS_FENC", "EGRESS_FENCE", "x EGRESS_FENCE IN="]
                )
            )
        else:
            msg = draw(fence_lines())[0]
            if kind == "mutated":
                pos = draw(st.integers(0, len(msg)))
                junk = draw(_junk)
                msg = msg[:pos] + junk + msg[pos + draw(st.integers(0, 12)) :]
            if draw(st.booleans()):
                msg = msg.rstrip(" ")
        if fmt == "kmsg":
            pri = draw(st.sampled_from([4, 6, 12, 14]))
            out.append(f"{pri},{i},{draw(st.integers(0, 10**12))},-;{msg}")
            if draw(st.integers(0, 4)) == 0:
                out.append(" SUBSYSTEM=net")
        elif fmt == "dmesg":
            raw = draw(st.sampled_from(["", "<4>", "<12>"]))
            out.append(
                f"{raw}[{draw(st.integers(0, 99999)):5d}.{draw(st.integers(0, 999999)):06d}] {msg}"
            )
        else:
            tag = draw(st.sampled_from(["kernel:", "kernel:", "kernel:", "sshd[2]:"]))
            up = draw(st.sampled_from(["", "[  455.929995] ", "[12.5]"]))
            stamp = draw(
                st.sampled_from(
                    ["Nov 30 19:07:05", "Jan  2 00:00:59", "2026-11-30T19:07:05.5+00:00"]
                )
            )
            out.append(f"{stamp} host-{i} {tag} {up}{msg}")
    return "\n".join(out) + draw(st.sampled_from(["\n", ""]))


@pytest.mark.parametrize("fmt", ["syslog", "kmsg", "dmesg"])
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_bulk_agrees_with_per_line_parsers(fmt: str, data: st.DataObject) -> None:
    assert_same(data.draw(log_text(fmt)), fmt)
