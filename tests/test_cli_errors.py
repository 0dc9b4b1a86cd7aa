"""Every bad start and bad input ends in one clear line and an exit status — 2 for bad
configuration or input (naming the key or file), 1 for a runtime failure — never a traceback,
never a hang.  And the backtest reports what it could not place."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "alarm.cli"]


def capalarm(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def one_line(res: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert "Traceback" not in res.stderr, res.stderr
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("capalarm: "), lines[0]
    return lines[0]


@contextlib.contextmanager
def busy_port(port: int = 0) -> Iterator[int]:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close()
        if port == 0:
            raise
        yield port  # somebody else holds it: busy all the same
        return
    s.listen()
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


def file_config(tmp_path: Path, **extra: str) -> Path:
    log = tmp_path / "kern.log"
    log.write_text("")
    cfg = tmp_path / "c.yaml"
    lines = [
        f"state_dir: {extra.get('state_dir', tmp_path / 'state')}",
        f"sources: [{{name: k, type: file, paths: [{log}]}}]",
    ]
    cfg.write_text("\n".join(lines) + "\n")
    return cfg


def test_a_busy_port_is_one_line_and_exit_1(tmp_path):
    with busy_port() as port:
        res = capalarm(
            "run", "--config", str(file_config(tmp_path)), "--listen", f"127.0.0.1:{port}"
        )
    assert res.returncode == 1
    assert f"127.0.0.1:{port}" in one_line(res) and "in use" in res.stderr


def test_listen_nonsense_is_exit_2_naming_the_option():
    res = capalarm("run", "--listen", "nonsense")
    assert res.returncode == 2
    assert "--listen" in one_line(res) and "nonsense" in res.stderr


def test_a_state_directory_that_cannot_be_made_is_exit_1_naming_it(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    res = capalarm(
        "run", "--config", str(file_config(tmp_path)), "--state-dir", str(blocker / "state")
    )
    assert res.returncode == 1
    assert str(blocker / "state") in one_line(res)


def test_the_demo_never_hangs_on_a_busy_port(tmp_path):
    with busy_port() as port:
        res = capalarm("demo", "--duration", "1", "--listen", f"127.0.0.1:{port}", timeout=30)
    assert res.returncode == 1 and "in use" in one_line(res)


def test_the_demo_takes_a_free_port_when_its_default_is_busy():
    with busy_port(9733):
        res = capalarm("demo", "--duration", "2", timeout=60)
    assert res.returncode == 0, res.stderr
    assert "127.0.0.1:9733 is taken; using a free port" in res.stdout


def test_backtest_of_a_missing_or_unknown_file_is_exit_2_naming_it(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("tick: 10s\n")
    missing = tmp_path / "nope.log"
    res = capalarm("backtest", "--config", str(cfg), str(missing))
    assert res.returncode == 2 and str(missing) in one_line(res)
    odd = tmp_path / "odd.txt"
    odd.write_text("this is\nnot any log format\n")
    res = capalarm("backtest", "--config", str(cfg), str(odd))
    assert res.returncode == 2 and str(odd) in one_line(res) and "format" in res.stderr


@pytest.mark.parametrize("workers", ["0", "-3", "100000", "many"])
def test_backtest_workers_out_of_range_are_exit_2_naming_the_option(tmp_path, workers):
    # -3 was a traceback; 100000 tried to start that many processes and hung.
    cfg = tmp_path / "c.yaml"
    cfg.write_text("tick: 10s\n")
    events = tmp_path / "e.jsonl"
    events.write_text('{"ts": 1, "surface": "s", "bytes": 5}\n')
    res = capalarm("backtest", "--config", str(cfg), "--workers", workers, str(events), timeout=30)
    assert res.returncode == 2 and "--workers" in one_line(res)


@pytest.mark.parametrize("duration", ["inf", "nan", "-5", "0"])
def test_a_demo_duration_that_never_ends_or_never_starts_is_exit_2(duration):
    res = capalarm("demo", "--duration", duration, timeout=30)
    assert res.returncode == 2 and "--duration" in one_line(res)


def _alerting_backtest(tmp_path: Path) -> tuple[Path, Path]:
    """A backtest writing a few hundred kB of alerts: more than a pipe holds unread."""
    budget = "budget: {allowance_bits_per_second: 1, tolerance_bits: 10}"
    surfaces = ", ".join(f"{{name: s{i}, kind: egress, {budget}}}" for i in range(300))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"tick: 10s\nsurfaces: [{surfaces}]\n")
    events = tmp_path / "e.jsonl"
    events.write_text(
        "".join(f'{{"ts": {i * 10}, "surface": "s{i}", "bytes": 5000000}}\n' for i in range(300))
    )
    return cfg, events


def test_backtest_output_that_cannot_be_written_is_exit_1_naming_it(tmp_path):
    cfg, events = _alerting_backtest(tmp_path)
    res = capalarm("backtest", "--config", str(cfg), "-o", "/dev/full", str(events))
    assert res.returncode == 1
    assert one_line(res) == "capalarm: backtest: cannot write /dev/full: No space left on device"


def test_backtest_into_a_pipe_its_reader_closed_is_one_line(tmp_path):
    cfg, events = _alerting_backtest(tmp_path)
    with subprocess.Popen(
        [*CLI, "backtest", "--config", str(cfg), str(events)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.readline()
        proc.stdout.close()  # `| head -1`
        stderr = proc.stderr.read()
        code = proc.wait(timeout=60)
    lines = [line for line in stderr.splitlines() if "capalarm: backtest:" in line]
    assert "Traceback" not in stderr, stderr
    assert code == 1 and lines == ["capalarm: backtest: cannot write standard output: Broken pipe"]


FENCE_DATA = Path(__file__).resolve().parent / "data/kernel-fence"


def test_backtest_writes_a_forged_records_alert_like_the_services(tmp_path):
    dump = tmp_path / "kmsg.txt"
    text = (FENCE_DATA / "kmsg-records.txt").read_text()
    # A look-alike written from user space has facility 1 (PRI 12).
    text += (
        "12,434400,455999999,-;EGRESS_FENCE IN= OUT=lo SRC=127.0.0.1 DST=127.0.0.1 LEN=9999 "
        "TOS=0x00 PREC=0x00 TTL=64 ID=1 DF PROTO=UDP SPT=1 DPT=2 LEN=9979\n"
    )
    dump.write_text(text)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("tick: 10s\nsources: [{name: kernel, type: kmsg}]\n")
    out = tmp_path / "alerts.jsonl"
    res = capalarm("backtest", "--config", str(cfg), "-o", str(out), str(dump))
    assert res.returncode == 0, res.stderr
    changes = [json.loads(line) for line in out.read_text().splitlines()]
    forged = [c for c in changes if c["rule"] == "forged_records"]
    assert [c["state"] for c in forged] == ["firing", "resolved"]
    assert forged[0]["source"] == "kernel" and forged[0]["value"] == 1.0


def test_a_write_event_nested_too_deep_to_decode_is_one_parse_error(tmp_path):
    """json.loads raises RecursionError on it: one malformed line, counted, the rest read,
    whether it comes before or after a good line."""
    good = '{"ts": 1780000000, "surface": "cache", "bytes": 300}\n'
    deep = '{"ts": 1780000005, "surface": ' + "[" * 100_000 + "}\n"
    cfg = tmp_path / "c.yaml"
    cfg.write_text("tick: 10s\nsurfaces: [{name: cache, kind: fs}]\n")
    events = tmp_path / "events.jsonl"
    for text in (good + deep, deep + good):
        events.write_text(text)
        out = str(tmp_path / "o.jsonl")
        res = capalarm("backtest", "--config", str(cfg), "-o", out, str(events))
        assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
        summary = json.loads(res.stderr.splitlines()[0])["backtest"]
        assert summary["parse_errors"] == 1 and summary["surface_bytes"]["fs/cache"] == 300


def test_write_events_take_their_kind_from_the_declared_surface_and_strays_are_reported(
    tmp_path,
):
    events = tmp_path / "events.jsonl"
    events.write_text(
        "".join(
            json.dumps({"ts": 1_780_000_000 + i, "surface": name, "bytes": 100, "events": 1}) + "\n"
            for i, name in enumerate(["cache", "cache", "mystery", "cache"])
        )
    )
    cfg = tmp_path / "c.yaml"
    cfg.write_text("tick: 10s\nsurfaces: [{name: cache, kind: fs}]\n")
    res = capalarm("backtest", "--config", str(cfg), "-o", str(tmp_path / "o.jsonl"), str(events))
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stderr.splitlines()[0])["backtest"]
    assert summary["surface_bytes"]["fs/cache"] == 300
    assert summary["undeclared_surfaces"] == {"mystery": 1}
    assert summary["unknown_surface_events"] == 1
    assert "mystery" in res.stderr.splitlines()[-1]


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ("sources: [{name: k, type: nope}]", "sources[0].type"),
        ("surfaces: [{name: s, kind: fs, match: {dst: [10.0.0.0/8]}}]", "surfaces[0].match.dst"),
        ("surfaces: [{name: s, kind: fs, match: {source: [kernel]}}]", "surfaces[0].match.source"),
        ("event_time: {lateness: soon}", "event_time.lateness"),
        # a registry source without the key that says which API it polls
        ("sources: [{type: registry, name: r, url: 'http://127.0.0.1:1/'}]", "sources[0].api"),
        # a key given twice, the first forgotten: PyYAML alone would keep the last silently
        ("tick: 10s\nsurfaces: [{name: s, kind: fs}]\ntick: 1h", "key 'tick' given twice"),
        ("surfaces: [{name: s, kind: fs, name: t}]", "key 'name' given twice"),
        # nested past the YAML parser's recursion (RecursionError inside PyYAML)
        pytest.param("surfaces: " + "[" * 20_000, "(yaml)", id="nested-too-deep"),
        # a protocol the kernel never prints after PROTO=: the surface would match nothing
        ("surfaces: [{name: s, match: {proto: [udpp]}}]", "surfaces[0].match.proto[0]"),
        ("surfaces: [{name: s, match: {proto: [tcp, sctp]}}]", "surfaces[0].match.proto[1]"),
    ],
)
def test_bad_config_is_exit_2_naming_the_key(tmp_path, body, key):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(body + "\n")
    res = capalarm("check-config", str(cfg))
    assert res.returncode == 2 and key in one_line(res)
    assert "<unicode string>" not in res.stderr


def test_check_config_names_every_problem_in_one_pass(tmp_path):
    """A duplicate surface name used to appear only once the schema errors were fixed."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "surfaces:\n"
        "  - {name: proxy, match: {proto: [udpp]}}\n"
        "  - {name: proxy, spike: {z: -1}}\n"
        "  - {name: cache, kind: fs, match: {source: [nowhere]}}\n"
    )
    res = capalarm("check-config", str(cfg))
    line = one_line(res)
    assert res.returncode == 2
    for key in (
        "surfaces[0].match.proto[0]: unknown protocol 'udpp'",
        "surfaces[1].spike.z",
        "surfaces: name 'proxy' is declared twice",
        "surfaces[2].match.source: no source named 'nowhere' is declared",
    ):
        assert key in line, (key, line)


