"""Notifications: the service's one entry point for alert delivery.

- ``record(changes)`` — called on the pipeline thread *before* the detector state that
  produced the changes is saved: routes each change and writes the resulting rows to the
  outbox in one transaction (``exporters/recording.py``).  A crash after it and before the
  state save re-evaluates the tick and may queue the same alert again (at-least-once), never
  nothing.
- ``run()`` — one supervised delivery worker per channel (``exporters/workers.py``), plus
  housekeeping every second: repeats, silences that ended, flapping alerts that settled,
  rows of removed destinations, dead-letter retention.
- ``reload(config)`` — SIGHUP: destinations, filters, silences and secrets are rebuilt aside
  from a config that has already validated (``exporters/destinations.py``); if building fails
  (a secret missing) it raises ConfigError and nothing changes.
- every failed write: the disk-full fallback (``exporters/diskfull.py``), whose held changes
  survive a kill in a journal; ``firing(fp)``: whether an alert is open as far as the router
  knows (the service's own alarms, after a restart).
- ``views`` (the channels, for ``/metrics``), ``api()`` (``exporters/notify_api.py``),
  ``stats()``.

Threads.  The pipeline thread calls ``record`` and ``firing``; the outbox thread runs
``reconcile`` and ``api``; a scrape reads ``views`` from a worker thread; the event loop owns
the workers.  Everything one configuration produced (its destinations and its channels) is one
immutable ``_Active``, replaced by a single assignment under ``_lock``; the writers (``record``,
``reconcile``, the sweep of removed destinations) take the same lock and
read it once, so each works with one configuration from start to end, and a reload can
neither lose a change nor queue one twice.  Readers take no lock: they read one snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alarm.detector.alerts import AlertChange
from alarm.settings import ConfigError
from alarm.state import storage_cause
from exporters.channels import ChannelSet, LiveChannels, channel_set
from exporters.destinations import DestinationSet, build_destinations
from exporters.diskfull import ERROR_LOG_EVERY, HeldChanges
from exporters.notify_api import notifications_body
from exporters.outbox import ChannelStats, Outbox
from exporters.recording import dead_letter_orphans, plan_changes, write_plan
from exporters.routing import NOTIFIABLE
from exporters.workers import Workers

if TYPE_CHECKING:  # the assembled model: importing it imports every source type's settings
    from alarm.config import Config

log = logging.getLogger("capalarm.notify")

HOUSEKEEPING_SECONDS = 1.0
PURGE_EVERY = 3600.0
STATS_MAX_AGE = 0.5  # a scrape reads queue figures at most this old


@dataclass(slots=True, frozen=True)
class _Active:
    """Everything built from one configuration; replaced whole on reload."""

    destinations: DestinationSet
    channels: ChannelSet


class _StatsCache:
    """Queue depth, oldest row and dead letters per channel, read from the outbox at most
    every STATS_MAX_AGE: every channel's figures in one scrape cost one query."""

    def __init__(self, outbox: Outbox):
        self._outbox = outbox
        self._cached: tuple[float, Mapping[str, ChannelStats]] = (-STATS_MAX_AGE, {})

    def __call__(self, fresh: bool = False) -> Mapping[str, ChannelStats]:
        at, cached = self._cached  # one read: any thread may be refreshing it
        now = time.monotonic()
        if fresh or now - at > STATS_MAX_AGE:
            try:
                cached = self._outbox.stats()
            except sqlite3.Error:
                return cached
            self._cached = (now, cached)
        return cached


