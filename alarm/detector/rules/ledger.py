"""What every row carried, kept for weeks: the memory the long-memory rules share.

The core rules (spike, budget, duty) learn within a day and forget within one or two weeks;
operators run capalarm for months, and what a surface does once a week or once a fortnight, or
in sessions a few times a week, is outside their memory.  The ledger keeps, per row, cheaply:

- the current *windows* of 10 minutes, an hour and a day, each in two phases (the second
  half a window later, so an event shorter than half a window is whole in one of them), of
  three quantities: capacity bits, events, and written ticks;
- per window length and quantity, the largest completed window of each of the last
  ``WEEKS`` calendar weeks (a ring shared by every row, since all rows share the clock), and
  the largest single tick and longest run of written ticks of each;
- per hour of the week, the largest hour-long window of bits ending in it, over the previous weeks:
  two copies reset six weeks apart and three weeks out of phase, so their maximum always
  covers at least the last three full weeks (a fortnightly job's last occurrence) and at most
  six, in 1.3 kB a row instead of a ring of weeks per hour;
- per UTC day, the day's totals of the three quantities for the last ``DAYS`` days.

Time advances in blocks of ``BLOCK`` seconds: a tick is copied into a buffer as it came, and
the buffer is folded into the block (sums, largest tick, last writes) and the windows are
updated when the block closes: a tick is one native pass over the rows (``ledger_add`` in
alarm/detector/_fused.c: the row copies, the runs of written ticks, the rows written for the
first time), and a few dozen vector passes every five minutes.  Runs are followed tick by
tick because, folded from the buffer, they took (ticks, rows) temporaries: 0.6 s at 100k
rows once a block, a stall of the whole tick.  As six numpy passes and a few index arrays,
the tick cost a small fleet ~9 us, a fifth of its whole tick.
"""

from __future__ import annotations

import math

import numpy as np

from alarm.detector import fused
from alarm.detector.columns import as_float64

