"""Drift rule: a day far above the surface's weeks, in bits, in writes or in written ticks.

The core rules adapt within about a day, so a patient writer moves them: a 2-5 bit/s writer on
a quiet surface raised that surface's day allowance from 1.5 to 5.8 bit/s within a day while
its daily count of writes rose 5-7x, and was never paged.  This rule judges each of the last
day's totals against the surface's *days before yesterday*: the writer's own days enter that
memory only two days late, and then as one day among up to five weeks, so it cannot raise
its own threshold within the days it takes to be seen.

Per row and quantity (capacity bits, events, written ticks), from the ledger's daily totals of
the kept days up to two days ago, from the day the row first wrote (at least one): their mean
``m``, spread ``s`` and largest ``x``.  The threshold is the largest of ``ratio`` x m, ``over_max`` x x and m + 4 s, plus a
margin (what a few stray packets are); the last day is the larger of the ledger's two open
day windows.  With fewer than a week of such days the ratios are those of a young surface
(6 and 3), after that 3 and 3: a week of days has seen the surface's own weekly swing.  It
fires when any quantity passes its threshold, and resolves an hour after every quantity is
below half of it.  (The largest day is a bound of its own, three times over: a surface that
works in sessions has days several times its mean by habit.)

That sees a writer who multiplies what the surface carries.  One who follows the surface's
own daily curve, adding a third to every tick it writes, is within its largest days; but a
busy surface's days are regular where its ticks are not, and a third more on a day is many
spreads of them.  So each UTC day so far is also judged against *the same weekday* of the
weeks kept: above the largest of those days times ``exp(4 x spread)``, the spread being that
of a day's log total about its weekday's mean over every weekday kept (at least 0.05, so at
least 22 % above the largest).  A surface whose days vary widely (sessions, a fortnightly
job) has a wide spread and is judged loosely; a proxy whose days repeat within a few percent
is judged tightly.  Judged with two same weekdays kept, every one of them written, and six
days beyond one per weekday: a surface that works on some weeks' Tuesdays and not others'
(sessions) has no regular Tuesday to be judged against, only the day statistic.  A day's
growth that the surface's own largest day already reached twice over is not drift; a weekly
job's day is among the days kept.

Until two same weekdays are kept (a surface's first two weeks and two days), its *ordinary
days* stand in for its weeks, as hour-of-day pooling stands in for hour-of-week profiles
while weeks are few: with a week of days kept (the day statistic's maturity: the surface has
shown its weekly swing), the kept days within 1.5x of its largest, where they are at least
five in seven of its days (a working-day surface's weekdays; every day of a proxy's).  Today
is judged against the largest of them the same way.  A surface whose days vary (sessions,
jobs, bursts) has few days near its largest and is not judged by it.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from alarm.detector.rules.base import Rule, RuleRows, TickInput
from alarm.detector.rules.ledger import DAY, NO_PERIOD, QUANTITIES

LAG_DAYS = 2  # a day joins the baseline two days after it began
MATURE_DAYS = 7
RATIO = (6.0, 3.0)  # x the mean day: young, mature
OVER_MAX = (3.0, 3.0)  # x the largest day kept: young, mature
SPREADS = 4.0
# What a day may add whatever the history: 1 KiB of capacity, 8 writes, 8 written ticks.
MARGIN = np.array([8192.0, 8.0, 8.0])
CLEAR_FRACTION = 0.5
# The weekday statistic: bits and events only (written ticks saturate on busy surfaces).
WEEKDAY_QUANTITIES = 2
WEEKDAY_MIN = 2  # days of the same weekday kept
WEEKDAY_MIN_DOF = 6  # days beyond one per weekday, for the spread
WEEKDAY_SPREAD_FLOOR = 0.05
WEEKDAY_CLEAR = 1.1
COMPARABLE = np.log(4.0)  # weekdays whose mean day is within 4x below today's pool spreads
# While two same weekdays are not kept, the surface's ordinary days stand in for them: with
# a week of days kept, the kept days within 1.5x of its largest, where they are 5 in 7 of them.
POOL_NEAR = np.log(1.5)
POOL_SHARE = 5.0 / 7.0
WORDS = {"bits": "bits", "events": "writes", "written_ticks": "written ticks"}


class DriftRule(Rule):
    name: ClassVar[str] = "drift"
    # A day far above the surface's weeks: a patient writer the day-scale rules learnt.
    SEVERITY: ClassVar[str] = "critical"
    FOLDS: ClassVar[frozenset[str]] = frozenset({"young"})
    PER_BLOCK: ClassVar[bool] = True
    STATE: ClassVar[tuple[str, ...]] = (
        "threshold",
        "recent",
        "days_kept",
        "judged",
        "weekday_threshold",
        "today",
    )

    def __init__(self, rows: RuleRows) -> None:
        super().__init__(rows)
        n = len(rows.targets)
        q = len(QUANTITIES)
        self.enabled[:] = np.array([c is None or c.enabled for c in self.configured()], dtype=bool)
        self.threshold = np.full((q, n), np.inf)
        self.recent = np.zeros((q, n))
        self.days_kept = np.zeros(n, dtype=np.int32)
        self.judged = np.zeros(n, dtype=bool)
        self.weekday_threshold = np.full((WEEKDAY_QUANTITIES, n), np.inf)
        # Where the weekday threshold is the ordinary days' (no two same weekdays kept yet);
        # made with it, when a day is kept (not saved: a restore makes both again).
        self.pooled = np.zeros((WEEKDAY_QUANTITIES, n), dtype=bool)
        self.today = np.zeros((WEEKDAY_QUANTITIES, n))
        self._yesterday_totals = np.zeros((WEEKDAY_QUANTITIES, n))
        self._days_kept: tuple[int, int] | None = None  # what the thresholds were made of

    def judge(self, t: TickInput) -> tuple[np.ndarray, np.ndarray] | None:
        ledger = self.rows.ledger
        if not ledger.closed:
            return None
        today = math.floor(t.start / 86400.0)
        days_kept = (today, int(ledger.day_of.max()))
        if days_kept != self._days_kept:  # the thresholds change only when a day does
            self._days_kept = days_kept
            self._thresholds(today)
        self.recent = np.maximum(ledger.window[DAY, 0], ledger.window[DAY, 1])
        self.today = ledger.window[DAY, 0, :WEEKDAY_QUANTITIES]  # the UTC day so far
        breached = (self.recent > self.threshold).any(axis=0)
        breached |= (self.today > self.weekday_threshold).any(axis=0)
        clear = (self.recent <= CLEAR_FRACTION * self.threshold).all(axis=0)
        # Today starts from nothing at midnight: yesterday's whole day must be clear too, or a
        # writer paged yesterday is paged again every day.
        past = np.maximum(self.today, self._yesterday_totals)
        clear &= (past <= self.weekday_threshold / WEEKDAY_CLEAR).all(axis=0)
        return breached, clear

    def restored(self) -> None:
        self._days_kept = None

    def _thresholds(self, today: int) -> None:
        ledger = self.rows.ledger
        daily, days = ledger.days_before(today, LAG_DAYS)
        # A row's days count from the day it first wrote: the days before it existed are
        # not its normal (a surface that appears mid-fleet is not a drift from zero).
        born = ledger.first_day != NO_PERIOD
        lived = (days[:, None] >= ledger.first_day[None, :]) & born[None, :]  # (days, rows)
        kept = lived.sum(axis=0)
        weight = lived / np.maximum(kept, 1)
        mean = (daily * weight).sum(axis=1)
        spread = np.sqrt(np.maximum(0.0, (daily * daily * weight).sum(axis=1) - mean * mean))
        largest = np.where(lived, daily, 0.0).max(axis=1, initial=0.0)
        mature = kept >= MATURE_DAYS
        ratio = np.where(mature, RATIO[1], RATIO[0])
        over = np.where(mature, OVER_MAX[1], OVER_MAX[0])
        threshold = np.maximum(np.maximum(ratio * mean, over * largest), mean + SPREADS * spread)
        threshold += MARGIN[:, None]
        self.judged = (kept > 0) & self.enabled
        self.threshold = np.where(self.judged, threshold, np.inf)
        self.days_kept[:] = kept
        self.weekday_threshold = self._weekday(daily, days, lived, today)
        self._yesterday_totals = self._yesterday(today)

    def _yesterday(self, today: int) -> np.ndarray:
        """Yesterday's totals (quantity, rows), from the ledger's whole days (0 if not kept)."""
        ledger = self.rows.ledger
        kept = ledger.day_of == today - 1
        if not kept.any():
            return np.zeros((WEEKDAY_QUANTITIES, len(self.rows.targets)))
        return ledger.daily[:WEEKDAY_QUANTITIES, int(np.flatnonzero(kept)[0])].astype(np.float64)

    def _weekday(
        self, daily: np.ndarray, days: np.ndarray, lived: np.ndarray, today: int
    ) -> np.ndarray:
        """The weekday threshold (quantity, rows): the largest of the same weekday's totals
        kept, times exp(SPREADS x the spread of a day's log total about its weekday's mean),
        where the row has WEEKDAY_MIN such days; +inf elsewhere."""
        logs = np.log1p(daily[:WEEKDAY_QUANTITIES])  # (quantity, days, rows)
        weekday = days % 7
        n = lived.shape[1]
        groups = [lived & (weekday == w)[:, None] for w in range(7)]  # (days, rows) each
        counts = np.array([g.sum(axis=0) for g in groups])  # (weekday, rows)
        means = np.array(
            [
                np.where(g, logs, 0.0).sum(axis=1) / np.maximum(c, 1)
                for g, c in zip(groups, counts, strict=True)
            ]
        )  # (weekday, quantity, rows)
        # The spread is pooled over the weekdays of today's scale: a workday surface's
        # weekend days, a few strays each, vary far more than its working days.
        own = means[today % 7]
        sq = np.zeros((WEEKDAY_QUANTITIES, n))
        dof = np.zeros((WEEKDAY_QUANTITIES, n))
        for w in range(7):
            comparable = means[w] >= own - COMPARABLE
            dev = np.where(groups[w], logs - means[w][:, None, :], 0.0)
            sq += np.where(comparable, (dev * dev).sum(axis=1), 0.0)
            dof += np.where(comparable, np.maximum(counts[w] - 1, 0), 0)
        spread = np.sqrt(sq / np.maximum(dof, 1))
        spread = np.maximum(spread, WEEKDAY_SPREAD_FLOOR)
        same = lived & (weekday == today % 7)[:, None]
        largest = np.where(same, daily[:WEEKDAY_QUANTITIES], 0.0).max(axis=1, initial=0.0)
        # Judged where the surface wrote on every one of its kept same weekdays: the statistic
        # is for surfaces whose days are regular.  One that works some weeks' Tuesdays and not
        # others' (sessions) is judged by the day statistic; held to the margin on a weekday
        # whose kept days were empty, it paged an ordinary session (48 drift pages in five
        # weeks of 60 session-based sandboxes).
        smallest = np.where(same, daily[:WEEKDAY_QUANTITIES], np.inf).min(axis=1, initial=np.inf)
        # SPREADS spreads above the largest, in the log1p scale the spread is measured in.
        threshold = np.expm1(np.log1p(largest) + SPREADS * spread)
        threshold += MARGIN[:WEEKDAY_QUANTITIES, None]
        judged = (same.sum(axis=0) >= WEEKDAY_MIN) & (dof >= WEEKDAY_MIN_DOF) & self.enabled
        judged = judged & (smallest > 0)
        pooled, pooled_judged = self._ordinary_days(logs, lived)
        self.pooled = ~judged & pooled_judged
        return np.where(judged, threshold, np.where(self.pooled, pooled, np.inf))

    def _ordinary_days(self, logs: np.ndarray, lived: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The threshold of the surface's ordinary days (quantity, rows), and where it
        judges: the largest kept day times exp(SPREADS x the spread of the ordinary days' log
        totals), the ordinary days being those within POOL_NEAR of the largest.

        Hour-of-day pooling while weeks are few, for days: a working-day surface's second
        week is judged against its first week's working days, where a curve follower that
        started on day 10 to 14 had been judged by nothing but the 3x day statistic until
        two same weekdays were kept (and by then its own days were among them).  Judged
        from a week of kept days (MATURE_DAYS: judged from five, it paged the two-week
        fleets' level shifts in their first week as well, level-shift 0.99 -> 1.19 false
        pages a surface-week on their choice seeds, against 1.09), and only where the
        ordinary days are most of the kept days: a surface whose days vary (sessions,
        jobs, bursts) has few days near its largest."""
        kept = lived.sum(axis=0)  # (rows,)
        largest = np.where(lived, logs, -np.inf).max(axis=1, initial=-np.inf)  # (quantity, rows)
        ordinary = lived & (logs >= largest[:, None, :] - POOL_NEAR)  # (quantity, days, rows)
        count = ordinary.sum(axis=1)
        mean = np.where(ordinary, logs, 0.0).sum(axis=1) / np.maximum(count, 1)
        dev = np.where(ordinary, logs - mean[:, None, :], 0.0)
        spread = np.sqrt((dev * dev).sum(axis=1) / np.maximum(count - 1, 1))
        spread = np.maximum(spread, WEEKDAY_SPREAD_FLOOR)
        threshold = np.expm1(largest + SPREADS * spread) + MARGIN[:WEEKDAY_QUANTITIES, None]
        judged = (kept >= MATURE_DAYS) & (count >= POOL_SHARE * kept) & self.enabled
        return np.where(judged, threshold, np.inf), judged

    def describe(self, row: int) -> tuple[float, float, str, dict[str, Any]]:
        ratios = self.recent[:, row] / self.threshold[:, row]
        q = int(np.argmax(np.nan_to_num(ratios, nan=0.0, posinf=0.0)))
        value, threshold = float(self.recent[q, row]), float(self.threshold[q, row])
        weekday = self.today[:, row] / self.weekday_threshold[:, row]
        w = int(np.argmax(np.nan_to_num(weekday, nan=0.0, posinf=0.0)))
        by_weekday = bool(weekday[w] > ratios[q])
        figures: dict[str, Any] = {
            "drift_quantity": QUANTITIES[q],
            "drift_days_kept": int(self.days_kept[row]),
        }
        for i, name in enumerate(QUANTITIES):
            figures[f"drift_{name}_last_day"] = float(self.recent[i, row])
            figures[f"drift_{name}_threshold"] = float(self.threshold[i, row])
        figures["drift_statistic"] = "weekday" if by_weekday else "day"
        for i, name in enumerate(QUANTITIES[:WEEKDAY_QUANTITIES]):
            figures[f"drift_{name}_today"] = float(self.today[i, row])
            figures[f"drift_{name}_weekday_threshold"] = float(self.weekday_threshold[i, row])
        if by_weekday:
            value, threshold = float(self.today[w, row]), float(self.weekday_threshold[w, row])
            figures["drift_quantity"] = QUANTITIES[w]
            if self.pooled[w, row]:
                figures["drift_statistic"] = "ordinary_days"
                against = "any of its ordinary days by more than they vary"
            else:
                against = "any same weekday of its last weeks by more than its days vary"
            what = (
                f"carried {value:,.0f} {WORDS[QUANTITIES[w]]} so far today, above {against} "
                f"(threshold {threshold:,.0f}): more than its own daily curve"
            )
            return value, threshold, what, figures
        words = WORDS[QUANTITIES[q]]
        what = (
            f"carried {value:,.0f} {words} in its last day, against a threshold of "
            f"{threshold:,.0f} from its {int(self.days_kept[row])} days before yesterday: "
            f"a slow rise that its own recent days cannot excuse"
        )
        return value, threshold, what, figures
