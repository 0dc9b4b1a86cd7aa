"""What a backtest tells the person running it: where its parse errors are (file and line),
how far a long run has got (on a terminal only), the embedded default config when --config is
not given, and an alert for a log of nothing but forged records."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from alarm import backtest
from alarm.backtest import locate_parse_errors, parse_events, run_backtest
from alarm.collectors.kernel import fastscan
from alarm.config import config_from_dict

CLI = [sys.executable, "-m", "alarm.cli"]
FORGED = (
    "12,{seq},{us},-;EGRESS_FENCE IN= OUT=lo SRC=127.0.0.1 DST=127.0.0.1 LEN=9999 TOS=0x00 "
    "PREC=0x00 TTL=64 ID=1 DF PROTO=UDP SPT=1 DPT=2 LEN=9979\n"
)
KERNEL = FORGED.replace("12,", "4,", 1)  # facility 0: the kernel's own


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def event(ts: float, nbytes: int = 100) -> str:
    return json.dumps({"ts": ts, "surface": "proxy", "bytes": nbytes}) + "\n"


def config() -> object:
    return config_from_dict({"tick": "10s", "surfaces": [{"name": "proxy", "match": {}}]})


def test_parse_errors_are_located_by_line(tmp_path: Path) -> None:
    lines = [event(1_780_000_000 + i) for i in range(200)]
    lines[6] = "not json\n"
    lines[41] = "\n"  # blank: not an error, but a line
    lines[120] = '{"ts": 1, "surface": "proxy", "bytes": -5}\n'  # implausible count
    lines[121] = "{broken\r\n"
    path = tmp_path / "events.jsonl"
    path.write_text("".join(lines))
    summary = run_backtest(config(), [str(path)], io.StringIO(), workers=1)
    assert summary.parse_errors == 3
    assert [(e["file"], e["line"], e["text"]) for e in summary.parse_error_lines] == [
        (str(path), 7, "not json"),
        (str(path), 121, '{"ts": 1, "surface": "proxy", "bytes": -5}'),
        (str(path), 122, "{broken"),
    ]


def test_located_parse_errors_are_bounded_and_count_lines_across_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small ranges: the line numbers must carry over from one worker's range to the next.
    monkeypatch.setattr(backtest, "MIN_SPLIT", 4096)
    monkeypatch.setattr(backtest, "SPLIT_BYTES", 4096)
    lines = [event(1_780_000_000 + i) for i in range(3000)]
    bad = list(range(500, 3000, 250))
    for i in bad:
        lines[i] = f"garbage {i}\n"
    path = tmp_path / "events.jsonl"
    path.write_text("".join(lines))
    summary = run_backtest(config(), [str(path)], io.StringIO(), workers=2)
    assert summary.parse_errors == len(bad)
    shown = summary.parse_error_lines
    assert len(shown) == backtest.PARSE_ERRORS_SHOWN
    assert [e["line"] for e in shown] == [i + 1 for i in bad[: len(shown)]]
    assert all(e["text"] == f"garbage {e['line'] - 1}" for e in shown)


@pytest.mark.parametrize("native", [True, False])
def test_kernel_parse_errors_are_located_on_either_path(native: bool) -> None:
    good = KERNEL.format(seq=1, us=1_000_000)
    bad = "4,2,2000000,-;EGRESS_FENCE IN= OUT=lo SRC=nonsense DST=127.0.0.1 LEN=x\n"
    data = (good * 10 + bad + good * 5 + bad).encode()

    def errors_of(chunk: bytes) -> int:
        return fastscan.scan_flows(
            chunk, "kmsg", ("EGRESS_FENCE",), 10.0, native=native
        ).parse_errors

    assert errors_of(data) == 2
    assert locate_parse_errors(data, errors_of, 5) == [10, 16]
    assert locate_parse_errors(data, errors_of, 1) == [10]


SYSLOG = (
    "Nov 30 19:07:{s:02d} node-7 kernel: [  456.013731] EGRESS_FENCE IN= OUT=eth0 "
    "SRC=10.0.0.2 DST=10.20.0.{d} LEN={n} TTL=64 ID=1 DF PROTO=TCP SPT=40000 DPT=443\n"
)
SYSLOG_BAD = "Nov 30 19:07:30 node-7 kernel: EGRESS_FENCE IN= OUT=eth0 SRC=nonsense LEN=x\n"


def syslog_lines(n: int) -> list[str]:
    lines = [SYSLOG.format(s=i % 60, d=i % 7, n=60 + i % 900) for i in range(n)]
    for i in (3, 4, 90, 91, 400, 401, 402, 777):
        lines[i] = SYSLOG_BAD  # the same bad line again and again, and in a row
    lines[500] = "x" + SYSLOG_BAD  # another bad line that ends as they do
    lines[501] = SYSLOG_BAD.rstrip("\n")[:-1] + "y\n"
    return lines


def test_the_kernel_scanner_locates_its_syslog_errors_as_bisection_does() -> None:
    """A worker says where a chunk's parse errors are (among the few lines the native
    scanner handed back), so the backtest does not read and scan the chunk again; the
    lines are those reading the chunk again in halves finds."""
    data = "".join(syslog_lines(1000)).encode()

    def errors_of(chunk: bytes) -> int:
        return fastscan.scan_flows(chunk, "syslog", ("EGRESS_FENCE",), 10.0).parse_errors

    for want in (1, 3, 5, 20):
        scan = fastscan.scan_flows(data, "syslog", ("EGRESS_FENCE",), 10.0, locate_errors=want)
        expected = locate_parse_errors(data, errors_of, want)
        assert len(expected) == min(want, scan.parse_errors)
        lines = data.splitlines(keepends=True)
        if fastscan.native_available():
            assert scan.error_lines == [(i, lines[i]) for i in expected]
        else:  # the regex read every line: nothing was handed back to look among
            assert scan.error_lines is None


def test_kernel_log_errors_are_named_by_line_across_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(backtest, "MIN_SPLIT", 8192)
    monkeypatch.setattr(backtest, "SPLIT_BYTES", 8192)
    lines = syslog_lines(1000)
    path = tmp_path / "kern.log"
    path.write_text("".join(lines))
    summary = run_backtest(config(), [str(path)], io.StringIO(), workers=2, year=2026)
    data = path.read_bytes()

    def errors_of(chunk: bytes) -> int:
        return fastscan.scan_flows(chunk, "syslog", ("EGRESS_FENCE",), 10.0, 2026).parse_errors

    assert summary.parse_errors == errors_of(data) == 9  # "xNov 30 ..." is no kernel line
    bad = locate_parse_errors(data, errors_of, backtest.PARSE_ERRORS_SHOWN)
    assert [(e["line"], e["text"]) for e in summary.parse_error_lines] == [
        (i + 1, lines[i].rstrip("\n")) for i in bad
    ]


def test_the_event_reader_locates_its_own_errors() -> None:
    data = (event(1.0) + "x\n" + event(2.0)).encode()
    assert locate_parse_errors(data, lambda d: parse_events(d).parse_errors, 5) == [1]


def test_the_summary_names_where_the_errors_are_without_a_config(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(event(1_780_000_000) + "oops\n" + event(1_780_000_001))
    res = subprocess.run(
        [*CLI, "backtest", str(path)], capture_output=True, text=True, timeout=120
    )  # no --config: the embedded default, as `run` has
    assert res.returncode == 0, res.stderr
    report = json.loads(
        next(line for line in res.stderr.splitlines() if line.startswith('{"backtest"'))
    )
    assert "(proxy)" in res.stderr  # the embedded default declares no surface
    assert report["backtest"]["parse_error_lines"] == [
        {"file": str(path), "line": 2, "text": "oops"}
    ]
    assert "\r" not in res.stderr  # not a terminal: no progress line


def test_progress_on_a_terminal_only_and_cleared(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text("".join(event(1_780_000_000 + i) for i in range(100)))
    term = Terminal()
    run_backtest(
        config(), [str(path)], io.StringIO(), workers=1, progress_stream=term, progress_every=0
    )
    shown = term.getvalue()
    assert "\rcapalarm: backtest: 100% of 0.0 MB (file 1/1 events.jsonl), 100 lines" in shown
    assert shown.endswith("\r\x1b[K")
    piped = io.StringIO()  # isatty() is False
    run_backtest(
        config(), [str(path)], io.StringIO(), workers=1, progress_stream=piped, progress_every=0
    )
    assert piped.getvalue() == ""


def test_progress_is_throttled() -> None:
    now = [0.0]
    term = Terminal()
    progress = backtest.Progress(term, 1000, every=1.0, clock=lambda: now[0])
    for step in range(50):  # 5 s in 0.1 s steps
        now[0] = step / 10
        progress.update("f", 1, 1, step * 20, step, 0)
    assert term.getvalue().count("\r") == 4  # at 1, 2, 3 and 4 s; nothing in the first second


@pytest.mark.parametrize("native", [True, False])
def test_a_log_of_only_forged_records_raises_the_forged_alert(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: bool
) -> None:
    """No record was counted, so no tick was ever evaluated: the forged records were in the
    summary but no alert line said so."""
    if not native:
        monkeypatch.setattr(fastscan, "_native", None)
    path = tmp_path / "kmsg.txt"
    path.write_text("".join(FORGED.format(seq=i, us=i * 1_000_000) for i in range(1, 4)))
    out = io.StringIO()
    summary = run_backtest(config_from_dict({"tick": "10s"}), [str(path)], out, workers=1)
    assert summary.forged == 3
    changes = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(c["rule"], c["state"]) for c in changes][:1] == [("forged_records", "firing")]
