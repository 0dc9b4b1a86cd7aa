"""When the state directory cannot be written (disk full), nothing is dropped silently.

The alert changes that could not be stored are held here, in memory and bounded
(``MAX_UNPERSISTED``; what falls off is counted in every channel's ``dropped`` and logged).
Meanwhile the router's decisions for them are delivered from memory, and an
``outbox_write_failed`` alarm (critical, ``kind: service``) goes to every destination with
them; the error is logged at most once a minute, with its cause in words (locked by another
process, disk full, read-only: alarm/state.py ``storage_cause``).  At each later write the
held changes are offered again, bracketed by that alarm's firing and resolve, so the write that
succeeds stores them and resolves the alarm in one transaction.

Not thread-safe by itself: the notifier calls it with its lock held.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alarm.detector.alerts import AlertChange, fingerprint
from alarm.state import storage_cause

log = logging.getLogger("capalarm.notify")

MAX_UNPERSISTED = 10000  # alert changes held in memory while the disk is full
ERROR_LOG_EVERY = 60.0
ALARM_FINGERPRINT = fingerprint("service/outbox", "outbox_write_failed")


@dataclass(slots=True, frozen=True)
class WriteError:
    since: float
    error: str  # "ExceptionName: message" of the first failure
    cause: str = ""  # what it means (storage_cause): "locked by another process (...)"


class HeldChanges:
    def __init__(self, outbox_path: Path):
        self.path = outbox_path
        self.changes: list[dict[str, Any]] = []  # not stored yet, oldest first
        self.error: WriteError | None = None
        self.errors = 0  # failed writes, ever
        self._last_log = 0.0

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
