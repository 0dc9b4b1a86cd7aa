"""Log lines an operator and a log shipper can use: UTC timestamps with their zone, logfmt and
JSON besides plain text, one ``capalarm`` logger tree, the log flags before or after the verb,
a start-up line saying what is in use and a shutdown line, and registry errors that say what
went wrong, not only the exception's class."""

from __future__ import annotations

import ast
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from alarm import logs
from tests.registries.harness import Recorder, collector, poll

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "alarm.cli"]
RFC3339_UTC = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


def record(msg: str, *args: Any, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            exc_info = sys.exc_info()
    return logging.LogRecord("capalarm.http", logging.WARNING, __file__, 1, msg, args, exc_info)


def test_plain_lines_are_in_utc_with_the_zone() -> None:
    rec = record("hello %s", "there")
    rec.created = 0.25
    line = logs.formatter("plain").format(rec)
    assert line == "1970-01-01T00:00:00.250Z WARNING capalarm.http: hello there"


def test_logfmt_keeps_one_record_on_one_line() -> None:
    line = logs.formatter("logfmt").format(record('a "quoted"\nforged=line'))
    assert "\n" not in line
    assert re.fullmatch(
        rf'ts={RFC3339_UTC} level=warn logger=capalarm.http msg="a \\"quoted\\"\\nforged=line"',
        line,
    ), line


def test_json_is_one_object_per_line_with_the_traceback() -> None:
    line = logs.formatter("json").format(record("failed", exc=True))
    assert "\n" not in line
    obj = json.loads(line)
    assert obj["level"] == "warn" and obj["logger"] == "capalarm.http"
    assert obj["msg"] == "failed" and "ValueError: boom" in obj["exc"]
    assert re.fullmatch(RFC3339_UTC, obj["ts"])


def test_every_logger_is_in_the_capalarm_tree() -> None:
    """A module's ``__name__`` (alarm.collectors.registry.poller) is outside the tree that one
    level and one log shipper's selector cover."""
    wrong = []
    for tree in ("alarm", "exporters"):
        for path in sorted((ROOT / tree).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not (
                    isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "getLogger"
                ):
                    continue
                arg = node.args[0] if node.args else None
                name = arg.value if isinstance(arg, ast.Constant) else None
                if path.name == "logs.py":
                    continue  # the helpers themselves
                if not (
                    isinstance(name, str) and (name == "capalarm" or name.startswith("capalarm."))
                ):
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not wrong, wrong


@pytest.mark.parametrize(
    "flags",
    [
        ["--log-level", "DEBUG", "check-config"],  # the old spelling, before the verb
        ["--log.level", "warn", "check-config"],
        ["check-config", "--log.level", "debug", "--log.format", "json"],
        ["check-config", "--log-level", "ERROR"],
    ],
)
def test_log_flags_before_or_after_the_verb(tmp_path: Path, flags: list[str]) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("sources: [{name: k, type: kmsg}]\n")
    res = subprocess.run([*CLI, *flags, str(cfg)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"{cfg}: ok")


def test_a_bad_log_level_is_one_line_exit_2() -> None:
    res = subprocess.run(
        [*CLI, "run", "--log.level", "loud"], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 2
    assert (
        res.stderr.strip()
        == "capalarm: run: argument --log.level/--log-level: 'loud' is not a log level (debug, info, warning, error)"
    )


def test_start_up_and_shutdown_lines_say_what_is_in_use(tmp_path: Path) -> None:
    kern = tmp_path / "kern.log"
    kern.write_text("")
    state = tmp_path / "state"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"state_dir: {state}\nsources: [{{name: k, type: file, paths: [{kern}]}}]\n")
    proc = subprocess.Popen(
        [*CLI, "run", "--config", str(cfg), "--listen", "127.0.0.1:0", "--log.format", "json"],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TZ": "America/New_York"},  # UTC whatever the host's zone
    )
    lines: list[dict[str, Any]] = []
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line, "capalarm exited before its start-up line"
            lines.append(json.loads(line))
            if "started" in lines[-1]["msg"]:
                break
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        lines += [json.loads(line) for line in proc.stderr.read().splitlines()]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    assert all(re.fullmatch(RFC3339_UTC, rec["ts"]) for rec in lines)
    assert all(rec["logger"].startswith("capalarm") for rec in lines)
    (start,) = [rec["msg"] for rec in lines if "started" in rec["msg"]]
    assert f"config {cfg}" in start and f"state directory {state}" in start
    assert "listening on http://127.0.0.1:0 (port " in start
    assert "sources k (file: file)" in start  # the kernel backend
    assert lines[-1]["msg"] == f"capalarm stopped: state saved in {state / 'capalarm.db'}"


async def test_registry_errors_say_what_went_wrong(caplog: pytest.LogCaptureFixture) -> None:
    """'unexpected data: KeyError' did not say which key; the message does."""

    class Broken:
        async def poll(self, cycle: Any) -> None:
            raise KeyError("size")

    rec = Recorder()
    source = collector(rec, api="json", url="http://127.0.0.1:9/posts", items="posts", id="id")
    source.adapter = Broken()  # type: ignore[assignment]
    with caplog.at_level(logging.WARNING, logger="capalarm"):
        assert not await poll(source, rec)
    assert "unexpected data: KeyError: 'size'" in source.health.last_error
    assert any(
        r.name == "capalarm.registry" and "KeyError: 'size'" in r.getMessage()
        for r in caplog.records
    )
