"""Reloads of the notifications while everything else goes on: the pipeline thread recording,
the outbox thread reconciling, scrapes reading the channels, the workers sending.  A reload
never stops the service and never raises anything but ConfigError; a change recorded while
it happens is queued exactly once per destination; channels that stay keep their counters and
their worker; a worker or a housekeeping pass that fails is started again and counted."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from alarm.settings import ConfigError
from exporters import destinations
from exporters.notify import Notifications
from tests.fakes.kit import change, notify_config, record, running_notifications, wait_for
from tests.fakes.receiver import Receiver
from tests.fakes.server import free_port, serve

RELOADS = 100


def webhook(name: str, url: str, **kw: Any) -> dict[str, Any]:
    return {"type": "webhook", "name": name, "url": url, **kw}


def two_configs(tmp_path: Path) -> tuple[Any, Any]:
    """A: webhooks a and b.  B: a with another URL and timeout (its worker is replaced), b as
    an Alertmanager destination (a new channel of the same name), and a third destination c.
    Nothing listens at the URLs: every row stays queued, retried, and can be counted."""
    closed = [f"http://127.0.0.1:{free_port()}" for _ in range(4)]
    slow = {"base_backoff": "30s", "max_backoff": "60s"}
    a = {"destinations": [webhook("a", closed[0]), webhook("b", closed[1])], "outbox": slow}
    b = {
        "destinations": [
            webhook("a", closed[2], timeout="2s"),
            {"type": "alertmanager", "name": "b", "urls": [closed[3]], "repeat_interval": "1h"},
            webhook("c", closed[0]),
        ],
        "outbox": slow,
    }
    return notify_config(tmp_path, a), notify_config(tmp_path, b)


def rows_by_channel(n: Notifications) -> dict[str, Counter[tuple[str, str]]]:
    """(fingerprint, event) -> how many rows, per channel, queued or dead-lettered."""
    out: dict[str, Counter[tuple[str, str]]] = {}
    with n.outbox.reading() as tx:
        cur = tx.db.execute(
            "SELECT channel, order_key, event FROM notify_outbox "
            "UNION ALL SELECT channel, order_key, event FROM notify_dead"
        )
        for channel, fp, event in cur:
            out.setdefault(channel, Counter())[(fp, event)] += 1
    return out


def queued_channels(n: Notifications) -> set[str]:
    with n.outbox.reading() as tx:
        return {c for (c,) in tx.db.execute("SELECT DISTINCT channel FROM notify_outbox")}


@pytest.mark.parametrize("reload_on", ["event loop", "another thread"])
async def test_reload_storm_while_recording_and_reading_loses_and_duplicates_nothing(
    tmp_path, reload_on
):
    config_a, config_b = two_configs(tmp_path)
    n = Notifications(config_a)
    loop = asyncio.get_running_loop()
    # Threads switch every 50 µs instead of every 5 ms: many more interleavings per run.
    switch = sys.getswitchinterval()
    sys.setswitchinterval(5e-5)
    task = asyncio.create_task(n.run())
    errors: list[BaseException] = []
    reloads_done = threading.Event()
    stop = threading.Event()
    fired: list[str] = []
    resolved: list[str] = []

    def guarded(fn):
        def run() -> None:
            try:
                fn()
            except BaseException as exc:
                errors.append(exc)

        return run

    @guarded
    def recorder() -> None:
        """The pipeline thread: firing changes, and a resolve for every third surface."""
        i = 0
        while not reloads_done.is_set() or i < 200:
            now = time.time()
            batch = [change(f"s{i + k}", at=now) for k in range(4)]
            n.record(batch, now)
            fired.extend(c.fingerprint for c in batch)
            ends = [c for c in batch if int(c.target[1:]) % 3 == 0]
            for c in ends:
                c.state, c.previous, c.at = "resolved", "firing", now + 0.5
            n.record(ends, now + 0.5)
            resolved.extend(c.fingerprint for c in ends)
            i += 4

    @guarded
    def reader() -> None:
        """A scrape and the API, again and again."""
        names = {"a", "b", "c"}
        while not stop.is_set():
            views = n.views
            for ch in views:
                assert ch.name in names
                figures = (ch.sent, ch.failed, ch.retried, ch.dropped, ch.unpersisted)
                figures += (ch.queue_depth, ch.oldest_queued_age, ch.dead_letters)
                assert all(f >= 0 for f in figures)
            snapshot = tuple(views)
            assert 2 <= len(snapshot) <= 3 and snapshot[0].name == "a"
            body = asyncio.run_coroutine_threadsafe(n.api(), loop).result(timeout=30)
            assert {c["channel"] for c in body["channels"]} <= names

    def storm_in_thread() -> None:
        for i in range(RELOADS):
            n.reload(config_b if i % 2 == 0 else config_a)
            time.sleep(0.005)

    threads = [threading.Thread(target=recorder), threading.Thread(target=reader)]
    if reload_on == "another thread":
        threads.append(threading.Thread(target=guarded(storm_in_thread)))
    for t in threads:
        t.start()
    try:
        if reload_on == "event loop":  # as the service's SIGHUP handler does
            for i in range(RELOADS):
                n.reload(config_b if i % 2 == 0 else config_a)
                await asyncio.sleep(0.005)
        else:
            await asyncio.to_thread(threads[-1].join)
        reloads_done.set()
        await asyncio.to_thread(threads[0].join)
        stop.set()
        await asyncio.to_thread(threads[1].join)
        assert errors == []
        assert not task.done(), "the notifier stopped"
        # The last reload went back to A: c's rows are swept to the dead letters.
        await wait_for(lambda: "c" not in queued_channels(n), timeout=10)
        assert [ch.name for ch in n.views] == ["a", "b"]
    finally:
        sys.setswitchinterval(switch)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    rows = rows_by_channel(n)
    n.close()

    assert len(fired) >= 200 and len(set(fired)) == len(fired)
    expected = Counter({(fp, "firing"): 1 for fp in fired})
    expected.update({(fp, "resolved"): 1 for fp in resolved})
    # a and b are in both configurations: each change exactly once, whichever was running.
    assert rows["a"] == expected
    assert rows["b"] == expected
    # c only in B: at most once each (recorded, or caught up by a reconcile, while B ran).
    assert all(count == 1 for count in rows.get("c", Counter()).values())
    assert set(rows) <= {"a", "b", "c"}


def test_a_reader_iterating_the_channels_during_a_reload_sees_one_configuration(tmp_path):
    """A scrape that is half-way through the channels when a reload lands finishes with the
    channels it started with, never a mix of two configurations."""
    config_a, config_b = two_configs(tmp_path)
    n = Notifications(config_a)
    walking = iter(n.views)
    first = next(walking)
    n.reload(config_b)
    seen = [first, *walking]
    assert [(ch.name, ch.type) for ch in seen] == [("a", "webhook"), ("b", "webhook")]
    assert [(ch.name, ch.type) for ch in n.views] == [
        ("a", "webhook"),
        ("b", "alertmanager"),
        ("c", "webhook"),
    ]
    n.close()


async def test_a_destination_removed_by_a_reload_has_its_queue_moved_to_dead_letters(tmp_path):
    closed = f"http://127.0.0.1:{free_port()}"
    both = {"destinations": [webhook("a", closed), webhook("b", closed)]}
    only_a = notify_config(tmp_path, {"destinations": [webhook("a", closed)]})
    n = Notifications(notify_config(tmp_path, both))
    n.record([change("x"), change("y")])
    task = asyncio.create_task(n.run())
    try:
        n.reload(only_a)
        body = await wait_for(lambda: _dead_in_api(n, "b", 2), timeout=10)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        n.close()
    reasons = {d["reason"] for d in body["dead_letters"] if d["channel"] == "b"}
    assert reasons == {"destination removed from the configuration"}
    assert [c["channel"] for c in body["channels"]] == ["a"]


async def _dead_in_api(n: Notifications, channel: str, count: int) -> dict[str, Any] | None:
    body = await n.api()
    dead = [d for d in body["dead_letters"] if d["channel"] == channel]
    return body if len(dead) == count else None


def test_reload_raises_only_config_error_and_keeps_what_runs(tmp_path, monkeypatch):
    good, other = two_configs(tmp_path)
    n = Notifications(good)
    before = tuple(n.views)
    missing = notify_config(
        tmp_path,
        {
            "destinations": [
                {"type": "slack", "name": "chat", "url": {"file": str(tmp_path / "none")}}
            ]
        },
    )
    with pytest.raises(ConfigError) as err:
        n.reload(missing)
    assert "notifications.destinations[0] (chat)" in str(err.value)

    def broken(*_: Any) -> Any:
        raise RuntimeError("a bug in a sender")

    monkeypatch.setattr(destinations, "sender_for", broken)
    with pytest.raises(ConfigError) as err:
        n.reload(other)
    assert "RuntimeError: a bug in a sender" in str(err.value)
    assert tuple(n.views) == before  # the same channels, the same objects
    n.record([change("still-routed")])
    assert len(n.outbox.head("a", 10)) == 1 and len(n.outbox.head("b", 10)) == 1
    n.close()


async def test_a_reference_to_views_follows_reloads_and_channels_keep_their_counters(tmp_path):
    """The HTTP server keeps the ``views`` it was given: it must see the channels of every
    reload.  A channel that stays is the same object, its counters go on."""
    rx1, rx2 = Receiver(), Receiver()
    async with serve(rx1.app()) as one, serve(rx2.app()) as two:
        cfg = {"destinations": [webhook("w", f"{one.base}/hook")]}
        async with running_notifications(tmp_path, cfg) as n:
            views = n.views
            await record(n, change("first"))
            await wait_for(lambda: rx1.received, timeout=10)
            (w,) = views
            await wait_for(lambda: w.sent == 1, timeout=5)
            # Only the URL changes: the worker goes on with the new one.
            cfg = {"destinations": [webhook("w", f"{two.base}/hook"), webhook("v", one.base)]}
            n.reload(notify_config(tmp_path, cfg))
            assert [ch.name for ch in views] == ["w", "v"]
            assert views[0] is w and w.target == f"{two.base}/hook"
            await record(n, change("second"))
            await wait_for(lambda: rx2.received, timeout=10)
            await wait_for(lambda: w.sent == 2, timeout=5)
            # The session changes (timeout): a new worker, the same channel and counters.
            cfg = {"destinations": [webhook("w", f"{one.base}/hook", timeout="3s")]}
            n.reload(notify_config(tmp_path, cfg))
            await record(n, change("third"))
            await wait_for(lambda: len(rx1.received) == 2, timeout=10)
            await wait_for(lambda: w.sent == 3, timeout=5)
            assert tuple(views) == (w,)
    assert [r.payload["data"]["target"] for r in rx1.received] == ["first", "third"]
    assert [r.payload["data"]["target"] for r in rx2.received] == ["second"]
    assert len(rx1.ids() + rx2.ids()) == 3  # nothing sent twice across the reloads


async def test_a_worker_that_fails_is_started_again_counted_and_delivers(tmp_path, caplog):
    rx = Receiver()
    async with serve(rx.app()) as srv:
        cfg = {"destinations": [webhook("w", f"{srv.base}/hook")]}
        async with running_notifications(tmp_path, cfg) as n:
            real_claim = n.outbox.claim
            calls = {"n": 0}

            def claim_failing_once(*args: Any) -> Any:
                calls["n"] += 1
                if calls["n"] == 1:
                    raise KeyError("a bug nobody expected")
                return real_claim(*args)

            n.outbox.claim = claim_failing_once  # type: ignore[method-assign]
            await record(n, change())
            await wait_for(lambda: rx.received, timeout=10)
            body = await n.api()
    (ch,) = body["channels"]
    assert ch["restarts"] == 1 and ch["sent"] == 1
    assert "the worker of w failed" in caplog.text and "KeyError" in caplog.text


async def test_a_failing_housekeeping_pass_is_counted_and_the_next_one_runs(tmp_path, caplog):
    cfg = {"destinations": [webhook("w", f"http://127.0.0.1:{free_port()}/hook")]}
    async with running_notifications(tmp_path, cfg) as n:
        real = n.reconcile
        calls = {"n": 0}

        def reconcile_failing_once(now: float | None = None) -> int:
            calls["n"] += 1
            if calls["n"] == 1:
                raise ValueError("a stored change that does not parse")
            return real(now)

        n.reconcile = reconcile_failing_once  # type: ignore[method-assign]
        await wait_for(lambda: calls["n"] >= 3, timeout=10)
        body = await n.api()
    assert body["outbox"]["housekeeping_errors"] == 1
    assert "housekeeping failed" in caplog.text and "ValueError" in caplog.text
