"""New-surface rule: a conservative budget for a surface's first days, when none is declared.

A declared surface without a budget gets one derived from what it carries (rules/budget.py); during
its first day that budget follows the traffic, so a board declared without a budget took
70,000 small posts (9.5 MB) in its first hour and nothing paged, where the same traffic paged
in 10 s against a declared budget: the swarm of this project's origin story.  So from its
first write such a surface is held to a default for its kind that grows as the surface is
learnt, fourfold a day (``GROWTH``), for ``learning`` (two days unless configured); then the derived budget and
the long-memory rules have seen it.

A one-sided CUSUM on the capacity bound, as the budgets are: ``S = max(0, S + bits - k t)``,
fires above ``h``, resolves an hour after S is below half of it; a surface pages at most once
in its life (a surface nobody sized is one question to its operator, not one a day).  Defaults per kind (bit/s on
the first day, bits):

======== =========== ===========
kind      allowance   tolerance
======== =========== ===========
egress    64 kbit/s   64 Mbit
fs        64 kbit/s   64 Mbit
registry  8 kbit/s    16 Mbit
======== =========== ===========

A 10 MB burst on a day-old board (80 Mbit against 16 Mbit above 8 kbit/s) pages within
minutes; a busy proxy at 1 Mbit/s pages once on its first day, as any surface nobody has
sized should, and the page resolves as the allowance grows past it.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from alarm.detector.rules.base import Rule, RuleRows, TickInput
from alarm.kinds import KINDS

LEARNING = 2 * 86400.0
GROWTH = 4.0  # the allowance grows this much a day of the surface's life
FALLBACK = (8e3, 16e6)  # a row of no registered kind: the tightest
CLEAR_FRACTION = 0.5


class NewSurfaceRule(Rule):
    name: ClassVar[str] = "newsurface"
    # A surface with no declared budget past its kind's default in its first days.
    SEVERITY: ClassVar[str] = "critical"
    STATE: ClassVar[tuple[str, ...]] = ("first_write", "excess", "paged", "done")

    def __init__(self, rows: RuleRows) -> None:
        super().__init__(rows)
        n = len(rows.targets)
        configured = self.configured()
        on = np.array([c is None or c.enabled for c in configured], dtype=bool)
        self.enabled = rows.derived & on
        self.enabled[rows.members :] = False
        pairs = [KINDS[k].newsurface if k in KINDS else FALLBACK for k in rows.kinds]
        self.allowance = np.array(
            [
                k
                if c is None or c.allowance_bits_per_second is None
                else c.allowance_bits_per_second
                for (k, _), c in zip(pairs, configured, strict=True)
            ]
        )
        self.tolerance = np.array(
            [
                h if c is None or c.tolerance_bits is None else c.tolerance_bits
                for (_, h), c in zip(pairs, configured, strict=True)
            ]
        )
        self.learning = np.array(
            [LEARNING if c is None else c.learning for c in configured], dtype=np.float64
        )
        self.first_write = np.full(n, np.nan)
        self.excess = np.zeros(n)
        self.paged = np.zeros(n, dtype=bool)
        # A row pages at most once in its life: after its page clears, or its learning ends,
        # the derived budget and the long-memory rules have it.
        self.done = np.zeros(n, dtype=bool)
        # Rows on the rule not written yet, and rows in their learning days (indices).
        self._waiting = np.flatnonzero(self.enabled)
        self._learning = np.zeros(0, dtype=np.int64)
        self._quiet = QuietRows(n, self.learning[self.enabled])

    def judge(self, t: TickInput) -> tuple[np.ndarray, np.ndarray] | None:
        waiting = self._waiting
        quiet = self._quiet
        if waiting.size:  # rows not written yet: their life starts at their first write
            born = waiting[t.bits[waiting] > 0]
            if born.size:
                self.first_write[born] = t.start
                self._learning = np.union1d(self._learning, born)
                self._waiting = np.setdiff1d(waiting, born, assume_unique=True)
                quiet.joined(born, t.start, self.excess)
        rows = self._learning
        if not rows.size:
            return None
        if quiet.may_end(t.start):
            age = t.start - self.first_write[rows]
            over = (age > self.learning[rows]) | self.done[rows]
            if np.count_nonzero(over):  # learnt: the derived budget and long-memory rules have it
                self.excess[rows[over]] = 0.0
                rows = self._learning = rows[~over]
            quiet.left(rows, self.first_write, self.excess)
        # Only the rows that carry a sum or wrote above their first allowance can owe
        # anything this tick: the others' excess stays 0 (QuietRows).
        rows = quiet.may_owe(rows, t, self.allowance)
        age = t.start - self.first_write[rows]
        allowance = self.allowance[rows] * GROWTH ** (age / 86400.0)
        excess = np.maximum(0.0, self.excess[rows] + t.bits[rows] - allowance * t.tick)
        self.excess[rows] = excess
        quiet.owing = rows[excess > 0]
        tolerance = self.tolerance[rows]
        calm = not np.count_nonzero(excess > CLEAR_FRACTION * tolerance)
        if calm and not (self.paged.any() and np.count_nonzero(self.paged[self._learning])):
            return None  # every learning row clear, none paged: nothing to step
        n = len(self.rows.targets)
        breached = np.zeros(n, dtype=bool)
        clear = np.ones(n, dtype=bool)
        # A learning row that owes nothing has an excess of 0: not breached, clear.
        breached[rows] = excess > tolerance
        clear[rows] = excess <= CLEAR_FRACTION * tolerance
        done = self.paged & clear
        if np.count_nonzero(done & ~self.done):
            quiet.done_changed()
        self.done |= done
        self.paged |= breached
        return breached, clear

    def restored(self) -> None:
        on = self.enabled & ~self.done
        self._waiting = np.flatnonzero(on & np.isnan(self.first_write))
        self._learning = np.flatnonzero(on & ~np.isnan(self.first_write))
        self._quiet = QuietRows(len(self.rows.targets), self.learning[self.enabled])
        self._quiet.left(self._learning, self.first_write, self.excess)

    def describe(self, row: int) -> tuple[float, float, str, dict[str, Any]]:
        excess, tol = float(self.excess[row]), float(self.tolerance[row])
        figures = {
            "newsurface_allowance_bits_per_second": float(self.allowance[row]),
            "newsurface_excess_bits": excess,
            "newsurface_tolerance_bits": tol,
            "newsurface_first_write": float(self.first_write[row]),
        }
        what = (
            f"carried {excess:,.0f} bits above a new surface's allowance in its first days "
            f"(from {self.allowance[row]:,.0f} bit/s, growing {GROWTH:g}x a day; tolerance "
            f"{tol:,.0f} bits): no budget was declared and what it carries is not yet learnt"
        )
        return excess, tol, what, figures


class QuietRows:
    """Which learning rows a tick can change, so that it costs a pass over the tick's bits and
    not a dozen numpy passes and a power over every learning row (at 100k surfaces declared
    without budgets, all in their first days, those were 1.5 ms of each tick).

    A row with an excess of 0 that carried at most its first allowance x the tick keeps an
    excess of 0, as every row did: its allowance is the first x GROWTH ** (age / day), not
    below the first where its age is not negative, and each rounding is monotone.  Rows past
    their learning are looked for only where one may be: once the earliest first write is
    older than the shortest ``learning``, or after a tick that made a row ``done``."""

    def __init__(self, n: int, learning: np.ndarray) -> None:
        self._shortest = float(learning.min()) if learning.size else np.inf
        # Per row, its first allowance x ``_tick`` where it is learning (+inf elsewhere).
        self._limit = np.full(n, np.inf)
        self._tick = np.nan  # nan: the limits are to be set at the next tick
        self.owing = np.zeros(0, dtype=np.int64)  # the learning rows whose excess is not 0
        self._first = np.inf  # the earliest first write among the learning rows
        self._latest = -np.inf  # and the latest
        self._recheck = False

    def joined(self, born: np.ndarray, start: float, excess: np.ndarray) -> None:
        """Rows ``born`` started learning at ``start``."""
        self._first = min(self._first, start)
        self._latest = max(self._latest, start)
        self._tick = np.nan
        owing = born[excess[born] != 0]
        if owing.size:
            self.owing = np.union1d(self.owing, owing)

    def left(self, rows: np.ndarray, first_write: np.ndarray, excess: np.ndarray) -> None:
        """The learning rows are ``rows`` now (some may have ended)."""
        self._first = float(first_write[rows].min()) if rows.size else np.inf
        self._latest = float(first_write[rows].max()) if rows.size else -np.inf
        self.owing = rows[excess[rows] != 0]
        self._tick = np.nan
        self._recheck = False

    def done_changed(self) -> None:
        """A learning row became ``done``: the next tick looks for rows that ended."""
        self._recheck = True

    def may_end(self, start: float) -> bool:
        """Whether a learning row may be past its ``learning``, or done, at ``start``: not
        where start - the earliest first write is within the shortest learning (then every
        row's age is within its own)."""
        return self._recheck or start - self._first > self._shortest

    def may_owe(self, rows: np.ndarray, t: TickInput, allowance: np.ndarray) -> np.ndarray:
        """Of the learning ``rows``, those whose excess may be above 0 after tick ``t``."""
        if not t.start >= self._latest:  # a tick before a row's first write: an age below 0
            return rows
        if t.tick != self._tick:
            self._tick = t.tick
            self._limit.fill(np.inf)
            self._limit[rows] = allowance[rows] * t.tick
        above = np.flatnonzero(t.bits > self._limit)
        return np.union1d(above, self.owing) if self.owing.size else above
