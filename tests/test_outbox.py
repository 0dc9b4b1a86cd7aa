"""The durable outbox and the router: stored before sent, per-alert order, retries, dead letters
(in metrics, the API and the log), filters, one notification per state change, repeats,
silences, flap damping, and a reload that validates before it replaces."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from pathlib import Path

from alarm.config import load_config
from alarm.service import Service
from exporters.delivery import backoff, retry_after
from exporters.notify import Notifications
from exporters.notify_config import OutboxConfig
from tests.fakes.kit import change, notify_config, record, running_notifications
from tests.fakes.receiver import Receiver
from tests.fakes.server import serve
from tests.servicekit import get, metric, running_service, wait_for

FAST = {"base_backoff": "20ms", "max_backoff": "100ms"}


def webhook(name: str, url: str, **kw) -> dict:
    return {"type": "webhook", "name": name, "url": url, **kw}


def queued(n: Notifications, channel: str) -> list[dict]:
    return n.outbox.head(channel, 1000)


def ack_all(n: Notifications, channel: str) -> None:
    for row in queued(n, channel):
        n.outbox.ack(row["id"])


async def test_stored_before_sent_and_deleted_once_accepted(tmp_path):
    rx = Receiver()
    async with serve(rx.app()) as srv:
        cfg = notify_config(tmp_path, {"destinations": [webhook("w", f"{srv.base}/hook")]})
        n = Notifications(cfg)
        n.record([change()])  # no worker yet: the row waits in the database
        rows = queued(n, "w")
        assert [r["event"] for r in rows] == ["firing"] and rx.attempts == 0
        n.close()
        async with running_notifications(tmp_path, cfg.notifications.model_dump()) as n2:
            await wait_for(lambda: rx.received, timeout=10)
            await wait_for(lambda: not queued(n2, "w"), timeout=5)
    assert rx.ids() == [f"msg_{rows[0]['idempotency_key']}"]


async def test_per_alert_order_is_kept_with_parallel_sends_and_failures(tmp_path):
    rx = Receiver()
    rng = random.Random(7)
    rx.fail_next([rng.choice(["500", "", ""]) for _ in range(150)])  # "": a normal 204
    async with serve(rx.app()) as srv:
        cfg = {
            "destinations": [webhook("w", f"{srv.base}/hook", concurrency=8)],
            "outbox": FAST,
        }
        async with running_notifications(tmp_path, cfg) as n:
            t0 = time.time()
            targets = [f"s{i}" for i in range(40)]
            await record(n, *[change(t, at=t0) for t in targets])
            await record(n, *[change(t, state="resolved", at=t0 + 1) for t in targets])
            await wait_for(lambda: len(rx.unique()) == 80, timeout=30)
    seen: dict[str, list[str]] = {}
    for r in rx.received:
        seen.setdefault(r.payload["data"]["fingerprint"], []).append(r.payload["data"]["status"])
    assert len(seen) == 40
    assert all(states == ["firing", "resolved"] for states in seen.values()), seen
    assert len(rx.ids()) == len(set(rx.ids()))  # nothing sent twice


def test_backoff_is_exponential_capped_and_jittered_and_retry_after_is_read():
    cfg = OutboxConfig(base_backoff=1, max_backoff=60)
    rng = random.Random(1)
    for attempt, cap in ((1, 1), (2, 2), (3, 4), (7, 60), (30, 60)):
        values = [backoff(attempt, cfg, rng) for _ in range(200)]
        assert all(cap / 2 <= v <= cap for v in values)
        assert max(values) - min(values) > cap / 4  # jitter spreads them
    now = time.time()
    assert retry_after("7", now) == 7
    assert (
        29
        <= retry_after(time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(now + 30)), now)
        <= 31
    )  # type: ignore[operator]
    assert retry_after("soon", now) is None and retry_after(None, now) is None


async def test_undeliverable_goes_to_dead_letters_seen_in_metrics_api_and_log(tmp_path, caplog):
    caplog.set_level(logging.ERROR, logger="capalarm.notify")
    always_500, rejecting = Receiver(), Receiver()
    always_500.fail_next(["500"] * 1000)
    rejecting.fail_next(["4xx"] * 1000)
    async with serve(always_500.app()) as down, serve(rejecting.app()) as bad:
        cfg = {
            "tick": "0.5s",
            "state_dir": str(tmp_path / "state"),
            "sources": [{"name": "none"}],
            "notifications": {
                "destinations": [
                    webhook("flaky", f"{down.base}/hook"),
                    webhook("picky", f"{bad.base}/hook"),
                ],
                "outbox": {"base_backoff": "50ms", "max_backoff": "100ms", "max_age": "1s"},
            },
        }
        async with running_service(cfg, collectors=[]) as service:
            await asyncio.to_thread(service.notify.record, [change()])
            service.notify.wake()
            await wait_for(lambda: service.notify.outbox.dead_letters(None, 10).__len__() == 2, 15)
            _, _, text = await get(service, "/metrics")
            _, _, api = await get(service, "/api/v1/notifications")
    assert metric(text, "capalarm_notifier_dead_letters", notifier="flaky") == 1
    assert metric(text, "capalarm_notifier_dead_letters", notifier="picky") == 1
    assert metric(text, "capalarm_notifier_failed_total", notifier="picky") == 1
    assert metric(text, "capalarm_notifier_queue_depth", notifier="flaky") == 0
    body = json.loads(api)
    reasons = {d["channel"]: d["reason"] for d in body["dead_letters"]}
    assert reasons["picky"].startswith("rejected: HTTP 422")
    assert reasons["flaky"].startswith("undelivered after") and "HTTP 500" in reasons["flaky"]
    assert rejecting.attempts == 1  # a 4xx is not retried
    assert always_500.attempts >= 3
    assert {c["channel"]: c["dead_letters"] for c in body["channels"]} == {"flaky": 1, "picky": 1}
    logged = [r.getMessage() for r in caplog.records if "dead letter" in r.getMessage()]
    assert len(logged) == 2 and all("spike" in m for m in logged)


# -- routing: decided and stored, checked in the outbox without sending -----------------


def router(tmp_path: Path, notifications: dict) -> Notifications:
    return Notifications(notify_config(tmp_path, notifications))


def events(n: Notifications, channel: str) -> list[tuple[str, str]]:
    cur = n.outbox.db.execute(
        "SELECT event, body FROM notify_outbox WHERE channel = ? ORDER BY id", (channel,)
    )
    return [(event, json.loads(body)["change"]["rule"]) for event, body in cur]


def test_filters_by_target_kind_rule_and_severity(tmp_path):
    n = router(
        tmp_path,
        {
            "destinations": [
                webhook("all", "http://127.0.0.1:9/a"),
                webhook("pager", "http://127.0.0.1:9/b", filter={"min_severity": "critical"}),
                webhook("proxy", "http://127.0.0.1:9/c", filter={"targets": ["registry-*"]}),
                webhook("sources", "http://127.0.0.1:9/d", filter={"kinds": ["source"]}),
            ]
        },
    )
    n.record(
        [
            change("registry-proxy", "spike"),  # warning
            change("paste-board", "budget"),  # critical
            change("kernel", "source_down", kind="source", target_type="source"),  # error
        ]
    )
    rules = {
        ch: sorted(rule for _, rule in events(n, ch)) for ch in ("all", "pager", "proxy", "sources")
    }
    assert rules == {
        "all": ["budget", "source_down", "spike"],
        "pager": ["budget"],
        "proxy": ["spike"],
        "sources": ["source_down"],
    }
    n.close()


def test_one_notification_per_state_change(tmp_path):
    n = router(tmp_path, {"destinations": [webhook("w", "http://127.0.0.1:9/a")]})
    t0 = time.time()
    n.record([change(state="pending", at=t0)])
    n.record([change(at=t0)])
    n.record([change(at=t0 + 1)])  # the same state again (a restart re-announcing it)
    n.record([change(state="resolved", at=t0 + 2)])
    n.record([change(state="resolved", at=t0 + 3)])
    assert [e for e, _ in events(n, "w")] == ["firing", "resolved"]
    n.close()


def test_repeat_interval_for_alerts_that_stay_firing(tmp_path):
    n = router(
        tmp_path, {"destinations": [webhook("w", "http://127.0.0.1:9/a", repeat_interval="60s")]}
    )
    t0 = time.time()
    n.record([change(at=t0)], t0)
    assert n.reconcile(t0 + 61) == 0  # the first is still queued: it refreshes the receiver
    ack_all(n, "w")
    assert n.reconcile(t0 + 30) == 0
    assert n.reconcile(t0 + 61) == 1
    rows = queued(n, "w")
    assert [r["event"] for r in rows] == ["repeat"]
    ack_all(n, "w")
    assert n.reconcile(t0 + 62) == 0
    assert n.reconcile(t0 + 122) == 1
    keys = {r["idempotency_key"] for r in queued(n, "w")}
    assert len(keys) == 1 and rows[0]["idempotency_key"] not in keys  # each repeat is its own
    n.close()


def test_silence_holds_firing_until_its_window_ends_but_never_a_resolve(tmp_path):
    t0 = time.time()
    n = router(
        tmp_path,
        {
            "destinations": [webhook("w", "http://127.0.0.1:9/a")],
            "silences": [
                {
                    "match": {"targets": ["paste-*"]},
                    "starts": t0,
                    "ends": t0 + 100,
                    "comment": "drill",
                },
                {"match": {"rules": ["spike"]}, "starts": t0 + 5, "ends": t0 + 100},
            ],
        },
    )
    n.record([change("paste-board", "budget", at=t0 + 10)], t0 + 10)
    assert queued(n, "w") == []
    assert n.reconcile(t0 + 50) == 0
    assert n.reconcile(t0 + 101) == 1  # still firing when the silence ended: now it is sent
    ack_all(n, "w")
    # A page opened before its silence is still closed.
    n.record([change("registry-proxy", "spike", at=t0 + 1)], t0 + 1)
    n.record([change("registry-proxy", "spike", state="resolved", at=t0 + 20)], t0 + 20)
    assert [r["event"] for r in queued(n, "w")] == ["firing", "resolved"]
    # An alert that fired and resolved inside a silence is never sent at all.
    n.record([change("paste-2", "budget", at=t0 + 30)], t0 + 30)
    n.record([change("paste-2", "budget", state="resolved", at=t0 + 40)], t0 + 40)
    n.reconcile(t0 + 200)
    assert len(queued(n, "w")) == 2
    n.close()


def test_flap_damping_holds_changes_until_the_alert_settles(tmp_path):
    n = router(
        tmp_path,
        {
            "destinations": [webhook("w", "http://127.0.0.1:9/a")],
            "flap": {"window": "10m", "max_changes": 4, "settle": "5m"},
        },
    )
    t0 = time.time()
    for i in range(7):  # firing, resolved, ... firing: seven transitions in a minute
        state = "firing" if i % 2 == 0 else "resolved"
        n.record([change(state=state, at=t0 + 10 * i, started_at=t0)], t0 + 10 * i)
    assert [r["event"] for r in queued(n, "w")] == ["firing", "resolved", "firing", "resolved"]
    assert n.reconcile(t0 + 60 + 299) == 0  # not settled yet
    assert n.reconcile(t0 + 60 + 301) == 1  # settled firing: sent once
    assert [r["event"] for r in queued(n, "w")][-1] == "firing"
    n.close()


async def test_reload_validates_before_replacing_routes_and_silences(tmp_path, caplog):
    path = tmp_path / "capalarm.yaml"

    def write(silence_ends: str) -> None:
        path.write_text(
            f"""
tick: 1s
state_dir: {tmp_path / "state"}
http: {{listen: "127.0.0.1:0"}}
notifications:
  destinations:
    - {{type: webhook, name: w, url: "http://127.0.0.1:9/hook"}}
  silences:
    - {{match: {{targets: [proxy]}}, starts: 2020-01-01T00:00:00Z, ends: {silence_ends}, comment: c}}
"""
        )

    write("2099-01-01T00:00:00Z")
    service = Service(load_config(path), collectors=[])
    task = asyncio.create_task(service.run())
    try:
        await asyncio.wait_for(service.started.wait(), 10)
        write("not-a-time")
        assert service.reload() is False
        assert "notifications.silences[0].ends" in caplog.text
        _, _, body = await get(service, "/api/v1/notifications")
        assert [s["comment"] for s in json.loads(body)["silences"]] == ["c"]
        write("2098-01-01T00:00:00Z")
        path.write_text(path.read_text().replace("comment: c", "comment: renewed"))
        assert service.reload() is True
        _, _, body = await get(service, "/api/v1/notifications")
        assert [s["comment"] for s in json.loads(body)["silences"]] == ["renewed"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
