"""Real Alertmanager (Debian's ``prometheus-alertmanager``), two of them on loopback as the
peers of an HA pair: both receive every alert; the test reads the alerts back through their
API v2, sees the re-sends keep them from expiring, sees them resolve, and sees Alertmanager
route them to a webhook receiver (firing, then resolved)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.fakes.kit import change, record, running_notifications, wait_for
from tests.fakes.server import free_port, serve

BINARY = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
pytestmark = pytest.mark.skipif(
    BINARY is None and os.environ.get("CI") != "true",
    reason="needs Debian's prometheus-alertmanager (scripts/test.sh installs it)",
)


@contextlib.asynccontextmanager
async def alertmanager(tmp: Path, hook_url: str, port: int | None = None) -> AsyncIterator[str]:
    assert BINARY, "prometheus-alertmanager is not installed (scripts/test.sh installs it)"
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "am.yml").write_text(
        f"""
route:
  receiver: hook
  group_by: [alertname, surface]
  group_wait: 100ms
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: hook
    webhook_configs:
      - url: {hook_url}
        send_resolved: true
"""
    )
    port = port or free_port()
    proc = subprocess.Popen(
        [
            BINARY,
            f"--config.file={tmp / 'am.yml'}",
            f"--storage.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",  # no gossip: nothing listens beyond loopback
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp / "am.log", "w"),  # noqa: SIM115 - closed with the process
    )
    base = f"http://127.0.0.1:{port}"
    try:

        async def ready() -> bool:
            try:
                async with aiohttp.ClientSession() as s, s.get(f"{base}/-/ready") as r:
                    return r.status == 200
            except aiohttp.ClientError:
                return False

        await wait_for(ready, timeout=20)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()


async def am_alerts(base: str) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as s, s.get(f"{base}/api/v2/alerts") as r:
        assert r.status == 200
        return await r.json()


def ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


async def test_alerts_reach_every_peer_stay_fresh_resolve_and_are_routed(tmp_path):
    routed: list[dict[str, Any]] = []

    async def am_webhook(request: web.Request) -> web.Response:
        routed.append(await request.json())
        return web.Response(status=200)

    app = web.Application()
    app.add_routes([web.post("/am", am_webhook)])
    async with (
        serve(app) as hook,
        alertmanager(tmp_path / "am1", f"{hook.base}/am") as am1,
        alertmanager(tmp_path / "am2", f"{hook.base}/am") as am2,
    ):
        cfg = {
            "destinations": [
                {"type": "alertmanager", "name": "am", "urls": [am1, am2], "repeat_interval": "1s"}
            ],
            "links": {
                "external_url": "http://127.0.0.1:9733/",
                "runbook": "https://rb.example/{rule}",
            },
        }
        async with running_notifications(tmp_path / "state", cfg) as n:
            t0 = time.time()
            spike = change("registry-proxy", "spike", at=t0, started_at=t0 - 5)
            await record(n, spike)

            for base in (am1, am2):
                await wait_for(lambda b=base: am_alerts(b), timeout=10)
            (alert,) = await am_alerts(am1)
            labels = alert["labels"]
            assert labels == {
                "alertname": "CapalarmSpike",
                "surface": "registry-proxy",
                "kind": "egress",
                "rule": "spike",
                "severity": "warning",
            }
            ann = alert["annotations"]
            assert "rose to 24,000 B/s, x20.0 its baseline of 1,200 B/s" in ann["summary"]
            assert ann["runbook_url"] == "https://rb.example/spike"
            assert ann["capacity_bits_per_second"] == "194560"
            assert alert["generatorURL"] == "http://127.0.0.1:9733/"
            assert abs(ts(alert["startsAt"]) - (t0 - 5)) < 0.01
            assert alert["status"]["state"] == "active"

            # Re-sent every second: endsAt keeps moving ahead, so the alert never expires.
            first_end = ts(alert["endsAt"])
            await asyncio.sleep(2.5)
            (again,) = await am_alerts(am2)
            assert ts(again["endsAt"]) > first_end

            # Both peers route it to the webhook receiver.
            await wait_for(lambda: len([r for r in routed if r["status"] == "firing"]) >= 2, 10)

            await record(
                n, change("registry-proxy", "spike", "resolved", at=time.time(), started_at=t0 - 5)
            )
            for base in (am1, am2):
                await wait_for(lambda b=base: _empty(b), timeout=10)
            await wait_for(lambda: len([r for r in routed if r["status"] == "resolved"]) >= 2, 10)
            (ch1, ch2) = n.views
            assert (ch1.name, ch2.name) == ("am#0", "am#1") and ch1.failed == ch2.failed == 0

    resolved = next(r for r in routed if r["status"] == "resolved")
    assert resolved["alerts"][0]["labels"]["alertname"] == "CapalarmSpike"
    assert resolved["alerts"][0]["status"] == "resolved"


async def _empty(base: str) -> bool:
    return await am_alerts(base) == []


async def test_a_peer_that_is_down_gets_its_alerts_when_it_is_back(tmp_path):
    """Each peer is its own queue: one down does not hold back the other, and catches up."""
    routed: list[dict[str, Any]] = []

    async def am_webhook(request: web.Request) -> web.Response:
        routed.append(await request.json())
        return web.Response(status=200)

    app = web.Application()
    app.add_routes([web.post("/am", am_webhook)])
    late_port = free_port()
    async with serve(app) as hook, alertmanager(tmp_path / "up", f"{hook.base}/am") as up:
        cfg = {
            "destinations": [
                {
                    "type": "alertmanager",
                    "name": "am",
                    "urls": [up, f"http://127.0.0.1:{late_port}"],
                    "repeat_interval": "30s",
                }
            ],
            "outbox": {"base_backoff": "100ms", "max_backoff": "500ms"},
        }
        async with running_notifications(tmp_path / "state", cfg) as n:
            await record(n, change("paste-board", "budget"))
            await wait_for(lambda: am_alerts(up), timeout=10)
            assert n.views[1].queue_depth == 1 and n.views[1].retried >= 1
            # The second peer starts: its queued alert is delivered.
            async with alertmanager(tmp_path / "late", f"{hook.base}/am", late_port) as late:
                await wait_for(lambda: n.views[1].sent == 1, timeout=15)
                (alert,) = await am_alerts(late)
                assert alert["labels"]["surface"] == "paste-board"
