"""Start an aiohttp application on loopback for a test, on a free or a given port."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web


def strict_json(raw: bytes | str) -> Any:
    """Parse a body as the vendors' servers do (RFC 8259: Go's encoding/json, Slack's and
    PagerDuty's APIs): Infinity, -Infinity and NaN are not JSON (Python's json accepts them)."""

    def reject(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(raw, parse_constant=reject)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    def __init__(self, runner: web.AppRunner, port: int):
        self.runner = runner
        self.port = port
        self.base = f"http://127.0.0.1:{port}"


@contextlib.asynccontextmanager
async def serve(app: web.Application, port: int = 0) -> AsyncIterator[Served]:
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield Served(runner, bound)
    finally:
        await runner.cleanup()
