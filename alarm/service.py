"""The service: collectors -> pipeline (one thread) -> ticks -> detector -> exporters.

Structure: one TaskGroup holding a task per collector, the ticker, the HTTP server and a task
per notifier.  All pipeline state lives on a single-worker executor, so ingestion, tick
evaluation, snapshots and state saves are serialised without locks and the event loop only
moves bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sqlite3
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

from alarm.collectors.base import Batch, Collector
from alarm.config import Config, ConfigError, SourceConfig, load_config
from alarm.detector.alerts import AlertChange
from alarm.pipeline import Pipeline, Snapshot, take_snapshot
from alarm.records import KernelRecord
from alarm.state import StateStore
from exporters.http import HttpServer
from exporters.notify import Notifications

log = logging.getLogger("capalarm")
RECENT_CHANGES = 200
COLLECTOR_RESTART_MAX = 30.0


class NoKernelLog(RuntimeError):
    """Neither /dev/kmsg nor journald can be read."""


def kernel_line_parser(fmt: str) -> Callable[[str], KernelRecord | None]:
    """A line parser for file sources; 'auto' decides per line, since a file can mix forms."""
    from alarm import kernel_formats as kf

    year = time.gmtime().tm_year
    if fmt == "kmsg":
        return kf.parse_kmsg_record
    if fmt == "dmesg":
        return kf.parse_dmesg_line
    if fmt == "syslog":
        return lambda line: kf.parse_syslog_line(line, year)

    def auto(line: str) -> KernelRecord | None:
        head = line[:1]
        if head.isdigit() and "," in line[:12]:
            return kf.parse_kmsg_record(line)
        if head in "[<":
            return kf.parse_dmesg_line(line)
        return kf.parse_syslog_line(line, year)

    return auto


def _can_open(path: str) -> bool:
    # os.access is not enough: reading /dev/kmsg also needs CAP_SYSLOG when dmesg_restrict=1.
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
    except OSError:
        return False
    return True


def build_collector(src: SourceConfig, position: dict[str, Any] | None) -> Collector:
    kind = src.type
    if kind == "auto":
        if _can_open(src.kmsg_path):
            kind = "kmsg"
        elif shutil.which("journalctl"):
            kind = "journald"
        else:
            raise NoKernelLog(
                f"source {src.name!r}: cannot read {src.kmsg_path} (run as root or grant CAP_SYSLOG) "
                "and journalctl is not installed; configure a file source (type: file) instead"
            )
    if kind == "kmsg":
        from alarm.collectors.kmsg import KmsgCollector

        return KmsgCollector(
            name=src.name,
            path=src.kmsg_path,
            position=position,
            start_at_end=src.start_at_end,
            nice=src.nice,
        )
    if kind == "journald":
        from alarm.collectors.journald import JournaldCollector

        return JournaldCollector(name=src.name, position=position)
    from alarm.collectors.file_tail import FileTailCollector

    return FileTailCollector(
        name=src.name,
        paths=list(src.paths),
        line_parser=kernel_line_parser(src.format),
        position=position,
    )


# The slow state save may take at most 1/SLOW_SAVE_FACTOR of the pipeline thread's time.
SLOW_SAVE_FACTOR = 20.0


class Service:
    def __init__(
        self,
        config: Config,
        *,
        collectors: list[tuple[SourceConfig, Collector]] | None = None,
        on_change: Callable[[AlertChange], None] | None = None,
    ):
        """``collectors``: use these instead of building them from ``config.sources`` (the demo
        and tests plug in their own)."""
        self.config = config
        self.pipeline = Pipeline(config)
        self.store = StateStore(config.state_dir)
        self.pipeline.load_state(self.store.load())
        for header, arrays in self.store.load_groups().values():
            self.pipeline.detector.load_arrays(header, arrays)
        # When the detector's slow arrays were last saved, and what that save cost (monotonic).
        self._slow_saved: float | None = None
        self._slow_seconds = 0.0
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="capalarm-pipeline")
        if collectors is None:
            collectors = [
                (src, build_collector(src, self.pipeline.positions.get(src.name)))
                for src in config.sources
            ]
        self.collectors: list[tuple[SourceConfig, Collector]] = []
        for src, collector in collectors:
            # One stats object per source, shared by the collector and the pipeline.
            self.pipeline.attach_source(src.name, collector.stats)
            self.collectors.append((src, collector))
        # Durable delivery (exporters/notify.py); its channels are the notifier views.
        self.notify = Notifications(config)
        self.notifiers = self.notify.views
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_CHANGES)
        self.on_change = on_change
        self.http_port: int | None = None
        self.started = asyncio.Event()

    # -- pipeline thread ---------------------------------------------------------------
    async def _on_pipeline(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def _ingest(self, src: SourceConfig, collector: Collector, batch: Batch) -> None:
        trusted_source = bool(collector.stats.provenance_verified)
        self.pipeline.ingest_kernel(src.name, batch.records, tuple(src.prefixes), trusted_source)
        self.pipeline.set_position(src.name, batch.position)

    def _tick(self, end: float) -> list[AlertChange]:
        t0 = time.thread_time()
        result = self.pipeline.close_tick(end)
        self.pipeline.last_tick_seconds = time.thread_time() - t0
        # Notifications are written before the detector state that produced them: a crash
        # between the two re-evaluates the tick and may notify twice, but never not at all.
        self.notify.record(result.changes, end)
        try:
            self._save_state(final=False)
        except (sqlite3.Error, OSError) as exc:
            # A full state directory must not stop the alarm: keep evaluating, say so loudly
            # (the notifier raises an outbox_write_failed alert), save again next tick.
            log.error("cannot save state to %s: %s", self.store.path, exc)
            self.notify.storage_failed(exc)
        return result.changes

    def _save_state(self, final: bool) -> None:
        """Positions, counters and the detector's fast arrays every tick, in one transaction;
        the detector's learned profiles (slow arrays, ~90% of its bytes) when the last such
        save is SLOW_SAVE_FACTOR times its own cost ago (every tick while that is cheap), and at
        shutdown.  A crash loses at most that much profile learning, never a count, a CUSUM
        sum or an alert state."""
        det = self.pipeline.detector
        header = det.state_header()
        groups = {"fast": (header, det.state_arrays("fast"))}
        now = time.monotonic()
        slow = (
            final
            or self._slow_saved is None
            or now - self._slow_saved
            >= max(self.config.tick, SLOW_SAVE_FACTOR * self._slow_seconds)
        )
        if slow:
            groups["slow"] = (header, det.state_arrays("slow"))
        self.store.save(self.pipeline.to_state(detector=False), groups=groups)
        if slow:
            self._slow_saved = time.monotonic()
            self._slow_seconds = self._slow_saved - now

    async def snapshot(self) -> Snapshot:
        return await self._on_pipeline(
            take_snapshot, self.pipeline, time.time(), self.config.http.top_contributors
        )

    # -- tasks -------------------------------------------------------------------------
    async def _run_collector(self, src: SourceConfig, collector: Collector) -> None:
        async def emit(batch: Batch) -> None:
            await self._on_pipeline(self._ingest, src, collector, batch)

        delay = 1.0
        while True:
            try:
                await collector.run(emit)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a source must never take the service down
                collector.stats.up = False
                collector.stats.last_error = f"{type(exc).__name__}: {exc}"[:500]
                log.error(
                    "source %s failed: %s; restarting in %.0fs",
                    src.name,
                    collector.stats.last_error,
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, COLLECTOR_RESTART_MAX)

    async def _ticker(self) -> None:
        tick = self.config.tick
        while True:
            now = time.time()
            end = (now // tick + 1) * tick
            await asyncio.sleep(end - now)
            changes = await self._on_pipeline(self._tick, end)
            for change in changes:
                self._dispatch(change)

    def _dispatch(self, change: AlertChange) -> None:
        payload = change.to_dict()
        self.recent.append(payload)
        level = logging.WARNING if change.state == "firing" else logging.INFO
        log.log(
            level, "alert %s %s/%s: %s", change.state, change.target, change.rule, change.summary
        )
        if self.on_change:
            self.on_change(change)
        if change.state in ("firing", "resolved"):
            self.notify.wake()  # already stored by _tick; the workers send it now

    def _ready(self) -> tuple[bool, str]:
        down = [src.name for src, c in self.collectors if not c.stats.up]
        if down:
            return False, "sources not reading: " + ", ".join(down)
        return True, ""

    async def _serve_http(self) -> None:
        server = HttpServer(
            self.snapshot,
            self.notifiers,
            lambda: list(self.recent),
            self._ready,
            notifications=self.notify.api,
        )
        runner = web.AppRunner(server.app, access_log=None)
        await runner.setup()
        host, port = self.config.http.host_port()
        site = web.TCPSite(runner, host, port)
        await site.start()
        sockets = site._server.sockets if site._server else []  # type: ignore[union-attr]
        self.http_port = sockets[0].getsockname()[1] if sockets else port
        self.notify.set_status_page(f"http://{host}:{self.http_port}/")
        log.info("serving http://%s:%d/ (metrics at /metrics)", host, self.http_port)
        self.started.set()
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._serve_http())
                tg.create_task(self._ticker())
                for src, collector in self.collectors:
                    tg.create_task(self._run_collector(src, collector))
                tg.create_task(self.notify.run())
        finally:
            # Positions and counters of everything counted so far, in one transaction.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._on_pipeline(lambda: self._save_state(final=True)))
            self.executor.shutdown(wait=True)
            self.store.close()
            self.notify.close()

    def reload(self, config: Config | None = None) -> bool:
        """SIGHUP: read the config file again; if it validates, apply its notifications section
        (destinations, routes, silences, secrets).  Other sections need a restart.  An invalid
        config changes nothing and is reported problem by problem."""
        source = self.config._source
        try:
            if config is None:
                if source is None:
                    log.warning("reload: the config was not loaded from a file; nothing to read")
                    return False
                config = load_config(source)
            self.notify.reload(config)
        except ConfigError as exc:
            log.error("reload: configuration rejected, keeping the running one:")
            for problem in exc.problems:
                log.error("  %s", problem)
            return False
        log.info("reload: notifications applied from %s (other sections need a restart)", source)
        return True


async def run_until_signalled(service: Service) -> None:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    loop.add_signal_handler(signal.SIGHUP, service.reload)
    with contextlib.suppress(asyncio.CancelledError):
        await service.run()
