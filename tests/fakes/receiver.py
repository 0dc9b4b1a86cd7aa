"""A webhook receiver that verifies Standard Webhooks signatures with the independent
``standardwebhooks`` package (PyPI), records what it accepted, and misbehaves on request.

Faults (``fail_next``): ``"500"`` answers 500; ``"hang"`` holds the request past the sender's
timeout (nothing is recorded); ``"garbage"`` writes bytes that are not HTTP and closes the
connection; ``"4xx"`` answers 422; ``"wait"`` holds the request until the test sets
``release``, then accepts it as any other (the send is in flight meanwhile).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from tests.fakes.server import strict_json


@dataclass
class Receipt:
    webhook_id: str
    payload: dict[str, Any]
    at: float


@dataclass
class Receiver:
    secret: str | None = None  # whsec_...; None: signatures are not checked
    hang_seconds: float = 3.0
    received: list[Receipt] = field(default_factory=list)
    attempts: int = 0
    bad_signatures: list[str] = field(default_factory=list)
    bad_bodies: list[str] = field(default_factory=list)  # bodies that were not strict JSON
    attempted_ids: list[str] = field(default_factory=list)  # every request, accepted or not
    _script: list[str] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)  # ends a "wait"

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes([web.post("/hook", self.hook)])
        return app

    def fail_next(self, faults: list[str]) -> None:
        self._script.extend(faults)

    def ids(self) -> list[str]:
        return [r.webhook_id for r in self.received]

    def unique(self) -> dict[str, Receipt]:
        """What a receiver that drops duplicates by webhook-id would keep, in arrival order."""
        out: dict[str, Receipt] = {}
        for r in self.received:
            out.setdefault(r.webhook_id, r)
        return out

    async def hook(self, request: web.Request) -> web.StreamResponse:
        self.attempts += 1
        self.arrived.set()
        self.attempted_ids.append(request.headers.get("webhook-id", ""))
        body = await request.read()
        if self._script:
            fault = self._script.pop(0)
            if fault == "500":
                return web.Response(status=500, text="internal error")
            if fault == "4xx":
                return web.Response(status=422, text="unprocessable")
            if fault == "hang":
                await asyncio.sleep(self.hang_seconds)
                return web.Response(status=503)
            if fault == "wait":
                await self.release.wait()
            if fault == "garbage":
                assert request.transport is not None
                request.transport.write(b"\x00\xffnot http at all\r\n\r\n")
                request.transport.close()
                return web.Response(status=200)
        headers = dict(request.headers)
        if self.secret is not None:
            try:
                Webhook(self.secret).verify(body.decode(), headers)
            except WebhookVerificationError as exc:
                self.bad_signatures.append(str(exc))
                return web.Response(status=401, text="bad signature")
        try:
            payload = strict_json(body)
        except ValueError as exc:
            self.bad_bodies.append(str(exc))
            return web.Response(status=400, text="not JSON")
        self.received.append(Receipt(headers.get("webhook-id", ""), payload, time.time()))
        return web.Response(status=204)
