"""Worker supervision: one delivery worker per channel (``exporters/delivery.py``), kept in
step with the running configuration, and started again if it ever fails.

Owned by the event loop thread: ``sync``, ``wake`` and ``stop`` are called there only (the
notifier hops to the loop when a reload comes from another thread).

On a reload a channel's worker goes on when only what is read per send changed (its sender
and secrets, its URL, retry limits): nothing in flight is cut.  When its session must change
(timeout, concurrency) or the channel is a new one (a new name, or a type changed), the old
worker is cancelled and the new one starts only once the old one has finished writing the
outcomes it holds, so two workers never send one channel's rows at once and a row delivered
just before the reload is not sent again.  A worker that fails unexpectedly (a bug, an
exception nobody expected) is logged with its traceback, counted in its channel's
``restarts`` and started again after a backoff; its rows wait in the outbox meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from alarm.notify_config import OutboxConfig
from exporters.channels import ChannelSet
from exporters.delivery import Channel, ChannelWorker, MemoryRows
from exporters.destinations import ChannelTarget, DestinationSet
from exporters.diskfull import Journal
from exporters.outbox import Outbox

log = logging.getLogger("capalarm.notify")

RESTART_MIN = 1.0
RESTART_MAX = 60.0
STABLE_AFTER = 60.0  # a worker that ran this long before failing starts again at once


@dataclass(slots=True, frozen=True)
class WorkerSettings:
    channel: Channel
    memory: MemoryRows
    target: ChannelTarget
    outbox: OutboxConfig

    def same_session(self, other: WorkerSettings) -> bool:
        """Whether a worker for ``self`` can go on as a worker for ``other``."""
        a, b = self.target.destination, other.target.destination
        return (
            self.channel is other.channel
            and self.memory is other.memory
            and (a.timeout, a.concurrency) == (b.timeout, b.concurrency)
        )

    def make(self, outbox: Outbox, journal: Journal | None) -> ChannelWorker:
        d = self.target.destination
        return ChannelWorker(
            self.channel,
            d.sender,
            self.target.target,
            outbox,
            self.outbox,
            timeout=d.timeout,
            concurrency=d.concurrency,
            max_attempts=d.max_attempts,
            memory=self.memory,
            journal=journal,
        )


class _Supervised:
    """One channel's worker and the task that keeps it running."""

    __slots__ = ("settings", "task", "worker")

    def __init__(self, settings: WorkerSettings):
        self.settings = settings
        self.worker: ChannelWorker | None = None
        self.task: asyncio.Task[None] | None = None

    def update(self, settings: WorkerSettings) -> None:
        self.settings = settings
        if self.worker is not None:
            d = settings.target.destination
            self.worker.update(d.sender, settings.target.target, settings.outbox, d.max_attempts)

    async def run(
        self, outbox: Outbox, journal: Journal | None, after: asyncio.Task[None] | None
    ) -> None:
        if after is not None:
            # The worker this one replaces writes what it delivered before this one claims.
            await asyncio.gather(after, return_exceptions=True)
        failures = 0
        while True:
            self.worker = self.settings.make(outbox, journal)
            started = time.monotonic()
            try:
                await self.worker.run()
                raise RuntimeError("the delivery worker returned")
            except asyncio.CancelledError:
                raise
            except Exception:
                ch = self.settings.channel
                ch.restarts += 1
                failures = 1 if time.monotonic() - started >= STABLE_AFTER else failures + 1
                delay = (
                    0.0 if failures == 1 else min(RESTART_MAX, RESTART_MIN * 2 ** (failures - 2))
                )
                log.exception(
                    "notifications: the worker of %s failed; starting it again in %.0fs "
                    "(its notifications wait in the outbox)",
                    ch.name,
                    delay,
                )
                await asyncio.sleep(delay)


class Workers:
    def __init__(self, outbox: Outbox, journal: Journal | None = None):
        """``journal``: the held-changes journal, where a worker writes the keys of rows it
        delivered but could not delete (exporters/diskfull.py)."""
        self.outbox = outbox
        self.journal = journal
        self._running: dict[str, _Supervised] = {}
        self._retiring: set[asyncio.Task[None]] = set()  # cancelled, still writing outcomes

    def sync(self, dests: DestinationSet, channels: ChannelSet) -> None:
        """Bring the workers in step with ``dests`` / ``channels`` (the same swap)."""
        wanted = {
            name: WorkerSettings(
                channels.by_name[name], channels.memory[name], ct, dests.config.outbox
            )
            for name, ct in dests.channels.items()
        }
        for name in self._running.keys() - wanted.keys():
            self._retire(self._running.pop(name).task)
        for name, settings in wanted.items():
            sup = self._running.get(name)
            if sup is not None and sup.settings.same_session(settings):
                sup.update(settings)
                continue
            old = sup.task if sup is not None else None
            self._retire(old)
            new = _Supervised(settings)
            new.task = asyncio.create_task(
                new.run(self.outbox, self.journal, old), name=f"notify:{name}"
            )
            self._running[name] = new

    def _retire(self, task: asyncio.Task[None] | None) -> None:
        if task is not None:
            task.cancel()
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    def wake(self) -> None:
        for sup in self._running.values():
            if sup.worker is not None:
                sup.worker.wake()

    async def stop(self) -> None:
        tasks = [sup.task for sup in self._running.values() if sup.task is not None]
        tasks += self._retiring
        self._running.clear()
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