BLOCK = 300.0
HORIZONS = (600.0, 3600.0, 86400.0)  # the window lengths, seconds
HOUR, DAY = 1, 2  # indices into HORIZONS
QUANTITIES = ("bits", "events", "written_ticks")
WEEK = 7 * 86400.0
WEEKS = 6  # weekly maxima kept (the current week included)
DAYS = 36  # daily totals kept
SLOT_RESET_WEEKS = 6  # each hour-of-week copy starts again this often
HOURS_A_WEEK = 168
# A gap longer than this is not walked block by block: the windows are closed empty at once.
MAX_WALK_BLOCKS = int(2 * WEEK // BLOCK)
NO_PERIOD = -(1 << 40)
NO_ROWS = np.zeros(0, dtype=np.int64)
BUFFER_TICKS = 64  # ticks kept as they came before they are folded into the open block


class Ledger:
    """Per row (members then aggregates, as the detector's rows) the windows above."""

    # Per-row arrays saved with the detector's state (rows last); ``SLOW`` among them change
    # only when a window closes and are saved on the slow cadence.
    STATE = (
        "last_write",
        "longest_gap",
        "born_at",
        "first_day",
        "block",
        "block_peak",
        "run",
        "block_run",
        "week_run",
        "window",
        "week_max",
        "week_peak",
        "slot_now",
        "slot_a",
        "slot_b",
        "daily",
        "seen",
    )
    SLOW = frozenset({"week_max", "week_peak", "week_run", "slot_now", "slot_a", "slot_b", "daily"})

    def __init__(self, n: int):
        self.n = n
        self.lengths = [round(h / BLOCK) for h in HORIZONS]
        q = len(QUANTITIES)
        self.block = np.zeros((q, n))
        # The largest single tick's bits: in the open block, and per week kept.
        self.block_peak = np.zeros(n)
        self.week_peak = np.zeros((WEEKS, n), dtype=np.float32)
        # The ticks of the open block not folded in yet (add), and when each row last wrote.
        self._buf_bits = np.zeros((BUFFER_TICKS, n))
        self._buf_events = np.zeros((BUFFER_TICKS, n))
        self._buf_start = np.zeros(BUFFER_TICKS)
        self._buffered = 0
        self.last_write = np.full(n, -np.inf)
        self.longest_gap = np.zeros(n)  # the longest silence each row broke
        # Ticks written in a row without a pause: now, the longest in the open block, and
        # the longest of each week kept.
        self.run = np.zeros(n)
        self.block_run = np.zeros(n)
        self.week_run = np.zeros((WEEKS, n), dtype=np.float32)
        # The first day each row was written (NO_PERIOD: never yet): its life, in days, is
        # what its history is measured in, not the detector's.
        self.first_day = np.full(n, NO_PERIOD, dtype=np.int64)
        self.born_at = np.full(n, np.nan)  # when each row first wrote (NaN: not yet)
        self.born = NO_ROWS  # the rows whose first write was in the last tick added
        self.window = np.zeros((len(HORIZONS), 2, q, n))
        self.week_max = np.zeros((len(HORIZONS), q, WEEKS, n), dtype=np.float32)
        self.week_of = np.full(WEEKS, NO_PERIOD, dtype=np.int64)  # which week each slot holds
        self.slot_now = np.zeros((HOURS_A_WEEK, n), dtype=np.float32)  # this week's hours
        self.slot_a = np.zeros((HOURS_A_WEEK, n), dtype=np.float32)
        self.slot_b = np.zeros((HOURS_A_WEEK, n), dtype=np.float32)
        self.daily = np.zeros((q, DAYS, n), dtype=np.float32)
        self.day_of = np.full(DAYS, NO_PERIOD, dtype=np.int64)
        # Seconds of observation each row has had: blocks since it was first evaluated.
        self.seen = np.zeros(n)
        self._unborn = True
        self.block_index = NO_PERIOD
        self.closed = False  # whether the last add closed a block (rules judge then)
        self._native = fused.required()  # at start, not at the first tick
        # The arrays the native tick and fold read and write, held by the extension for the
        # ledger's life (every one is changed in place, restores included).
        self._held_add = self._native.Held(
            self._buf_bits, self._buf_events, self.run, self.block_run, self.first_day
        )
        self._held_fold = self._native.Held(
            self._buf_bits,
            self._buf_events,
            self._buf_start,
            self.block,
            self.block_peak,
            self.last_write,
            self.longest_gap,
        )

    # -- time ---------------------------------------------------------------------------
    def add(self, start: float, bits: np.ndarray, events: np.ndarray) -> None:
        """Count the tick that began at ``start``: kept as it is until its block closes (or
        the buffer fills), then folded in with the block's other ticks in a few vector
        passes, so that a tick costs two row copies."""
        b = math.floor(start / BLOCK)
        self.closed = False
        if self.block_index == NO_PERIOD:
            self.block_index = b
        if b != self.block_index:
            self._fold_buffer()
            self._advance(b)
            self.closed = True
        k = self._buffered
        if k == BUFFER_TICKS:
            self._fold_buffer()
            k = 0
        bits, events = as_float64(bits), as_float64(events)
        # The tick into the buffers, the run of written ticks it ends (0 where it was not
        # written) and the block's longest run, in place; and how many rows never written
        # before it wrote (-1: none is left to be): ``ledger_add`` in _fused.c.
        born = self._native.ledger_add(k, bits, events, NO_PERIOD, self._unborn, self._held_add)
        self._buf_start[k] = start
        self._buffered = k + 1
        self.born = NO_ROWS
        if born > 0:
            self._births(start, bits)
        elif born < 0:
            self._unborn = False

    def _births(self, start: float, bits: np.ndarray) -> None:
        unborn = np.flatnonzero(self.first_day == NO_PERIOD)
        born = unborn[bits[unborn] > 0]
        if born.size:
            self.first_day[born] = math.floor(start / 86400.0)
            self.born_at[born] = start
            self.born = born
        self._unborn = unborn.size > born.size

    def _fold_buffer(self) -> None:
        """The buffered ticks into the open block: sums, the largest tick and the last
        write of each row (the runs are already counted, in ``add``): ``ledger_fold`` in
        _fused.c."""
        k = self._buffered
        if not k:
            return
        self._native.ledger_fold(k, self._held_fold)
        self._buffered = 0

    def flush(self) -> None:
        """Fold the buffered ticks in (before the state is saved)."""
        self._fold_buffer()

    def _open(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(quantity, rows) sums of the open block with the buffered ticks; the last tick's
        bits; the run of written ticks the last tick ends."""
        k = self._buffered
        blk = self.block[:, rows].copy()
        if not k:
            return blk, np.zeros(len(rows)), self.run[rows]
        bits = np.ascontiguousarray(self._buf_bits[:k, rows])
        events = np.ascontiguousarray(self._buf_events[:k, rows])
        # The fold's sums, into a copy (the rest of what it folds goes to scratch rows).
        scratch = np.zeros((3, len(rows)))
        self._native.ledger_fold(
            k,
            self._native.Held(bits, events, self._buf_start[:k].copy(), blk, *scratch),
        )
        return blk, bits[-1], self.run[rows]

    def _advance(self, b: int) -> None:
        if b < self.block_index:  # a clock that went back: count on in the current block
            return
        steps = b - self.block_index
        if steps > MAX_WALK_BLOCKS:
            self._close_block()
            self.window[:] = 0.0
            self.block_index = b
            return
        for _ in range(steps):
            self._close_block()
            self.block_index += 1

    def _close_block(self) -> None:
        """Close block ``block_index``: into every window, and every window that ends with it
        into the weekly maxima, the hour-of-week slots and the daily totals."""
        b = self.block_index
        self.seen += BLOCK
        self.window += self.block  # every horizon and phase
        end = (b + 1) * BLOCK  # when the block ends
        week = int(end // WEEK) if end % WEEK else int(end // WEEK) - 1
        for h, length in enumerate(self.lengths):
            for phase in (0, 1):
                offset = phase * (length // 2)
                if (b + 1 - offset) % length:
                    continue
                self._close_window(h, phase, week, end)
        slot = week % WEEKS
        if self.week_of[slot] < week:
            self._start_week(slot, week)
        np.maximum(self.week_peak[slot], self.block_peak, out=self.week_peak[slot])
        np.maximum(self.week_run[slot], self.block_run, out=self.week_run[slot])
        self.block[:] = 0.0
        self.block_peak[:] = 0.0
        self.block_run[:] = self.run

    def _start_week(self, slot: int, week: int) -> None:
        """The first close of a new week: the ring's slot it reuses starts empty."""
        self.week_max[:, :, slot] = 0.0
        self.week_peak[slot] = 0.0
        self.week_run[slot] = 0.0
        self.week_of[slot] = week

    def _close_window(self, h: int, phase: int, week: int, end: float) -> None:
        values = self.window[h, phase]
        slot = week % WEEKS
        if self.week_of[slot] < week:
            self._start_week(slot, week)
        np.maximum(self.week_max[h, :, slot], values, out=self.week_max[h, :, slot])
        if h == HOUR:
            # Both phases: an hour-long job that straddles the clock hour is whole in the
            # window half an hour later, kept at the hour that window ends in.
            hour = int(((end - BLOCK) % WEEK) // 3600.0)
            np.maximum(self.slot_now[hour], values[0], out=self.slot_now[hour])
            if phase == 0 and hour == HOURS_A_WEEK - 1:
                self._roll_week(week)
        if h == DAY and phase == 0:
            day = int((end - 86400.0) // 86400.0)
            i = day % DAYS
            self.day_of[i] = day
            self.daily[:, i] = values
        values[:] = 0.0

    def _roll_week(self, week: int) -> None:
        """The week's hours join the copies; each copy starts again every SLOT_RESET_WEEKS,
        the two half a period apart."""
        if week % SLOT_RESET_WEEKS == 0:
            self.slot_a[:] = 0.0
        if week % SLOT_RESET_WEEKS == SLOT_RESET_WEEKS // 2:
            self.slot_b[:] = 0.0
        np.maximum(self.slot_a, self.slot_now, out=self.slot_a)
        np.maximum(self.slot_b, self.slot_now, out=self.slot_b)
        self.slot_now[:] = 0.0

    # -- reading ------------------------------------------------------------------------
    def current(self, rows: np.ndarray) -> np.ndarray:
        """(horizon, quantity, rows): the larger phase of each open window, with the open
        block and the ticks not yet folded in: what the rows carried lately, at each scale;
        horizon ``len(HORIZONS)`` is the last tick's bits and the run of written ticks it
        ends, as in ``weekly``."""
        blk, last_bits, run = self._open(rows)
        out = np.zeros((len(HORIZONS) + 1, len(QUANTITIES), len(rows)))
        out[:-1] = (self.window[:, :, :, rows] + blk[None, None]).max(axis=1)
        out[-1, 0] = last_bits
        out[-1, 2] = run
        return out

    def weekly(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(horizon, quantity, rows): the largest and the second largest of the weekly maxima
        of the weeks before this one (a week with no window closed counts as 0: what is
        under way this week, an attack included, is no precedent for itself); horizon
        ``len(HORIZONS)`` is the single tick: its bits, and the longest run of written ticks
        (its events are 0)."""
        week = int((self.block_index * BLOCK) // WEEK)
        live = (self.week_of > week - WEEKS) & (self.week_of < week)
        maxima = np.zeros((len(HORIZONS) + 1, len(QUANTITIES), WEEKS, len(rows)))
        maxima[:-1] = self.week_max[..., rows]
        maxima[-1, 0] = self.week_peak[:, rows]
        maxima[-1, 2] = self.week_run[:, rows]
        maxima[:, :, ~live] = 0.0
        kept = np.sort(maxima, axis=2)
        return kept[:, :, -1], kept[:, :, -2]

    def weekly_hours(self, rows: np.ndarray) -> np.ndarray:
        """(weeks, rows): the largest hour of bits of each kept week before this one (0 for a
        week not kept or not lived): how many weeks a surface did something, not only how
        much it did at most."""
        week = int((self.block_index * BLOCK) // WEEK)
        live = (self.week_of > week - WEEKS) & (self.week_of < week)
        hours = self.week_max[HOUR, 0][:, rows].astype(np.float64)
        hours[~live] = 0.0
        return hours

    def hour_of_week(self, start: float, rows: np.ndarray) -> np.ndarray:
        """Per row, the largest hour of bits at this hour of the week, the hour after it and
        the two before it, in the previous weeks (the current week's hours are not precedent
        yet).  Two before: the spike rule's 30-minute statistic decays for an hour or two
        after a big run ends, and fires then if the run was larger than the last."""
        hour = int((start % WEEK) // 3600.0)
        slots = [(hour + d) % HOURS_A_WEEK for d in (-2, -1, 0, 1)]
        both = np.maximum(self.slot_a[slots][:, rows], self.slot_b[slots][:, rows])
        return both.max(axis=0).astype(np.float64)

    def days_before(self, today: int, lag: int) -> tuple[np.ndarray, np.ndarray]:
        """The kept daily totals of days up to ``today - lag`` (quantity, days, n) and which
        days they are."""
        use = (self.day_of != NO_PERIOD) & (self.day_of <= today - lag)
        use &= self.day_of > today - DAYS
        return self.daily[:, use].astype(np.float64), self.day_of[use]

    def late(self, rows: np.ndarray, start: float, after: float) -> np.ndarray:
        """Those of ``rows`` whose first write came ``after`` seconds or more after they
        were first watched."""
        watched_from = start - self.seen[rows]
        return rows[self.born_at[rows] - watched_from >= after]

    def nbytes(self) -> int:
        return sum(getattr(self, a).nbytes for a in self.STATE)

    def clock_state(self) -> dict:
        return {
            "block_index": self.block_index,
            "week_of": self.week_of.tolist(),
            "day_of": self.day_of.tolist(),
        }

    def load_clock(self, saved: object) -> None:
        if not isinstance(saved, dict):
            return
        try:
            week_of = np.array(saved["week_of"], dtype=np.int64)
            day_of = np.array(saved["day_of"], dtype=np.int64)
            if week_of.shape != self.week_of.shape or day_of.shape != self.day_of.shape:
                return
            self.block_index = int(saved["block_index"])
            self.week_of, self.day_of = week_of, day_of
        except (KeyError, TypeError, ValueError):
            return
