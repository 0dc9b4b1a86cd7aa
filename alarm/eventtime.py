"""Event time: which tick an event counts in, and when a tick may be evaluated.

An event counts in the tick its own timestamp falls in (``floor(ts / tick)``), however late it
is read.  Ticks are evaluated in order, each once.  A tick closes when every source that holds
it open is past its end:

- a source's *watermark* is the largest ``Batch.watermark`` it handed over ("every event
  stamped before this has been handed over"); a source that is *caught up* (it read everything
  it could) is taken to be at ``now - grace`` — events still in flight get ``grace``;
- where every source polls (``SourceHealth.poll_interval``: registries, boards; the Helm
  chart's registry Deployment), a poller is never taken to be at ``now``: a poll sees what
  happened before it started, so its watermark is the start of its last successful poll and
  it holds ticks there while the next poll on schedule may still move it — while the
  watermark is younger than one interval (at most ``MAX_POLL_HOLD``) plus ``lateness``
  (``poll_hold``).  So a post listed by the next on-time poll counts in its own tick, not
  late.  Beside a source that reads records as they come, pollers hold nothing: that
  source's alarms do not wait a poll interval, and a polled item whose tick has been
  evaluated counts in the first open tick, as late;
- a source holds ticks open only while its watermark keeps moving: one that is up but stuck
  for ``lateness`` of wall-clock time (a poller: older than ``poll_hold``) stops holding them,
  and one that is down holds none (the others must not go unjudged because one is blind —
  its blindness is the ``source_down`` alarm) — except, at start, a source that has not
  handed anything over yet, for up to ``lateness`` (a kmsg reader replaying the ring buffer
  after a restart);
- with no source holding ticks open, ticks close at ``now - lateness``.

An event for a tick already evaluated (late), or older than ``max_backlog``, counts in the first
open tick and in ``late_events``; one stamped more than a tick ahead of ``now`` counts now
(``future_events``).  So a backlog read at start — a kern.log with two hours in it, the ring
buffer after a restart — is evaluated tick by tick on its own timestamps, as the backtest does,
and never lands in one tick.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from alarm.events import SourceHealth

# A batch spanning ticks x rows up to this many is placed as dense per-tick sums (one
# scatter for the batch; the tick's sums are then ready when it is evaluated); a larger one
# (a wide table) as chunks of the rows that wrote.
DENSE_CELLS = 1 << 19
# A poller holds ticks open for at most this much of its interval (plus ``lateness``): every
# source's ticks wait for it, so a registry polled hourly must not hold the kernel's alarms
# back an hour.  Past it, what its next poll lists counts late.
MAX_POLL_HOLD = 300.0


@dataclass(slots=True)
class Cells:
    """What is counted in one open tick so far: chunks of cells, each a surface row and its
    sums (``columns``: a (3, cells) block of bytes, events and capacity bytes), or the dense
    sums of the one batch that counted in it (``dense``, (3, rows of the table))."""

    rows: list[np.ndarray] = field(default_factory=list)
    columns: list[np.ndarray] = field(default_factory=list)
    size: int = 0
    dense: np.ndarray | None = None
    # Whether the cells hold each row at most once (one chunk from EventClock.add, which sums
    # a batch's writes per tick and row): then the tick's sums are a scatter, not a bincount.
    distinct: bool = True
    # The tick's contributors (the pipeline's StagedCredits), credited when it is evaluated;
    # not saved: after a restart an open tick's evidence starts again, its counts do not.
    credits: Any = None

    def add(self, rows: np.ndarray, columns: np.ndarray) -> None:
        """A chunk of cells: ``columns`` is (3, len(rows)) float64."""
        if self.dense is not None:
            self._sparse()
        self.distinct = not self.rows
        self.rows.append(rows)
        self.columns.append(columns)
        self.size += len(rows)

    def chunks(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """The cells as (rows, columns) chunks."""
        if self.dense is not None:
            self._sparse()
        return list(zip(self.rows, self.columns, strict=True))

    def _sparse(self) -> None:
        """Dense sums as a chunk of the rows that wrote."""
        dense, self.dense = self.dense, None
        assert dense is not None
        rows = np.flatnonzero(dense.any(axis=0))
        self.rows, self.columns = [rows], [dense[:, rows]]
        self.distinct = True

    def sums(self, n: int) -> np.ndarray:
        """Dense per-row sums for a table of ``n`` rows: (3, n), bytes, events and capacity
        bytes."""
        if self.dense is not None and self.dense.shape[1] == n:
            return self.dense
        if self.dense is not None:
            self._sparse()
        out = np.zeros((3, n))
        if not self.rows:
            return out
        if self.distinct:
            out[:, self.rows[0]] = self.columns[0]
            return out
        rows = np.concatenate(self.rows)
        columns = np.concatenate(self.columns, axis=1)
        for i in range(3):
            out[i] = np.bincount(rows, weights=columns[i], minlength=n)
        return out

    def compact(self, n: int) -> None:
        """Fold the chunks into one cell per row that wrote (bounds memory per tick)."""
        sums = self.sums(n)
        rows = np.flatnonzero((sums > 0).any(axis=0))
        self.rows = [rows]
        self.columns = [sums[:, rows]]
        self.size = len(rows)
        self.distinct = True
        self.dense = None


@dataclass(slots=True)
class SourceClock:
    watermark: float = -math.inf
    advanced_at: float = 0.0  # wall (or simulated) time the watermark last moved
    reported: bool = False  # has handed over a batch since the service started


class EventClock:
    """Open ticks and source watermarks; decides what can be closed."""

    def __init__(self, tick: float, grace: float, lateness: float, max_backlog: float):
        self.tick = tick
        self.grace = grace
        self.lateness = lateness
        self.max_backlog = max_backlog
        self.next_index: int | None = None  # the first tick not yet evaluated
        self.open: dict[int, Cells] = {}
        self.sources: dict[str, SourceClock] = {}

    # -- sources -----------------------------------------------------------------------
    def attach(self, name: str, now: float) -> None:
        self.sources.setdefault(name, SourceClock(advanced_at=now))

    def detach(self, name: str) -> None:
        self.sources.pop(name, None)

    def advance(self, name: str, watermark: float | None, now: float) -> None:
        clock = self.sources.get(name)
        if clock is None:
            clock = self.sources[name] = SourceClock(advanced_at=now)
        clock.reported = True
        if watermark is not None and watermark > clock.watermark:
            clock.watermark = watermark
            clock.advanced_at = now

    def closable_end(self, now: float, health: Mapping[str, SourceHealth]) -> float:
        """Up to where ticks may be evaluated at ``now``."""
        holding: list[float] = []
        # Beside a source that reads records as they come (the kernel, a file system) no
        # poller holds ticks: that source's alarms would wait up to a poll interval plus
        # lateness for it (a minute at the defaults, against a second); what the next poll
        # lists for a tick already evaluated counts in the first open tick (late_events).
        streaming = any(
            (h := health.get(name)) is None or h.poll_interval <= 0 for name in self.sources
        )
        for name, clock in self.sources.items():
            h = health.get(name)
            if h is not None and h.up and h.poll_interval > 0 and not streaming:
                # A poller knows what happened before its last successful poll started (its
                # watermark), never up to now: what came after is listed by the next poll.
                # Its ticks wait while that poll, on schedule, may still move the watermark.
                if now - clock.watermark < self.poll_hold(h.poll_interval):
                    holding.append(clock.watermark)
                continue  # stuck (a hanging poll, a Retry-After): what it lists counts late
            if h is not None and h.up and h.caught_up:
                # Caught up: its events up to now (less what is still in flight) are in.
                if now - self.grace > clock.watermark:
                    clock.watermark = now - self.grace
                    clock.advanced_at = now
                holding.append(clock.watermark)
            elif h is not None and not h.up and clock.reported:
                continue  # down: what it reads when it is back counts late
            elif now - clock.advanced_at < self.lateness:
                holding.append(clock.watermark)
        return min(holding) if holding else now - self.lateness

    def poll_hold(self, interval: float) -> float:
        """How far behind ``now`` a poller that is up may hold ticks: one interval (at most
        :data:`MAX_POLL_HOLD`) until its next poll starts, and ``lateness`` for that poll to
        page through the listing and hand it over."""
        return min(interval, MAX_POLL_HOLD) + self.lateness

    # -- cells -------------------------------------------------------------------------
    def place(self, ts: np.ndarray, now: float | None) -> tuple[np.ndarray, int, int]:
        """The tick index of each event, with late and future ones moved; returns (indices,
        late, future).  ``now`` None: a replay, nothing is in the future.  Before the first
        tick is evaluated nothing is late: where evaluation starts is decided then
        (``begin``), from the earliest event every source has handed over by that time."""
        idx = np.floor(ts / self.tick).astype(np.int64)
        future = 0
        if now is not None:
            ahead = idx > math.floor(now / self.tick) + 1
            future = int(ahead.sum())
            if future:
                idx[ahead] = math.floor(now / self.tick)
        late = 0
        if self.next_index is not None:
            behind = idx < self.next_index
            late = int(behind.sum())
            if late:
                idx[behind] = self.next_index
        return idx, late, future

    def begin(self, end: float, now: float | None) -> int:
        """Fix where evaluation starts (first call) and keep it within ``max_backlog`` of
        ``now``; returns the events of ticks that will not be evaluated (counted late)."""
        if self.next_index is None:
            self.next_index = min([math.floor(end / self.tick), *self.open])
        if now is None:
            return 0
        floor = math.floor((now - self.max_backlog) / self.tick)
        return self.skip_to(floor) if floor > self.next_index else 0

    def skip_to(self, index: int) -> int:
        """Ticks before ``index`` will not be evaluated; what they hold moves to ``index``.
        Returns the number of cells moved."""
        moved = 0
        for i in [i for i in self.open if i < index]:
            cells = self.open.pop(i)
            moved += cells.size
            target = self.open.setdefault(index, Cells())
            for rows, columns in cells.chunks():
                target.add(rows, columns)
            if cells.credits is not None:
                target.credits = (
                    cells.credits if target.credits is None else target.credits.merge(cells.credits)
                )
        self.next_index = index
        return moved

    def add(
        self,
        idx: np.ndarray,
        rows: np.ndarray,
        b: np.ndarray,
        e: np.ndarray,
        c: np.ndarray,
        table_rows: int = 0,
    ) -> None:
        """Count cells (tick index, table row, bytes, events, capacity bytes) in their open
        ticks; ``table_rows``: the table's size (0: unknown, every tick gets a chunk)."""
        if table_rows > 0 and len(idx):
            first = int(idx.min())
            span = int(idx.max()) - first + 1
            # (A row past the table goes the sorted way, which refuses it.)
            if span * table_rows <= DENSE_CELLS and int(rows.max()) < table_rows:
                self._add_dense(idx, rows, (b, e, c), first, span, table_rows)
                return
        order = np.lexsort((rows, idx))
        idx, rows = idx[order], rows[order]
        columns = np.stack([b[order], e[order], c[order]])
        # Writes of the same row in the same tick are summed here (the sums are of whole
        # bytes and events, exact in any order), so a tick added once holds each row once.
        first = np.ones(len(idx), dtype=bool)
        first[1:] = (idx[1:] != idx[:-1]) | (rows[1:] != rows[:-1])
        if not first.all():
            group = np.cumsum(first) - 1
            columns = np.stack([np.bincount(group, weights=col) for col in columns])
            idx, rows = idx[first], rows[first]
        ticks, starts, counts = np.unique(idx, return_index=True, return_counts=True)
        ends = [*starts[1:].tolist(), len(idx)]
        dense = None
        if table_rows > 0 and ticks.size * table_rows <= DENSE_CELLS:
            dense = np.zeros((ticks.size, 3, table_rows))
            dense[np.repeat(np.arange(ticks.size), counts), :, rows] = columns.T
        open_ = self.open
        for k, (t, s, end) in enumerate(zip(ticks.tolist(), starts.tolist(), ends, strict=True)):
            cells = open_.get(t)
            if dense is not None and (cells is None or (not cells.rows and cells.dense is None)):
                if cells is None:
                    cells = open_[t] = Cells()
                cells.dense = dense[k]
                cells.size = end - s
                continue
            if cells is None:
                cells = open_[t] = Cells()
            cells.add(rows[s:end], columns[:, s:end])

    def _add_dense(
        self,
        idx: np.ndarray,
        rows: np.ndarray,
        values: tuple[np.ndarray, np.ndarray, np.ndarray],
        first: int,
        span: int,
        table_rows: int,
    ) -> None:
        """``add`` of a batch whose ticks ``first .. first + span - 1`` times the table's rows
        fit DENSE_CELLS: summed per (tick, row) by bincount, with no sort (a sort of the
        batch's cells was most of a replayed batch's cost).  The same sums as the sorted
        path: bincount adds each cell's writes in the batch's order, as the sorted path's
        stable sort keeps them, and a tick already holding cells gets its rows that wrote,
        in row order, as a chunk."""
        key = (idx - first) * table_rows + rows
        cells_n = span * table_rows
        held = np.bincount(key, minlength=cells_n).reshape(span, table_rows)
        dense = np.empty((span, 3, table_rows))
        for i, column in enumerate(values):
            dense[:, i, :] = np.bincount(key, weights=column, minlength=cells_n).reshape(
                span, table_rows
            )
        wrote = held > 0
        sizes = np.count_nonzero(wrote, axis=1)
        ticks = np.flatnonzero(sizes)
        open_ = self.open
        for k, size in zip(ticks.tolist(), sizes[ticks].tolist(), strict=True):
            cells = open_.get(first + k)
            if cells is None:
                open_[first + k] = Cells(dense=dense[k], size=size)
            elif cells.rows or cells.dense is not None:
                which = np.flatnonzero(wrote[k])
                cells.add(which, dense[k][:, which])
            else:  # staged for its contributors only
                cells.dense = dense[k]
                cells.size = size

    def staged(self, index: int) -> Cells:
        """The open tick ``index`` (created if nothing is counted in it yet)."""
        return self.open.setdefault(index, Cells())

    @property
    def cells(self) -> int:
        return sum(c.size for c in self.open.values())

    def take(self, index: int) -> Cells:
        self.next_index = index + 1
        return self.open.pop(index, None) or Cells()

    # -- state -------------------------------------------------------------------------
    def to_state(self, n: int) -> dict[str, Any]:
        ticks = {}
        for i, cells in self.open.items():
            cells.compact(n)
            ticks[str(i)] = [cells.rows[0].tolist(), *cells.columns[0].tolist()]
        return {
            "tick": self.tick,
            "next_index": self.next_index,
            "open": ticks,
            "watermarks": {
                n: c.watermark for n, c in self.sources.items() if math.isfinite(c.watermark)
            },
        }

    def load_state(self, state: dict[str, Any], rows_map: np.ndarray, now: float) -> None:
        """``rows_map``: saved row -> current row (-1: the surface is gone; its open cells with
        it).  A state saved with another tick length is not used."""
        if not isinstance(state, dict) or state.get("tick") != self.tick:
            return
        nxt = state.get("next_index")
        self.next_index = int(nxt) if isinstance(nxt, int) else None
        for key, cols in (state.get("open") or {}).items():
            try:
                rows = np.asarray(cols[0], dtype=np.int64)
                keep = (rows >= 0) & (rows < len(rows_map))
                mapped = rows_map[rows[keep]]
                ok = mapped >= 0
                cells = Cells()
                columns = np.array([np.asarray(c, dtype=np.float64) for c in cols[1:4]])
                cells.add(mapped[ok], columns[:, keep][:, ok])
                self.open[int(key)] = cells
            except (TypeError, ValueError, IndexError):
                continue
        for name, wm in (state.get("watermarks") or {}).items():
            if isinstance(wm, int | float):
                self.sources[str(name)] = SourceClock(float(wm), now)
