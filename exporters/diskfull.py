"""When the state directory cannot be written (disk full), nothing is dropped silently.

The alert changes that could not be stored are held here, in memory and bounded
(``MAX_UNPERSISTED``; what falls off is counted in every channel's ``dropped`` and logged).
Meanwhile the router's decisions for them are delivered from memory, and an
``outbox_write_failed`` alarm (critical, ``kind: service``) goes to every destination with
them; the error is logged at most once a minute, with its cause in words (locked by another
process, disk full, read-only: alarm/state.py ``storage_cause``).  At each later write the
held changes are offered again, bracketed by that alarm's firing and resolve, so the write that
succeeds stores them and resolves the alarm in one transaction.

A ``kill -9`` while they are held must not forget them: the page that went out from memory
would be sent again by the restarted service (which evaluates the same ticks again, its state
save having failed too), and the alarm would never be resolved.  So they are also written to
the *journal*, ``capalarm.held`` beside the database: a file allocated at start
(``JOURNAL_BYTES``) and overwritten in place, which needs no free space on a full disk and no
SQLite lock.  It holds the held changes, the alarm's start and cause, and the idempotency keys
delivered from memory.  A restarted service reads it back, and its first write stores what it
holds exactly as the write that succeeds would have: the alarm resolves, and rows already
delivered are not queued again.  (On a copy-on-write file system, btrfs or ZFS, overwriting
needs free blocks too: there the journal is only as good as the space left.)

A row that *was* stored, delivered, and whose delete could not be written (the disk filled in
between) is the other way a kill re-pages: the restarted service finds it in the outbox and
sends it again.  Its worker writes its key to the journal as *unsettled* when that delete
fails; a worker that claims a row whose key the journal holds (the next process's, or a worker
started again) counts it delivered and deletes it without sending it, and a key leaves the
journal only once the write that deletes its row has committed (exporters/delivery.py).  Keys
whose rows are gone at start are dropped then (``Notifications.__init__``).

Bounded: what does not fit ``JOURNAL_BYTES`` is counted (``lost_keys``, ``lost``) and logged.
Keys go first, oldest first: a key left out costs a page sent twice after a kill (at least
once), a held change left out a page never sent.

HeldChanges is not thread-safe by itself: the notifier calls it with its lock held.  The
journal has a lock of its own: the channels' workers, on the event loop, add delivered and
unsettled keys to it and settle them, while the pipeline thread writes the held changes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import threading
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alarm.detector.alerts import AlertChange, fingerprint
from alarm.state import storage_cause

log = logging.getLogger("capalarm.notify")

MAX_UNPERSISTED = 10000  # alert changes held in memory while the disk is full
ERROR_LOG_EVERY = 60.0
ALARM_FINGERPRINT = fingerprint("service/outbox", "outbox_write_failed")
JOURNAL_NAME = "capalarm.held"
JOURNAL_BYTES = 1 << 20  # allocated at start; what does not fit is counted and logged
_MAGIC = b"capalarm-held 1"
_HEADER = 64  # "<magic> <length> <crc32>\n", space-padded


@dataclass(slots=True, frozen=True)
class WriteError:
    since: float
    error: str  # "ExceptionName: message" of the first failure
    cause: str = ""  # what it means (storage_cause): "locked by another process (...)"


class Journal:
    """The held changes, the alarm, the keys delivered from memory and the unsettled keys
    (delivered from the outbox, their delete not written), in a file allocated at start and
    overwritten in place (module docstring).  Thread-safe."""

    def __init__(self, path: Path, size: int = JOURNAL_BYTES):
        self.path = path
        self.size = size
        self.lost = 0  # held changes that did not fit, ever (each counted once)
        self.lost_keys = 0  # delivered or unsettled keys that did not fit, ever
        self._lock = threading.Lock()
        self._changes: list[dict[str, Any]] = []
        self._error: WriteError | None = None
        # Dicts for their order: what does not fit goes oldest first.
        self._delivered: dict[str, None] = {}
        self._unsettled: dict[str, None] = {}
        # The held changes the last write left out, by identity: every write offers the
        # whole held list again, and a change left out by the last one is not lost again.
        self._left_out: set[tuple[Any, ...]] = set()
        self._fd: int | None = None
        self.saved = self._read()
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            log.error("notifications: no held-changes journal %s: %s", path, exc)
            return
        try:
            if os.fstat(fd).st_size < size:
                os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            # A full disk at start: no journal, the held changes live in memory only.
            os.close(fd)
            log.error(
                "notifications: cannot allocate the held-changes journal %s (%s): held "
                "changes will not survive a kill",
                path,
                storage_cause(exc, path),
            )
            return
        self._fd = fd

    def _read(self) -> dict[str, Any]:
        """What the last process left: {} when nothing (or nothing readable)."""
        try:
            with self.path.open("rb") as fh:
                head = fh.read(_HEADER)
                parts = head.split()
                if len(parts) != 4 or b" ".join(parts[:2]) != _MAGIC:
                    return {}
                length, crc = int(parts[2]), int(parts[3])
                body = fh.read(length)
        except (OSError, ValueError):
            return {}
        if length == 0:
            return {}
        if len(body) != length or zlib.crc32(body) != crc:
            log.error("notifications: the held-changes journal %s is torn; ignored", self.path)
            return {}
        try:
            saved = json.loads(body)
        except ValueError:
            return {}
        return saved if isinstance(saved, dict) else {}

    def held(self, changes: list[dict[str, Any]], error: WriteError | None) -> None:
        with self._lock:
            self._changes = changes
            self._error = error
            self._write()

    def load(
        self,
        changes: list[dict[str, Any]],
        error: WriteError | None,
        delivered: Iterable[str],
        unsettled: Iterable[str],
    ) -> None:
        """Take up what the last process left, in one write: a kill between two writes would
        leave a file without part of it."""
        with self._lock:
            self._changes, self._error = changes, error
            self._delivered = dict.fromkeys(delivered)
            self._unsettled = dict.fromkeys(unsettled)
            self._write()

    def delivered(self, keys: Iterable[str]) -> None:
        """Keys delivered from memory: their rows are not to be stored (cleared by ``clear``)."""
        with self._lock:
            self._delivered.update(dict.fromkeys(keys))
            self._write()

    def unsettled(self, keys: Iterable[str]) -> None:
        """Keys of stored rows that were delivered but whose delete could not be written."""
        with self._lock:
            new = [k for k in keys if k not in self._unsettled]
            if new:
                self._unsettled.update(dict.fromkeys(new))
                self._write()

    def settled(self, keys: Iterable[str]) -> None:
        """The deletes of these keys' rows have committed (or the rows are gone)."""
        with self._lock:
            if not self._unsettled:  # the usual case: one check per settled batch
                return
            gone = 0
            for k in keys:
                if k in self._unsettled:
                    del self._unsettled[k]
                    gone += 1
            if gone:
                self._write()

    def delivered_keys(self) -> frozenset[str]:
        """Every key it holds as delivered, from memory or unsettled: not to be sent again."""
        with self._lock:
            if not self._delivered and not self._unsettled:
                return frozenset()
            return frozenset(self._delivered.keys() | self._unsettled.keys())

    def unsettled_keys(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._unsettled)

    def clear(self) -> None:
        """Everything it held is in the outbox.  Unsettled keys stay: their rows are still
        there, and only the writes that delete them settle them."""
        with self._lock:
            if self._changes or self._error is not None or self._delivered:
                self._changes, self._error, self._delivered = [], None, {}
                self._write()

    def _write(self) -> None:
        if self._fd is None:
            return
        body = b""
        changes = self._changes
        if changes or self._error is not None or self._delivered or self._unsettled:
            while True:
                doc: dict[str, Any] = {
                    "error": None if self._error is None else dataclasses.asdict(self._error),
                    "changes": changes,
                    "delivered": list(self._delivered),
                    "unsettled": list(self._unsettled),
                }
                body = json.dumps(doc, separators=(",", ":"), default=str).encode()
                over = len(body) - (self.size - _HEADER)
                if over <= 0:
                    break
                if self._delivered or self._unsettled:
                    self._drop_keys(over)
                    continue
                if not changes:
                    break
                # The oldest go first, as they do from the memory bound.
                changes = changes[max(1, len(changes) // 10) :]
        if len(body) > self.size - _HEADER:
            # Only an error message longer than the journal: never written past the space
            # allocated, which a full disk would refuse anyway.
            body, changes = b"", []
        self._count_left_out(self._changes[: len(self._changes) - len(changes)])
        head = b"%s %d %d" % (_MAGIC, len(body), zlib.crc32(body))
        try:
            if body:
                os.pwrite(self._fd, body, _HEADER)
            os.pwrite(self._fd, head.ljust(_HEADER - 1) + b"\n", 0)
        except OSError as exc:
            log.error("notifications: cannot write the journal %s: %s", self.path, exc)

    def _count_left_out(self, left_out: list[dict[str, Any]]) -> None:
        """Count and log the held changes this write left out that the last one kept."""
        ids = {_change_id(c) for c in left_out}
        new = len(ids - self._left_out)
        self._left_out = ids
        if new:
            self.lost += new
            log.error(
                "notifications: %d held changes do not fit the journal %s: after a kill they "
                "will not be sent",
                new,
                self.path,
            )

    def _drop_keys(self, over: int) -> None:
        """Leave out the oldest keys, about ``over`` bytes of them, delivered-from-memory
        first (module docstring: keys go before held changes)."""
        n = 0
        for keys in (self._delivered, self._unsettled):
            while keys and over > 0:
                oldest = next(iter(keys))
                del keys[oldest]
                over -= len(oldest) + 3  # the key, its quotes and a comma
                n += 1
        self.lost_keys += n
        log.error(
            "notifications: %d delivered keys do not fit the journal %s: after a kill their "
            "notifications may be sent again",
            n,
            self.path,
        )

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = None


class HeldChanges:
    def __init__(self, outbox_path: Path):
        self.path = outbox_path
        self.changes: list[dict[str, Any]] = []  # not stored yet, oldest first
        self.error: WriteError | None = None
        self.errors = 0  # failed writes, ever
        self._last_log = 0.0
        self.journal = Journal(outbox_path.with_name(JOURNAL_NAME))
        # Idempotency keys a killed process delivered from memory (from its journal).
        self.delivered: set[str] = set()
        self._restore(self.journal.saved)

    def _restore(self, saved: dict[str, Any]) -> None:
        changes = saved.get("changes")
        error = saved.get("error")
        delivered = _keys(saved.get("delivered"))
        unsettled = _keys(saved.get("unsettled"))
        if isinstance(changes, list):
            self.changes = [c for c in changes if isinstance(c, dict) and "fingerprint" in c]
        self.delivered = set(delivered)
        if isinstance(error, dict):
            with contextlib.suppress(TypeError, ValueError):
                self.error = WriteError(
                    float(error["since"]), str(error["error"]), str(error.get("cause", ""))
                )
        if self.changes or self.error is not None or delivered or unsettled:
            self.journal.load(self.changes, self.error, delivered, unsettled)
        if unsettled:
            # The workers settle them: each row is counted delivered and deleted, not sent.
            log.warning(
                "notifications: the last run delivered %d notifications whose delete it could "
                "not write; they will not be sent again",
                len(unsettled),
            )
        if self.changes or self.error is not None or self.delivered:
            log.warning(
                "notifications: the last run held %d alert changes it could not store "
                "(%d delivered from memory); storing them now",
                len(self.changes),
                len(self.delivered),
            )

    def to_write(self, new: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
        """What the next write stores: the held changes and the new ones; while the alarm is
        raised, bracketed by its firing (so it is known) and its resolve (this write worked)."""
        pending = [*self.changes, *new]
        if self.error is None:
            return pending
        return [
            self.alarm("firing", self.error.since, len(pending)),
            *pending,
            self.alarm("resolved", now, len(pending)),
        ]

    def failed(
        self, pending: list[dict[str, Any]], exc: BaseException, now: float
    ) -> tuple[list[dict[str, Any]], int]:
        """A write failed: hold ``pending`` (the held and new changes).  Returns the changes
        now held, the alarm's firing first, and how many fell off the bound."""
        self.errors += 1
        error = f"{type(exc).__name__}: {exc}"
        cause = storage_cause(exc, self.path)
        if self.error is None:
            self.error = WriteError(now, error, cause)
        lost = max(0, len(pending) - MAX_UNPERSISTED)
        if lost:
            pending = pending[lost:]
            log.error("notifications: %d held alert changes dropped (memory bound)", lost)
        self.changes = pending
        self.journal.held(pending, self.error)
        if now - self._last_log >= ERROR_LOG_EVERY:
            self._last_log = now
            log.error(
                "notifications cannot be written to %s: %s (%s) — %d alert changes held in "
                "memory and delivered from memory until it can be written again",
                self.path,
                cause,
                error,
                len(pending),
            )
        return [self.alarm("firing", self.error.since, len(pending)), *pending], lost

    def stored(self) -> None:
        """A write succeeded: everything held is in the outbox."""
        if self.error is not None:
            log.warning(
                "notifications are stored again in %s; %d held changes written",
                self.path,
                len(self.changes),
            )
        self.error = None
        self.changes = []
        self.delivered = set()
        self.journal.clear()

    def alarm(self, state: str, at: float, held: int) -> dict[str, Any]:
        assert self.error is not None
        since = self.error.since
        if state == "firing":
            why = f"{self.error.cause}: " if self.error.cause else ""
            summary = (
                f"capalarm cannot write notifications to {self.path} ({why}{self.error.error}); "
                f"{held} alert changes are held in memory and sent from memory until it can be "
                "written again"
            )
        else:
            summary = f"capalarm writes notifications to {self.path} again"
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
            summary=summary,
        ).to_dict()


def _change_id(change: dict[str, Any]) -> tuple[Any, ...]:
    """What tells one held alert change from another (an alert's change at a time)."""
    return (change.get("fingerprint"), change.get("state"), change.get("at"))


def _keys(value: Any) -> list[str]:
    """A list of idempotency keys read back from the journal, in its order."""
    return [k for k in value if isinstance(k, str)] if isinstance(value, list) else []
