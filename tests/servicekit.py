"""Start the real service in-process for tests, and read its HTTP side."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp

from alarm.config import config_from_dict
from alarm.service import Service


@contextlib.asynccontextmanager
async def running_service(config: dict[str, Any], **kwargs: Any) -> AsyncIterator[Service]:
    config = {"http": {"listen": "127.0.0.1:0"}, **config}
    service = Service(config_from_dict(config), **kwargs)
    task = asyncio.create_task(service.run())
    try:
        await asyncio.wait_for(service.started.wait(), 10)
        yield service
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def get(service: Service, path: str, **headers: str) -> tuple[int, str, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{service.http_port}{path}", headers=headers) as resp,
    ):
        return resp.status, resp.headers.get("Content-Type", ""), await resp.text()


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one series in a text exposition, or None."""
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        m = re.match(rf"^{re.escape(name)}(?:\{{(.*)\}})? (\S+)", line)
        if not m:
            continue
        have = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(1) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            return float(m.group(2))
    return None


async def wait_for(
    predicate: Callable[[], Any], timeout: float = 15.0, interval: float = 0.1
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)
