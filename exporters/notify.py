"""Notifications: the service's one entry point for alert delivery.

- ``record(changes)`` — called on the pipeline thread *before* the detector state that
  produced the changes is saved: routes each change (exporters/routing.py) and writes the
  resulting rows to the outbox in one transaction.  A crash after it and before the state save
  re-evaluates the tick and may queue the same alert again (at-least-once), never nothing.
- ``run()`` — one delivery worker per channel (exporters/delivery.py), plus housekeeping every
  second: repeats, silences that ended, flapping alerts that settled, dead-letter retention.
- ``reload(config)`` — SIGHUP: destinations, filters, silences and secrets are rebuilt from a
  config that has already validated; if building fails (a secret missing), nothing changes.

When the state directory cannot be written (disk full), nothing is dropped silently: the
changes are kept in memory (bounded), delivered from memory meanwhile, an
``outbox_write_failed`` alert (critical) is raised through every destination, the error is
logged, and ``capalarm_notifier_unpersisted`` shows what waits.  Once a write succeeds again
the held changes are stored, the alert resolves, and rows already delivered from memory are
not queued again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alarm.config import Config, ConfigError
from alarm.detector.alerts import AlertChange, fingerprint
from exporters.alertmanager import AlertmanagerSender
from exporters.delivery import Channel, ChannelWorker, MemoryRows, Sender
from exporters.notify_config import (
    AlertmanagerDestination,
    NotificationsConfig,
    PagerDutyDestination,
    SlackDestination,
    WebhookDestination,
)
from exporters.outbox import ChannelStats, NewRow, Outbox, Row, _Tx
from exporters.pagerduty import PagerDutySender
from exporters.payload import LinkSet
from exporters.routing import (
    NOTIFIABLE,
    AlertMemory,
    Route,
    Sent,
    active_silence,
    decide,
    flapping,
    forgettable,
    observe,
)
from exporters.signing import decode_secret
from exporters.slack import SlackSender
from exporters.webhook import WebhookSender

log = logging.getLogger("capalarm.notify")

HOUSEKEEPING_SECONDS = 1.0
MAX_UNPERSISTED = 10000  # alert changes held in memory while the disk is full
ERROR_LOG_EVERY = 60.0
ALARM_FINGERPRINT = fingerprint("service/outbox", "outbox_write_failed")


def idem_key(channel: str, fp: str, event: str, started_at: Any, seq: int) -> str:
    """Chosen once per notification, stored with it, sent with every attempt."""
    text = f"{channel}\x00{fp}\x00{event}\x00{started_at}\x00{seq}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(slots=True)
class _Destination:
    route: Route
    type: str
    sender: Sender
    targets: list[tuple[str, str]]  # (channel, target URL or description)
    timeout: float
    concurrency: int
    max_attempts: int | None


@dataclass(slots=True)
class _Active:
    """Everything built from one config; replaced whole on reload."""

    cfg: NotificationsConfig
    links: LinkSet
    destinations: list[_Destination] = field(default_factory=list)

    def channels(self) -> dict[str, tuple[_Destination, str]]:
        return {ch: (d, target) for d in self.destinations for ch, target in d.targets}


def destinations_of(config: Config) -> list[Any]:
    """The configured destinations, with the ``webhooks`` shorthand as unsigned webhooks."""
    legacy = [
        WebhookDestination(
            name=w.name or f"webhook{i}",
            url=w.url,
            timeout=w.timeout,
            headers=w.headers,
            max_attempts=w.max_retries + 1,
            body="change",
        )
        for i, w in enumerate(config.webhooks)
    ]
    return [*config.notifications.destinations, *legacy]


def build(config: Config, status_page: str) -> _Active:
    """Destinations with their secrets read.  Raises ConfigError naming the destination."""
    ncfg = config.notifications
    links = LinkSet(ncfg.links.external_url or status_page, ncfg.links.runbook)
    active = _Active(ncfg, links)
    problems: list[str] = []
    seen: set[str] = set()
    top = ncfg.top_contributors
    for i, d in enumerate(destinations_of(config)):
        where = f"notifications.destinations[{i}] ({d.name})"
        if d.name in seen:
            problems.append(f"{where}: name {d.name!r} is declared twice (webhooks included)")
            continue
        seen.add(d.name)
        sender: Any
        try:
            if isinstance(d, WebhookDestination):
                keys = [decode_secret(s) for src in d.secrets for s in src.read_all()]
                sender = WebhookSender(d, links, keys, top)
            elif isinstance(d, AlertmanagerDestination):
                sender = AlertmanagerSender(d, links, top)
            elif isinstance(d, PagerDutyDestination):
                sender = PagerDutySender(d, links, d.routing_key.read_one(), top)
            elif isinstance(d, SlackDestination):
                sender = SlackSender(d, links, d.url.read_one(), top)
            else:  # pragma: no cover - the config's union is closed
                raise ValueError(f"unknown destination type {type(d).__name__}")
        except ValueError as exc:
            problems.append(f"{where}: {exc}")
            continue
        active.destinations.append(
            _Destination(
                route=Route(d.name, d.filter, d.repeat_interval),
                type=d.type,
                sender=sender,
                targets=sender.targets(),
                timeout=d.timeout,
                concurrency=d.concurrency,
                max_attempts=d.max_attempts,
            )
        )
    if problems:
        raise ConfigError(problems)
    return active


@dataclass(slots=True)
class _Plan:
    rows: list[NewRow] = field(default_factory=list)
    alerts: dict[str, AlertMemory] = field(default_factory=dict)
    sent: dict[tuple[str, str], Sent] = field(default_factory=dict)
    drops: set[str] = field(default_factory=set)


class Notifications:
    def __init__(self, config: Config, status_page: str | None = None):
        self.outbox = Outbox(Path(config.state_dir) / "capalarm.db")
        host, port = config.http.host_port()
        self._active = build(config, status_page or f"http://{host}:{port}/")
        self.views: list[Channel] = []  # live: exporters read it at every scrape
        self._channels: dict[str, Channel] = {}
        self._memory: dict[str, MemoryRows] = {}
        self._workers: dict[str, tuple[ChannelWorker, asyncio.Task[None]]] = {}
        self._lock = threading.Lock()  # the pipeline thread and the outbox thread both persist
        self._unpersisted: list[dict[str, Any]] = []
        self._write_error: tuple[float, str] | None = None
        self._last_error_log = 0.0
        self.write_errors = 0
        self._stats_cache: tuple[float, dict[str, ChannelStats]] = (0.0, {})
        self._tg: asyncio.TaskGroup | None = None
        self._sync_views()

    # -- configuration -------------------------------------------------------------------
    def set_status_page(self, url: str) -> None:
        """The service's own address, once its port is known (unless external_url is set)."""
        if not self._active.cfg.links.external_url:
            self._active.links.status_page = url

    def reload(self, config: Config) -> None:
        """Replace destinations, routes and silences.  Raises ConfigError, changing nothing."""
        active = build(config, self._active.links.status_page)
        with self._lock:
            self._active = active
        self._sync_views()
        if self._tg is not None:
            self._restart_workers()
        log.info(
            "notifications reloaded: %d destinations, %d silences",
            len(active.destinations),
            len(active.cfg.silences),
        )

    def _sync_views(self) -> None:
        channels = self._active.channels()
        for name, (d, target) in channels.items():
            ch = self._channels.get(name)
            if ch is None or ch.type != d.type:
                ch = Channel(name, d.route.name, d.type, target, stats=self.stats)
                self._channels[name] = ch
            ch.target = target
            self._memory.setdefault(name, MemoryRows())
        self.views[:] = [self._channels[n] for n in channels]

    # -- recording (pipeline thread) -------------------------------------------------------
    def record(self, changes: list[AlertChange], now: float | None = None) -> int:
        """Route and store the firing/resolved changes.  Returns rows queued."""
        new = [c.to_dict() for c in changes if c.state in NOTIFIABLE]
        if not new and not self._unpersisted and self._write_error is None:
            return 0
        return self._persist(new, time.time() if now is None else now, reconcile=False)

    def reconcile(self, now: float | None = None) -> int:
        """Time-driven decisions: repeats, silences that ended, flapping alerts that settled,
        held changes after a write failure.  Returns rows queued."""
        return self._persist([], time.time() if now is None else now, reconcile=True)

    def storage_failed(self, exc: BaseException) -> None:
        """The state store could not save (the same disk): raise the alarm now."""
        with self._lock:
            self._write_failed(self._active, self._unpersisted, exc, time.time())

    def _persist(self, new: list[dict[str, Any]], now: float, reconcile: bool) -> int:
        with self._lock:
            active = self._active
            pending = self._unpersisted + new
            changes = pending
            if self._write_error is not None:
                since, error = self._write_error
                changes = [
                    self._alarm("firing", since, since, error, len(pending)),
                    *pending,
                    self._alarm("resolved", now, since, error, len(pending)),
                ]
            try:
                with self.outbox.transaction() as tx:
                    plan = self._decide(tx, active, changes, now, reconcile)
                    self._apply(tx, plan, now)
            except (sqlite3.Error, OSError) as exc:
                self._write_failed(active, pending, exc, now)
                return 0
            if self._write_error is not None:
                log.warning(
                    "notifications are stored again in %s; %d held changes written",
                    self.outbox.path,
                    len(pending),
                )
                self._write_error = None
                for name, mem in self._memory.items():
                    mem.clear()
                    if name in self._channels:
                        self._channels[name].unpersisted = 0
            self._unpersisted = []
            return len(plan.rows)

    def _decide(
        self, tx: _Tx, active: _Active, changes: list[dict[str, Any]], now: float, reconcile: bool
    ) -> _Plan:
        plan = _Plan()
        flap = active.cfg.flap

        def memory(fp: str) -> AlertMemory | None:
            if fp in plan.alerts:
                return plan.alerts[fp]
            stored = tx.alert(fp)
            if stored is None:
                return None
            return AlertMemory(fp, stored[0], stored[1], stored[2], stored[3])

        for change in changes:
            fp = str(change["fingerprint"])
            m = observe(memory(fp), change, flap)
            if m is None:
                continue
            plan.alerts[fp] = m
            self._route(tx, active, m, now, plan)
        if reconcile:
            for fp, state, change, changed, transitions in tx.alerts():
                if fp in plan.alerts:
                    continue
                m = AlertMemory(fp, state, change, changed, transitions)
                if forgettable(m, self._sent(tx, fp, plan), flap, now):
                    plan.drops.add(fp)
                    continue
                self._route(tx, active, m, now, plan)
        return plan

    @staticmethod
    def _sent(tx: _Tx, fp: str, plan: _Plan) -> dict[str, Sent]:
        sent = {dest: Sent(*v) for dest, v in tx.sent(fp).items()}
        for (dest, f), s in plan.sent.items():
            if f == fp:
                sent[dest] = s
        return sent

    def _route(self, tx: _Tx, active: _Active, m: AlertMemory, now: float, plan: _Plan) -> None:
        cfg = active.cfg
        severity = cfg.severity(str(m.change.get("rule")))
        sent = self._sent(tx, m.fingerprint, plan)
        for d in active.destinations:
            channels = [ch for ch, _ in d.targets]
            event = decide(
                d.route,
                m,
                sent.get(d.route.name),
                severity,
                silences=cfg.silences,
                flap=cfg.flap,
                now=now,
                queued=lambda chs=channels: any(tx.has_pending(c, m.fingerprint) for c in chs),
            )
            if event is None:
                continue
            prev = sent.get(d.route.name)
            seq = (prev.seq if prev else 0) + 1
            body = {
                "event": event,
                "severity": severity,
                "destination": d.route.name,
                "seq": seq,
                "change": m.change,
            }
            started = m.change.get("started_at")
            for ch in channels:
                key = idem_key(ch, m.fingerprint, event, started, seq)
                plan.rows.append(NewRow(ch, m.fingerprint, key, event, body))
            state = "resolved" if event == "resolved" else "firing"
            plan.sent[(d.route.name, m.fingerprint)] = Sent(state, now, seq)

    def _apply(self, tx: _Tx, plan: _Plan, now: float) -> None:
        for fp, m in plan.alerts.items():
            tx.put_alert(fp, m.state, m.change, m.changed, m.transitions)
        for (dest, fp), s in plan.sent.items():
            tx.put_sent(dest, fp, s.state, s.at, s.seq)
        for fp in plan.drops:
            tx.drop_alert(fp)
        # Rows already delivered from memory while the disk was full are not queued again.
        delivered = set().union(*(m.delivered for m in self._memory.values()))
        tx.insert([r for r in plan.rows if r.idem_key not in delivered], now)
        if delivered:
            for m in self._memory.values():
                m.delivered.clear()

    # -- the disk is full ----------------------------------------------------------------
    def _alarm(self, state: str, at: float, since: float, error: str, held: int) -> dict[str, Any]:
        return AlertChange(
            fingerprint=ALARM_FINGERPRINT,
            target_type="service",
            target="outbox",
            kind="service",
            rule="outbox_write_failed",
            state=state,
            previous="firing" if state == "resolved" else "inactive",
            at=at,
            started_at=since,
            value=float(held),
            threshold=0.0,
            figures={"unpersisted_changes": held},
            summary=(
                f"capalarm cannot write notifications to {self.outbox.path} ({error}); "
                f"{held} alert changes are held in memory and sent from memory until the state "
                "directory has room again"
            )
            if state == "firing"
            else f"capalarm writes notifications to {self.outbox.path} again",
        ).to_dict()

    def _write_failed(
        self, active: _Active, pending: list[dict[str, Any]], exc: BaseException, now: float
    ) -> None:
        self.write_errors += 1
        error = f"{type(exc).__name__}: {exc}"
        if self._write_error is None:
            self._write_error = (now, error)
        if len(pending) > MAX_UNPERSISTED:
            lost = len(pending) - MAX_UNPERSISTED
            pending = pending[lost:]
            for ch in self._channels.values():
                ch.dropped += lost
            log.error("notifications: %d held alert changes dropped (memory bound)", lost)
        self._unpersisted = pending
        if now - self._last_error_log >= ERROR_LOG_EVERY:
            self._last_error_log = now
            log.error(
                "notifications cannot be written to %s: %s — %d alert changes held in memory "
                "and delivered from memory; free space in the state directory",
                self.outbox.path,
                error,
                len(pending),
            )
        since, first_error = self._write_error
        alarm = self._alarm("firing", since, since, first_error, len(pending))
        try:
            with self.outbox.reading() as tx:
                plan = self._decide(tx, active, [alarm, *pending], now, reconcile=False)
        except sqlite3.Error as read_exc:
            log.error("notifications: cannot even read %s: %s", self.outbox.path, read_exc)
            return
        by_channel: dict[str, list[Row]] = {}
        for r in plan.rows:  # ids are given by MemoryRows, stable per idempotency key
            row = Row(0, r.channel, r.order_key, r.idem_key, r.event, now, 0, r.body)
            by_channel.setdefault(r.channel, []).append(row)
        for name, mem in self._memory.items():
            mem.replace(by_channel.get(name, []))
            if name in self._channels:
                self._channels[name].unpersisted = len(mem.rows)

    # -- delivery ------------------------------------------------------------------------
    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            self._restart_workers()
            tg.create_task(self._housekeeping())

    def wake(self) -> None:
        for worker, _ in self._workers.values():
            worker.wake()

    def _restart_workers(self) -> None:
        assert self._tg is not None
        for _worker, task in self._workers.values():
            task.cancel()
        self._workers.clear()
        cfg = self._active.cfg.outbox
        for name, (d, target) in self._active.channels().items():
            worker = ChannelWorker(
                self._channels[name],
                d.sender,
                target,
                self.outbox,
                cfg,
                timeout=d.timeout,
                concurrency=d.concurrency,
                max_attempts=d.max_attempts,
                memory=self._memory[name],
            )
            self._workers[name] = (worker, self._tg.create_task(worker.run()))
        self._tg.create_task(self._dead_letter_orphans_async())

    async def _dead_letter_orphans_async(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            await self.outbox.call(self._dead_letter_orphans, time.time())

    def _dead_letter_orphans(self, now: float) -> None:
        """Rows queued for a destination that is no longer configured: visible, not lost."""
        known = set(self._active.channels())
        for channel in self.outbox.channels_with_rows():
            if channel not in known:
                n = self.outbox.dead_channel(
                    channel, "destination removed from the configuration", now
                )
                log.error(
                    "notifications: %d queued for removed destination %s moved to dead letters",
                    n,
                    channel,
                )

    async def _housekeeping(self) -> None:
        last_purge = 0.0
        while True:
            await asyncio.sleep(HOUSEKEEPING_SECONDS)
            now = time.time()
            queued = await self.outbox.call(self.reconcile, now)
            if queued or self._write_error is not None:
                self.wake()
            if now - last_purge > 3600:
                last_purge = now
                retention = self._active.cfg.outbox.dead_letter_retention
                with contextlib.suppress(sqlite3.Error):
                    await self.outbox.call(self.outbox.purge_dead, now - retention)

    # -- what exporters read -----------------------------------------------------------
    def stats(self) -> dict[str, ChannelStats]:
        at, cached = self._stats_cache
        now = time.monotonic()
        if now - at > 0.5:
            try:
                cached = self.outbox.stats()
            except sqlite3.Error:
                return cached
            self._stats_cache = (now, cached)
        return cached

    async def api(self, dead_limit: int = 50, head_limit: int = 20) -> dict[str, Any]:
        """The body of /api/v1/notifications."""
        return await self.outbox.call(self._api, dead_limit, head_limit)

    def _api(self, dead_limit: int, head_limit: int) -> dict[str, Any]:
        now = time.time()
        active = self._active
        self._stats_cache = (0.0, {})
        stats = self.stats()
        channels = []
        for ch in list(self.views):
            st = stats.get(ch.name, ChannelStats())
            channels.append(
                {
                    "channel": ch.name,
                    "destination": ch.destination,
                    "type": ch.type,
                    "target": ch.target,
                    "sent": ch.sent,
                    "failed": ch.failed,
                    "retried": ch.retried,
                    "dropped": ch.dropped,
                    "queue_depth": st.depth,
                    "oldest_queued_age_seconds": now - st.oldest_created
                    if st.oldest_created
                    else 0.0,
                    "unpersisted": ch.unpersisted,
                    "dead_letters": st.dead,
                    "queued": self.outbox.head(ch.name, head_limit),
                }
            )
        with self.outbox.reading() as tx:
            alerts = tx.alerts()
        flap = active.cfg.flap
        tracked = []
        for fp, state, change, changed, transitions in alerts:
            m = AlertMemory(fp, state, change, changed, transitions)
            severity = active.cfg.severity(str(change.get("rule")))
            silence = active_silence(active.cfg.silences, change, severity, now)
            tracked.append(
                {
                    "fingerprint": fp,
                    "state": state,
                    "rule": change.get("rule"),
                    "target": change.get("surface")
                    or change.get("source")
                    or change.get("service"),
                    "severity": severity,
                    "changed_at": changed,
                    "flapping": flapping(m, flap, now),
                    "silenced_by": silence.comment or "silence" if silence else None,
                }
            )
        return {
            "outbox": {
                "path": str(self.outbox.path),
                "write_error": self._write_error[1] if self._write_error else None,
                "write_errors": self.write_errors,
                "unpersisted_changes": len(self._unpersisted),
            },
            "channels": channels,
            "dead_letters": self.outbox.dead_letters(None, dead_limit),
            "alerts": tracked,
            "silences": [
                {
                    "match": s.match.model_dump(exclude_defaults=True),
                    "starts": s.starts,
                    "ends": s.ends,
                    "comment": s.comment,
                    "active": s.starts <= now < s.ends,
                }
                for s in active.cfg.silences
            ],
        }

    def close(self) -> None:
        self.outbox.close()