@pytest.mark.parametrize(
    ("body", "warning"),
    [
        ("sources: []\n", "sources: none declared, so this config watches nothing"),
        (
            "surfaces: [{name: cache, kind: fs}]\n",
            "surfaces[0] ('cache'): no source feeds fs surfaces, so it watches nothing",
        ),
    ],
)
def test_check_config_warns_about_a_config_that_watches_nothing(tmp_path, body, warning):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(body)
    res = capalarm("check-config", str(cfg))
    assert res.returncode == 0  # valid: a warning, not an error
    [said] = res.stderr.splitlines()
    assert said.startswith(f"capalarm: warning: {cfg}: {warning}"), said
    assert res.stdout.startswith(f"{cfg}: ok (") and res.stdout.endswith(", 1 warning)\n")


def test_check_config_of_a_config_that_watches_something_has_no_warning(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("surfaces: [{name: proxy, match: {dport: [443], proto: [tcp]}}]\n")
    res = capalarm("check-config", str(cfg))
    assert res.returncode == 0 and res.stderr == ""
    assert res.stdout == f"{cfg}: ok (1 sources, 1 surfaces, tick 10s)\n"


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ("tick: 10s\nsurfaces:\n  - name: [a\n", "line 3, column 11"),
        ("tick: 10s\ntick: 1h\n", "line 2, column 1"),
        ("tick: 10s\n  bad indent: 1\n", "line 2"),
    ],
)
def test_yaml_errors_name_the_file_not_a_unicode_string(tmp_path, body, where):
    cfg = tmp_path / "capalarm.yaml"
    cfg.write_text(body)
    res = capalarm("check-config", str(cfg))
    line = one_line(res)
    assert res.returncode == 2
    assert "<unicode string>" not in line
    assert f'in "{cfg}", {where}' in line, line


