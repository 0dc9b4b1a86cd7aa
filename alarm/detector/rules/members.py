"""Members rule: far more of a kind's surfaces writing at once than ever at that hour.

A swarm whose members each add a few writes of their ordinary size moves no member's rules
and barely the aggregate's sum (each member's writes are as big as ever), but it changes how
many members write at once: on a real swarm all 200 members wrote in one hour against 34 in a
median hour.  So each aggregate row counts its members written in the last ten minutes and in
the last hour (the ledger's open windows, the larger phase) and judges each count against the
largest it reached at that hour of the day over the last week and at that hour of the week
(and the hours either side) over the weeks before: what is normal for that hour of the week,
with the days of the last week pooled in while weeks are few.

It fires when a count passes that largest by ``SLACK`` of it and at least ``MIN_EXTRA``
members, once two days are kept; it resolves an hour after both counts are back within the
largest.  The alert names the members that wrote most (the aggregate's evidence).  A member's
own alerts stay its own: this rule says what no member can.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from alarm.detector.rows import members_in_order
from alarm.detector.rules.base import Rule, RuleRows, TickInput

SCALES = ("10m", "1h")
KEPT_HOURS = 6 * 168
SLACK = 0.3
MIN_EXTRA = 4.0
MIN_SAMPLES = 2  # hours of history at this hour: two days
WRITTEN_TICKS = 2  # the ledger's quantity index


class MembersRule(Rule):
    name: ClassVar[str] = "members"
    # Far more of a kind's surfaces writing at once than ever at that hour: a swarm.
    SEVERITY: ClassVar[str] = "warning"
    # Arrays of one column per aggregate, not per row (the detector restores them by the
    # aggregates' keys).
    PER_BLOCK: ClassVar[bool] = True
    STATE: ClassVar[tuple[str, ...]] = ("history", "count", "threshold", "last_hour")
    PER_AGGREGATE: ClassVar[bool] = True

    def __init__(self, rows: RuleRows) -> None:
        super().__init__(rows)
        a = len(rows.aggregate_of)
        self.enabled[:] = False
        # An aggregate's ``members: false`` turns this rule off with the members statistic.
        self.enabled[rows.members : rows.members + a] = [
            bool(getattr(c, "members", True)) for c in rows.settings[rows.members :]
        ]
        self.aggregate_of = rows.aggregate_of
        # Per scale and aggregate, the largest count of each of the last KEPT_HOURS hours
        # (-1: no count that hour), the hour's slot at ``hour % KEPT_HOURS``.
        self.history = np.full((len(SCALES), KEPT_HOURS, a), -1.0, dtype=np.float32)
        self.count = np.zeros((len(SCALES), a))
        self.threshold = np.full((len(SCALES), a), np.inf)
        self.hour = -1  # the absolute hour the history's open slot is of
        # The same, saved (one per aggregate, as every array here): after a restart the hours
        # it was down are cleared, not left holding counts from KEPT_HOURS before.
        self.last_hour = np.full(a, -1.0)
        self._samples_of: tuple[int, list[int]] = (-1, [])
        # Every aggregate's members in aggregate order, where each aggregate's start, and the
        # aggregates without members.
        self._order, bounds = members_in_order(rows.aggregate_of)
        self._starts = bounds[:-1]
        self._empty = np.diff(bounds) == 0

    def judge(self, t: TickInput) -> tuple[np.ndarray, np.ndarray] | None:
        ledger = self.rows.ledger
        if not ledger.closed or not self.aggregate_of:
            return None
        hour = int(t.start // 3600.0)
        if hour != self.hour:
            if self.hour >= 0:
                for skipped in range(self.hour + 1, min(hour, self.hour + KEPT_HOURS) + 1):
                    self.history[:, skipped % KEPT_HOURS] = -1.0
            self.hour = hour
            self.last_hour[:] = hour
        written = ledger.window[:2, :, WRITTEN_TICKS] > 0  # (scale, phase, row)
        slot = hour % KEPT_HOURS
        if self._samples_of[0] != hour:
            # The thresholds of the hour: its samples' largest counts, which do not change
            # until the next hour (the slot written is never among them, no hour being 6
            # weeks before itself), so they are computed once an hour, not once a block.
            samples = self._samples(hour)
            self._samples_of = (hour, samples)
            ref = self.history[:, samples].astype(np.float64)  # (scale, sample, aggregate)
            judged = (ref >= 0).sum(axis=1) >= MIN_SAMPLES
            largest = ref.max(axis=1, initial=-1.0)
            self.threshold[:] = np.where(
                judged, largest + np.maximum(MIN_EXTRA, SLACK * largest), np.inf
            )
        # Every aggregate at once (a loop of ten numpy calls an aggregate cost a small fleet
        # a third of its block's rules): the members written, per scale and phase, summed by
        # aggregate over the members in aggregate order (a zero after them: an aggregate
        # without members sums nothing), the larger phase per scale.
        gathered = np.zeros((*written.shape[:2], self._order.size + 1), dtype=np.int64)
        gathered[:, :, :-1] = written[:, :, self._order]
        summed = np.add.reduceat(gathered, self._starts, axis=2)
        summed[:, :, self._empty] = 0
        active = summed.max(axis=1)  # (scale, aggregate)
        self.count[:] = active
        now = self.history[:, slot]
        np.maximum(now, active, out=now)
        n = len(self.rows.targets)
        breached, clear = np.zeros(n, dtype=bool), np.ones(n, dtype=bool)
        rows = slice(self.rows.members, self.rows.members + len(self.aggregate_of))
        breached[rows] = (self.count > self.threshold).any(axis=0)
        clear[rows] = (self.count <= self.threshold / (1.0 + SLACK)).all(axis=0)
        return breached, clear

    def restored(self) -> None:
        self.hour = int(self.last_hour.max(initial=-1.0))
        self._samples_of = (-1, [])

    @staticmethod
    def _samples(hour: int) -> list[int]:
        """History slots normal for ``hour``: the same hour on each of the last seven days,
        and that hour of the week with the hours either side in each week before."""
        days = [hour - 24 * d for d in range(1, 8)]
        weeks = [hour - 168 * w + s for w in range(1, KEPT_HOURS // 168) for s in (-1, 0, 1)]
        return sorted({h % KEPT_HOURS for h in days + weeks if h >= 0})

    def describe(self, row: int) -> tuple[float, float, str, dict[str, Any]]:
        j = row - self.rows.members
        ratios = self.count[:, j] / self.threshold[:, j]
        s = int(np.argmax(np.nan_to_num(ratios, nan=0.0, posinf=0.0)))
        value, threshold = float(self.count[s, j]), float(self.threshold[s, j])
        members = len(self.aggregate_of[j])
        figures = {
            "members_scale": SCALES[s],
            "members_active": value,
            "members_active_threshold": threshold,
            "members_total": members,
        }
        what = (
            f"had {value:,.0f} of its {members} members writing in the last {SCALES[s]}, "
            f"more than at that hour on any recent day or week (threshold {threshold:,.0f}): "
            f"a swarm of ordinary writes"
        )
        return value, threshold, what, figures
