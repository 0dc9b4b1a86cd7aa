"""A forged-records alert carries one sample of what was forged (issue 27): the first forged
record of the window the alert judged, sanitised and bounded, from every way kernel records
are read (kmsg and journal records live, a kmsg dump or journal export in a backtest, the
native scanner and the regex), into the alert's payload."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from alarm.backtest import run_backtest
from alarm.collectors.kernel import fence as fence_module
from alarm.collectors.kernel.fastscan import native_available, scan_flows
from alarm.collectors.kernel.fence import FenceReader
from alarm.collectors.kernel.records import KernelRecord
from alarm.config import config_from_dict
from alarm.events import FORGED_SAMPLE_CHARS, Batch
from alarm.pipeline import Pipeline
from exporters.payload import LinkSet, alert_document

FENCE_DATA = Path(__file__).resolve().parent / "data/kernel-fence"
PFX = ("EGRESS_FENCE",)
FORGED = (
    "EGRESS_FENCE IN= OUT=lo SRC=127.0.0.1 DST=10.9.9.9 LEN=9999 TOS=0x00 PREC=0x00 TTL=64 "
    "ID=1 DF PROTO=UDP SPT=1 DPT=2 LEN=9979 UID=4242 GID=4242"
)
KERNEL = "EGRESS_FENCE IN= OUT=eth0 SRC=10.0.0.2 DST=10.1.2.3 LEN={} PROTO=TCP SPT=1 DPT=443 "


def journal_entry(message: str, transport: str, facility: str, usec: int) -> str:
    return json.dumps(
        {
            "MESSAGE": message,
            "_TRANSPORT": transport,
            "SYSLOG_FACILITY": facility,
            "__REALTIME_TIMESTAMP": str(usec),
        }
    )


def test_a_backtest_of_a_kmsg_dump_pages_the_forged_line_itself(tmp_path) -> None:
    dump = tmp_path / "kmsg.txt"
    text = (FENCE_DATA / "kmsg-records.txt").read_text()
    # Written from user space into /dev/kmsg (facility 1, PRI 12): forged, never traffic.
    dump.write_text(text + f"12,434400,455999999,-;{FORGED}\n")
    out = io.StringIO()
    summary = run_backtest(config_from_dict({"tick": "10s"}), [str(dump)], out, workers=2)
    assert summary.forged == 1
    changes = [json.loads(line) for line in out.getvalue().splitlines()]
    (fired,) = [c for c in changes if c["rule"] == "forged_records" and c["state"] == "firing"]
    assert fired["figures"]["forged_sample"] == FORGED
    doc = alert_document({"change": fired}, "k", LinkSet("http://capalarm/", None), 10)
    assert doc["forged_sample"] == FORGED


@pytest.mark.parametrize("native", [True, False])
def test_scans_of_a_kmsg_dump_and_a_journal_export_find_the_forged_record(native) -> None:
    if native and not native_available():
        pytest.skip("alarm._fastscan not built here (no C compiler at install time)")
    trusted = [f"4,{i},{1000 + i},-;{KERNEL.format(100 + i)}" for i in range(50)]
    # A look-alike that is not a fence record (malformed) is not forged: not the sample.
    lines = [*trusted, "12,60,2000,-;EGRESS_FENCE garbage", f"12,61,2001,-;{FORGED}", ""]
    scan = scan_flows("\n".join(lines).encode(), "kmsg", PFX, 1.0, native=native)
    assert (scan.forged, scan.forged_sample) == (1, FORGED)
    # journald files what user space writes to /dev/kmsg as kernel transport, facility 1.
    entries = [journal_entry(KERNEL.format(100), "kernel", "0", 10**15)]
    entries.append(journal_entry(FORGED, "kernel", "1", 10**15 + 1))
    export = ("\n".join(entries) + "\n").encode()
    scan = scan_flows(export, "journal-json", PFX, 1.0, native=native)
    assert (scan.forged, scan.forged_sample) == (1, FORGED)
    clean = scan_flows(("\n".join(trusted) + "\n").encode(), "kmsg", PFX, 1.0, native=native)
    assert (clean.forged, clean.forged_sample) == (0, None)


@pytest.mark.parametrize("batch", [1, 10**9], ids=["native", "per-record"])
def test_live_records_keep_the_first_forged_one_sanitised_and_bounded(batch) -> None:
    hostile = FORGED + " \x1b[2J\x07" + "A" * 5000  # terminal escapes and a page of text
    recs = [KernelRecord(0.0, KERNEL.format(n), 0, trusted=True) for n in range(100, 140)]
    recs.insert(5, KernelRecord(0.0, hostile, 1, trusted=False))
    recs.append(KernelRecord(0.0, FORGED, 1, trusted=False))
    fence_module.NATIVE_BATCH, saved = batch, fence_module.NATIVE_BATCH
    try:
        read = FenceReader(PFX, require_trusted=True, tick=1.0).read(recs)
    finally:
        fence_module.NATIVE_BATCH = saved
    assert read.forged == 2
    sample = read.forged_sample
    assert sample is not None and sample.startswith(FORGED)
    assert "\x1b" not in sample and "\x07" not in sample
    assert len(sample) <= FORGED_SAMPLE_CHARS + 1  # and the ellipsis that marks the cut


def test_the_alert_carries_the_sample_of_its_own_window_and_keeps_it_across_a_restart() -> None:
    config = config_from_dict({"tick": "1s"})
    pipe = Pipeline(config, extra_sources={"kernel": ("kmsg", "egress")})
    assert pipe.close_until(0.0) == []  # the clock starts at tick 0
    first = Batch(None, {"forged_records": 1}, watermark=0.5, forged_sample="first")
    pipe.apply("kernel", first, None)
    pipe.apply("kernel", Batch(None, {"forged_records": 1}, forged_sample="second"), None)
    (result,) = pipe.close_until(1.0)
    (change,) = [c for c in result.changes if c.rule == "forged_records"]
    assert change.figures["forged_sample"] == "first", "the window's first forged record"
    saved = json.loads(json.dumps(pipe.to_state()))
    again = Pipeline(config, extra_sources={"kernel": ("kmsg", "egress")})
    again.load_state(saved)
    assert again.sources["kernel"].forged_sample == "first"
