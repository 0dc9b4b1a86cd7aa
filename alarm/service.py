"""The service: the composition root — sources -> pipeline (one thread) -> ticks -> detector ->
exporters.  The only module that imports every layer.

Structure: one TaskGroup holding a supervised task per source, the ticker, the HTTP server, the
reloader and the notifier.  All pipeline state lives on a single-worker executor, so applying
batches, evaluating ticks, snapshots, state saves and reloads are serialised without locks and
the event loop only moves bytes.  Source health is written on the loop and handed to the
pipeline as a copy with each call.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import signal
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from alarm import __version__
from alarm.collectors import SOURCE_TYPES
from alarm.collectors.base import Collector, SourceContext, SourceUnavailable
from alarm.collectors.kernel.canary import EgressCanary
from alarm.config import ConfigError, load_config
from alarm.detector.alerts import AlertChange
from alarm.events import Batch, SourceHealth
from alarm.failures import FailureRun
from alarm.history import HistoryRequest
from alarm.pipeline import Pipeline
from alarm.snapshot import Snapshot, SnapshotRequest, StateSaveView
from alarm.state import StateStore, storage_cause
from alarm.statesave import ALARM_FINGERPRINT as STATE_ALARM
from alarm.statesave import SavePlan
from exporters.http import HttpServer
from exporters.notify import Notifications
from exporters.webconfig import WebConfig

if TYPE_CHECKING:  # the assembled model: importing it imports every source type's settings
    from alarm.config import Config

log = logging.getLogger("capalarm")
RECENT_CHANGES = 200
COLLECTOR_RESTART_MAX = 30.0
# Cells counted in ticks not yet evaluated before a source is made to wait (a backlog read far
# ahead of a slower source): bounds memory whatever the sources do.
MAX_OPEN_CELLS = 2_000_000
# Ticks evaluated per call on the pipeline thread: a long backlog is evaluated in slices, so
# scrapes, snapshots and other sources' batches get in between.
TICKS_PER_CALL = 500
# A state save that keeps failing (a full disk fails every tick) is logged at most this often.
SAVE_ERROR_LOG_EVERY = 60.0
# Settings a running service cannot change; a reload that changes them keeps the running ones.
RESTART_ONLY = ("tick", "state_dir", "http", "event_time", "heavy_hitters", "egress_canary")


class ServiceError(RuntimeError):
    """A runtime failure that stops the service (a busy port): one line, exit status 1."""


@dataclass(slots=True)
class Advance:
    changes: list[AlertChange]
    more: bool  # ticks are still due: evaluate the next slice


@dataclass(slots=True)
class RunningSource:
    name: str
    settings: Any  # the source's config model (None: a collector given by the caller)
    collector: Collector
    task: asyncio.Task[None] | None = None
    restarts: int = 0
    up_since: float = field(default_factory=time.time)


def settle_heap() -> None:
    """Collects what is garbage, then moves every object left to the garbage collector's
    permanent generation (gc.freeze), where its full collections no longer look.  What the
    service builds at start (the config's models, the surface table, the detector's objects)
    lives as long as it runs: 3.4 million objects at 100,000 surfaces, which every full
    collection walked with the GIL held, stopping the pipeline, the sources and the HTTP side
    for 1.5-1.8 s (0.0 ms once frozen).  Once at start and once after each reload (a full
    collection, the replaced pipeline's objects thawed first so that they can go)."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


class Service:
    def __init__(
        self,
        config: Config,
        *,
        config_path: str | None = None,
        collectors: Mapping[str, Collector] | None = None,
        on_change: Callable[[AlertChange], None] | None = None,
        web_config: WebConfig | None = None,
    ):
        """``collectors``: use these for sources of these names instead of building them from
        the config (the demo and tests plug in their own; names the config does not declare
        feed egress unless the collector has a ``kind``).  ``web_config``: TLS and basic auth
        for the HTTP side (``--web.config.file``), re-read when its file changes."""
        self.config = config
        self.web_config = web_config
        self.config_path = config_path
        self._given = dict(collectors or {})
        self.store = StateStore(config.state_dir)
        self.pipeline = Pipeline(config, self._extra_sources(config))
        now = time.time()
        self._startup_changes = self.pipeline.load_state(
            self.store.load(), list(self.store.load_groups().values()), now
        )
        self._dropped_ledgers = [
            s for s in self.store.ledger_sources() if s not in self.pipeline.sources
        ]
        # When to save, retries, the state_save_failed alarm (alarm/statesave.py).
        self._saves = SavePlan(config.tick, str(self.store.path))
        # Saves failed in a row, how many of them were logged, and when the last log was.
        self._save_errors = 0
        self._save_errors_logged = 0
        self._save_error_logged_at = 0.0
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="capalarm-pipeline")
        self.sources: dict[str, RunningSource] = {}
        for name in self.pipeline.sources:
            self.sources[name] = self._build(name, config)
        self.notify = Notifications(config, write_lock=self.store.write_lock)
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_CHANGES)
        self.on_change = on_change
        self.http_port: int | None = None
        self.started = asyncio.Event()
        self._reload_wanted = asyncio.Event()
        self._tg: asyncio.TaskGroup | None = None
        self.reloads = 0
        # The pipeline's calls that raised, ticks and batches apart: ticks that always fail
        # while batches count still judge nothing (alarm/failures.py).
        self.tick_failures = FailureRun()
        self.batch_failures = FailureRun()
        self.http: HttpServer | None = None
        self.canary = (
            EgressCanary(
                config.egress_canary,
                lambda: {rs.name: rs.collector for rs in self.sources.values()},
            )
            if config.egress_canary is not None
            else None
        )

    def _extra_sources(self, config: Config) -> dict[str, tuple[str, str]]:
        declared = {s.name for s in config.sources}
        return {
            name: ("external", getattr(c, "kind", "egress"))
            for name, c in self._given.items()
            if name not in declared
        }

    def _build(self, name: str, config: Config) -> RunningSource:
        given = self._given.get(name)
        if given is not None:
            return RunningSource(name, None, given)
        settings = next(s for s in config.sources if s.name == name)
        ctx = SourceContext(
            tick=config.tick,
            position=self.pipeline.positions.get(name),
            ledger=self.store.ledger_reader(name),
            state_dir=config.state_dir,
        )
        return RunningSource(name, settings, SOURCE_TYPES[settings.type].build(settings, ctx))

    @property
    def collectors(self) -> list[tuple[str, Collector]]:
        return [(s.name, s.collector) for s in self.sources.values()]

    def _health(self) -> dict[str, SourceHealth]:
        """Copies of every source's health, taken on the loop for the pipeline thread."""
        out = {}
        for name, s in self.sources.items():
            h = s.collector.health
            out[name] = SourceHealth(**{f: getattr(h, f) for f in SourceHealth.__slots__})  # type: ignore[attr-defined]
        return out

    # -- pipeline thread ---------------------------------------------------------------
    async def _on_pipeline(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def _apply(self, name: str, batch: Batch, health: dict[str, SourceHealth]) -> Advance:
        now = time.time()
        if name not in self.pipeline.sources:
            return Advance([], False)  # a source removed by a reload, its last batch in flight
        self.pipeline.apply(name, batch, now)
        return self._advance(now, health)

    def _advance(self, now: float, health: dict[str, SourceHealth]) -> Advance:
        """Evaluate the ticks the sources' watermarks allow (a slice of them at a time);
        save after any."""
        p = self.pipeline
        end = p.closable_end(now, health)
        t0 = time.thread_time()
        results = p.close_until(end, now, health, limit=TICKS_PER_CALL)
        if not results:
            return Advance([], False)
        p.last_tick_seconds = (time.thread_time() - t0) / len(results)
        changes = [c for r in results for c in r.changes]
        self._record_and_save(changes)
        return Advance(changes, p.behind(end))

    async def _catch_up(self, first: Advance) -> None:
        """Dispatch what an evaluation changed; while ticks are still due, evaluate the next
        slice (each its own call, so everything else on the pipeline thread gets a turn)."""
        result = first
        while True:
            self._dispatch_all(result.changes)
            if not result.more:
                return
            result = await self._on_pipeline(self._advance, time.time(), self._health())

    def _record_and_save(self, changes: list[AlertChange], force: bool = False) -> None:
        """Record the changes, then save the state if a checkpoint is due (``force``: now).
        Notifications are written before the detector state that produced them: a crash
        between the two evaluates the ticks again, whose changes the router knows and does
        not send again (alarm/statesave.py)."""
        if changes:
            self.notify.record(changes, time.time())
        plan = self._saves
        if not (force or plan.due(time.monotonic())):
            return
        try:
            self._save_state(final=False)
        except (sqlite3.Error, OSError) as exc:
            # A full state directory or a lock held by another process must not stop the
            # alarm: keep counting and paging, say so (the state_save_failed alarm), retry.
            self._save_failed(exc)
            alarm = plan.failed(time.monotonic(), time.time(), storage_cause(exc, plan.path))
        else:
            if self._save_errors:
                log.warning(
                    "state saved to %s again, after %d failed saves",
                    self.store.path,
                    self._save_errors,
                )
                self._save_errors = self._save_errors_logged = 0
            if not plan.checked_open:
                # A process killed while its saves failed left the alarm firing.
                plan.checked_open = True
                if self.notify.firing(STATE_ALARM):
                    plan.reopened(time.time())
            alarm = plan.resolved(time.time())
        if alarm is not None:
            self.notify.record([alarm], time.time())
            self.notify.wake()

    def _save_failed(self, exc: BaseException) -> None:
        """Every tick's save fails while the disk is full: the first failure is logged, then
        one line a minute (SAVE_ERROR_LOG_EVERY) with how many failed since, each naming the
        cause (locked by another process, disk full, read-only), not just SQLite's words."""
        self._save_errors += 1
        now = time.monotonic()
        if self._save_errors > 1 and now - self._save_error_logged_at < SAVE_ERROR_LOG_EVERY:
            return
        cause = storage_cause(exc, self.store.path)
        if self._save_errors == 1:
            log.error("cannot save state to %s: %s (%s)", self.store.path, cause, exc)
        else:
            log.error(
                "still cannot save state to %s: %s (%s); %d failed saves in the last %.0fs, "
                "%d in all",
                self.store.path,
                cause,
                exc,
                self._save_errors - self._save_errors_logged,
                now - self._save_error_logged_at,
                self._save_errors,
            )
        self._save_error_logged_at = now
        self._save_errors_logged = self._save_errors

    def _save_state(self, final: bool) -> None:
        """A checkpoint: positions, counters, open ticks, ledger rows and the detector's fast
        arrays in one transaction; with the detector's learned profiles (slow arrays, ~80% of
        its bytes) on their own cadence and at shutdown (alarm/statesave.py)."""
        p = self.pipeline
        det = p.detector
        header = det.state_header()
        groups = {"fast": (header, det.state_arrays("fast"))}
        now = time.monotonic()
        slow = final or self._saves.slow_due(now)
        if slow:
            groups["slow"] = (header, det.state_arrays("slow"))
        self.store.save(
            p.to_state(), groups=groups, ledger=p.ledger, drop_ledgers=self._dropped_ledgers
        )
        p.ledger = {}
        self._dropped_ledgers = []
        stats = self.store.last_save
        self._saves.saved(now, time.monotonic(), slow, stats.total_bytes, stats.chunks_written)

    def _snapshot(
        self,
        now: float,
        health: dict[str, SourceHealth],
        request: SnapshotRequest | HistoryRequest | None,
    ) -> Snapshot:
        snap = self.pipeline.snapshot(now, self.config.http.top_contributors, health, {}, request)
        plan = self._saves
        snap.internal_errors = self.tick_failures.total + self.batch_failures.total
        snap.state_save = StateSaveView(
            saves=plan.saves,
            failures=plan.failed_total,
            last_seconds=plan.last_seconds,
            last_at=plan.last_at,
            last_bytes=plan.last_bytes,
            last_chunks=plan.last_chunks,
            bytes_total=plan.bytes_total,
            chunks_total=plan.chunks_total,
            wal_bytes=self.store.wal_bytes(),
        )
        return snap

    async def snapshot(self, request: SnapshotRequest | HistoryRequest | None = None) -> Snapshot:
        """``request``: what to copy beyond the columns (a page's rows, the last hour of some
        surfaces: the status page, the API; alarm/snapshot.py); None: every surface."""
        snap = await self._on_pipeline(self._snapshot, time.time(), self._health(), request)
        if self.canary is not None:
            snap.egress_canary = self.canary.view()
        return snap

    # -- tasks -------------------------------------------------------------------------
    async def _run_source(self, rs: RunningSource) -> None:
        name = rs.name

        async def emit(batch: Batch) -> None:
            try:
                advance = await self._on_pipeline(self._apply, name, batch, self._health())
            except Exception as exc:  # the source is restarted from its position
                self._pipeline_failed(self.batch_failures, exc, f"counting a batch of {name}")
                raise
            self.batch_failures.worked()
            await self._catch_up(advance)
            if self.pipeline.clock.cells > MAX_OPEN_CELLS:
                await self._wait_for_room()

        delay = 1.0
        while True:
            try:
                await rs.collector.run(emit)
                return
            except (asyncio.CancelledError, ServiceError):
                raise
            except Exception as exc:  # a source must never take the service down
                health = rs.collector.health
                health.up = False
                health.caught_up = False
                health.failed(f"{type(exc).__name__}: {exc}", time.time())
                rs.restarts += 1
                log.error(
                    "source %s failed: %s; restarting in %.0fs", name, health.last_error, delay
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, COLLECTOR_RESTART_MAX)

    async def _wait_for_room(self) -> None:
        """Hold a source that is far ahead until the others catch up (or stop holding)."""
        while self.pipeline.clock.cells > MAX_OPEN_CELLS:
            await asyncio.sleep(0.05)
            await self._catch_up(
                await self._on_pipeline(self._advance, time.time(), self._health())
            )

    async def _ticker(self) -> None:
        tick = self.config.tick
        grace = self.config.event_time.grace
        while True:
            now = time.time()
            wake = (now - grace) // tick * tick + tick + grace
            await asyncio.sleep(max(0.0, wake - now))
            try:
                await self._catch_up(
                    await self._on_pipeline(self._advance, time.time(), self._health())
                )
            except Exception as exc:
                # A bug in one evaluation must not stop the alarm: say so, count it, go on
                # (until nothing but failures for minutes: alarm/failures.py).
                self._pipeline_failed(self.tick_failures, exc, "tick evaluation")
            else:
                self.tick_failures.worked()

    def _pipeline_failed(self, run: FailureRun, exc: BaseException, what: str) -> None:
        """A pipeline call raised: its traceback logged at the first of a run of failures,
        a line at each later one; the service stops once they have run for minutes."""
        now = time.time()
        if run.in_a_row:
            log.error("%s failed again: %s: %s", what, type(exc).__name__, exc)
        else:
            log.error("%s failed", what, exc_info=exc)
        run.failed(exc, now)
        why = run.why_stop(now)
        if why:
            raise ServiceError(why) from None

    def _dispatch_all(self, changes: list[AlertChange]) -> None:
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
            self.notify.wake()  # already stored; the workers send it now

    def _ready(self) -> tuple[bool, str]:
        down = [name for name, c in self.collectors if not c.health.up]
        if down:
            return False, "sources not reading: " + ", ".join(down)
        return True, ""

    async def _start_http(self) -> HttpServer:
        server = HttpServer(
            self.snapshot,
            lambda: self.notify.views,
            lambda: list(self.recent),
            self._ready,
            notifications=self.notify.api,
            web_config=self.web_config,
            metrics=self.config.http.metrics,
        )
        host, port = self.config.http.host_port()
        try:
            self.http_port = await server.start(host, port)
        except OSError as exc:
            await server.stop()
            why = "address already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
            raise ServiceError(f"cannot listen on {host}:{port}: {why}") from None
        self.http = server
        self.notify.set_status_page(f"{server.scheme}://{host}:{self.http_port}/")
        log.info("serving %s://%s:%d/ (metrics at /metrics)", server.scheme, host, self.http_port)
        return server

    def _describe_sources(self) -> str:
        """``kernel (auto: kmsg), uploads (pypi)``: each source's type and, where the type
        chooses how to read (auto picks kmsg or journald), the backend it chose."""
        parts = []
        for rs in self.sources.values():
            kind = getattr(rs.settings, "type", None) or "external"
            mode = rs.collector.health.mode
            parts.append(f"{rs.name} ({kind}: {mode})" if mode else f"{rs.name} ({kind})")
        return ", ".join(parts) or "none"

    def _startup_line(self) -> str:
        """What this process uses, in one line: the first thing to check when it does not
        behave as expected (a forgotten --config runs the embedded default)."""
        return (
            f"capalarm {__version__} started: config {self.config_path or 'embedded default'}, "
            f"state directory {self.config.state_dir}, listening on "
            f"{self.http.scheme if self.http else 'http'}://{self.config.http.listen} "
            f"(port {self.http_port}), sources {self._describe_sources()}"
        )

    async def run(self) -> None:
        server = await self._start_http()  # a busy port is reported before anything starts
        self.pipeline.start(time.time())
        if self._startup_changes:
            changes, self._startup_changes = self._startup_changes, []
            await self._on_pipeline(self._record_and_save, changes)
            self._dispatch_all(changes)
        settle_heap()
        self.started.set()
        log.info("%s", self._startup_line())
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                tg.create_task(self._ticker())
                tg.create_task(self._reloader())
                for rs in self.sources.values():
                    rs.task = tg.create_task(self._run_source(rs))
                tg.create_task(self.notify.run())
                if self.canary is not None:
                    tg.create_task(self.canary.run())
        except BaseExceptionGroup as group:
            stopped = group.subgroup(ServiceError)
            if stopped is None:
                raise
            raise stopped.exceptions[0] from None  # one line, exit status 1 (alarm/cli.py)
        finally:
            self._tg = None
            with contextlib.suppress(asyncio.CancelledError):
                await server.stop()
            # Positions and counters of everything counted so far, in one transaction.
            saved = "not saved"
            with contextlib.suppress(Exception):
                await asyncio.shield(self._on_pipeline(lambda: self._save_state(final=True)))
                saved = "saved"
            self.executor.shutdown(wait=True)
            self.store.close()
            self.notify.close()
            gc.unfreeze()  # what this run kept is garbage now (tests run many in one process)
            # The last line of a run: that it ended on purpose, and whether its state is kept.
            log.info("capalarm stopped: state %s in %s", saved, self.store.path)

    # -- reload ------------------------------------------------------------------------
    def request_reload(self) -> None:
        """SIGHUP: reloads are queued and run one at a time; a storm of signals is one or two
        reloads, never a crash."""
        self._reload_wanted.set()

    async def _reloader(self) -> None:
        while True:
            await self._reload_wanted.wait()
            self._reload_wanted.clear()
            try:
                await self.reload()
            except Exception:  # a reload must never stop the service
                log.exception("reload failed; the running configuration is kept")

    async def reload(self, config: Config | None = None) -> bool:
        """Read the config file again; if it validates, apply it: notifications, sources and
        surfaces.  A source or surface that is gone resolves its alerts ("removed from the
        configuration") and drops its series.  Settings listed in RESTART_ONLY keep their
        running values.  An invalid config changes nothing and is reported problem by
        problem."""
        try:
            if config is None:
                if self.config_path is None:
                    log.warning("reload: the config was not loaded from a file; nothing to read")
                    return False
                config = await asyncio.to_thread(load_config, self.config_path)
            config = self._keep_restart_only(config)
            self.notify.reload(config)
        except ConfigError as exc:
            log.error("reload: configuration rejected, keeping the running one:")
            for problem in exc.problems:
                log.error("  %s", problem)
            return False
        changes = await self._on_pipeline(self._swap_pipeline, config)
        self.config = config
        await self._restart_sources(config)
        self._dispatch_all(changes)
        settle_heap()  # the replaced pipeline and config are garbage now
        self.reloads += 1
        log.info("reload: applied %s", self.config_path or "the new configuration")
        return True

    def _keep_restart_only(self, config: Config) -> Config:
        changed = [k for k in RESTART_ONLY if getattr(config, k) != getattr(self.config, k)]
        if changed:
            log.warning("reload: %s need a restart; keeping the running values", ", ".join(changed))
            config = config.model_copy(update={k: getattr(self.config, k) for k in changed})
        return config

    def _swap_pipeline(self, config: Config) -> list[AlertChange]:
        old = self.pipeline
        det = old.detector
        header = det.state_header()
        arrays = {**det.state_arrays("fast"), **det.state_arrays("slow")}
        new = Pipeline(config, self._extra_sources(config))
        now = time.time()
        changes = new.load_state(old.to_state(), [(header, arrays)], now)
        new.ledger = {n: rows for n, rows in old.ledger.items() if n in new.sources}
        new.last_tick_seconds = old.last_tick_seconds
        new.adopt_history(old)
        new.start(now)
        for name, clock in old.clock.sources.items():
            if name in new.clock.sources:
                new.clock.sources[name] = clock
        self._dropped_ledgers += [n for n in old.sources if n not in new.sources]
        self.pipeline = new
        self._record_and_save(changes, force=True)
        return changes

    async def _restart_sources(self, config: Config) -> None:
        wanted = {s.name: s for s in config.sources}
        stopped = False
        for name in list(self.sources):
            rs = self.sources[name]
            keep = name in self._given or wanted.get(name) == rs.settings
            if keep and name in self.pipeline.sources:
                continue
            del self.sources[name]
            stopped = True
            if rs.task is not None:
                rs.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await rs.task
        if stopped:
            # A rebuilt source starts from its saved position and ledger rows.  A stopped
            # source's last batches may still be applying on the pipeline thread (a cancelled
            # emit does not stop it) and their rows are not saved until a tick closes: the new
            # source would find those files unknown and count them again.  Queued behind them
            # on the same thread, save everything before any new source reads it.
            await self._on_pipeline(self._record_and_save, [], True)
        for name in self.pipeline.sources:
            if name in self.sources:
                continue
            try:
                rs = self._build(name, config)
            except (SourceUnavailable, OSError, ValueError) as exc:
                log.error("reload: source %s cannot start: %s", name, exc)
                continue
            self.sources[name] = rs
            if self._tg is not None:
                rs.task = self._tg.create_task(self._run_source(rs))


async def run_until_signalled(service: Service) -> None:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    loop.add_signal_handler(signal.SIGHUP, service.request_reload)
    with contextlib.suppress(asyncio.CancelledError):
        await service.run()
