"""Delivery: one worker per channel takes due rows from the outbox, sends them, and settles
each one — delivered (deleted), retried later (backoff with jitter, or the receiver's
Retry-After), or dead-lettered (rejected, too many attempts, or older than the maximum age).

Order is kept per alert: a worker never has two rows of the same order key in flight, and the
outbox only offers the oldest row of each key.  Different alerts go out in parallel, up to the
destination's ``concurrency``, so a backlog drains at the receiver's pace, not one round trip
at a time.

A delivered row whose delete cannot be written (disk full) is not sent again: by this worker,
which retries the delete after a backoff, nor, after a kill, by the next process, because its
key is written to the held-changes journal first (exporters/diskfull.py).  A worker that claims
a row whose key the journal holds counts it delivered and deletes it without sending it; the
key leaves the journal once that delete has committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urljoin

import aiohttp

from alarm import __version__
from alarm.collectors.registry.sight import shown_url
from alarm.notify_config import OutboxConfig
from alarm.retryafter import retry_after as parse_retry_after
from exporters.diskfull import Journal
from exporters.outbox import ChannelStats, Outbox, Row, Settle

log = logging.getLogger("capalarm.notify")

USER_AGENT = f"capalarm/{__version__}"
MAX_RETRY_AFTER = 3600.0
WARN_EVERY = 30.0  # seconds between retry warnings of one channel
SETTLE_BACKOFF_MAX = 30.0  # seconds between retries of outcome writes that failed
NETWORK_ERRORS = (aiohttp.ClientError, TimeoutError, OSError)


class LineLimit:
    """One log line per WARN_EVERY at most, saying how many it held back since the last."""

    def __init__(self, what: str) -> None:
        self.what = what  # what the held-back lines were, after "N more"
        self.last = 0.0
        self.quiet = 0

    def due(self, now: float) -> str | None:
        """The suffix of a line to log now (empty when none was held back), or None: held
        back."""
        if now - self.last < WARN_EVERY:
            self.quiet += 1
            return None
        more = f" ({self.quiet} more{self.what} since the last line)" if self.quiet else ""
        self.last, self.quiet = now, 0
        return more


@dataclass(slots=True, frozen=True)
class Outcome:
    ok: bool
    retry: bool = False
    reason: str = ""
    retry_after: float | None = None


DELIVERED = Outcome(ok=True)


def retry(reason: str, after: float | None = None) -> Outcome:
    return Outcome(ok=False, retry=True, reason=reason, retry_after=after)


def reject(reason: str) -> Outcome:
    return Outcome(ok=False, retry=False, reason=reason)


def retry_after(value: str | None, now: float) -> float | None:
    """Retry-After as delay-seconds or an HTTP date, at most MAX_RETRY_AFTER (the one parser
    every client uses: alarm/retryafter.py)."""
    return parse_retry_after(value, now, MAX_RETRY_AFTER)


def post(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: Mapping[str, str]
) -> contextlib.AbstractAsyncContextManager[aiohttp.ClientResponse]:
    """POST one notification to its configured URL, and only there.  aiohttp follows
    redirects by default: a 301/302/303 would turn the POST into a bodiless GET whose 200
    counted as delivered (the alert lost, silently), and a 307/308 would carry the signed body
    and the configured secret headers to whatever origin the Location names.  Every sender
    posts through here so that none can forget it; the 3xx is read by :func:`redirected`."""
    return session.post(url, data=body, headers=headers, allow_redirects=False)


def redirected(status: int, location: str | None, url: str, *, path_is_secret: bool) -> Outcome:
    """A 3xx to a notification: not followed, so not delivered, and retried like any other
    failure (a receiver moved by mistake is fixed by its operator, and the queue then drains).
    The reason names where it pointed, with the userinfo and query cut (they may hold
    credentials, and the reason is shown on the API); only the origin where the path is the
    secret (a Slack webhook redirected to its https twin would name its token)."""
    if not location:
        return retry(f"HTTP {status} without a Location; redirects are not followed")
    where = urljoin(url, location)
    if path_is_secret:
        where = urljoin(where, "/")
    return retry(
        f"HTTP {status} redirect to {shown_url(where)} not followed: notifications go only to "
        "the configured URL"
    )


def classify(
    status: int,
    headers: Mapping[str, str],
    body: str,
    now: float,
    *,
    url: str,
    path_is_secret: bool = False,
) -> Outcome:
    """The common reading of an HTTP answer to a POST to ``url``: 2xx delivered; a 3xx, 408,
    429 and 5xx retried (after Retry-After when given); any other 4xx is the receiver refusing
    this notification, which sending it again would not change."""
    snippet = body[:200].replace("\n", " ")
    if 200 <= status < 300:
        return DELIVERED
    if 300 <= status < 400:
        return redirected(status, headers.get("Location"), url, path_is_secret=path_is_secret)
    if status in (408, 429) or status >= 500:
        return retry(
            f"HTTP {status} {snippet}".strip(), retry_after(headers.get("Retry-After"), now)
        )
    return reject(f"HTTP {status} {snippet}".strip())


def backoff(attempt: int, cfg: OutboxConfig, rng: random.Random) -> float:
    """Exponential, capped, with 'equal jitter': half fixed, half random, so retries of many
    rows after an outage spread out instead of arriving together."""
    delay = min(cfg.max_backoff, cfg.base_backoff * 2 ** max(0, attempt - 1))
    return delay / 2 + rng.uniform(0, delay / 2)


class Sender(Protocol):
    """A destination's protocol: render a row for one target URL and send it."""

    def targets(self) -> list[tuple[str, str]]:
        """Its channels: (channel name, the target shown for it) — one per URL it posts to."""
        ...

    async def send(
        self, session: aiohttp.ClientSession, target: str, row: Row, now: float
    ) -> Outcome: ...


