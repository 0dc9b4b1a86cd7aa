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

    def judge(self, t: TickInput) -> tuple[np.ndarray, np.ndarray] | None:
        waiting = self._waiting
        if waiting.size:  # rows not written yet: their life starts at their first write
            born = waiting[t.bits[waiting] > 0]
            if born.size:
                self.first_write[born] = t.start
                self._learning = np.union1d(self._learning, born)
                self._waiting = np.setdiff1d(waiting, born, assume_unique=True)
        rows = self._learning
        if not rows.size:
            return None
        age = t.start - self.first_write[rows]
        over = (age > self.learning[rows]) | self.done[rows]
        if np.count_nonzero(over):  # learnt: the derived budget and long-memory rules have it
            self.excess[rows[over]] = 0.0
            rows = self._learning = rows[~over]
            age = age[~over]
        allowance = self.allowance[rows] * GROWTH ** (age / 86400.0)
        excess = np.maximum(0.0, self.excess[rows] + t.bits[rows] - allowance * t.tick)
        self.excess[rows] = excess
        tolerance = self.tolerance[rows]
        calm = not np.count_nonzero(excess > CLEAR_FRACTION * tolerance)
        if calm and not np.count_nonzero(self.paged[rows]):
            return None  # every learning row clear, none paged: nothing to step
        n = len(self.rows.targets)
        breached = np.zeros(n, dtype=bool)
        clear = np.ones(n, dtype=bool)
        breached[rows] = excess > tolerance
        clear[rows] = excess <= CLEAR_FRACTION * tolerance
        self.done |= self.paged & clear
        self.paged |= breached
        return breached, clear

    def restored(self) -> None:
        on = self.enabled & ~self.done
        self._waiting = np.flatnonzero(on & np.isnan(self.first_write))
        self._learning = np.flatnonzero(on & ~np.isnan(self.first_write))

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
