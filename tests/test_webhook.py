"""The ``webhooks:`` shorthand, now on the durable outbox: the v1 body (the change record), in
order, with retries; a receiver that refuses or cannot be reached ends in the dead-letter
table after ``max_retries``, counted — never dropped silently."""

from __future__ import annotations

import asyncio
import json

from tests.fakes.kit import change, learning_change, record, running_notifications, wait_for
from tests.fakes.receiver import Receiver
from tests.fakes.server import serve
from tests.servicekit import get, running_service

FAST = {"outbox": {"base_backoff": "10ms", "max_backoff": "50ms"}}


async def test_delivers_in_order_and_retries_through_failures(tmp_path):
    rx = Receiver()
    rx.fail_next(["500", "500"])
    async with serve(rx.app()) as srv:
        hooks = [{"url": f"{srv.base}/hook", "max_retries": 5}]
        async with running_notifications(tmp_path, FAST, webhooks=hooks) as n:
            await record(n, change(state="firing"))
            await record(n, change(state="resolved"))
            await wait_for(lambda: len(rx.received) == 2, timeout=10)
            (ch,) = n.views
            await wait_for(lambda: ch.queue_depth == 0, timeout=5)
    # the v1 body: the detector's change record, as the demo and existing receivers parse it
    assert [r.payload["state"] for r in rx.received] == ["firing", "resolved"]
    assert rx.received[0].payload["surface"] == "registry-proxy"
    assert rx.received[0].webhook_id.startswith("msg_")  # the idempotency key rides along
    assert ch.name == "webhook0" and ch.sent == 2 and ch.retried == 2 and ch.failed == 0


async def test_rejected_and_unreachable_end_as_dead_letters(tmp_path):
    rx = Receiver()
    rx.fail_next(["4xx"] * 10)
    async with serve(rx.app()) as srv:
        hooks = [
            {"url": f"{srv.base}/hook", "name": "bad", "max_retries": 3},
            {"url": "http://127.0.0.1:9/hook", "name": "down", "max_retries": 2, "timeout": 1},
        ]
        async with running_notifications(tmp_path, FAST, webhooks=hooks) as n:
            await record(n, change())
            bad, down = n.views
            await wait_for(lambda: bad.failed and down.failed, timeout=10)
            assert bad.retried == 0 and rx.attempts == 1  # 4xx is not retried
            assert down.retried == 2  # three attempts, then given up
            await wait_for(lambda: bad.dead_letters == 1 and down.dead_letters == 1, timeout=5)


async def test_a_learning_alert_is_delivered_as_strict_json_naming_the_floor_it_passed(tmp_path):
    rx = Receiver()
    async with serve(rx.app()) as srv:
        notifications = FAST | {
            "destinations": [{"type": "webhook", "name": "std", "url": f"{srv.base}/hook"}]
        }
        hooks = [{"url": f"{srv.base}/hook", "name": "v1"}]
        async with running_notifications(tmp_path, notifications, webhooks=hooks) as n:
            await record(n, learning_change())
            await wait_for(lambda: len(rx.received) == 2 or rx.bad_bodies, timeout=10)
    # The receiver parses as Go and the vendors do: Infinity would have been refused.
    assert rx.bad_bodies == [] and len(rx.received) == 2
    by_type = {"type" in r.payload: r.payload for r in rx.received}
    v1, std = by_type[False], by_type[True]
    assert v1["threshold"] == 60_000.0
    assert v1["figures"]["budget_tolerance_bits"] is None
    assert v1["figures"]["budget_seasonal"]["tolerance_score"] is None
    data = std["data"]
    assert "(threshold 60,000 B/s)" in data["summary"]
    assert data["lampson"]["tolerance_bits"] is None


async def test_the_notifications_api_shows_no_userinfo_or_query_of_a_target(tmp_path):
    """Webhook and Alertmanager URLs often carry a password or a signature
    (``http://user:pass@host/hook?sig=...``): /api/v1/notifications shows where they go, not
    those (as registry URLs are shown)."""
    async with serve(Receiver().app()) as srv:
        host = srv.base.removeprefix("http://")
        cfg = {
            "tick": "0.5s",
            "state_dir": str(tmp_path / "state"),
            "sources": [{"name": "none"}],
            "notifications": {
                "destinations": [
                    {
                        "type": "webhook",
                        "name": "hook",
                        "url": f"http://hook-user:hook-pass@{host}/hook?sig=hook-sig-value",
                    },
                    {
                        "type": "alertmanager",
                        "name": "am",
                        "urls": ["http://am-user:am-pass@127.0.0.1:9/?token=am-token-value"],
                    },
                ],
                **FAST,
            },
        }
        async with running_service(cfg, collectors={}) as service:
            await asyncio.to_thread(service.notify.record, [change()])
            service.notify.wake()
            await wait_for(lambda: service.notify.views[1].retried, timeout=10)
            status, _, api = await get(service, "/api/v1/notifications")
    assert status == 200
    for secret in ("hook-pass", "hook-sig-value", "am-pass", "am-token-value"):
        assert secret not in api
    targets = {c["channel"]: c["target"] for c in json.loads(api)["channels"]}
    assert targets["hook"] == f"{srv.base}/hook"
    assert targets["am"].startswith("http://127.0.0.1:9/")
