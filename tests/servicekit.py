"""Start the real service in-process for tests, and read its HTTP side."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from alarm.config import config_from_dict
from alarm.service import Service
from tests.fakes.kit import wait_for

__all__ = ["get", "metric", "running_service", "wait_for"]


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


def surface_totals(service: Service, name: str, kind: str = "egress") -> tuple[int, int]:
    """(bytes, events) counted on a surface so far."""
    table = service.pipeline.table
    row = table.index[(kind, name)]
    return int(table.bytes_total[row]), int(table.events_total[row])


def source_count(service: Service, source: str, counter: str) -> int:
    return service.pipeline.sources[source].counters[counter]


class RecordsCollector:
    """Hands the service one batch of kernel records (through the fence reader, as a kernel
    source does), then idles, up and caught up."""

    def __init__(self, name: str, records: list, prefixes: tuple[str, ...], tick: float):
        from alarm.collectors.kernel.fence import FenceReader
        from alarm.events import SourceHealth

        self.name = name
        self.records = records
        self.reader = FenceReader(prefixes, require_trusted=True, tick=tick)
        self.health = SourceHealth(provenance_verified=True)

    async def run(self, emit: Any) -> None:
        from alarm.events import Batch

        self.health.up = True
        read = self.reader.read(self.records)
        counts = {"records_read": len(self.records), "forged_records": read.forged}
        await emit(Batch(read.events, {k: n for k, n in counts.items() if n}))
        self.health.caught_up = True
        await asyncio.Event().wait()
