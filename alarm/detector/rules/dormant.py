"""Dormant rule: a write into a surface that had been silent for a week.

A secret is small: 256 bits and one event is under every budget and no spike, and written
once it makes no rate.  What gives it away is where it lands: a surface that has written
nothing for a week (a cache filled once, a board nobody uses) has no business carrying
anything, and any write into it is judged against that silence.

Per member row, the time of its last write and the longest silence it has broken before.  A
written tick fires when the row had written before, has been silent at least ``silence``
(configured per surface, ``SILENT`` unless set) and
longer than ``LONGER`` x any silence it broke before (a surface that goes quiet for weeks by
habit — a monthly job — is not startled by its own habit).  A fortnightly job's second run
breaks a fortnight of silence: it is a scheduled event, folded by the precedent of its hour of
the week (precedent.py) once it has run once.  A declared surface that has never written has
been silent for as long as it has been watched: its first write after a week of that is
judged too (a surface put to use weeks after it was declared pages once, as it should: it is
either new work its operator knows of, or the secret this rule is for).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from alarm.detector.rules.base import Rule, RuleRows, TickInput

SILENT = 7 * 86400.0
LONGER = 1.5
RESOLVE_HOLD = 3600.0


class DormantRule(Rule):
    name: ClassVar[str] = "dormant"
    # A write into a surface silent for a week: a secret left where nobody looks.  Folded
    # only as a scheduled write (a precedent on the clock): a write after silence at any
    # time is what this rule is for.
    SEVERITY: ClassVar[str] = "critical"
    FOLDS: ClassVar[frozenset[str]] = frozenset({"precedent", "clock_only"})
    STATE: ClassVar[tuple[str, ...]] = ("broken", "written", "paged_at")

    def __init__(self, rows: RuleRows) -> None:
        super().__init__(rows)
        n = len(rows.targets)
        configured = self.configured()
        self.enabled[:] = np.array([c is None or c.enabled for c in configured], dtype=bool)
        self.enabled[rows.members :] = False  # an aggregate's silence is its members'
        self.silence = np.array(
            [SILENT if c is None else c.silence for c in configured], dtype=np.float64
        )
        self.broken = np.zeros(n)  # the silence the last firing broke, seconds
        self.written = np.zeros(n)  # bits of the tick that broke it
        self.paged_at = np.full(n, -np.inf)
        # The rows silent long enough to be judged, as of the ledger's last block: a tick
        # looks only at them (usually none).
        self._watch = np.zeros(0, dtype=np.int64)
        self._since = np.zeros(0)
        self._refreshed = False

    def judge(self, t: TickInput) -> tuple[np.ndarray, np.ndarray] | None:
        ledger = self.rows.ledger
        if ledger.closed or not self._refreshed:
            self._refresh(t.start)
            self._refreshed = True
        if not self._watch.size:
            return None
        wrote = t.bits[self._watch] > 0
        if not np.count_nonzero(wrote):  # a third of ndarray.any()'s cost on a small fleet
            return None
        rows = self._watch[wrote]
        n = len(self.rows.targets)
        breached = np.zeros(n, dtype=bool)
        breached[rows] = True
        self.broken[rows] = t.start - self._since[wrote]
        self.written[rows] = t.bits[rows]
        self.paged_at[rows] = t.start
        keep = ~wrote
        self._watch, self._since = self._watch[keep], self._since[keep]
        return breached, ~breached

    def restored(self) -> None:
        self._refreshed = False

    def _refresh(self, start: float) -> None:
        """The rows silent for their ``silence``, longer than LONGER x any silence they broke; a row
        never written has been silent since it was first watched."""
        ledger = self.rows.ledger
        since = np.where(np.isfinite(ledger.last_write), ledger.last_write, start - ledger.seen)
        silent = start - since
        quiet = self.enabled & (silent >= self.silence) & (silent > LONGER * ledger.longest_gap)
        quiet &= self.paged_at < since  # not already paged for this silence
        self._watch = np.flatnonzero(quiet)
        self._since = since[self._watch]

    def describe(self, row: int) -> tuple[float, float, str, dict[str, Any]]:
        days = float(self.broken[row]) / 86400.0
        bits = float(self.written[row])
        figures = {"silence_seconds": float(self.broken[row]), "silence_broken_bits": bits}
        what = (
            f"was written ({bits:,.0f} bits) after {days:,.1f} days of silence, longer than "
            f"any silence it had broken before: nothing should land in a surface left unused"
        )
        return bits, 0.0, what, figures
