"""`capalarm backtest`: replay recorded input on its own timestamps, alerts as JSON lines."""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys
from pathlib import Path

from alarm.backtest import run_backtest
from alarm.config import config_from_dict

FENCE_DATA = Path(__file__).resolve().parent / "data/kernel-fence"


def strict_json(line: str):
    """Parse as RFC 8259 does: no Infinity, -Infinity or NaN (Go's and browsers' parsers)."""

    def reject(constant: str):
        raise AssertionError(f"{constant} is not JSON: {line}")

    return json.loads(line, parse_constant=reject)


def spike_config(**extra):
    return config_from_dict(
        {
            "tick": "10s",
            "surfaces": [
                {
                    "name": "proxy",
                    "match": {"dport": [443]},
                    # A spike from the first tick (calibrated thresholds need days of history).
                    "spike": {"absolute_bytes_per_second": 10_000, "resolve_hold": "30s"},
                    "budget": {"allowance_bits_per_second": 1e9, "tolerance_bits": 1e12},
                }
            ],
            **extra,
        }
    )


def write_events(path: Path, spike_at: int, spike_for: int) -> None:
    rng = random.Random(7)
    t0 = 1_780_000_000
    with open(path, "w") as fh:
        for second in range(0, 3600, 2):
            nbytes = int(rng.uniform(800, 1200)) * 2
            if spike_at <= second < spike_at + spike_for:
                nbytes *= 20
            fh.write(
                json.dumps({"ts": t0 + second, "surface": "proxy", "bytes": nbytes, "events": 2})
                + "\n"
            )
        fh.write("not json\n")
        fh.write(json.dumps({"ts": t0, "surface": "proxy", "bytes": -5}) + "\n")


def test_event_replay_fires_and_resolves_once_with_figures(tmp_path):
    events = tmp_path / "events.jsonl"
    write_events(events, spike_at=1800, spike_for=60)
    out = io.StringIO()
    summary = run_backtest(spike_config(), [str(events)], out, workers=1)
    changes = [strict_json(line) for line in out.getvalue().splitlines()]
    spikes = [c for c in changes if c["rule"] == "spike"]
    assert [c["state"] for c in spikes] == ["firing", "resolved"], changes
    firing = spikes[0]
    assert firing["surface"] == "proxy"
    assert 1_780_001_800 <= firing["at"] <= 1_780_001_810  # within one tick of the onset
    assert firing["figures"]["rate_bytes_per_second"] > 10_000
    # An hour of history cannot calibrate a threshold: the alert names the floor it passed,
    # not an infinite threshold (which would also make the document invalid JSON).
    assert firing["threshold"] == 10_000
    assert "absolute floor 10,000 B/s, its own threshold still being learned" in firing["summary"]
    assert summary.parse_errors == 2
    assert summary.records == 1800


def test_quiet_replay_raises_nothing(tmp_path):
    events = tmp_path / "events.jsonl"
    write_events(events, spike_at=10**9, spike_for=0)
    out = io.StringIO()
    run_backtest(spike_config(), [str(events)], out, workers=1)
    assert out.getvalue() == ""


def test_kmsg_dump_budget_and_forged(tmp_path):
    dump = tmp_path / "kmsg.txt"
    text = (FENCE_DATA / "kmsg-records.txt").read_text()
    # A look-alike written from user space has facility 1 (PRI 12): never counted as traffic.
    text += "12,434400,455999999,-;EGRESS_FENCE IN= OUT=lo SRC=127.0.0.1 DST=127.0.0.1 LEN=9999 TOS=0x00 PREC=0x00 TTL=64 ID=1 DF PROTO=UDP SPT=1 DPT=2 LEN=9979\n"
    dump.write_text(text)
    config = config_from_dict(
        {
            "tick": "10s",
            "unclassified": {"egress": {"allowance_bits_per_second": 1, "tolerance_bits": 1000}},
        }
    )
    out = io.StringIO()
    summary = run_backtest(config, [str(dump)], out, workers=2)
    assert summary.records == 8 and summary.forged == 1 and summary.parse_errors == 0
    changes = [strict_json(line) for line in out.getvalue().splitlines()]
    budget = [c for c in changes if c["rule"] == "budget" and c["surface"] == "unclassified"]
    assert budget and budget[0]["state"] == "firing"
    assert {c["contributor"].split(":")[0] for c in budget[0]["contributors"]} <= {"127.0.0.1", ""}


