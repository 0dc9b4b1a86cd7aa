"""The durable outbox and the router: stored before sent, per-alert order, retries, filters,
one notification per state change, repeats, silences, flap damping.  What needs the whole
service (dead letters in /metrics, SIGHUP) is in test_outbox_service.py."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

from alarm.config import config_from_dict
from alarm.notify_config import OutboxConfig
from exporters.delivery import backoff, retry_after
from exporters.notify import Notifications
from exporters.outbox import Settle
from tests.fakes.kit import change, notify_config, record, running_notifications, wait_for
from tests.fakes.receiver import Receiver
from tests.fakes.server import serve

FAST = {"base_backoff": "20ms", "max_backoff": "100ms"}


def webhook(name: str, url: str, **kw) -> dict:
    return {"type": "webhook", "name": name, "url": url, **kw}


def queued(n: Notifications, channel: str) -> list[dict]:
    return n.outbox.head(channel, 1000)


def ack_all(n: Notifications, channel: str) -> None:
    n.outbox.settle(Settle("ack", row["id"]) for row in queued(n, channel))


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
            "flap": {"window": "10m", "max_changes": 4, "settle": "5m", "reopen_window": "0s"},
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


def test_an_alert_that_fires_again_within_the_reopen_window_is_one_incident(tmp_path):
    """Pages = incidents: a resolve waits out the window; a firing inside it pages no one
    again, and the resolve that finally goes out spans the whole incident."""
    n = router(
        tmp_path,
        {
            "destinations": [webhook("w", "http://127.0.0.1:9/a")],
            "flap": {"enabled": False, "reopen_window": "5m"},
        },
    )
    t0 = time.time()
    # As the detector reports them: a resolve carries the start of the firing it ends.
    for at, state, started in ((0, "firing", 0), (30, "resolved", 0), (90, "firing", 90),
                               (120, "resolved", 90)):  # fmt: skip
        n.record([change(state=state, at=t0 + at, started_at=t0 + started)], t0 + at)
    assert [r["event"] for r in queued(n, "w")] == ["firing"]
    assert n.reconcile(t0 + 120 + 299) == 0  # the incident may still reopen
    assert n.reconcile(t0 + 120 + 301) == 1
    assert events(n, "w") == [("firing", "spike"), ("resolved", "spike")]
    resolve = json.loads(
        n.outbox.db.execute("SELECT body FROM notify_outbox WHERE event = 'resolved'").fetchone()[0]
    )["change"]
    assert (resolve["started_at"], resolve["at"]) == (t0, t0 + 120)  # the whole incident
    # Firing again after the window: a new incident, a new page.
    n.record([change(state="firing", at=t0 + 900, started_at=t0 + 900)], t0 + 900)
    assert [e for e, _ in events(n, "w")] == ["firing", "resolved", "firing"]
    n.close()


def test_by_default_a_flap_within_ten_minutes_is_one_page(tmp_path):
    """The default config (no ``flap`` section) counts incidents, not flaps."""
    cfg = config_from_dict(
        {
            "state_dir": str(tmp_path),
            "notifications": {"destinations": [webhook("w", "http://127.0.0.1:9/a")]},
        }
    )
    n = Notifications(cfg)
    t0 = time.time()
    n.record([change(at=t0, started_at=t0)], t0)
    n.record([change(state="resolved", at=t0 + 30, started_at=t0)], t0 + 30)
    n.record([change(at=t0 + 300, started_at=t0 + 300)], t0 + 300)
    n.record([change(state="resolved", at=t0 + 330, started_at=t0 + 300)], t0 + 330)
    assert n.reconcile(t0 + 330 + 599) == 0
    assert n.reconcile(t0 + 330 + 601) == 1
    assert [e for e, _ in events(n, "w")] == ["firing", "resolved"]
    n.close()


def test_without_a_reopen_window_a_resolve_goes_out_at_once(tmp_path):
    n = router(
        tmp_path,
        {"destinations": [webhook("w", "http://127.0.0.1:9/a")], "flap": {"reopen_window": "0s"}},
    )
    t0 = time.time()
    n.record([change(at=t0)], t0)
    n.record([change(state="resolved", at=t0 + 30)], t0 + 30)
    n.record([change(at=t0 + 60, started_at=t0 + 60)], t0 + 60)
    assert [e for e, _ in events(n, "w")] == ["firing", "resolved", "firing"]
    n.close()


def test_a_held_resolve_is_sent_after_a_restart(tmp_path):
    """The held resolve is in the router's memory on disk, not in the process: a page that
    was opened is closed even if capalarm restarts inside the window."""
    cfg = {
        "destinations": [webhook("w", "http://127.0.0.1:9/a")],
        "flap": {"reopen_window": "5m"},
    }
    t0 = time.time()
    n = router(tmp_path, cfg)
    n.record([change(at=t0, started_at=t0)], t0)
    n.record([change(state="resolved", at=t0 + 30, started_at=t0)], t0 + 30)
    n.close()
    again = router(tmp_path, cfg)
    assert again.reconcile(t0 + 100) == 0
    assert again.reconcile(t0 + 331) == 1
    assert [e for e, _ in events(again, "w")] == ["firing", "resolved"]
    again.close()
