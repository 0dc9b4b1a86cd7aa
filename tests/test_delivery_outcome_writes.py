"""A delivery whose outcome cannot be written (a full disk, a locked database): the worker
retries the write after a backoff, logs it at most every WARN_EVERY, and never sends the row
again, from this process or (its key in the held-changes journal) the next.  Before, each
failed write woke the worker at once: hundreds of writes and log lines a second for as long
as the disk stayed full."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from exporters import notify as notify_module
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


async def test_a_page_sent_from_memory_while_the_write_that_stores_it_runs_goes_out_once(
    tmp_path, monkeypatch: pytest.MonkeyPatch
):
    """The disk full, a page goes out from memory; room again, the write that stores the held
    changes takes a snapshot of what memory delivered, and the send completes while it runs.
    Before, that page's row was queued by the write, the journal's delivered keys were cleared
    with it, and the outbox's worker sent the page a second time."""
    full = {"on": 0}
    real_transaction = Outbox.transaction

    def transaction(self):
        if full["on"]:
            raise sqlite3.OperationalError("database or disk is full")
        return real_transaction(self)

    monkeypatch.setattr(Outbox, "transaction", transaction)
    rx = Receiver()
    # The memory sends (outbox_write_failed's page, then s1's) are held open by the receiver.
    rx.fail_next(["wait", "wait"])
    loop = asyncio.get_running_loop()
    real_write_plan = notify_module.write_plan
    writes = []

    def write_plan(tx, plan, delivered, now):
        # The storing write, mid-way: let the held send of s1 complete, and its worker record
        # it, before this write commits.
        if not writes:
            loop.call_soon_threadsafe(rx.release.set)
            deadline = time.monotonic() + 10
            while len(rx.received) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.3)
        writes.append(delivered)
        return real_write_plan(tx, plan, delivered, now)

    monkeypatch.setattr(notify_module, "write_plan", write_plan)
    async with serve(rx.app()) as srv, running_notifications(tmp_path, webhook(srv.port)) as n:
        full["on"] = 1  # the disk fills
        await record(n, change("s1"))  # held: sent from memory, the receiver waits
        await asyncio.wait_for(rx.arrived.wait(), 10)
        full["on"] = 0
        await record(n, change("s2"))  # stores s1 (and s2) while s1's send completes
        (ch,) = n.views
        await wait_for(lambda: ch.queue_depth == 0 and len(rx.received) >= 2)
        await asyncio.sleep(1.0)  # a second send of s1 would come now
    assert writes and not writes[0]  # the snapshot was taken before either was delivered
    targets = [r.payload["data"]["target"] for r in rx.received]
    assert targets.count("s1") == 1 and targets.count("s2") == 1, targets
    assert len(rx.ids()) == len(set(rx.ids())), targets  # nothing sent twice