def test_implausible_times_and_counts_are_parse_errors_not_a_crash_or_a_hang(tmp_path):
    events = tmp_path / "events.jsonl"
    write_events(events, spike_at=1800, spike_for=60)
    with open(events, "a") as fh:
        fh.write('{"ts": 1e30, "surface": "proxy", "bytes": 5}\n')  # would stall the clock
        fh.write('{"ts": 1780000000, "surface": "proxy", "bytes": 99999999999999999999999}\n')
        fh.write('{"ts": 1780000000, "surface": "proxy", "bytes": 1e400}\n')  # inf
        fh.write('{"ts": -1, "surface": "proxy", "bytes": 5, "kind": "egress"}\n')
    out = io.StringIO()
    summary = run_backtest(spike_config(), [str(events)], out, workers=1)
    assert summary.parse_errors == 2 + 4
    assert summary.records == 1800
    assert [json.loads(line)["state"] for line in out.getvalue().splitlines()] == [
        "firing",
        "resolved",
    ]


def test_cli_backtest_writes_json_lines(tmp_path):
    events = tmp_path / "events.jsonl"
    write_events(events, spike_at=1800, spike_for=60)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "tick: 10s\nsurfaces:\n  - {name: proxy, match: {dport: [443]}, "
        "spike: {absolute_bytes_per_second: 10000}, "
        "budget: {allowance_bits_per_second: 1e9, tolerance_bits: 1e12}}\n"
    )
    out = tmp_path / "alerts.jsonl"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "alarm.cli",
            "backtest",
            "--config",
            str(cfg),
            "-o",
            str(out),
            str(events),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    states = [json.loads(line)["state"] for line in out.read_text().splitlines()]
    assert states == ["firing", "resolved"]
    assert json.loads(res.stderr.strip().splitlines()[-1])["backtest"]["records"] == 1800


def test_journal_export_counts_kernel_records_and_rejects_user_writes(tmp_path):
    line = (FENCE_DATA / "kmsg-records.txt").read_text().splitlines()[0].split(";", 1)[1]
    entry = {"__REALTIME_TIMESTAMP": "1780000000000000", "MESSAGE": line, "_TRANSPORT": "kernel"}
    journal = tmp_path / "journal.json"
    journal.write_text(
        json.dumps({**entry, "SYSLOG_FACILITY": "0"})
        + "\n"
        # what journald files for a user-space write to /dev/kmsg: kernel transport, facility 1
        + json.dumps({**entry, "SYSLOG_FACILITY": "1"})
        + "\n{broken\n"
    )
    summary = run_backtest(
        config_from_dict({"tick": "10s"}), [str(journal)], io.StringIO(), workers=1
    )
    assert (summary.records, summary.forged, summary.parse_errors) == (1, 1, 1)


def test_summary_says_per_file_which_path_read_it(tmp_path):
    """Debian 12's rsyslog stamps (RFC 3339) are read natively, and the summary says so per
    file; a line handed back to the regex path is counted, not hidden behind "native"."""
    msg = (FENCE_DATA / "dmesg-lines.txt").read_text().splitlines()[2].split("] ", 1)[1]
    clean = tmp_path / "kern.log"
    clean.write_text(
        "".join(
            f"2026-12-03T22:11:{s:02d}.123456+00:00 h kernel: [ 1.5] {msg}\n" for s in range(40)
        )
    )
    mixed = tmp_path / "kern.log.1"
    mixed.write_text(clean.read_text() + "2026-12-03T22:12:00+00:00 h kernel: EGRESS_FENCE x\n")
    journal = tmp_path / "journal.json"
    entry = {"__REALTIME_TIMESTAMP": "1780000000000000", "MESSAGE": msg, "_TRANSPORT": "kernel"}
    journal.write_text(json.dumps({**entry, "SYSLOG_FACILITY": "0"}) + "\n")
    config = config_from_dict({"tick": "10s"})
    summary = run_backtest(config, [str(clean)], io.StringIO(), workers=1)
    assert (summary.records, summary.handed_back, summary.scanner) == (40, 0, "native")
    assert summary.files == [
        {"path": str(clean), "format": "syslog", "lines": 40, "handed_back": 0, "scanner": "native"}
    ]
    summary = run_backtest(config, [str(mixed), str(journal)], io.StringIO(), workers=1)
    assert (summary.records, summary.parse_errors, summary.handed_back) == (41, 1, 1)
    assert [(f["scanner"], f["lines"], f["handed_back"]) for f in summary.files] == [
        ("native+regex", 41, 1),
        ("native", 1, 0),
    ]
    assert summary.scanner == "native+regex"