@dataclass(slots=True)
class Channel:
    """One queue of one destination; also the NotifierView that exporters/prometheus.py and
    /api/v1/notifications read."""

    name: str
    destination: str
    type: str
    target: str  # for display: a URL without userinfo and query, or where the secret URL is
    stats: Callable[[], Mapping[str, ChannelStats]] | None = None  # cached outbox figures
    sent: int = 0
    failed: int = 0
    retried: int = 0
    dropped: int = 0
    unpersisted: int = 0  # rows held in memory because the outbox could not be written
    unjournaled: int = 0  # held changes left out of the journal (exporters/diskfull.py)
    restarts: int = 0  # times its worker failed unexpectedly and was started again

    def _figures(self) -> ChannelStats | None:
        return self.stats().get(self.name) if self.stats else None

    @property
    def queue_depth(self) -> int:
        f = self._figures()
        return (f.depth if f else 0) + self.unpersisted

    @property
    def oldest_queued_age(self) -> float:
        f = self._figures()
        return time.time() - f.oldest_created if f and f.oldest_created else 0.0

    @property
    def dead_letters(self) -> int:
        f = self._figures()
        return f.dead if f else 0


class MemoryRows:
    """Rows that could not be written (disk full), sent from memory meanwhile.

    Two threads use it: the pipeline thread replaces the rows at every failed write and clears
    them once a write succeeds; the channel's worker, on the event loop, sends them and records
    what became of each.  One lock makes every method atomic, so a row delivered while the
    pipeline thread is deciding the rows again is never held (and sent) again."""

    __slots__ = (
        "_attempts",
        "_delivered",
        "_ids",
        "_lock",
        "_next_at",
        "_rows",
        "listener",
        "stored_listener",
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: list[Row] = []
        self._next_at: dict[int, float] = {}
        self._attempts: dict[int, int] = {}
        self._delivered: set[str] = set()  # idempotency keys
        self._ids: dict[str, int] = {}  # idempotency key -> stable negative id
        # Told each key delivered (the notifier's held-changes journal, exporters/diskfull.py):
        # ``listener`` while its row is held here, ``stored_listener`` once the write that
        # stored the held rows has cleared them (a send that was in flight then: its row is
        # queued in the outbox now, and must not go out again from there).
        self.listener: Callable[[list[str]], None] | None = None
        self.stored_listener: Callable[[list[str]], None] | None = None

    def __len__(self) -> int:
        return len(self._rows)

    # -- the pipeline thread ---------------------------------------------------------------
    def replace(self, rows: Iterable[Row]) -> int:
        """The rows to hold now (decided again at every failed write); a row keeps its id,
        attempts and backoff across replacements, and one delivered is not held again.
        Returns how many are held."""
        with self._lock:
            held = []
            for r in rows:
                if r.idem_key in self._delivered:
                    continue
                rid = self._ids.setdefault(r.idem_key, -(len(self._ids) + 1))
                held.append(
                    Row(rid, r.channel, r.order_key, r.idem_key, r.event, r.created, 0, r.body)
                )
            self._rows = held
            self._next_at = {r.id: self._next_at.get(r.id, 0.0) for r in held}
            self._attempts = {r.id: self._attempts[r.id] for r in held if r.id in self._attempts}
            return len(held)

    def clear(self) -> None:
        """Everything held is stored now."""
        with self._lock:
            self._rows = []
            self._next_at.clear()
            self._attempts.clear()
            self._ids.clear()

    def delivered_keys(self) -> set[str]:
        """Idempotency keys delivered from memory: not to be queued again once stored."""
        with self._lock:
            return set(self._delivered)

    def forget_delivered(self, keys: set[str]) -> None:
        with self._lock:
            self._delivered -= keys

    # -- the channel's worker --------------------------------------------------------------
    def due(self, now: float) -> list[Row]:
        """Held rows whose next attempt is due, oldest first."""
        with self._lock:
            return [r for r in self._rows if self._next_at.get(r.id, 0.0) <= now]

    def next_due(self) -> float | None:
        with self._lock:
            return min(self._next_at.values(), default=None)

    def attempts(self, row: Row) -> int:
        with self._lock:
            return self._attempts.get(row.id, 0)

    def delivered(self, row: Row) -> None:
        with self._lock:
            held = row.idem_key in self._ids  # else cleared: stored since it was taken
            if held:
                self._delivered.add(row.idem_key)
            self._drop(row)
        tell = self.listener if held else self.stored_listener
        if tell is not None:
            tell([row.idem_key])

    def gave_up(self, row: Row) -> None:
        with self._lock:
            self._drop(row)

    def retry_at(self, row: Row, attempts: int, at: float) -> None:
        with self._lock:
            self._attempts[row.id] = attempts
            self._next_at[row.id] = at

    def _drop(self, row: Row) -> None:
        self._rows = [r for r in self._rows if r.idem_key != row.idem_key]
        self._next_at.pop(row.id, None)


class ChannelWorker:
    def __init__(
        self,
        channel: Channel,
        sender: Sender,
        target: str,
        outbox: Outbox,
        cfg: OutboxConfig,
        *,
        timeout: float,
        concurrency: int,
        max_attempts: int | None,
        memory: MemoryRows,
        journal: Journal | None = None,
        seed: int | None = None,
    ):
        self.channel = channel
        self.sender = sender
        self.target = target
        self.outbox = outbox
        self.cfg = cfg
        self.timeout = timeout
        self.concurrency = concurrency
        self.max_attempts = max_attempts
        self.memory = memory
        self.journal = journal  # where unsettled keys survive a kill (module docstring)
        self._rng = random.Random(seed)
        self._wake = asyncio.Event()
        # Rows claimed ahead, so that a backlog costs one query per batch, not per send.  Safe:
        # a claimed row is the oldest of its alert and stays so until this worker settles it.
        self._buffer: deque[Row] = deque()
        self._prefetch = max(64, 4 * concurrency)
        # Outcomes are written in batches, one transaction per batch, by one task at a time:
        # a round trip to the database thread per send would cost more than the send.
        self._ops: list[Settle] = []
        self._settling: dict[int, str] = {}  # row id -> order key, until its outcome commits
        # Delivered, but the delete did not commit (disk full): row id -> idempotency key.
        self._unacked: dict[int, str] = {}
        self._flush: asyncio.Task[None] | None = None
        self._retry_lines = LineLimit(" failed attempts")
        self._settle_lines = LineLimit("")
        self._settle_backoff = 0.0  # after failed outcome writes: seconds to the next retry
        self._settle_retry_at = 0.0
        # Failures since the last success, and whether any was the receiver asking us to slow
        # down: when it answers again after an outage, what waits in backoff is sent now.
        self._failing = False
        self._throttled = False
        self._expediting: asyncio.Task[None] | None = None

    def update(
        self, sender: Sender, target: str, cfg: OutboxConfig, max_attempts: int | None
    ) -> None:
        """A reload that changed what is read per send (secrets, URL, retry limits) but not the
        session (timeout, concurrency): the worker goes on, nothing in flight is cut.  Event
        loop thread only, like the worker itself."""
        self.sender, self.target, self.cfg, self.max_attempts = sender, target, cfg, max_attempts
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        connector = aiohttp.TCPConnector(limit=self.concurrency)
        inflight: dict[asyncio.Task[None], Row] = {}
        async with aiohttp.ClientSession(
            timeout=timeout, connector=connector, headers={"User-Agent": USER_AGENT}
        ) as session:
            try:
                while True:
                    self._wake.clear()
                    self._start_flush()
                    free = self.concurrency - len(inflight)
                    if free > 0:
                        busy = {r.order_key for r in inflight.values()}
                        busy.update(self._settling.values())
                        for row in await self._claim(free, busy):
                            task = asyncio.create_task(self._deliver(session, row))
                            inflight[task] = row
                    waiter = asyncio.ensure_future(self._wake.wait())
                    delay = await self._idle_delay() if len(inflight) < self.concurrency else None
                    done, _ = await asyncio.wait(
                        {waiter, *inflight}, timeout=delay, return_when=asyncio.FIRST_COMPLETED
                    )
                    waiter.cancel()
                    for task in done:
                        inflight.pop(task, None)  # type: ignore[call-overload]
            finally:
                for task in inflight:
                    task.cancel()
                await asyncio.gather(*inflight, return_exceptions=True)
                # Best effort: what was delivered is deleted now rather than sent again later.
                if self._flush is not None:
                    await asyncio.gather(self._flush, return_exceptions=True)
                self._ops += [Settle("ack", i, key=k) for i, k in self._unacked.items()]
                if self._ops:
                    try:
                        self.outbox.settle(self._ops)
                    except sqlite3.Error:
                        self._journal_unsettled(self._ops)
                    else:
                        self._journal_settled(self._ops)

    async def _idle_delay(self) -> float:
        now = time.time()
        try:
            due = await self.outbox.call(self.outbox.next_due, self.channel.name)
        except sqlite3.Error:
            due = None
        mem = self.memory.next_due()
        candidates = [d for d in (due, mem) if d is not None]
        if not candidates:
            return 1.0
        return min(1.0, max(0.005, min(candidates) - now))

    async def _claim(self, free: int, busy: set[str]) -> list[Row]:
        now = time.time()
        if not self._buffer:
            try:
                claimed = await self.outbox.call(
                    self.outbox.claim, self.channel.name, now, self._prefetch, busy
                )
            except sqlite3.Error as exc:
                log.error("%s: cannot read the outbox: %s", self.channel.name, exc)
                claimed = []
            skip = self._unacked.keys() | self._settling.keys()
            self._buffer.extend(self._not_delivered(r for r in claimed if r.id not in skip))
        rows: list[Row] = []
        while self._buffer and len(rows) < free:
            rows.append(self._buffer.popleft())
        busy |= {r.order_key for r in rows}
        for r in self.memory.due(now):
            if len(rows) >= free:
                break
            if r.order_key in busy:
                continue
            busy.add(r.order_key)  # one per key, oldest first; and never ahead of stored rows
            if await self.outbox.call(self.outbox.has_pending, self.channel.name, r.order_key):
                continue
            rows.append(r)
        return rows

    def _not_delivered(self, rows: Iterable[Row]) -> list[Row]:
        """``rows`` less those the journal holds as delivered: a killed process (or this
        channel's previous worker) sent them and could not write their delete.  Each is
        counted delivered and its delete queued, as if this worker had just sent it."""
        done = self.journal.delivered_keys() if self.journal is not None else frozenset()
        if not done:
            return list(rows)
        out: list[Row] = []
        settled = 0
        now = time.time()
        for r in rows:
            if r.idem_key not in done:
                out.append(r)
                continue
            op = self._settle(r, DELIVERED, now)
            if op is not None:
                self._ops.append(op)
                self._settling[r.id] = r.order_key
                settled += 1
        if settled:
            log.warning(
                "%s: %d notifications were delivered before (their delete could not be "
                "written): deleted, not sent again",
                self.channel.name,
                settled,
            )
            self._wake.set()
        return out

    def _journal_unsettled(self, ops: Iterable[Settle]) -> None:
        if self.journal is not None:
            self.journal.unsettled(op.key for op in ops if op.kind == "ack" and op.key)

    def _journal_settled(self, ops: Iterable[Settle]) -> None:
        if self.journal is not None:
            self.journal.settled(op.key for op in ops if op.kind == "ack")

    async def _deliver(self, session: aiohttp.ClientSession, row: Row) -> None:
        try:
            outcome = await self.sender.send(session, self.target, row, time.time())
        except NETWORK_ERRORS as exc:
            outcome = retry(f"{type(exc).__name__}: {exc}".strip(": "))
        except ValueError as exc:  # a garbage answer that did not parse
            outcome = retry(f"bad answer: {exc}")
        except Exception as exc:  # a bug rendering this row: keep it visible, not looping
            log.exception("%s: cannot send %s", self.channel.name, row.idem_key)
            outcome = reject(f"internal error: {type(exc).__name__}: {exc}")
        now = time.time()
        if outcome.ok and self._failing:
            self._failing = False
            if not self._throttled:
                self._expediting = asyncio.create_task(self._expedite(now))
            self._throttled = False
        elif not outcome.ok and outcome.retry:
            self._failing = True
            self._throttled |= outcome.retry_after is not None or "HTTP 429" in outcome.reason
        op = self._settle(row, outcome, now)
        if op is not None:
            self._ops.append(op)
            self._settling[row.id] = row.order_key
        self._wake.set()

    async def _expedite(self, now: float) -> None:
        """The receiver is back: rows in backoff need not wait out their timers (not after a
        429 or Retry-After, which asked for the wait)."""
        try:
            n = await self.outbox.call(self.outbox.expedite, self.channel.name, now)
        except sqlite3.Error:
            return
        if n:
            log.info(
                "%s: receiver answers again; %d queued notifications sent now", self.channel.name, n
            )
            self._wake.set()

    def _start_flush(self) -> None:
        if self._flush is not None and not self._flush.done():
            return
        if self._unacked and time.time() >= self._settle_retry_at:
            for row_id, key in self._unacked.items():
                self._ops.append(Settle("ack", row_id, key=key))
                self._settling.setdefault(row_id, "")
            self._unacked.clear()
        if self._ops:
            ops, self._ops = self._ops, []
            self._flush = asyncio.create_task(self._apply(ops))

    async def _apply(self, ops: list[Settle]) -> None:
        failed = False
        try:
            await self.outbox.call(self.outbox.settle, ops)
            self._journal_settled(ops)  # committed: only now may their keys leave the journal
        except sqlite3.Error as exc:
            failed = True
            # First, before the line: a kill -9 from now on must not send these rows again.
            self._journal_unsettled(ops)
            now = time.time()
            more = self._settle_lines.due(now)
            if more is not None:
                log.error(
                    "%s: cannot record %d delivery outcomes: %s%s",
                    self.channel.name,
                    len(ops),
                    exc,
                    more,
                )
            # Delivered rows must not go out again from this process: retry their deletes,
            # after a backoff (a full disk spun the worker, its writes and this line hundreds
            # of times a second).  A failed retry or dead-letter leaves the row due, so it is
            # simply tried again.
            self._unacked.update((op.row_id, op.key) for op in ops if op.kind == "ack")
            self._settle_backoff = min(SETTLE_BACKOFF_MAX, 2.0 * self._settle_backoff or 0.5)
            self._settle_retry_at = now + self._settle_backoff
        finally:
            for op in ops:
                self._settling.pop(op.row_id, None)
            if not failed:
                self._settle_backoff = 0.0
                self._wake.set()

    def _settle(self, row: Row, outcome: Outcome, now: float) -> Settle | None:
        """Count and log an outcome; return what to write (None: a row held in memory)."""
        ch = self.channel
        in_memory = row.id < 0
        if outcome.ok:
            ch.sent += 1
            if in_memory:
                self.memory.delivered(row)
                return None
            return Settle("ack", row.id, key=row.idem_key)
        attempts = (self.memory.attempts(row) if in_memory else row.attempts) + 1
        age = now - row.created
        give_up = None
        if not outcome.retry:
            give_up = f"rejected: {outcome.reason}"
        elif age >= self.cfg.max_age:
            give_up = f"undelivered after {attempts} attempts over {age:,.0f}s: {outcome.reason}"
        elif self.max_attempts is not None and attempts >= self.max_attempts:
            give_up = f"gave up after {attempts} attempts: {outcome.reason}"
        if give_up:
            ch.failed += 1
            log.error(
                "%s: dead letter %s (%s %s/%s): %s",
                ch.name,
                row.idem_key,
                row.event,
                row.body.get("change", {}).get("rule"),
                row.order_key,
                give_up,
            )
            if in_memory:
                self.memory.gave_up(row)
                return None
            return Settle("dead", row.id, now, give_up)
        ch.retried += 1
        delay = backoff(attempts, self.cfg, self._rng)
        if outcome.retry_after is not None:
            delay = max(delay, outcome.retry_after)
        # At most one line per channel per WARN_EVERY: an outage with a backlog of thousands
        # must not bury the log (the metrics count every retry).
        more = self._retry_lines.due(now)
        if more is not None:
            log.warning(
                "%s: attempt %d of %s failed (%s); next in %.1fs%s",
                ch.name,
                attempts,
                row.idem_key,
                outcome.reason,
                delay,
                more,
            )
        if in_memory:
            self.memory.retry_at(row, attempts, now + delay)
            return None
        return Settle("retry", row.id, now + delay, outcome.reason)
