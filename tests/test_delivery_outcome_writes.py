"""A delivery whose outcome cannot be written (a full disk, a locked database): the worker
retries the write after a backoff, logs it at most every WARN_EVERY, and never sends the row
again, from this process or (its key in the held-changes journal) the next.  Before, each
failed write woke the worker at once: hundreds of writes and log lines a second for as long
as the disk stayed full."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from exporters.diskfull import JOURNAL_NAME, Journal, WriteError
from exporters.outbox import Outbox
from tests.fakes.kit import change, record, running_notifications, wait_for
from tests.fakes.receiver import Receiver
from tests.fakes.server import serve


def full_disk(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Outcome writes fail while ``on`` (1), counted in ``failed``."""
    real_settle = Outbox.settle
    full = {"on": 1, "failed": 0}

    def settle(self, ops):
        if full["on"]:
            full["failed"] += 1
            raise sqlite3.OperationalError("database or disk is full")
        return real_settle(self, ops)

    monkeypatch.setattr(Outbox, "settle", settle)
    return full


def webhook(port: int) -> dict[str, Any]:
    return {
        "destinations": [{"type": "webhook", "name": "w", "url": f"http://127.0.0.1:{port}/hook"}]
    }


async def test_a_failing_outcome_write_backs_off_and_the_row_goes_out_once(
    tmp_path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    full = full_disk(monkeypatch)
    rx = Receiver()
    caplog.set_level(logging.ERROR, logger="capalarm")
    async with serve(rx.app()) as srv:
        cfg = webhook(srv.port)
        async with running_notifications(tmp_path, cfg) as n:
            await record(n, change("s1"))
            await wait_for(lambda: len(rx.received) == 1)
            await wait_for(lambda: full["failed"] >= 1)
            await asyncio.sleep(4.0)
            # 0.5, 1, 2 s of backoff: a handful of writes in 4 s, not hundreds.
            assert full["failed"] <= 6, full
            lines = [r for r in caplog.records if "cannot record" in r.getMessage()]
            assert len(lines) == 1, [r.getMessage() for r in lines]
            full["on"] = 0
            (ch,) = n.views
            await wait_for(lambda: ch.queue_depth == 0, timeout=20)
            assert len(rx.received) == 1  # delivered once, its outcome written late


def journaled(state_dir: Path) -> dict[str, Any]:
    """What the held-changes journal holds now, as a restarted process reads it."""
    journal = Journal(state_dir / JOURNAL_NAME)
    journal.close()
    return journal.saved


async def test_an_unwritten_delete_is_journaled_and_the_next_process_does_not_send_it(
    tmp_path, monkeypatch: pytest.MonkeyPatch
):
    """The in-process half of the kill -9 test in tests/test_state_faults.py (which mounts a
    tmpfs): the key of a row delivered whose delete failed, at shutdown too, is in the
    held-changes journal; a process started on the same directory, its outbox writable again,
    counts the row delivered and deletes it without sending it."""
    full = full_disk(monkeypatch)
    rx = Receiver()
    async with serve(rx.app()) as srv:
        cfg = webhook(srv.port)
        async with running_notifications(tmp_path, cfg) as n:
            await record(n, change("s1"))
            await wait_for(lambda: len(rx.received) == 1)
            await wait_for(lambda: journaled(tmp_path).get("unsettled"))
        # Stopped with the delete still unwritten: the row is in the outbox, as after a kill.
        assert journaled(tmp_path)["unsettled"] == [rx.ids()[0].removeprefix("msg_")]
        full["on"] = 0
        async with running_notifications(tmp_path, cfg) as n:
            (ch,) = n.views
            await wait_for(lambda: ch.queue_depth == 0 and ch.sent == 1)
            await asyncio.sleep(1.0)  # a second send would come now
    assert len(rx.received) == 1
    assert journaled(tmp_path).get("unsettled", []) == []  # settled once its delete committed


def test_the_journal_keeps_to_its_size_leaving_out_the_oldest_keys_first(
    tmp_path, caplog: pytest.LogCaptureFixture
):
    path = tmp_path / JOURNAL_NAME
    journal = Journal(path, size=4096)
    held = [{"fingerprint": "f", "state": "firing", "summary": "x" * 200}]
    journal.held(held, WriteError(1.0, "OperationalError: database or disk is full"))
    keys = [f"{i:032x}" for i in range(200)]  # 35 bytes each in the file: 7,000 in all
    journal.unsettled(keys[:100])
    journal.unsettled(keys[100:])
    journal.close()
    assert path.stat().st_size == 4096
    saved = Journal(path, size=4096).saved
    kept = saved["unsettled"]
    assert 0 < len(kept) < 200 and kept == keys[-len(kept) :]  # the newest
    assert saved["changes"] == held  # a key goes before a held change
    assert journal.lost_keys == 200 - len(kept) and journal.lost == 0
    assert "delivered keys do not fit the journal" in caplog.text


def test_a_held_change_left_out_of_the_journal_is_counted_and_logged_once(
    tmp_path, caplog: pytest.LogCaptureFixture
):
    # Every failed write offers the whole held list again (HeldChanges.failed): before, each
    # write left the same oldest changes out again and counted and logged them again, so a
    # full disk with a steady stream of alert changes reported thousands "lost" for a few.
    journal = Journal(tmp_path / JOURNAL_NAME, size=4096)
    error = WriteError(1.0, "OperationalError: database or disk is full")
    held: list[dict[str, object]] = []
    for i in range(40):  # ~200 bytes each: about 20 fit
        held.append({"fingerprint": f"f{i}", "state": "firing", "at": float(i), "s": "x" * 150})
        journal.held(list(held), error)
    journal.close()
    kept = Journal(tmp_path / JOURNAL_NAME, size=4096).saved["changes"]
    assert 0 < len(kept) < 40 and kept == held[-len(kept) :]  # the newest
    assert journal.lost == 40 - len(kept)
    logged = [r for r in caplog.records if "held changes do not fit the journal" in r.message]
    assert sum(int(r.getMessage().split()[1]) for r in logged) == journal.lost
