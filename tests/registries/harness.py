"""Drive a registry collector directly: batches go to a recorder that keeps position and ledger
as the pipeline would (one store, applied per batch), so a "restart" is a new collector built
from the same store."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter

from alarm.collectors.base import SourceContext
from alarm.collectors.registry import SOURCES
from alarm.collectors.registry.poller import RegistryPoller
from alarm.collectors.registry.settings import RegistrySettings
from alarm.events import Batch

REGISTRY = SOURCES[0]
_SETTINGS: TypeAdapter[Any] = TypeAdapter(RegistrySettings)


@dataclass(slots=True)
class Row:
    ts: float
    repository: str
    artifact: str
    nbytes: int
    capacity: int
    contributor: str
    evidence: dict[str, Any] | None


@dataclass
class Recorder:
    """What the pipeline would have applied, in order."""

    batches: list[Batch] = field(default_factory=list)
    position: dict[str, Any] | None = None
    ledger: dict[str, str] = field(default_factory=dict)

    async def __call__(self, batch: Batch) -> None:
        self.batches.append(batch)
        if batch.position is not None:
            self.position = batch.position
        for key, value in (batch.ledger or {}).items():
            if value is None:
                self.ledger.pop(key, None)
            else:
                self.ledger[key] = value

    def rows(self) -> list[Row]:
        out = []
        for b in self.batches:
            ev = b.events
            if ev is None:
                continue
            cap = ev.capacity_bytes()
            for j in range(len(ev)):
                i = int(ev.subject[j])
                repo, artifact = ev.subjects.keys[i]  # type: ignore[attr-defined]
                out.append(
                    Row(
                        float(ev.ts[j]),
                        repo,
                        artifact,
                        int(ev.nbytes[j]),
                        int(cap[j]),
                        ev.subjects.contributor(i),
                        ev.subjects.evidence(i),
                    )
                )
        return out

    def counts(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for b in self.batches:
            total.update(b.counts)
        return total

    def clear(self) -> None:
        self.batches.clear()


def settings(**cfg: Any) -> Any:
    cfg.setdefault("name", "reg")
    cfg.setdefault("type", "registry")
    return _SETTINGS.validate_python(cfg)


def collector(recorder: Recorder, **cfg: Any) -> RegistryPoller:
    """A collector as the service builds it, resuming from what ``recorder`` saved."""
    ctx = SourceContext(
        tick=1.0, position=recorder.position, ledger=lambda: iter(list(recorder.ledger.items()))
    )
    return REGISTRY.build(settings(**cfg), ctx)


async def poll(source: RegistryPoller, recorder: Recorder) -> bool:
    """One poll, as the collector's loop runs it."""
    async with source.client() as client:
        return await source.poll_once(client, recorder, time.time())


@contextlib.asynccontextmanager
async def running(source: RegistryPoller, recorder: Recorder) -> AsyncIterator[asyncio.Task[None]]:
    """The collector's own loop (polls on its schedule, its sight timer, its canary)."""
    task = asyncio.create_task(source.run(recorder))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
