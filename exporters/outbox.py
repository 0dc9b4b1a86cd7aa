"""The durable outbox: notifications in the service's SQLite database, written before they are
sent and deleted only once a receiver has accepted them.

Tables (beside the state store's ``kv``; their own connection to the same WAL-mode file):

- ``notify_outbox``: one row per notification per channel (a destination, or one URL of a
  destination with several).  ``order_key`` is the alert's fingerprint: only the oldest row of a
  key is ever eligible, so a resolve never overtakes its trigger.  ``idem_key`` is chosen once,
  at insert, and goes out with every attempt (``webhook-id``, PagerDuty ``dedup_key``...).
- ``notify_dead``: what could not be delivered (rejected, or older than the maximum age), kept
  for the API, the metrics and an operator.
- ``notify_alerts`` / ``notify_sent``: the router's memory (each alert's state and recent
  transitions; what each destination was last sent), written in the same transaction as the
  rows it decides, so a crash never separates a decision from its notification.

Durability: every write is a committed transaction (WAL, ``synchronous=NORMAL``): a process
killed at any point loses nothing that was committed; a power cut may lose the last commits,
the same as the detector state beside it.  Delivery is at-least-once: a row whose send was
in flight when the process died is sent again, with the same idempotency key.

Locks.  Writes wait for SQLite's write lock at most ``BUSY_TIMEOUT`` (alarm/state.py): the
pipeline thread records alert changes, and a database held by another process (a backup, an
operator's ``sqlite3`` in a transaction) must not stop it; a write that cannot get the lock
fails at once and its changes are held in memory (exporters/diskfull.py).  This process's own
writers (the state save, the outbox) take the state store's ``write_lock`` first, so they wait
for each other there, never inside SQLite.

All methods are synchronous and serialised by one lock; the event loop calls them through
``call`` (a single worker thread), the pipeline thread calls ``transaction`` directly.  A delivery
outcome is written with ``settle`` (a batch: delete, retry later, or dead-letter).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import threading
from collections.abc import Callable, Collection, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from alarm.state import BUSY_TIMEOUT, WAL_LIMIT

T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS notify_outbox (
    id INTEGER PRIMARY KEY,
    channel TEXT NOT NULL,
    order_key TEXT NOT NULL,
    idem_key TEXT NOT NULL,
    event TEXT NOT NULL,
    created REAL NOT NULL,
    next_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT NOT NULL DEFAULT '',
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS notify_outbox_order ON notify_outbox (channel, order_key, id);
CREATE INDEX IF NOT EXISTS notify_outbox_channel ON notify_outbox (channel);
CREATE TABLE IF NOT EXISTS notify_dead (
    id INTEGER PRIMARY KEY,
    channel TEXT NOT NULL,
    order_key TEXT NOT NULL,
    idem_key TEXT NOT NULL,
    event TEXT NOT NULL,
    created REAL NOT NULL,
    died REAL NOT NULL,
    attempts INTEGER NOT NULL,
    reason TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS notify_dead_channel ON notify_dead (channel, died);
CREATE TABLE IF NOT EXISTS notify_alerts (
    fingerprint TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    change TEXT NOT NULL,
    changed REAL NOT NULL,
    transitions TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS notify_sent (
    dest TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    state TEXT NOT NULL,
    at REAL NOT NULL,
    seq INTEGER NOT NULL,
    PRIMARY KEY (fingerprint, dest)
);
"""


@dataclass(slots=True, frozen=True)
class Row:
    """One queued notification for one channel."""

    id: int
    channel: str
    order_key: str
    idem_key: str
    event: str
    created: float
    attempts: int
    body: dict[str, Any]


@dataclass(slots=True, frozen=True)
class NewRow:
    channel: str
    order_key: str
    idem_key: str
    event: str
    body: dict[str, Any]


@dataclass(slots=True, frozen=True)
class Settle:
    """A delivery outcome to write: 'ack' (delete), 'retry' (at ``at``), 'dead' (at ``at``).
    ``key``: the row's idempotency key, for an 'ack' whose write fails (it goes to the
    held-changes journal, exporters/diskfull.py)."""

    kind: str
    row_id: int
    at: float = 0.0
    reason: str = ""
    key: str = ""


@dataclass(slots=True)
class ChannelStats:
    depth: int = 0
    oldest_created: float | None = None
    dead: int = 0


