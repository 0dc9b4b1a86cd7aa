"""Beacon rule: the same write size again and again at a regular interval.

A beacon (a C2 check-in, a leak in fixed-size lumps on a timer) can stay far below every volume
threshold and budget on a surface that writes a little all day: 1 KiB every 10 minutes is
14 bit/s.  What gives it away is regularity, which benign writes on such surfaces lack: their
sizes vary (a tick's byte count is a sum of writes and headers), their times are Poisson.  RITA
scores beacons the same way, on interval and size consistency per connection pair.

Per row, a ring of the last RING ticks in which the row wrote at least ``min_bytes`` (absolute
tick index, bytes).  A tick in which the row writes ``b`` bytes is beacon evidence when earlier
ring entries of the same size (within ``size_tolerance`` of ``b``; 0 = the same byte count)
sit at 1, 2, ..., ``repeats - 1`` periods back, each within ``jitter`` x period per period of
its place (never half a period), where the period is the gap to the latest earlier entry of
that size.  Not judged: periods shorter than two ticks (a steady rate, which the budgets
judge), periods longer than ``max_period``, and a row that wrote in more than half of the ticks
the beacon would span (up to RING): a stream, whose tick sums alias into a few recurring
sizes.  Aggregates are off: members' beacons alarm on the members.

One numeric definition: ``beacon_step`` in alarm/detector/_fused.c, a loop over rows called
with this rule's arrays.  It was numpy code with a C twin inside the whole native tick; a loop
is the rule's natural shape (most rows skip at the first test), and native it costs a call of
a few microseconds on a small fleet, where numpy's dozen passes cost tens.  numba would have
let it be written in Python, at 150 MB and half a second in every process (docs/detector.md,
"Where each rule written once stands").
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from alarm.config import BeaconRule as BeaconSettings
from alarm.detector import fused
from alarm.detector.columns import as_float64
from alarm.detector.rules.base import Rule, RuleRows, TickInput

# Writes remembered per row.  The ring must hold a beacon's ``repeats`` beats and every write
# of the surface's own in between: at 16 a surface writing three times per period pushed the
# first beats out before the fifth came (a 30-min beacon on a host written in 3 % of its 10 s
# ticks meets about five such writes per period).  32 holds the default five beats with six
# other writes per period, at the same tick cost (docs/detector.md, "Beacon rule").
RING = 32
NO_TICK = np.iinfo(np.int64).min // 2  # an empty ring entry: never a gap that matches


class BeaconBank:
    """Every row's rings and settings, judged a tick at a time by ``beacon_step``."""

    STATE = ("ring_tick", "ring_bytes", "ring_pos")

    def __init__(self, settings: list[BeaconSettings], tick: float):
        n = len(settings)
        self.enabled = np.array([s.enabled for s in settings], dtype=bool)
        self.repeats = np.array([s.repeats for s in settings], dtype=np.int64)
        self.min_bytes = np.array([s.min_bytes for s in settings], dtype=np.float64)
        self.tolerance = np.array([s.size_tolerance for s in settings], dtype=np.float32)
        self.exact = not self.tolerance.any()
        self.jitter = np.array([s.jitter for s in settings], dtype=np.float64)
        self.max_period = np.array(
            [max(2, int(s.max_period // tick)) for s in settings], dtype=np.int64
        )
        # Entry-major like every saved array (rows on the last axis, see persist.py).
        self.ring_tick = np.full((RING, n), NO_TICK, dtype=np.int64)
        self.ring_bytes = np.zeros((RING, n), dtype=np.float32)
        self.ring_pos = np.zeros(n, dtype=np.uint16)
        # The last tick's evidence per row: the period in ticks (0: none) and the size.
        self.period = np.zeros(n, dtype=np.int64)
        self.size = np.zeros(n)
        self.breach = np.zeros(n, dtype=bool)
        self._native = fused.required()
        # The arrays beacon_step reads and writes, held by the extension for the bank's life
        # (every one is changed in place, restores included).
        self._held = self._native.Held(
            self.enabled,
            self.repeats,
            self.min_bytes,
            self.tolerance,
            self.jitter,
            self.max_period,
            self.ring_tick,
            self.ring_bytes,
            self.ring_pos,
            self.period,
            self.size,
            self.breach,
        )

    def step(self, tick_index: int, nbytes: np.ndarray) -> int:
        """Judge and remember one tick's byte counts: how many rows are beacon evidence, each
        marked in ``breach`` (reused by the next tick)."""
        return self._native.beacon_step(tick_index, as_float64(nbytes), self.exact, self._held)

    def update(self, tick_index: int, nbytes: np.ndarray) -> np.ndarray:
        """``step``, and a copy of where the tick is beacon evidence."""
        self.step(tick_index, nbytes)
        return self.breach.copy()

    def nbytes(self) -> int:
        return sum(getattr(self, name).nbytes for name in self.STATE)


class BeaconRule(Rule):
    name: ClassVar[str] = "beacon"
    # A regular writer of one size: a C2 check-in or a timed leak, or a legitimate heartbeat.
    SEVERITY: ClassVar[str] = "warning"
    STATE: ClassVar[tuple[str, ...]] = BeaconBank.STATE

    def __init__(self, rows: RuleRows) -> None:
        super().__init__(rows)
        settings = [b.beacon for b in rows.budgets[: rows.members]]
        settings += [BeaconSettings(enabled=False)] * (len(rows.targets) - rows.members)
        fused.required()  # at start, not at the first tick: an install without it says so
        self.bank = BeaconBank(settings, rows.tick)
        self.enabled = self.bank.enabled
        # The saved state is the bank's own arrays (restored in place).
        self.ring_tick = self.bank.ring_tick
        self.ring_bytes = self.bank.ring_bytes
        self.ring_pos = self.bank.ring_pos
        self.resolve_hold = np.array([s.resolve_hold for s in settings], dtype=np.float64)

    def judge(self, t: TickInput) -> tuple[np.ndarray, np.ndarray] | None:
        if not self.bank.step(round(t.now / t.tick), t.nbytes):
            return None
        breach = self.bank.breach
        return breach, ~breach

    def describe(self, row: int) -> tuple[float, float, str, dict[str, Any]]:
        period = float(self.bank.period[row]) * self.rows.tick
        value = float(self.bank.size[row])
        figures = {"beacon_period_seconds": period, "beacon_bytes": value}
        what = (
            f"wrote {value:,.0f} B every {period:,.0f} s, again and again: a beacon "
            f"(same size, regular interval)"
        )
        return value, 0.0, what, figures
