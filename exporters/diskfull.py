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

HeldChanges is not thread-safe by itself: the notifier calls it with its lock held.  The
journal has a lock of its own (the channels' workers add delivered keys to it).
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
    """The held changes, the alarm and the keys delivered from memory, in a file allocated at
    start and overwritten in place (module docstring).  Thread-safe."""

    def __init__(self, path: Path, size: int = JOURNAL_BYTES):
        self.path = path
        self.size = size
        self.lost = 0  # held changes that did not fit, ever
        self._lock = threading.Lock()
        self._changes: list[dict[str, Any]] = []
        self._error: WriteError | None = None
        self._delivered: set[str] = set()
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

    def delivered(self, keys: Iterable[str]) -> None:
        with self._lock:
            self._delivered.update(keys)
            self._write()

    def clear(self) -> None:
        """Everything it held is in the outbox."""
        with self._lock:
            if self._changes or self._error is not None or self._delivered:
                self._changes, self._error, self._delivered = [], None, set()
                self._write()

    def _write(self) -> None:
        if self._fd is None:
            return
        body = b""
        if self._changes or self._error is not None or self._delivered:
            changes = self._changes
            while True:
                doc: dict[str, Any] = {
                    "error": None if self._error is None else dataclasses.asdict(self._error),
                    "changes": changes,
                    "delivered": sorted(self._delivered),
                }
                body = json.dumps(doc, separators=(",", ":"), default=str).encode()
                if len(body) <= self.size - _HEADER or not changes:
                    break
                # The oldest go first, as they do from the memory bound.
                drop = max(1, len(changes) // 10)
                changes = changes[drop:]
                self.lost += drop
                log.error(
                    "notifications: %d held changes do not fit the journal %s", drop, self.path
                )
        head = b"%s %d %d" % (_MAGIC, len(body), zlib.crc32(body))
        try:
            if body:
                os.pwrite(self._fd, body, _HEADER)
            os.pwrite(self._fd, head.ljust(_HEADER - 1) + b"\n", 0)
        except OSError as exc:
            log.error("notifications: cannot write the journal %s: %s", self.path, exc)

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
        delivered = saved.get("delivered")
        error = saved.get("error")
        if isinstance(changes, list):
            self.changes = [c for c in changes if isinstance(c, dict) and "fingerprint" in c]
        if isinstance(delivered, list):
            self.delivered = {str(k) for k in delivered}
        if isinstance(error, dict):
            with contextlib.suppress(TypeError, ValueError):
                self.error = WriteError(
                    float(error["since"]), str(error["error"]), str(error.get("cause", ""))
                )
        if self.changes or self.error is not None or self.delivered:
            self.journal.held(self.changes, self.error)
            self.journal.delivered(self.delivered)
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