class Notifications:
    def __init__(
        self,
        config: Config,
        status_page: str | None = None,
        write_lock: threading.Lock | None = None,
    ):
        """``write_lock``: the state store's (StateStore.write_lock), so that the outbox and
        the state save never wait on each other inside SQLite (alarm/state.py)."""
        self.outbox = Outbox(Path(config.state_dir) / "capalarm.db", write_lock=write_lock)
        host, port = config.http.host_port()
        dests = build_destinations(config, status_page or f"http://{host}:{port}/")
        self._stats = _StatsCache(self.outbox)
        self._active = _Active(dests, channel_set(dests, None, self._stats))
        self._lock = threading.Lock()
        self._held = HeldChanges(self.outbox.path)
        self._forget_gone_rows()
        self._journal_deliveries(self._active.channels)
        # What the event loop owns while run() runs.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._workers: Workers | None = None
        self._orphans_due = True  # sweep rows of removed destinations at the next housekeeping
        self.housekeeping_errors = 0
        # Alert changes older than what the router remembers of their alert (the ticks a
        # restarted service evaluates again): not routed again (exporters/recording.py).
        self.replayed = 0
        self.views = LiveChannels(lambda: self._active.channels.views)

    # -- configuration -------------------------------------------------------------------
    def set_status_page(self, url: str) -> None:
        """The service's own address, once its port is known (unless external_url is set)."""
        with self._lock:
            dests = self._active.destinations
            if not dests.config.links.external_url:
                dests.links.status_page = url  # one attribute every sender reads per send

    def reload(self, config: Config) -> None:
        """Replace destinations, routes and silences.  Raises ConfigError — and only that —
        changing nothing; safe from any thread."""
        try:
            dests = build_destinations(config, self._active.destinations.links.status_page)
        except ConfigError:
            raise
        except Exception as exc:  # a bug building a sender must not stop the service
            log.exception("notifications: cannot build the destinations of the new config")
            raise ConfigError([f"notifications: {type(exc).__name__}: {exc}"]) from exc
        with self._lock:
            # Built from the running set (channels that stay keep their counters and held
            # rows) under the lock, so two reloads never build from the same previous set.
            self._active = _Active(dests, channel_set(dests, self._active.channels, self._stats))
            self._journal_deliveries(self._active.channels)
            self._orphans_due = True
        self._on_loop(self._sync_workers)
        log.info(
            "notifications reloaded: %d destinations, %d silences",
            len(dests.destinations),
            len(dests.config.silences),
        )

    def _forget_gone_rows(self) -> None:
        """Unsettled keys whose rows are no longer queued (their delete committed after all,
        or a removed destination's rows went to the dead letters) leave the journal at start:
        nothing is left to keep from being sent, and they would fill it run after run."""
        journal = self._held.journal
        keys = journal.unsettled_keys()
        if not keys:
            return
        try:
            with self.outbox.reading() as tx:
                queued = tx.queued_keys(keys)
        except sqlite3.Error:
            return  # kept: a worker that claims one of their rows settles it
        journal.settled(keys - queued)

    def _journal_deliveries(self, channels: ChannelSet) -> None:
        """A row delivered from memory is written to the held-changes journal at once, so a
        killed process's successor does not send it again (exporters/diskfull.py)."""
        for mem in channels.memory.values():
            mem.listener = self._held.journal.delivered
            mem.stored_listener = self._held.journal.unsettled

    # -- recording (pipeline thread; reconcile on the outbox thread) ------------------------
    def record(self, changes: list[AlertChange], now: float | None = None) -> int:
        """Route and store the firing/resolved changes.  Returns rows queued."""
        new = [c.to_dict() for c in changes if c.state in NOTIFIABLE]
        held = self._held
        if not new and not held.changes and held.error is None and not held.delivered:
            return 0
        return self._persist(new, time.time() if now is None else now, reconcile=False)

    def reconcile(self, now: float | None = None) -> int:
        """Time-driven decisions: repeats, silences that ended, flapping alerts that settled,
        held changes after a write failure.  Returns rows queued."""
        return self._persist([], time.time() if now is None else now, reconcile=True)

    def firing(self, fingerprint: str) -> bool:
        """Whether the router remembers this alert firing: its last change held in memory (or
        in the journal of a killed process), else stored."""
        with self._lock:
            for change in reversed(self._held.changes):
                if change.get("fingerprint") == fingerprint:
                    return change.get("state") == "firing"
            try:
                with self.outbox.reading() as tx:
                    stored = tx.alert(fingerprint)
            except sqlite3.Error:
                return False
            return stored is not None and stored[0] == "firing"

    def _persist(self, new: list[dict[str, Any]], now: float, reconcile: bool) -> int:
        with self._lock:
            active = self._active
            changes = self._held.to_write(new, now)
            delivered = active.channels.delivered_from_memory() | self._held.delivered
            try:
                with self.outbox.transaction() as tx:
                    plan = plan_changes(tx, active.destinations, changes, now, reconcile)
                    write_plan(tx, plan, delivered, now)
            except (sqlite3.Error, OSError) as exc:
                self._hold(active, [*self._held.changes, *new], exc, now)
                return 0
            if plan.replayed:
                self.replayed += plan.replayed
                log.info(
                    "notifications: %d alert changes were already decided (ticks evaluated "
                    "again after a restart): not sent again",
                    plan.replayed,
                )
            if self._held.error is not None:
                active.channels.stored()
            self._held.stored()
            # Sent from memory while this write ran: their rows were queued by it, and the
            # journal's delivered keys it cleared no longer say so.  Kept as unsettled (sent,
            # queued): the worker that claims such a row deletes it without sending it.
            late = active.channels.delivered_from_memory() - delivered
            if late:
                self._held.journal.unsettled(late)
            active.channels.forget_delivered(delivered | late)
            return len(plan.rows)

    def _hold(
        self, active: _Active, pending: list[dict[str, Any]], exc: BaseException, now: float
    ) -> None:
        """A write failed (lock held): keep the changes, deliver their rows from memory."""
        journal = self._held.journal
        left_out = journal.lost
        changes, lost = self._held.failed(pending, exc, now)
        left_out = journal.lost - left_out
        for ch in active.channels.views:
            ch.dropped += lost
            ch.unjournaled += left_out
        try:
            with self.outbox.reading() as tx:
                plan = plan_changes(tx, active.destinations, changes, now, reconcile=False)
        except sqlite3.Error as read_exc:
            log.error("notifications: cannot even read %s: %s", self.outbox.path, read_exc)
            return
        done = self._held.delivered  # by the process before this one, from its journal
        active.channels.hold([r for r in plan.rows if r.idem_key not in done], now)

    def _sweep_orphans(self, now: float) -> None:
        """Rows queued for a destination that is no longer configured move to the dead
        letters (under the lock: no record can queue for a channel while it is swept)."""
        with self._lock:
            if not self._orphans_due:
                return
            known = self._active.channels.by_name.keys()
            with self.outbox.transaction() as tx:
                moved = dead_letter_orphans(tx, known, now)
            self._orphans_due = False
        for channel, n in moved.items():
            log.error(
                "notifications: %d queued for removed destination %s moved to dead letters",
                n,
                channel,
            )

    # -- delivery (event loop) -------------------------------------------------------------
    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._workers = Workers(self.outbox, self._held.journal)
        try:
            self._sync_workers()
            await self._housekeeping()
        finally:
            workers, self._workers, self._loop = self._workers, None, None
            await workers.stop()

    def wake(self) -> None:
        """New rows are stored: the workers look now.  Safe from any thread."""
        self._on_loop(self._wake_workers)

    def _wake_workers(self) -> None:
        if self._workers is not None:
            self._workers.wake()

    def _sync_workers(self) -> None:
        if self._workers is not None:
            active = self._active
            self._workers.sync(active.destinations, active.channels)

    def _on_loop(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop that runs the workers: now if this is that loop's thread,
        else soon.  Nothing to do when they are not running."""
        loop = self._loop
        if loop is None:
            return
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is loop:
            fn()
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(fn)

    async def _housekeeping(self) -> None:
        last_purge = last_error_log = 0.0
        while True:
            await asyncio.sleep(HOUSEKEEPING_SECONDS)
            now = time.time()
            try:
                if self._orphans_due:
                    await self.outbox.call(self._sweep_orphans, now)
                queued = await self.outbox.call(self.reconcile, now)
                if queued or self._held.error is not None:
                    self._wake_workers()
                if now - last_purge > PURGE_EVERY:
                    last_purge = now
                    retention = self._active.destinations.config.outbox.dead_letter_retention
                    await self.outbox.call(self.outbox.purge_dead, now - retention)
            except Exception as exc:
                # A failed pass is tried again in a second; it must not stop delivery.  Counted
                # every time, logged at most once a minute (a full disk fails every pass).
                self.housekeeping_errors += 1
                if now - last_error_log >= ERROR_LOG_EVERY:
                    last_error_log = now
                    stored = isinstance(exc, sqlite3.Error | OSError)
                    log.error(
                        "notifications: housekeeping failed (%d times so far): %s; trying "
                        "again every %.0fs",
                        self.housekeeping_errors,
                        f"{storage_cause(exc, self.outbox.path)} ({exc})" if stored else exc,
                        HOUSEKEEPING_SECONDS,
                        exc_info=not stored,
                    )

    # -- what exporters read ---------------------------------------------------------------
    def stats(self) -> Mapping[str, ChannelStats]:
        return self._stats()

    async def api(self, dead_limit: int = 50, head_limit: int = 20) -> dict[str, Any]:
        """The body of /api/v1/notifications."""
        return await self.outbox.call(self._api, dead_limit, head_limit)

    def _api(self, dead_limit: int, head_limit: int) -> dict[str, Any]:
        active = self._active
        return notifications_body(
            self.outbox,
            active.destinations,
            active.channels,
            self._held,
            self._stats(fresh=True),
            time.time(),
            housekeeping_errors=self.housekeeping_errors,
            dead_limit=dead_limit,
            head_limit=head_limit,
        )

    def close(self) -> None:
        self.outbox.close()
        self._held.journal.close()
