"""The loopback webhook receiver of the alert-latency benches (onset_to_webhook.py,
fs_burst_alert.py, registry_upload_alert.py): it records when each ``alert.firing`` of the
spike rule arrives, and gives the ``notifications`` config that sends there, signed with a
fresh Standard Webhooks secret, one page per firing."""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path
from typing import Any

from aiohttp import web


class SpikeReceiver:
    """``async with SpikeReceiver() as hook``: ``hook.received`` holds the arrival times."""

    def __init__(self) -> None:
        self.received: list[float] = []
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def _hook(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("type") == "alert.firing" and body.get("data", {}).get("rule") == "spike":
            self.received.append(time.time())
        return web.Response(status=204)

    async def __aenter__(self) -> SpikeReceiver:
        app = web.Application()
        app.add_routes([web.post("/hook", self._hook)])
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *_exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def notifications(self, tmp: str | Path) -> dict[str, Any]:
        """The config's ``notifications``: a signed webhook here (its secret written under
        ``tmp``).  Each firing is an incident: no flap damping, and no resolve held back to
        merge the next firing into it (``reopen_window``, 10 minutes by default)."""
        secret = Path(tmp, "webhook-secret")
        secret.write_text("whsec_" + base64.b64encode(os.urandom(32)).decode())
        return {
            "destinations": [
                {
                    "type": "webhook",
                    "name": "pager",
                    "url": f"http://127.0.0.1:{self.port}/hook",
                    "secrets": [{"file": str(secret)}],
                }
            ],
            "flap": {"enabled": False, "reopen_window": 0},
        }
