"""Duty rule: a surface written in far more ticks than it ever is.

A drip in small lumps (a few bytes in every tick, a DNS query every few seconds) carries
10-100 bit/s: a budget sums it for hours before its tolerance is passed, and the spike rule
never sees it (each tick is small).  What gives it away on a surface that writes a few times
an hour is *how often* it writes, whatever it writes: the issue's duty cycle, modelled apart
from the sizes.

Per row, the count of written ticks decayed with time constant ``window`` (c <- c x
exp(-tick / window) + [tick written]; a steady writer of every tick levels at about
window / tick), and the highest count of each of its last KEPT_DAYS days.  It fires when the
count reaches ``ratio`` x the highest kept day plus ``margin`` written ticks, and clears below
half of that.  The threshold is the surface's own extreme, not a quantile: a week of days
gives seven maxima, too few for a tail fit, and the day a record falls is not an attack (with
seven iid days, the next breaks the record one day in eight); ``ratio`` and ``margin`` are the
distance a record must go beyond it.  A surface whose days reach half of window / tick
(written in most ticks, in runs) cannot pass it: for those the rule is mute, and the
volume rules judge them.

The same extreme judges a second statistic: the *run*, the ticks written in a row without
a pause.  A surface written in most ticks cannot pass the count's threshold, but its runs end
at random: a cache written in a third of its ticks, with warm-ups that write every tick for
up to a quarter of an hour, never writes for half an hour without a pause, and a leak that
writes in every tick (a ramp, a drip on a busy cache) does.  The run fires at ``ratio`` x the
longest run of the kept days plus ``margin`` ticks, and clears once the run has broken.  A
surface written in every tick, always (a busy proxy), has one run as long as its history: the
run statistic is mute there too.

A day enters the kept maxima when it ends, as at most the threshold it was judged by: a
surface that now writes more often (a new normal, or a drip the rule already paged about)
doubles its threshold a day, so the page resolves within days and a patient attacker cannot
raise the threshold faster than that.  A row is judged once it has a full day of history.

One numeric definition: the tick's counts are ``duty_step`` in alarm/detector/_fused.c, called
with this rule's arrays; the bookkeeping of days and of skipped ticks, once a day or after a
gap, is numpy here (docs/detector.md, "Where each rule written once stands").  It was numpy
code with a C twin inside the whole native tick, which also used the rule's last tick to tell
an ordinary tick.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from alarm.config import DutyRule as DutySettings
from alarm.detector import fused
from alarm.detector.columns import as_float64
from alarm.detector.rules.base import Rule, RuleRows, TickInput

DAY = 86400.0
KEPT_DAYS = 7
NO_DAY = np.iinfo(np.int32).min  # a kept slot that holds no day
# The run statistic judges once a week of days is kept: legitimate long runs (a cache's
# warm-ups) come a few times a week, not every day (docs/detector.md, "Duty rule").
RUN_JUDGED_AFTER = KEPT_DAYS * DAY
CLEAR_FRACTION = 0.5  # of the threshold: a drip that pauses for a tick stays one incident


class DutyBank:
    """Every row's counts, runs and kept days; a tick at a time by ``update``."""

    STATE = (
        "count",
        "today",
        "row_day",
        "kept",
        "kept_day",
        "history",
        "threshold",
        "last_tick",
        "run",
        "run_today",
        "run_kept",
        "run_history",
        "run_threshold",
    )

    def __init__(self, rules: list[DutySettings], tick: float):
        n = len(rules)
        self.tick = tick
        self.enabled = np.array([r.enabled for r in rules], dtype=bool)
        self.window = np.array([r.window for r in rules], dtype=np.float64)
        self.decay = np.exp(-tick / np.maximum(self.window, 1e-9))
        self.ratio = np.array([r.ratio for r in rules], dtype=np.float64)
        self.margin = np.array([r.margin for r in rules], dtype=np.float64)
        self.count = np.zeros(n)
        self.today = np.zeros(n)  # the highest count so far on the row's current day
        self.row_day = np.full(n, NO_DAY, dtype=np.int32)  # which day ``today`` is of
        # Entry-major like every saved array (rows on the last axis, see persist.py).
        self.kept = np.zeros((KEPT_DAYS, n))
        self.kept_day = np.full((KEPT_DAYS, n), NO_DAY, dtype=np.int32)
        self.history = np.zeros(n)  # seconds the row has been judged on
        self.threshold = np.full(n, np.inf)  # +inf while learning (or off)
        self.last_tick = np.full(n, np.iinfo(np.int64).min // 2, dtype=np.int64)
        # The run statistic: ticks written in a row, its highest of each kept day (the day
        # slots are ``kept_day``'s), and its own history, so that a state saved before it
        # existed is not judged by a partial day's run.
        self.run = np.zeros(n)
        self.run_today = np.zeros(n)
        self.run_kept = np.zeros((KEPT_DAYS, n))
        self.run_history = np.zeros(n)
        self.run_threshold = np.full(n, np.inf)
        # The tick index and day every row was last updated at, while they all agree (None:
        # look at the rows' own, after a restore).
        self._last: int | None = None
        self._day: int | None = None
        self.breach = np.zeros(n, dtype=bool)
        self.clear = np.ones(n, dtype=bool)
        self._native = fused.required()
        # The arrays duty_step reads and writes, held by the extension for the bank's life
        # (every one is changed in place, restores included).
        self._held = self._native.Held(
            self.enabled,
            self.count,
            self.today,
            self.run,
            self.run_today,
            self.history,
            self.run_history,
            self.threshold,
            self.run_threshold,
            self.breach,
            self.clear,
            self.last_tick,
        )

    def nbytes(self) -> int:
        return sum(getattr(self, name).nbytes for name in self.STATE)

    def restored(self) -> None:
        """Saved arrays were loaded in place: the rows' last ticks may now differ."""
        self._last = None
        self._day = None

    def update(
        self, start: float, tick_index: int, nbytes: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, int, int]:
        """One tick (starting at ``start``) of byte counts: (breached, clear) per row (arrays
        reused by the next tick), how many rows breach and how many are not clear."""
        decay = self.advance(start, tick_index)
        breached, not_clear = self._native.duty_step(
            as_float64(decay), as_float64(nbytes), self.tick, CLEAR_FRACTION, tick_index, self._held
        )
        return self.breach, self.clear, breached, not_clear

    def advance(self, start: float, tick_index: int) -> np.ndarray:
        """The bookkeeping of a tick before its counts: the days that ended roll, ticks
        skipped since the last one break the runs; returns each row's decay of the count
        for this tick (``update`` applies it, and records the tick as every row's last)."""
        day = int(start // DAY)
        if self._last is not None and tick_index == self._last + 1:
            decay = self.decay
        else:
            # Skipped ticks (an outage, a restore) decay the count as empty ticks would.
            gap = np.clip(tick_index - self.last_tick, 1, 1 << 30)
            decay = self.decay ** gap.astype(np.float64)
            self.run[gap > 1] = 0.0  # and break the run
        self._last = tick_index
        if day != self._day:
            # Once a day (and after a restore): a pass over the rows, not every tick.
            stale = self.row_day != day
            if stale.any():
                self._roll(day, np.flatnonzero(stale))
            self._day = day
        return decay

    def _roll(self, day: int, rows: np.ndarray) -> None:
        """The rows' day ended: keep its highest count (at most its threshold) and judge the
        next day by the kept ones."""
        ended = self.row_day[rows]
        had = ended != NO_DAY
        keep, ended = rows[had], ended[had]
        slot = ended.astype(np.int64) % KEPT_DAYS
        self.kept[slot, keep] = np.minimum(self.today[keep], self.threshold[keep])
        self.run_kept[slot, keep] = np.minimum(self.run_today[keep], self.run_threshold[keep])
        self.kept_day[slot, keep] = ended
        self.today[rows] = 0.0
        self.run_today[rows] = self.run[rows]  # a run that goes on counts in the new day too
        self.row_day[rows] = day
        fresh = self.kept_day[:, rows] >= day - KEPT_DAYS
        judged = self.enabled[rows] & fresh.any(axis=0)
        ratio, margin = self.ratio[rows], self.margin[rows]
        highest = np.where(fresh, self.kept[:, rows], -np.inf).max(axis=0)
        self.threshold[rows] = np.where(
            judged & (self.history[rows] >= DAY), ratio * highest + margin, np.inf
        )
        longest = np.where(fresh, self.run_kept[:, rows], -np.inf).max(axis=0)
        self.run_threshold[rows] = np.where(
            judged & (self.run_history[rows] >= RUN_JUDGED_AFTER), ratio * longest + margin, np.inf
        )

    def run_leads(self, row: int) -> bool:
        """Whether the run, not the count, is the statistic furthest past its threshold."""
        return bool(self.run[row] * self.threshold[row] > self.count[row] * self.run_threshold[row])

    def figures(self, row: int) -> dict[str, float | str]:
        def finite(x: float) -> float:
            return x if np.isfinite(x) else 0.0

        fresh = self.kept_day[:, row] >= self.row_day[row] - KEPT_DAYS
        kept = self.kept[fresh, row]
        runs = self.run_kept[fresh, row]
        return {
            "duty_statistic": "run" if self.run_leads(row) else "count",
            "duty_written_ticks": float(self.count[row]),
            "duty_threshold": finite(float(self.threshold[row])),
            "duty_highest_day": float(kept.max()) if kept.size else 0.0,
            "duty_window_seconds": float(self.window[row]),
            "duty_run_seconds": float(self.run[row]) * self.tick,
            "duty_run_threshold_seconds": finite(float(self.run_threshold[row])) * self.tick,
            "duty_longest_run_seconds": (float(runs.max()) if runs.size else 0.0) * self.tick,
        }


class DutyRule(Rule):
    name: ClassVar[str] = "duty"
    # Written far more often than ever: a drip in small lumps, or a surface put to a new use.
    SEVERITY: ClassVar[str] = "warning"
    FOLDS: ClassVar[frozenset[str]] = frozenset({"precedent", "young"})
    STATE: ClassVar[tuple[str, ...]] = DutyBank.STATE

    def __init__(self, rows: RuleRows) -> None:
        super().__init__(rows)
        fused.required()  # at start, not at the first tick: an install without it says so
        # Off on aggregates: members' duty alarms on the members.
        settings = [b.duty for b in rows.budgets[: rows.members]]
        settings += [DutySettings(enabled=False)] * (len(rows.targets) - rows.members)
        self.bank = DutyBank(settings, rows.tick)
        self.enabled = self.bank.enabled
        for name in self.STATE:  # the saved state is the bank's own arrays (restored in place)
            setattr(self, name, getattr(self.bank, name))
        self.resolve_hold = np.array([s.resolve_hold for s in settings], dtype=np.float64)
        # The tick being judged (what an alert's summary quotes as the rate).
        zeros = np.zeros(len(rows.targets))
        self._tick = TickInput(
            0.0, 1.0, 0.0, zeros, zeros, zeros, zeros, zeros.astype(bool), np.zeros((2, zeros.size))
        )

    def judge(self, t: TickInput) -> tuple[np.ndarray, np.ndarray] | None:
        breach, clear, breached, not_clear = self.bank.update(
            t.start, round(t.now / t.tick), t.nbytes
        )
        self._tick = t
        if not breached and not not_clear:
            return None  # every row clear: alerts at rest stay so, open ones may resolve
        return breach, clear

    def restored(self) -> None:
        self.bank.restored()

    def describe(self, row: int) -> tuple[float, float, str, dict[str, Any]]:
        duty = self.bank.figures(row)
        rate = float(self._tick.nbytes[row]) / self._tick.tick
        if duty["duty_statistic"] == "run":
            value, threshold = duty["duty_run_seconds"], duty["duty_run_threshold_seconds"]
            what = (
                f"was written in every tick for {value:,.0f} s without a pause (on no day "
                f"of its last week longer than {duty['duty_longest_run_seconds']:,.0f} s, "
                f"threshold {threshold:,.0f} s): written far more often than ever, "
                f"{rate:,.1f} B/s"
            )
        else:
            value, threshold = duty["duty_written_ticks"], duty["duty_threshold"]
            what = (
                f"was written in {value:,.1f} of its recent ticks (decayed over "
                f"{duty['duty_window_seconds']:,.0f} s; on no day of its last week more "
                f"than {duty['duty_highest_day']:,.1f}, threshold {threshold:,.1f}): "
                f"written far more often than ever, {rate:,.1f} B/s"
            )
        return float(value), float(threshold), what, dict(duty)
