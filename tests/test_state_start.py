"""A state database that cannot be used ends the start in one line naming it, exit 1, never a
traceback (issue 28, item 8): garbage, truncated, locked by another process, read-only, in a
directory the user cannot write, or written with another schema version (the version the
store writes is read back and checked).  And the backtest, fed JSON lines with invalid
escapes, counts them as parse errors or refuses the file in one line.

Run as root (a container), "cannot write" is made with a read-only bind mount in a mount
namespace of the command's own (``unshare -m``); as another user, with chmod."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from alarm.state import SCHEMA_VERSION, StateError, StateStore

CLI = [sys.executable, "-m", "alarm.cli"]
ROOT = Path(__file__).resolve().parent.parent


def config(tmp_path: Path) -> Path:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("sources: []\nhttp: {listen: '127.0.0.1:0'}\n")
    return cfg


def run(tmp_path: Path, state: Path, prefix: list[str] | None = None, timeout: float = 30):
    """``capalarm run`` on ``state``: it must end by itself (a start that worked would run
    until the timeout)."""
    res = subprocess.run(
        [
            *(prefix or []),
            *CLI,
            "run",
            "--config",
            str(config(tmp_path)),
            "--state-dir",
            str(state),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert "Traceback" not in res.stderr, res.stderr
    assert len(lines) == 1 and lines[0].startswith("capalarm: "), res.stderr
    return res.returncode, lines[0]


def good_state(d: Path) -> Path:
    """A state directory a capalarm has written (the store and the outbox's tables)."""
    from alarm.config import config_from_dict
    from exporters.outbox import Outbox

    d.mkdir(parents=True, exist_ok=True)
    store = StateStore(d)
    store.save({"positions": {}, "sources": {}})
    store.close()
    Outbox(d / "capalarm.db").close()
    config_from_dict({"state_dir": str(d)})
    return d / "capalarm.db"


def test_a_garbage_database_is_one_line_exit_1(tmp_path):
    db = tmp_path / "state" / "capalarm.db"
    db.parent.mkdir()
    db.write_bytes(os.urandom(20_000))
    status, line = run(tmp_path, db.parent)
    assert status == 1 and str(db) in line and "not a SQLite database" in line, line


def test_a_truncated_database_is_one_line_exit_1(tmp_path):
    db = good_state(tmp_path / "state")
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    with open(db, "r+b") as fh:
        fh.truncate(db.stat().st_size // 3)
    status, line = run(tmp_path, db.parent)
    assert status == 1 and str(db) in line and "damaged" in line, line


def test_another_programs_database_is_not_written_to(tmp_path):
    db = tmp_path / "state" / "capalarm.db"
    db.parent.mkdir()
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE invoices (id INTEGER)")
    conn.commit()
    conn.close()
    before = db.read_bytes()
    status, line = run(tmp_path, db.parent)
    assert status == 1 and str(db) in line and "not a capalarm state database" in line, line
    assert db.read_bytes() == before


def test_a_database_of_another_schema_version_is_one_clear_line(tmp_path):
    db = good_state(tmp_path / "state")
    conn = sqlite3.connect(db)
    # What this capalarm wrote is what it reads back at start.
    assert conn.execute("SELECT value FROM kv WHERE key = 'schema'").fetchone() == (
        str(SCHEMA_VERSION),
    )
    conn.execute("UPDATE kv SET value = '99' WHERE key = 'schema'")
    conn.commit()
    conn.close()
    status, line = run(tmp_path, db.parent)
    assert status == 1 and str(db) in line, line
    assert f"schema version 99; this capalarm reads version {SCHEMA_VERSION}" in line, line
    with pytest.raises(StateError):
        StateStore(db.parent)


def test_a_database_locked_by_another_process_is_one_line_naming_the_cause(tmp_path):
    db = good_state(tmp_path / "state")
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sqlite3, sys, time\n"
         f"db = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
         "db.execute('PRAGMA locking_mode=EXCLUSIVE')\n"
         "db.execute('BEGIN EXCLUSIVE')\n"
         "db.execute(\"UPDATE kv SET saved = 0 WHERE key = 'schema'\")\n"
         "print('held', flush=True)\n"
         "time.sleep(60)\n"],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        t0 = time.monotonic()
        status, line = run(tmp_path, db.parent)
        assert time.monotonic() - t0 < 20
    finally:
        holder.kill()
        holder.wait()
    assert status == 1 and str(db) in line and "locked by another process" in line, line
    assert "free space" not in line


def readonly(path: Path) -> list[str]:
    """A command prefix under which ``path`` cannot be written by the command."""
    if os.geteuid() != 0:
        path.chmod(0o555)
        return []
    unshare = shutil.which("unshare")
    probe = (
        subprocess.run([unshare or "unshare", "-m", "true"], capture_output=True)
        if unshare
        else None
    )
    if probe is None or probe.returncode != 0:
        pytest.skip("running as root without unshare -m: cannot make a directory unwritable")
    p = str(path)
    return [unshare, "-m", "sh", "-c",
            f'mount --bind "{p}" "{p}" && mount -o remount,bind,ro "{p}" "{p}" && exec "$@"',
            "sh"]  # fmt: skip


def test_a_state_directory_that_cannot_be_written_is_one_line_exit_1(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    try:
        status, line = run(tmp_path, state, readonly(state))
    finally:
        state.chmod(0o755)
    assert status == 1 and str(state) in line, line
    assert "read-only file system" in line or "permission denied" in line, line


def test_a_read_only_database_is_one_line_exit_1(tmp_path):
    db = good_state(tmp_path / "state")
    try:
        status, line = run(tmp_path, db.parent, readonly(db.parent))
    finally:
        db.parent.chmod(0o755)
    assert status == 1 and str(db) in line, line
    assert "read-only file system" in line or "permission denied" in line, line


@pytest.mark.parametrize(
    "escape",
    ["\\x", "\\u12", "\\uZZZZ", "\\q", "\\", "\\ud800", "\\udc80\\udfff"],
    ids=["x", "u12", "uZZZZ", "q", "backslash", "lone-high", "lone-low"],
)
def test_backtest_of_json_lines_with_invalid_escapes_never_tracebacks(tmp_path, escape):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("surfaces: [{name: s, match: {dport: [443]}}]\n")
    good = '{"ts": 1700000000, "surface": "s", "bytes": 10, "contributor": "a"}\n'
    bad = '{"ts": 1700000001, "surface": "s", "bytes": 10, "contributor": "a' + escape + '"}\n'
    for name, text in (
        ("first.jsonl", bad + good),
        ("later.jsonl", good * 3 + bad),
        ("only.jsonl", bad),
    ):
        path = tmp_path / name
        path.write_text(text)
        out = tmp_path / f"{name}.out"
        res = subprocess.run(
            [*CLI, "backtest", "--config", str(cfg), "-o", str(out), str(path)],
            capture_output=True, text=True, timeout=60, cwd=ROOT,
        )  # fmt: skip
        assert "Traceback" not in res.stderr, res.stderr
        assert res.returncode in (0, 2), res.stderr
        if res.returncode == 2:
            lines = res.stderr.strip().splitlines()
            assert len(lines) == 1 and str(path) in lines[0], res.stderr
        else:
            out.read_text().encode("utf-8")  # whatever it wrote is UTF-8
