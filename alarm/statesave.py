"""When the service saves its state, and what a save that fails does.

A *checkpoint* is positions, counters, open ticks, ledger rows and the detector's fast arrays,
in one transaction (alarm/state.py); the detector's learned profiles (the slow arrays) go with
some checkpoints.  Each is saved when the last one of its kind is ``SAVE_FACTOR`` times its own
cost ago (and at least a tick ago), and at shutdown: saving takes at most about 1/SAVE_FACTOR
of the pipeline thread, whatever the number of surfaces.  With 100 surfaces a checkpoint costs
a millisecond and is saved every tick; with 100,000 about 0.25 s (the store writes the chunks of
the arrays that changed, alarm/state.py, and every surface's detector state changes every
tick: counts, ages, decaying levels, 37 MB of 179), still every 10 s tick; on a slower disk
or with more surfaces, every 20x its cost, not every tick.

What a crash loses is never a count or a page: positions and the counters they produced are
saved together, so a restarted service reads again from the last checkpoint's positions and
counts those records once; the ticks since are evaluated again and give the same alert changes
at the same tick times, which the router recognises and does not send again
(exporters/recording.py, replays).  The alert changes themselves are written every tick, before
any checkpoint (exporters/notify.py).

A save that fails (disk full, the database locked by another process, read-only) does not stop
counting or paging: the state stays in memory, where it is anyway (bounded by the surfaces and
the sources' own state: the ledger rows handed over are kept by key until saved), the save is
tried again after RETRY_FIRST doubling to RETRY_MAX seconds, and a ``state_save_failed`` alarm
(critical, ``kind: service``) fires at the first failure and resolves at the first save that
works, in this process or, after a kill, in the next one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from alarm.detector.alerts import AlertChange, fingerprint

SAVE_FACTOR = 20.0
RETRY_FIRST = 1.0
RETRY_MAX = 10.0
ALARM_RULE = "state_save_failed"
ALARM_FINGERPRINT = fingerprint("service/state", ALARM_RULE)


@dataclass(slots=True)
class _Cadence:
    saved_at: float | None = None  # monotonic
    cost: float = 0.0

    def due(self, now: float, tick: float) -> bool:
        return self.saved_at is None or now - self.saved_at >= max(tick, SAVE_FACTOR * self.cost)


class SavePlan:
    """The checkpoint's and the profiles' cadences, the retries and the alarm.  Used on the
    pipeline thread only."""

    def __init__(self, tick: float, path: str):
        self.tick = tick
        self.path = path
        self.checkpoint = _Cadence()
        self.slow = _Cadence()
        self.failures = 0  # in a row
        self.failed_total = 0
        self.retry_at = 0.0  # monotonic
        self.failing_since = 0.0  # wall clock: the alarm's start
        self.cause = ""  # alarm/state.py storage_cause of the first failure
        self.alarm_open = False
        self.checked_open = False  # whether a killed process's alarm was looked for
        # What the checkpoints wrote (the capalarm_state_* metrics): the last one's figures
        # (StateStore.last_save) and totals since start.
        self.saves = 0
        self.last_seconds = 0.0
        self.last_at = 0.0  # wall clock
        self.last_bytes = 0
        self.last_chunks = 0
        self.bytes_total = 0
        self.chunks_total = 0

    def due(self, now: float) -> bool:
        """Whether a checkpoint is due (``now``: monotonic)."""
        if self.failures:
            return now >= self.retry_at
        return self.checkpoint.due(now, self.tick)

    def slow_due(self, now: float) -> bool:
        return self.slow.due(now, self.tick)

    def saved(
        self, started: float, ended: float, slow: bool, written: int = 0, chunks: int = 0
    ) -> None:
        """A checkpoint (with the profiles when ``slow``) took ``started``..``ended`` and
        wrote ``written`` bytes, ``chunks`` of them array chunks (StateStore.last_save)."""
        self.saves += 1
        self.last_seconds = ended - started
        self.last_at = time.time()
        self.last_bytes = written
        self.last_chunks = chunks
        self.bytes_total += written
        self.chunks_total += chunks
        if slow:
            self.slow = _Cadence(ended, ended - started)
        # The profiles are the larger part of a slow checkpoint: the next plain checkpoint's
        # cadence is set by a plain one's cost.
        if not slow or self.checkpoint.saved_at is None:
            self.checkpoint = _Cadence(ended, ended - started)
        else:
            self.checkpoint.saved_at = ended
        self.failures = 0

    def failed(self, now: float, wall: float, cause: str) -> AlertChange | None:
        """A save failed at ``now`` (monotonic): when to try again; the alarm's firing at the
        first failure."""
        self.failures += 1
        self.failed_total += 1
        self.retry_at = now + min(RETRY_MAX, RETRY_FIRST * 2 ** (self.failures - 1))
        if self.alarm_open:
            return None
        self.alarm_open = True
        self.failing_since = wall
        self.cause = cause
        return self._alarm("firing", wall)

    def resolved(self, wall: float) -> AlertChange | None:
        """A save worked: the alarm's resolve if it is open."""
        if not self.alarm_open:
            return None
        self.alarm_open = False
        return self._alarm("resolved", wall)

    def reopened(self, wall: float) -> None:
        """The alarm is firing from a process that was killed before a save worked again."""
        self.alarm_open = True
        self.failing_since = wall

    def _alarm(self, state: str, at: float) -> AlertChange:
        if state == "firing":
            summary = (
                f"capalarm cannot save its state to {self.path} ({self.cause}): counting "
                "and paging go on; if it stops now, it reads again from its last saved "
                "positions"
            )
        else:
            summary = f"capalarm saves its state to {self.path} again"
        return AlertChange(
            fingerprint=ALARM_FINGERPRINT,
            target_type="service",
            target="state",
            kind="service",
            rule=ALARM_RULE,
            state=state,
            previous="firing" if state == "resolved" else "inactive",
            at=at,
            started_at=self.failing_since or at,
            value=float(self.failures),
            threshold=0.0,
            figures={"failed_saves": self.failures},
            summary=summary,
        )
