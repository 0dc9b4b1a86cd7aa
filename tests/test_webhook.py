"""Webhook v1 against a real HTTP receiver on loopback (aiohttp), including a receiver that
fails before it recovers."""

import asyncio

from aiohttp import web

from alarm.config import WebhookConfig
from exporters.webhook import WebhookNotifier


async def start_receiver(handler):
    app = web.Application()
    app.add_routes([web.post("/hook", handler)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}/hook"


async def test_delivers_in_order_and_retries_through_failures():
    got, calls = [], {"n": 0}

    async def handler(request):
        calls["n"] += 1
        if calls["n"] <= 2:
            return web.Response(status=503)
        got.append(await request.json())
        return web.Response(status=200)

    runner, url = await start_receiver(handler)
    n = WebhookNotifier(WebhookConfig(url=url, max_retries=5), 0, base_backoff=0.01)
    task = asyncio.create_task(n.run())
    try:
        n.submit({"fingerprint": "f", "state": "firing"})
        n.submit({"fingerprint": "f", "state": "resolved"})
        for _ in range(200):
            if len(got) == 2:
                break
            await asyncio.sleep(0.02)
        assert [p["state"] for p in got] == ["firing", "resolved"]  # a resolve never overtakes
        assert n.sent == 2 and n.retried == 2 and n.failed == 0 and n.queue_depth == 0
    finally:
        task.cancel()
        await runner.cleanup()


async def test_rejected_and_unreachable_are_counted_not_lost_silently():
    async def handler(request):
        return web.Response(status=400)

    runner, url = await start_receiver(handler)
    bad = WebhookNotifier(WebhookConfig(url=url, max_retries=3), 0, base_backoff=0.01)
    down = WebhookNotifier(
        WebhookConfig(url="http://127.0.0.1:9/hook", max_retries=2, timeout=1), 1, base_backoff=0.01
    )
    tasks = [asyncio.create_task(bad.run()), asyncio.create_task(down.run())]
    try:
        bad.submit({"state": "firing"})
        down.submit({"state": "firing"})
        for _ in range(200):
            if bad.failed and down.failed:
                break
            await asyncio.sleep(0.02)
        assert bad.failed == 1 and bad.retried == 0  # 4xx is not retried
        assert down.failed == 1 and down.retried == 2
    finally:
        for t in tasks:
            t.cancel()
        await runner.cleanup()


async def test_full_queue_drops_oldest_and_counts_it():
    n = WebhookNotifier(WebhookConfig(url="http://127.0.0.1:9/x", queue_size=2), 0)
    for i in range(5):
        n.submit({"i": i})
    assert n.dropped == 3 and n.queue_depth == 2
