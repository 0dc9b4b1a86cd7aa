"""A delivery whose outcome cannot be written (a full disk, a locked database): the worker
retries the write after a backoff, logs it at most every WARN_EVERY, and never sends the row
again from this process.  Before, each failed write woke the worker at once: hundreds of
writes and log lines a second for as long as the disk stayed full."""

from __future__ import annotations

import asyncio
import logging
import sqlite3

import pytest

from exporters.outbox import Outbox
from tests.fakes.kit import change, record, running_notifications, wait_for
from tests.fakes.receiver import Receiver
from tests.fakes.server import serve


async def test_a_failing_outcome_write_backs_off_and_the_row_goes_out_once(
    tmp_path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    real_settle = Outbox.settle
    calls = {"failed": 0}
    full = {"on": True}

    def settle(self, ops):
        if full["on"]:
            calls["failed"] += 1
            raise sqlite3.OperationalError("database or disk is full")
        return real_settle(self, ops)

    monkeypatch.setattr(Outbox, "settle", settle)
    rx = Receiver()
    caplog.set_level(logging.ERROR, logger="capalarm")
    async with serve(rx.app()) as srv:
        cfg = {
            "destinations": [
                {"type": "webhook", "name": "w", "url": f"http://127.0.0.1:{srv.port}/hook"}
            ]
        }
        async with running_notifications(tmp_path, cfg) as n:
            await record(n, change("s1"))
            await wait_for(lambda: len(rx.received) == 1)
            await wait_for(lambda: calls["failed"] >= 1)
            await asyncio.sleep(4.0)
            # 0.5, 1, 2 s of backoff: a handful of writes in 4 s, not hundreds.
            assert calls["failed"] <= 6, calls
            lines = [r for r in caplog.records if "cannot record" in r.getMessage()]
            assert len(lines) == 1, [r.getMessage() for r in lines]
            full["on"] = False
            (ch,) = n.views
            await wait_for(lambda: ch.queue_depth == 0, timeout=20)
            assert len(rx.received) == 1  # delivered once, its outcome written late
