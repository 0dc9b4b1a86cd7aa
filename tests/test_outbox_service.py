"""The outbox as the running service shows it: dead letters in /metrics, the API and the log,
and a SIGHUP reload that validates before it replaces routes and silences."""

from __future__ import annotations

import asyncio
import json
import logging

from alarm.config import load_config
from alarm.service import Service
from tests.fakes.kit import change, wait_for
from tests.fakes.receiver import Receiver
from tests.fakes.server import serve
from tests.servicekit import get, metric, running_service


def webhook(name: str, url: str, **kw) -> dict:
    return {"type": "webhook", "name": name, "url": url, **kw}


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
        async with running_service(cfg, collectors={}) as service:
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
    service = Service(load_config(path), config_path=str(path))
    task = asyncio.create_task(service.run())
    try:
        await asyncio.wait_for(service.started.wait(), 10)
        write("not-a-time")
        assert await service.reload() is False
        assert "notifications.silences[0].ends" in caplog.text
        _, _, body = await get(service, "/api/v1/notifications")
        assert [s["comment"] for s in json.loads(body)["silences"]] == ["c"]
        write("2098-01-01T00:00:00Z")
        path.write_text(path.read_text().replace("comment: c", "comment: renewed"))
        assert await service.reload() is True
        _, _, body = await get(service, "/api/v1/notifications")
        assert [s["comment"] for s in json.loads(body)["silences"]] == ["renewed"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
