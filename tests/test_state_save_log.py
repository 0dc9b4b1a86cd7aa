"""What a failed state save says, and how often (issue 28, items 7 and 10).

``database is locked`` was logged as a full disk ("free space in the state directory"); each
cause is now named (alarm/state.py ``storage_cause``): locked by another process, disk full,
read-only.  And a save that fails every tick (a full disk) is logged once, then at most once
a minute with how many failed since, and once more when a save works again."""

from __future__ import annotations

import errno
import logging
import sqlite3
import subprocess
import sys
import time

import pytest

import alarm.service as service_module
import alarm.statesave as statesave_module
from alarm.config import config_from_dict
from alarm.service import Service
from alarm.state import storage_cause


def quiet_service(tmp_path) -> Service:
    return Service(config_from_dict({"state_dir": str(tmp_path / "state"), "sources": []}))


@pytest.fixture
def service(tmp_path, monkeypatch):
    # Every call tries to save: a failed save is otherwise tried again a second later.
    monkeypatch.setattr(statesave_module, "RETRY_FIRST", 0.0)
    s = quiet_service(tmp_path)
    yield s
    s.executor.shutdown()
    s.store.close()
    s.notify.close()


def test_a_database_locked_by_another_process_is_named_as_such(service, caplog):
    db = service.store.path
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sqlite3, time\n"
         f"db = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
         "db.execute('BEGIN IMMEDIATE')\n"  # a writer's lock: readers go on, writers wait
         "db.execute(\"UPDATE kv SET saved = 0 WHERE key = 'schema'\")\n"
         "print('held', flush=True)\n"
         "time.sleep(60)\n"],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        service.store.db.execute("PRAGMA busy_timeout = 100")
        with caplog.at_level(logging.ERROR):
            service._record_and_save([])
    finally:
        holder.kill()
        holder.wait()
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    saved = [m for m in said if m.startswith("cannot save state to")]
    assert len(saved) == 1 and str(db) in saved[0], said
    assert "locked by another process" in saved[0] and "database is locked" in saved[0]
    # The notifier's own line (the state_save_failed alarm is held in memory) says the same.
    held = [m for m in said if m.startswith("notifications cannot be written")]
    assert len(held) == 1 and "locked by another process" in held[0], said
    assert not any("free space" in m for m in said), said
    # Saving works again once the other process lets go.
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        service._record_and_save([])
    assert any("state saved to" in r.getMessage() and "after 1 failed" in r.getMessage()
               for r in caplog.records)  # fmt: skip


def test_a_save_failing_every_tick_is_logged_once_a_minute_with_a_count(
    service, caplog, monkeypatch
):
    monkeypatch.setattr(service_module, "SAVE_ERROR_LOG_EVERY", 0.3)

    def full(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(service.store, "save", full)
    with caplog.at_level(logging.ERROR, logger="capalarm"):
        for _ in range(100):  # 100 ticks within the "minute"
            service._record_and_save([])
        first = [r.getMessage() for r in caplog.records if r.name == "capalarm"]
        time.sleep(0.35)
        for _ in range(50):
            service._record_and_save([])
    said = [r.getMessage() for r in caplog.records if r.name == "capalarm"]
    assert len(first) == 1 and first[0].startswith("cannot save state to"), first
    assert "disk full (free space in" in first[0]
    assert len(said) == 2, said
    assert said[1].startswith("still cannot save state to") and "disk full" in said[1]
    assert "100 failed saves in the last" in said[1] and "101 in all" in said[1], said[1]
    monkeypatch.undo()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="capalarm"):
        service._record_and_save([])
    assert [r.getMessage() for r in caplog.records if r.name == "capalarm"] == [
        f"state saved to {service.store.path} again, after 150 failed saves"
    ]


@pytest.mark.parametrize(
    ("exc", "cause"),
    [
        (sqlite3.OperationalError("database is locked"), "locked by another process"),
        (sqlite3.OperationalError("database table is locked"), "locked by another process"),
        (sqlite3.OperationalError("database or disk is full"), "disk full"),
        (OSError(errno.ENOSPC, "No space left on device"), "disk full"),
        (sqlite3.DatabaseError("file is not a database"), "not a SQLite database"),
        (sqlite3.DatabaseError("database disk image is malformed"), "damaged"),
        (sqlite3.OperationalError("attempt to write a readonly database"), "read-only"),
    ],
)
def test_each_cause_is_named(tmp_path, exc, cause):
    said = storage_cause(exc, tmp_path / "capalarm.db")
    assert said.startswith(cause), said
    assert "free space" not in said or cause == "disk full"