def test_an_alerts_evidence_names_who_wrote_in_its_episode_not_before(tmp_path):
    """A quiet tick closes an episode: the next alert's contributors are the next episode's
    writers, not the largest writers since start (alice wrote 3x what bob did)."""
    events = tmp_path / "events.jsonl"
    t0 = 1_780_000_000
    with open(events, "w") as fh:
        for start, who, size in ((100, "alice", 90_000), (400, "bob", 30_000)):
            for second in range(start, start + 20):
                doc = {"ts": t0 + second, "surface": "proxy", "bytes": size, "contributor": who}
                fh.write(json.dumps(doc) + "\n")
    out = io.StringIO()
    run_backtest(spike_config(), [str(events)], out, workers=1)
    spikes = [strict_json(line) for line in out.getvalue().splitlines()]
    spikes = [c for c in spikes if c["rule"] == "spike"]
    assert [c["state"] for c in spikes] == ["firing", "resolved", "firing", "resolved"], spikes
    # Only the judged tick's writes: alice's 10 s at 90 kB/s, not her whole episode or bob.
    assert [(c["contributor"], c["bytes"]) for c in spikes[0]["contributors"]] == [
        ("alice", 900_000)
    ]
    assert [c["contributor"] for c in spikes[2]["contributors"]] == ["bob"]


def test_a_budgets_evidence_spans_the_writes_its_sum_carries(tmp_path):
    """Writes far apart that one capacity budget adds up are one episode: the alert names
    every writer whose bits are still in the sum, not only the last tick's."""
    events = tmp_path / "events.jsonl"
    t0 = 1_780_000_000
    writes = [(100, "alice", 4000), (200, "bob", 4000), (5000, "carol", 4000), (5100, "dan", 4000)]
    with open(events, "w") as fh:
        for second, who, size in writes:
            doc = {"ts": t0 + second, "surface": "proxy", "bytes": size, "contributor": who}
            fh.write(json.dumps(doc) + "\n")
    config = config_from_dict(
        {
            "tick": "10s",
            "surfaces": [
                {
                    "name": "proxy",
                    "spike": {"absolute_bytes_per_second": 10_000},
                    "budget": {"allowance_bits_per_second": 100, "tolerance_bits": 50_000},
                }
            ],
        }
    )
    out = io.StringIO()
    run_backtest(config, [str(events)], out, workers=1)
    budget = [strict_json(line) for line in out.getvalue().splitlines()]
    budget = [c for c in budget if c["rule"] == "budget" and c["state"] == "firing"]
    # 32 kbit, drained 10 kbit in 100 s, then 32 kbit more: the sum passes 50 kbit at bob.
    # By t=5000 it has drained, so carol and dan are an episode of their own.
    assert [sorted(c["contributor"] for c in b["contributors"]) for b in budget] == [
        ["alice", "bob"],
        ["carol", "dan"],
    ]


def test_event_lines_in_any_key_order_and_bad_escapes_without_a_traceback(tmp_path):
    """Keys in another order are read by the native reader (issue 26); an invalid escape and
    a count of 5000 digits are a counted parse error each (both were a traceback)."""
    from alarm import backtest

    events = tmp_path / "events.jsonl"
    t0 = 1_780_000_000
    with open(events, "w") as fh:
        for second in range(0, 600, 2):
            fh.write(
                f'{{"kind": "egress", "bytes": 2000, "ts": {t0 + second}, "surface": "proxy", '
                '"events": 2}\n'
            )
        fh.write(f'{{"ts": {t0}, "surface": "pro\\xy", "bytes": 5}}\n')
        fh.write(f'{{"ts": {t0}, "surface": "proxy", "bytes": {"9" * 5000}}}\n')
    cfg = tmp_path / "c.yaml"
    cfg.write_text("tick: 10s\nsurfaces:\n  - {name: proxy, kind: egress}\n")
    res = subprocess.run(
        [sys.executable, "-m", "alarm.cli", "backtest", "--config", str(cfg), str(events)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    report = json.loads(res.stderr.strip().splitlines()[-1])["backtest"]
    assert (report["lines"], report["records"], report["parse_errors"]) == (302, 300, 2)
    if backtest.native_events is not None:
        # Only the line with the invalid escape went through json.loads.
        assert (report["scanner"], report["json_lines"]) == ("native", 1)
