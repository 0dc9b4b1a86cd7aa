"""Beacon rule: the same write size again and again at a regular interval, for every row at once.

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
sizes.  Only rows that wrote in the tick are touched.
"""

from __future__ import annotations

import numpy as np

from alarm.config import BeaconRule
from alarm.detector import fused

# Writes remembered per row.  The ring must hold a beacon's ``repeats`` beats and every write
# of the surface's own in between: at 16 a surface writing three times per period pushed the
# first beats out before the fifth came (a 30-min beacon on a host written in 3 % of its 10 s
# ticks meets about five such writes per period).  32 holds the default five beats with six
# other writes per period, at the same tick cost (docs/detector.md, "Beacon rule").
RING = 32
NO_TICK = np.iinfo(np.int64).min // 2  # an empty ring entry: never a gap that matches


class BeaconBank:
    STATE = ("ring_tick", "ring_bytes", "ring_pos")

    def __init__(self, rules: list[BeaconRule], tick: float):
        n = len(rules)
        self.enabled = np.array([r.enabled for r in rules], dtype=bool)
        self.repeats = np.array([r.repeats for r in rules], dtype=np.int64)
        self.min_bytes = np.array([r.min_bytes for r in rules], dtype=np.float64)
        self.size_tolerance = np.array([r.size_tolerance for r in rules])
        self._tolerance32 = self.size_tolerance.astype(np.float32)
        self._exact = not self.size_tolerance.any()
        self.jitter = np.array([r.jitter for r in rules])
        self.max_period = np.array([max(2, int(r.max_period // tick)) for r in rules])
        # Entry-major like every saved array (rows on the last axis, see persist.py).
        self.ring_tick = np.full((RING, n), NO_TICK, dtype=np.int64)
        # float32: byte counts are exact up to 16 MiB a tick, and above it sizes closer than
        # 1e-7 match, which changes nothing.
        self.ring_bytes = np.zeros((RING, n), dtype=np.float32)
        self.ring_pos = np.zeros(n, dtype=np.uint16)
        # Last tick's evidence per row: the period in ticks (0: none) and the size in bytes.
        self.period = np.zeros(n, dtype=np.int64)
        self.size = np.zeros(n)

    def nbytes(self) -> int:
        return sum(getattr(self, name).nbytes for name in self.STATE)

    def tick_arrays(self) -> dict[str, np.ndarray]:
        """The arrays the whole native tick reads and writes (fused.py), by name."""
        names = ("enabled", "repeats", "min_bytes", "jitter", "max_period", "ring_tick")
        names += ("ring_bytes", "ring_pos", "period", "size")
        return {f"beacon.{a}": getattr(self, a) for a in names} | {
            "beacon.tolerance32": self._tolerance32
        }

    @property
    def exact(self) -> bool:
        """Whether every row matches sizes exactly (no size tolerance)."""
        return self._exact

    def update(self, tick_index: int, nbytes: np.ndarray) -> np.ndarray:
        """Judge and remember one tick's byte counts; True where the tick is beacon evidence."""
        self.period[:] = 0
        breach = np.zeros(nbytes.size, dtype=bool)
        active = self.enabled & (nbytes >= self.min_bytes)
        size = nbytes.astype(np.float32)
        # Most writes match no earlier size: only the rest are looked at further.
        native = fused.native()
        if native is not None:
            matched = np.empty(nbytes.size, dtype=bool)
            native.beacon_match(
                self.ring_bytes, size, active, self._tolerance32, self._exact, matched
            )
            cand = np.flatnonzero(matched)
            same = self._same(self.ring_bytes[:, cand], size[cand], self._tolerance32[cand])
        else:
            # Over every row, not a gather of the active ones: a contiguous pass over the ring
            # is cheaper than copying 70% of it.  Empty entries hold 0, which no active size
            # equals.
            same = self._same(self.ring_bytes, size, self._tolerance32)
            cand = np.flatnonzero(active & same.any(axis=0))
            same = same[:, cand]
        # Writers of the same bytes in the tick before (period 1, which _judge rejects anyway)
        # are dropped before judging, so that a fleet of steady writers costs one pass.
        if cand.size:
            last = (self.ring_pos[cand].astype(np.int64) - 1) % RING
            steady = same[last, np.arange(cand.size)]
            steady &= tick_index - self.ring_tick[last, cand] < 2
            cand, same = cand[~steady], same[:, ~steady]
        if cand.size:
            self._judge(tick_index, cand, same, size[cand], breach)

        rows = np.flatnonzero(active)
        pos = self.ring_pos[rows].astype(np.int64)
        # Through the flat index (the rings are C-contiguous, so ravel is a view): a third of
        # the time numpy takes to scatter by (entry, row) pairs.
        flat = pos * self.ring_pos.size + rows
        self.ring_tick.ravel()[flat] = tick_index
        self.ring_bytes.ravel()[flat] = size[rows]
        self.ring_pos[rows] = (pos + 1) % RING
        return breach

    def _same(self, ring: np.ndarray, size: np.ndarray, tolerance: np.ndarray) -> np.ndarray:
        """Which ring entries hold ``size`` (within the rows' tolerance)."""
        if self._exact:
            return ring == size
        return np.abs(ring - size) <= tolerance * size

    def _judge(
        self,
        tick_index: int,
        rows: np.ndarray,
        same: np.ndarray,
        size: np.ndarray,
        breach: np.ndarray,
    ) -> None:
        age = tick_index - self.ring_tick[:, rows]
        gap = np.where(same, age, np.iinfo(np.int64).max)
        period = gap.min(axis=0)
        ok = (period >= 2) & (period <= self.max_period[rows])
        period = np.where(ok, period, 0)
        jitter = np.maximum(1, np.rint(self.jitter[rows] * period)).astype(np.int64)
        need = self.repeats[rows]
        # A row that wrote in most of the ticks the beacon would span (as far as the ring
        # sees) is a stream, not a beacon: a constant-rate stream's tick sums alias into a few
        # sizes that recur at short, regular gaps.
        window = np.minimum((need - 1) * period, RING)
        ok &= (age <= window).sum(axis=0) <= window // 2
        # Each earlier beat has its own window, never reaching half a period: one write may
        # not stand for two beats.
        half = (period - 1) // 2
        for k in range(2, int(need.max())):
            found = (np.abs(gap - k * period) <= np.minimum(k * jitter, half)).any(axis=0)
            ok &= found | (k >= need)
        hit = rows[ok]
        breach[hit] = True
        self.period[hit] = period[ok]
        self.size[hit] = size[ok]
