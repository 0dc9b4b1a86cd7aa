"""The last hour of every surface, for the status page and ``/api/v1/surfaces?history=1``.

One ring of slots shared by all surfaces (every evaluated tick updates every surface at once,
so they share one time axis), three float32 columns per slot and surface: the write rate, the
spike threshold (NaN while the spike rule does not judge: a learning surface has no threshold,
not a threshold of 0) and the budget's excess over its tolerance (the largest over the
horizons: 1 is where the budget alarm fires).

A slot is at least ``MIN_SLOT_SECONDS`` long (a whole number of ticks), so a surface never
holds more than ``MAX_SLOTS`` = 360 slots however short the tick: at 100,000 surfaces that is
360 x 100,000 x 3 x 4 B = 432 MB (docs/scaling.md).  A slot that spans several ticks keeps
each column's largest value (``fmax``: NaN only where every tick was NaN), so a one-tick
spike is still drawn at its height.

The ring lives on the pipeline thread and is updated once per evaluated tick; it is copied
(for the surfaces asked for only) into the Snapshot when the page or the API asks, never for
a scrape of /metrics.  It is not saved: after a restart the charts start empty.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from alarm.snapshot import HistoryWindow, SurfaceView

HOUR = 3600.0
MIN_SLOT_SECONDS = 10.0
MAX_SLOTS = 360


def slot_layout(tick: float) -> tuple[float, int]:
    """(slot seconds, slots) for a tick: slots of whole ticks, at least 10 s, covering an
    hour, at most 360 of them."""
    slot = tick * math.ceil(MIN_SLOT_SECONDS / tick - 1e-9)
    return slot, max(1, min(MAX_SLOTS, math.ceil(HOUR / slot - 1e-9)))


class History:
    """``record`` once per evaluated tick (pipeline thread); ``window`` copies some rows."""

    def __init__(self, rows: int, tick: float):
        self.rows = rows
        self.tick = tick
        self.slot_seconds, self.slots = slot_layout(tick)
        shape = (self.slots, rows)
        self.rate = np.full(shape, np.nan, dtype=np.float32)
        self.threshold = np.full(shape, np.nan, dtype=np.float32)
        self.budget_ratio = np.full(shape, np.nan, dtype=np.float32)
        # The slot number (start // slot_seconds) each position holds; -1: never written.
        self.slot_of = np.full(self.slots, -1, dtype=np.int64)
        self.last_slot = -1

    def nbytes(self) -> int:
        return self.rate.nbytes + self.threshold.nbytes + self.budget_ratio.nbytes

    def record(
        self, end: float, rate: np.ndarray, threshold: np.ndarray, budget_ratio: np.ndarray
    ) -> None:
        """One evaluated tick ending at ``end``: arrays of ``rows`` values each."""
        k = math.floor((end - self.tick / 2) / self.slot_seconds)
        if k < self.last_slot - self.slots:
            return  # older than the ring (a backlog far behind): not shown anyway
        pos = k % self.slots
        columns = (
            (self.rate, rate),
            (self.threshold, threshold),
            (self.budget_ratio, budget_ratio),
        )
        # float32 rings: a figure beyond its range (a threshold of 1e39 B/s) is shown as inf,
        # which is what it means on a chart, without a warning per tick.
        with np.errstate(over="ignore"):
            if self.slot_of[pos] != k:
                for ring, values in columns:
                    ring[pos] = values
                self.slot_of[pos] = k
            else:
                for ring, values in columns:
                    np.fmax(ring[pos], values, out=ring[pos], casting="unsafe")
        self.last_slot = max(self.last_slot, k)

    def window(self, rows: Sequence[int]) -> HistoryWindow:
        """A copy of the last hour of ``rows`` (row numbers of the detector's keys), oldest
        slot first; NaN where nothing was evaluated (before the start, during an outage)."""
        ks = np.arange(self.last_slot - self.slots + 1, self.last_slot + 1, dtype=np.int64)
        pos = ks % self.slots
        valid = (self.slot_of[pos] == ks) & (ks >= 0)
        idx = np.asarray(rows, dtype=np.int64)

        def take(ring: np.ndarray) -> np.ndarray:
            out = ring[np.ix_(pos, idx)].T.copy()  # (rows, slots)
            out[:, ~valid] = np.nan
            return out

        return HistoryWindow(
            rows=[int(r) for r in idx.tolist()],
            starts=(ks * self.slot_seconds).astype(np.float64),
            slot_seconds=self.slot_seconds,
            rate=take(self.rate),
            threshold=take(self.threshold),
            budget_ratio=take(self.budget_ratio),
        )

    def adopt(self, old: History, old_rows: np.ndarray) -> None:
        """Carry ``old``'s hour over a reload: ``old_rows[i]`` is the old row of new row ``i``
        (-1: a new surface, which starts empty)."""
        if old.slot_seconds != self.slot_seconds or old.slots != self.slots:
            return
        have = old_rows >= 0
        for mine, theirs in (
            (self.rate, old.rate),
            (self.threshold, old.threshold),
            (self.budget_ratio, old.budget_ratio),
        ):
            mine[:, have] = theirs[:, old_rows[have]]
        self.slot_of[:] = old.slot_of
        self.last_slot = old.last_slot


@dataclass(frozen=True, slots=True)
class HistoryRequest:
    """Which surfaces' history a snapshot carries: at most ``limit``, in attention order,
    only those named in ``names`` when it is given."""

    limit: int
    names: frozenset[str] | None = None


def attention_order(views: Sequence[SurfaceView]) -> list[int]:
    """Indices of ``views``, what needs a look first: firing, then pending, then the surfaces
    closest to their threshold or tolerance, then by name."""

    def key(i: int) -> tuple[int, float, str, str]:
        s = views[i]
        worst = max(s.rule_states().values())
        near = s.budget_excess / s.budget_tolerance if s.budget_tolerance > 0 else 0.0
        for _, _, tolerance, excess in s.budget_horizons:
            if tolerance > 0 and math.isfinite(tolerance):
                near = max(near, excess / tolerance)
        if s.baseline_ready and s.threshold > 0:
            near = max(near, s.rate / s.threshold)
        return (-worst, -near, s.kind, s.name)

    return sorted(range(len(views)), key=key)


__all__ = ["MAX_SLOTS", "History", "HistoryRequest", "attention_order"]
