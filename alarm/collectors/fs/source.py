"""``type: fs``: the collector the service runs, on the event loop.

It owns an :class:`Engine` and does nothing blocking itself: the saved ledger is read in
chunks (yielding to the loop between them), the engine opens and steps in a worker thread
(one step at a time, shielded, so a cancelled run never leaves a step half-done on the
engine), and the reader threads wake the loop through ``call_soon_threadsafe``.  After a wake
it waits ``BATCH_DELAY`` so a burst of events becomes one step and one batch.

A batch a step produced is kept until ``emit`` returned: if ``emit`` fails (or the run is
cancelled while emitting) the next run emits it first, so the engine's tracked state and what
the pipeline counted never part ways.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from alarm.collectors.base import SourceContext
from alarm.collectors.fs.engine import Engine, StepResult
from alarm.collectors.fs.reader import name_thread
from alarm.collectors.fs.settings import FsSettings
from alarm.collectors.fs.state import Output
from alarm.events import Batch, Emit, SourceHealth

BATCH_DELAY = 0.02
LEDGER_CHUNK = 5_000  # rows read per turn of the loop (the store's cursor is read there)


class FsCollector:
    def __init__(self, cfg: FsSettings, ctx: SourceContext) -> None:
        self.name = cfg.name
        self.cfg = cfg
        self.ctx = ctx
        self.health = SourceHealth(provenance_verified=False)
        self.engine = Engine(cfg, ctx.tick, ctx.position)
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._unsent: Batch | None = None
        self._inflight: asyncio.Future[Any] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._ledger_read = False
        self.steps = 0
        # Set once the first scans are done (tests and benches wait on it).
        self.ready = asyncio.Event()

    def _notify(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._wake.set)

    async def _in_thread(self, fn: Any, *args: Any) -> Any:
        """Run ``fn`` in a worker thread; if cancelled, wait for it before re-raising so
        the engine is never used by two threads."""
        if self._executor is None:
            # Its own thread, named fs-step in the kernel: the engine's CPU is its own.
            self._executor = ThreadPoolExecutor(1, "fs-step", name_thread, ("fs-step",))
        loop = asyncio.get_running_loop()
        fut = asyncio.ensure_future(loop.run_in_executor(self._executor, fn, *args))
        self._inflight = fut
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            with contextlib.suppress(BaseException):
                await asyncio.wait([fut])
            raise
        finally:
            self._inflight = None

    async def _read_ledger(self) -> Output:
        """The saved rows, read on the loop (the store's own thread) in chunks."""
        out = Output()
        rows: Iterator[tuple[str, str]] = self.ctx.ledger()
        while True:
            chunk = []
            for row in rows:
                chunk.append(row)
                if len(chunk) >= LEDGER_CHUNK:
                    break
            if not chunk:
                return out
            await self._in_thread(self.engine.load_ledger, chunk, out)

    async def run(self, emit: Emit) -> None:
        self._loop = asyncio.get_running_loop()
        self.engine.notify = self._notify
        health = self.health
        try:
            if self._unsent is not None:
                await emit(self._unsent)
                self._unsent = None
            first = Output()
            if not self._ledger_read:
                first = await self._read_ledger()
                self._ledger_read = True
            opened: Output = await self._in_thread(self.engine.open, time.time())
            first.counts.update(opened.counts)
            first.ledger.update(opened.ledger)
            first.problems += opened.problems
            first.events.extend(opened.events)
            self.engine.start()
            # Up: the source runs.  What it cannot see (a tree gone, a missed canary, a lost
            # watch) is ``blind``, the service's surface_blind alarm, not down.
            health.up = True
            health.blind = self.engine.blind()
            self._report(first.problems)
            pending = self._batch_of(first, None, None)
            if pending is not None:
                self._unsent = pending
                await emit(pending)
                self._unsent = None
            more = True
            while True:
                if not more:
                    now = time.time()
                    timeout = max(0.0, self.engine.next_deadline(now) - now)
                    if not self._wake.is_set():
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._wake.wait(), timeout)
                    if self._wake.is_set():
                        self._wake.clear()
                        await asyncio.sleep(BATCH_DELAY)
                t0 = time.monotonic()
                res, batch = await self._in_thread(self._step, time.time())
                self.steps += 1
                more = res.more
                if batch is not None:
                    self._unsent = batch
                    await emit(batch)
                    self._unsent = None
                health.read_seconds = time.monotonic() - t0
                health.last_success_at = time.time()
                health.up = res.up
                health.blind = res.blind
                health.mode = res.mode
                health.caught_up = res.caught_up and res.up
                if res.last_event_ts:
                    health.last_record_ts = max(health.last_record_ts, res.last_event_ts)
                self._report(res.problems)
                if not self.engine.jobs or all(j.reason == "poll" for j in self.engine.jobs):
                    self.ready.set()
        finally:
            health.up = False
            health.caught_up = False
            self.ready.clear()
            inflight = self._inflight
            if inflight is not None:
                with contextlib.suppress(BaseException):
                    await asyncio.wait([inflight])
            await asyncio.to_thread(self.engine.close)
            if self._executor is not None:
                self._executor.shutdown(wait=False)
                self._executor = None

    def _step(self, now: float) -> tuple[StepResult, Batch | None]:
        """One engine step and its batch, both in the worker thread (building the columns of
        a big batch is CPU work too)."""
        res = self.engine.step(now)
        out = Output(res.events, res.ledger, Counter(res.counts), res.problems)
        return res, self._batch_of(out, res.position, res.watermark)

    def _report(self, problems: list[str]) -> None:
        now = time.time()
        for p in problems:
            self.health.failed(p, now)

    def _batch_of(
        self, out: Output, position: dict[str, Any] | None, watermark: float | None
    ) -> Batch | None:
        counts = {k: int(n) for k, n in dict(out.counts).items() if n}
        if not (out.events or counts or out.ledger or position is not None or watermark):
            return None
        events = out.events.write_events("fs") if out.events else None
        return Batch(events, counts, position, watermark, out.ledger or None)


def build(cfg: FsSettings, ctx: SourceContext) -> FsCollector:
    return FsCollector(cfg, ctx)