BROKEN_PIPELINE = """
import sys
import alarm.failures, alarm.service
from alarm.cli import main

alarm.failures.STOP_AFTER, alarm.failures.STOP_AFTER_CALLS = 1.0, 3


def broken(self, now, health):
    # What a half-upgraded install did: the native module lacks a function the code calls.
    raise AttributeError("module 'alarm.detector._fused' has no attribute 'ledger_add'")


alarm.service.Service._advance = broken
sys.exit(main(sys.argv[1:]))
"""


def test_a_pipeline_that_only_fails_stops_the_service_with_one_line(tmp_path):
    # Before, a pipeline whose every call raised kept serving /metrics with no tick and a
    # source restarted every 30 s, for ever: alive to a scrape, blind to every write.
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"tick: 0.2s\nstate_dir: {tmp_path / 'state'}\n"
        f"sources: [{{name: k, type: file, paths: [{tmp_path / 'kern.log'}]}}]\n"
    )
    (tmp_path / "kern.log").write_text("")
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            BROKEN_PIPELINE,
            "run",
            "--config",
            str(cfg),
            "--listen",
            "127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("capalarm: the pipeline failed "), res.stderr
    assert "so nothing was counted or judged" in last and "has no attribute 'ledger_add'" in last
    # Logged at the first failure of ticks and of batches, not at each.
    assert 1 <= res.stderr.count("Traceback") <= 2, res.stderr
    assert "failed again: AttributeError" in res.stderr


def test_a_run_of_failures_stops_only_when_nothing_but_failures_for_minutes():
    from alarm.failures import STOP_AFTER, STOP_AFTER_CALLS, FailureRun

    run, boom = FailureRun(), AttributeError("no ledger_add")
    for i in range(STOP_AFTER_CALLS):
        run.failed(boom, 1000.0 + i)
    assert run.why_stop(1000.0 + STOP_AFTER - 1) == ""  # not for long enough yet
    assert f"{STOP_AFTER_CALLS} times in a row" in run.why_stop(1000.0 + STOP_AFTER)
    run.worked()  # one call that works starts the count again
    run.failed(boom, 2000.0)
    assert run.why_stop(2000.0 + 10 * STOP_AFTER) == ""  # one failure is not a run
    assert run.total == STOP_AFTER_CALLS + 1  # what /metrics shows: every failure
