"""Drop rule: a surface that stopped writing what it always writes.

The opposite alarm to the spike rule, off by default (``spike.drop_ratio``): a surface whose
five-minute rate stays below its rate level / ``drop_ratio``, with at least the spike rule's
floor (``floor_bytes_per_second``) missing, for ``drop_hold``, may have been routed around or
have lost its records.  It reads the spike rule's seasonal rate level, so it judges only where
that level is ready, and learns nothing of its own; it resolves after ``resolve_hold`` with
the rate back above the threshold.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from alarm.detector.rules.base import Rule, RuleRows, TickInput

FIVE_MINUTES = 0  # the row of TickInput.rates


class DropRule(Rule):
    name: ClassVar[str] = "drop"
    # A surface that stopped writing what it always writes: routed around, or its records lost.
    SEVERITY: ClassVar[str] = "warning"

    def __init__(self, rows: RuleRows) -> None:
        super().__init__(rows)
        spikes = rows.spikes
        self.ratio = np.array([r.drop_ratio if r.enabled else 0.0 for r in spikes])
        self.enabled = self.ratio > 0
        self.floor = np.array([r.floor_bytes_per_second for r in spikes], dtype=np.float64)
        self.hold = np.array([r.drop_hold for r in spikes], dtype=np.float64)
        self.resolve_hold = np.array([r.resolve_hold for r in spikes], dtype=np.float64)
        self._any = bool(self.enabled.any())
        n = len(spikes)
        # The last judged tick's figures, per row (what an alert says).
        self.threshold = np.zeros(n)
        self.rate = np.zeros(n)
        self.baseline = np.zeros(n)

    def judge(self, t: TickInput) -> tuple[np.ndarray, np.ndarray] | None:
        if not self._any:
            return None
        rate = t.rates[FIVE_MINUTES]
        np.divide(t.baseline, self.ratio, out=self.threshold, where=self.enabled)
        self.rate[:] = rate
        self.baseline[:] = t.baseline
        low = rate < self.threshold
        breached = t.baseline_ready & low & (t.baseline - rate >= self.floor)
        return breached, ~low

    def describe(self, row: int) -> tuple[float, float, str, dict[str, Any]]:
        rate, threshold = float(self.rate[row]), float(self.threshold[row])
        what = (
            f"wrote {rate:,.0f} B/s over five minutes against a baseline of "
            f"{self.baseline[row]:,.0f} B/s (below {threshold:,.0f} B/s: most of what it "
            f"usually writes is missing)"
        )
        return rate, threshold, what, {"drop_threshold_bytes_per_second": threshold}