class Outbox:
    def __init__(self, path: str | Path, write_lock: threading.Lock | None = None):
        """``write_lock``: held around every write transaction, shared with the state store
        of the same file (module docstring)."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE ... COMMIT), so a
        # decision and the rows it produces commit together or not at all.
        self.db = sqlite3.connect(
            self.path, check_same_thread=False, isolation_level=None, timeout=30
        )
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        # When this connection starts the WAL afresh it cuts the file back, as the state
        # store's does (alarm/state.py, "The WAL").
        self.db.execute(f"PRAGMA journal_size_limit={int(WAL_LIMIT)}")
        self._lock = threading.RLock()
        self._write_lock = write_lock if write_lock is not None else threading.Lock()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="capalarm-outbox")
        with self.transaction() as db:
            db.executescript_safe(SCHEMA)
        self.db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT * 1000)}")

    # -- plumbing --------------------------------------------------------------------
    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Transaction]:
        with self._lock, self._write_lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield Transaction(self.db)
                self.db.execute("COMMIT")
            except BaseException:
                # After SQLITE_FULL SQLite may already have rolled back; that is fine.
                with contextlib.suppress(sqlite3.Error):
                    self.db.execute("ROLLBACK")
                raise

    @contextlib.contextmanager
    def reading(self) -> Iterator[Transaction]:
        """A consistent read that never writes: what the router uses to decide while the
        disk is full (its decisions are then delivered from memory, not stored)."""
        with self._lock:
            self.db.execute("BEGIN")
            try:
                yield Transaction(self.db)
            finally:
                with contextlib.suppress(sqlite3.Error):
                    self.db.execute("ROLLBACK")

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        with self._lock:
            self.db.close()

    # -- the queue ---------------------------------------------------------------------
    def claim(self, channel: str, now: float, limit: int, busy: Iterable[str] = ()) -> list[Row]:
        """Up to ``limit`` rows that are due and are the oldest of their order key, skipping
        keys that already have a row in flight (``busy``)."""
        busy = set(busy)
        with self._lock:
            cur = self.db.execute(
                """SELECT id, channel, order_key, idem_key, event, created, attempts, body
                   FROM notify_outbox AS o
                   WHERE channel = ? AND next_at <= ?
                     AND id = (SELECT MIN(id) FROM notify_outbox
                               WHERE channel = o.channel AND order_key = o.order_key)
                   ORDER BY id LIMIT ?""",
                (channel, now, limit + len(busy)),
            )
            rows: list[Row] = []
            for r in cur:
                if r[2] in busy:
                    continue
                rows.append(Row(r[0], r[1], r[2], r[3], r[4], r[5], r[6], json.loads(r[7])))
                if len(rows) >= limit:
                    break
            cur.close()
            return rows

    def next_due(self, channel: str) -> float | None:
        with self._lock:
            row = self.db.execute(
                "SELECT MIN(next_at) FROM notify_outbox WHERE channel = ?", (channel,)
            ).fetchone()
            return row[0] if row else None

    def has_pending(self, channel: str, order_key: str) -> bool:
        with self._lock:
            return Transaction(self.db).has_pending(channel, order_key)

    def settle(self, ops: Iterable[Settle]) -> None:
        """Write a batch of delivery outcomes in one transaction."""
        with self.transaction() as tx:
            for op in ops:
                if op.kind == "retry":
                    tx.db.execute(
                        "UPDATE notify_outbox SET attempts = attempts + 1, next_at = ?, "
                        "last_error = ? WHERE id = ?",
                        (op.at, op.reason[:500], op.row_id),
                    )
                    continue
                if op.kind == "dead":
                    tx.db.execute(
                        """INSERT INTO notify_dead (channel, order_key, idem_key, event, created,
                           died, attempts, reason, body)
                           SELECT channel, order_key, idem_key, event, created, ?, attempts + 1,
                           ?, body FROM notify_outbox WHERE id = ?""",
                        (op.at, op.reason[:500], op.row_id),
                    )
                tx.db.execute("DELETE FROM notify_outbox WHERE id = ?", (op.row_id,))

    def expedite(self, channel: str, now: float) -> int:
        """Make every row of a channel due now (its receiver answered again)."""
        with self.transaction() as tx:
            return int(
                tx.db.execute(
                    "UPDATE notify_outbox SET next_at = ? WHERE channel = ? AND next_at > ?",
                    (now, channel, now),
                ).rowcount
            )

    # -- what the metrics and the API read ---------------------------------------------
    def stats(self) -> dict[str, ChannelStats]:
        out: dict[str, ChannelStats] = {}
        with self._lock:
            for channel, n, oldest in self.db.execute(
                "SELECT channel, COUNT(*), MIN(created) FROM notify_outbox GROUP BY channel"
            ):
                out[channel] = ChannelStats(depth=n, oldest_created=oldest)
            for channel, n in self.db.execute(
                "SELECT channel, COUNT(*) FROM notify_dead GROUP BY channel"
            ):
                out.setdefault(channel, ChannelStats()).dead = n
        return out

    def head(self, channel: str, limit: int) -> list[dict[str, Any]]:
        with self._lock:
            cur = self.db.execute(
                "SELECT id, order_key, idem_key, event, created, next_at, attempts, last_error "
                "FROM notify_outbox WHERE channel = ? ORDER BY id LIMIT ?",
                (channel, limit),
            )
            keys = ("id", "fingerprint", "idempotency_key", "event", "created", "next_attempt_at",
                    "attempts", "last_error")  # fmt: skip
            return [dict(zip(keys, r, strict=True)) for r in cur]

    def dead_letters(self, channel: str | None, limit: int) -> list[dict[str, Any]]:
        where, args = ("WHERE channel = ?", (channel,)) if channel else ("", ())
        with self._lock:
            cur = self.db.execute(
                "SELECT id, channel, order_key, idem_key, event, created, died, attempts, reason, "
                f"body FROM notify_dead {where} ORDER BY id DESC LIMIT ?",
                (*args, limit),
            )
            out = []
            for r in cur:
                body = json.loads(r[9])
                change = body.get("change", {})
                out.append(
                    {
                        "id": r[0],
                        "channel": r[1],
                        "fingerprint": r[2],
                        "idempotency_key": r[3],
                        "event": r[4],
                        "created": r[5],
                        "died": r[6],
                        "attempts": r[7],
                        "reason": r[8],
                        "rule": change.get("rule"),
                        "target": change.get("surface")
                        or change.get("source")
                        or change.get("service"),
                        "summary": change.get("summary", ""),
                    }
                )
            return out

    def purge_dead(self, older_than: float) -> int:
        with self.transaction() as tx:
            return int(
                tx.db.execute("DELETE FROM notify_dead WHERE died < ?", (older_than,)).rowcount
            )


class Transaction:
    """The router's reads and writes inside one transaction (from ``Outbox.transaction`` or,
    read-only, ``Outbox.reading``); valid only inside that ``with`` block."""

    __slots__ = ("db",)

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def executescript_safe(self, script: str) -> None:
        # executescript() would COMMIT the open transaction first; run statement by statement.
        for stmt in script.split(";"):
            if stmt.strip():
                self.db.execute(stmt)

    def insert(self, rows: Iterable[NewRow], now: float) -> None:
        self.db.executemany(
            "INSERT INTO notify_outbox (channel, order_key, idem_key, event, created, next_at, body) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(r.channel, r.order_key, r.idem_key, r.event, now, now, _dumps(r.body)) for r in rows],
        )

    def alerts(self) -> list[tuple[str, str, dict[str, Any], float, list[float]]]:
        return [
            (fp, state, json.loads(change), changed, json.loads(tr))
            for fp, state, change, changed, tr in self.db.execute(
                "SELECT fingerprint, state, change, changed, transitions FROM notify_alerts"
            )
        ]

    def alert(self, fingerprint: str) -> tuple[str, dict[str, Any], float, list[float]] | None:
        r = self.db.execute(
            "SELECT state, change, changed, transitions FROM notify_alerts WHERE fingerprint = ?",
            (fingerprint,),
        ).fetchone()
        return None if r is None else (r[0], json.loads(r[1]), r[2], json.loads(r[3]))

    def put_alert(
        self,
        fingerprint: str,
        state: str,
        change: dict[str, Any],
        changed: float,
        transitions: list[float],
    ) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO notify_alerts VALUES (?, ?, ?, ?, ?)",
            (fingerprint, state, _dumps(change), changed, json.dumps(transitions)),
        )

    def drop_alert(self, fingerprint: str) -> None:
        self.db.execute("DELETE FROM notify_alerts WHERE fingerprint = ?", (fingerprint,))
        self.db.execute("DELETE FROM notify_sent WHERE fingerprint = ?", (fingerprint,))

    def sent(self, fingerprint: str) -> dict[str, tuple[str, float, int]]:
        return {
            dest: (state, at, seq)
            for dest, state, at, seq in self.db.execute(
                "SELECT dest, state, at, seq FROM notify_sent WHERE fingerprint = ?",
                (fingerprint,),
            )
        }

    def put_sent(self, dest: str, fingerprint: str, state: str, at: float, seq: int) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO notify_sent (dest, fingerprint, state, at, seq) "
            "VALUES (?, ?, ?, ?, ?)",
            (dest, fingerprint, state, at, seq),
        )

    def channels_with_rows(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT DISTINCT channel FROM notify_outbox")]

    def dead_channel(self, channel: str, reason: str, now: float) -> int:
        """Dead-letter everything queued for a channel (its destination left the config)."""
        self.db.execute(
            """INSERT INTO notify_dead
               (channel, order_key, idem_key, event, created, died, attempts, reason, body)
               SELECT channel, order_key, idem_key, event, created, ?, attempts, ?, body
               FROM notify_outbox WHERE channel = ? ORDER BY id""",
            (now, reason[:500], channel),
        )
        return int(
            self.db.execute("DELETE FROM notify_outbox WHERE channel = ?", (channel,)).rowcount
        )

    def queued_keys(self, keys: Collection[str]) -> set[str]:
        """Which of ``keys`` a queued row has (a scan of the queue: at start only)."""
        return {k for (k,) in self.db.execute("SELECT idem_key FROM notify_outbox") if k in keys}

    def has_pending(self, channel: str, order_key: str) -> bool:
        return (
            self.db.execute(
                "SELECT 1 FROM notify_outbox WHERE channel = ? AND order_key = ? LIMIT 1",
                (channel, order_key),
            ).fetchone()
            is not None
        )


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)
