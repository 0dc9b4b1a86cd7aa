"""Seasonal robust baseline for spikes, evaluated for every surface at once (numpy).

Each row (a surface) is judged in log-rate space, y = ln(1 + rate / unit): multiplicative noise
and bursts become additive, and a mostly-zero surface stays near 0 instead of at -inf.  Per row:

- a *recent* level: an exponentially weighted mean of y over ``history`` (the v1 window), used
  until the seasonal profiles have history for the current slot;
- a *daily* profile (96 slots of 15 min) and a *weekly* profile (168 hourly slots) of y, each
  slot learned only while the clock is in it, as an 0.8-expectile (an upper-leaning mean).  The
  prediction is the highest ready profile value among the current 15-min slot, its neighbours
  within ``seasonal_window`` (default one each side: cron jitter, a nightly job that spills over
  a slot edge) and the weekly hour: recurring legitimate bursts are learned, a burst at a time
  that has never been busy is not;
- a *weekday shift*: the daily profile is learned every day, so weekdays dominate it.  Once the
  weekly hour is ready and lies below the daily profile's mean over that hour, the daily
  profile is shifted down by the difference (at most ``weekday_dip_max``, 4x: a weekend is
  typically 2-3x quieter, and the bound limits what one odd week, a holiday or an outage,
  learned into a weekly slot can do to the same hour a week later), so a Sunday evening is
  judged against Sunday evenings, not against Tuesday's, while the daily profile keeps its
  15-minute resolution (an hourly weekly slot alone would dilute a 10-minute CI warm-up);
- a robust spread of the residual y - prediction: a streaming MAD (sign stochastic
  approximation of the median absolute residual), falling back to the mean absolute residual
  when the MAD collapses to 0, as it does on sparse, mostly-zero surfaces.

Threshold (bytes/s) = max(min(pred * e^(z * spread), pred * max_ratio), pred * min_ratio,
floor), with pred the predicted rate.  What is learned is clipped to the threshold, and every
learned level may rise by at most ``max_learn_up`` per day (per week for the weekly profile),
so neither a spike nor a patient attacker can walk the baseline up faster than that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from alarm.config import SpikeRule
from alarm.detector import fused

DAY = 86400.0
WEEK = 7 * DAY
DAY_SLOT = 900.0  # 15 min
DAY_SLOTS = int(DAY / DAY_SLOT)
WEEK_SLOT = 3600.0
WEEK_SLOTS = int(WEEK / WEEK_SLOT)
# Unix time 0 was a Thursday; shift so that weekly slot 0 is Monday 00:00 UTC.
WEEK_OFFSET = 3 * DAY

MAD_TO_SD = 1.4826
MEANAD_TO_SD = 1.2533
MAD_EPS = 1e-3  # a MAD below this (0.1% in rate) counts as 0: use the mean deviation
MAD_STEP = 0.02  # relative step of the streaming MAD
SPREAD_MIN = 0.01
# A profile averages over about this many occurrences of its slot (days, or weeks).
PROFILE_MEMORY = 7.0
PROFILE_EXPECTILE = 0.8
DAY_SLOTS_PER_HOUR = int(WEEK_SLOT / DAY_SLOT)


@dataclass(slots=True, frozen=True)
class Prediction:
    """One tick's judgement for every row (all arrays of length n)."""

    pred_y: np.ndarray
    baseline: np.ndarray  # bytes/s
    threshold: np.ndarray  # bytes/s; +inf where not judging
    ready: np.ndarray  # bool
    day_slot: int
    week_slot: int


class SeasonalBaseline:
    """Rows are surfaces; every method works on all rows at once."""

    # Arrays saved with the detector state (see persist.py), by name.
    STATE = ("count", "recent", "mad", "meanad", "day", "day_n", "week", "week_n")

    def __init__(self, rules: list[SpikeRule], tick: float):
        n = len(rules)
        self.tick = tick
        f64 = np.float64
        self.enabled = np.array([r.enabled for r in rules], dtype=bool)
        self.z = np.array([r.z for r in rules], dtype=f64)
        self.min_ratio = np.array([r.min_ratio for r in rules], dtype=f64)
        self.max_ratio = np.array([r.max_ratio for r in rules], dtype=f64)
        self.floor = np.array([r.floor_bytes_per_second for r in rules], dtype=f64)
        # The unit of the log transform: well below the floor, so that rates that matter are in
        # the log (ratio) regime, and rates of a few bytes/s stay close to 0.
        self.unit = np.maximum(self.floor / 16.0, 1.0)
        self.min_ticks = np.array(
            [max(1, round(r.min_history / tick)) for r in rules], dtype=np.int64
        )
        self.alpha = np.array([min(1.0, tick / max(r.history, tick)) for r in rules], dtype=f64)
        self.seasonal = np.array([r.seasonal for r in rules], dtype=bool)
        self.dip_max = np.array([math.log(r.weekday_dip_max) for r in rules], dtype=np.float32)
        # Daily-profile neighbours looked at on either side of the current slot, per row.
        self.reach = np.array([round(r.seasonal_window / DAY_SLOT) for r in rules], np.int64)
        self._reach_max = int(self.reach.max()) if n else 0
        self._reach_uniform = bool(n == 0 or (self.reach == self._reach_max).all())
        log_up = np.array([math.log(r.max_learn_up) for r in rules], dtype=f64)
        # Largest rise per update: the day's (week's) allowance spread over the updates a
        # slot gets in a day (week).  The recent level is updated every tick.
        self.rise_recent = log_up * tick / DAY
        self.slot_ticks_day = max(1.0, DAY_SLOT / tick)
        self.slot_ticks_week = max(1.0, WEEK_SLOT / tick)
        self.rise_day = (log_up / self.slot_ticks_day).astype(np.float32)
        self.rise_week = (log_up / self.slot_ticks_week).astype(np.float32)
        self._unit32 = self.unit.astype(np.float32)
        self._alpha32 = self.alpha.astype(np.float32)
        self._rise_recent32 = self.rise_recent.astype(np.float32)

        f32 = np.float32
        self.count = np.zeros(n, dtype=np.int64)
        self.recent = np.zeros(n, dtype=f32)
        self.mad = np.zeros(n, dtype=f32)
        self.meanad = np.zeros(n, dtype=f32)
        # Slot-major, so that one slot's values for every row are contiguous.
        self.day = np.zeros((DAY_SLOTS, n), dtype=f32)
        self.day_n = np.zeros((DAY_SLOTS, n), dtype=np.uint16)
        self.week = np.zeros((WEEK_SLOTS, n), dtype=f32)
        self.week_n = np.zeros((WEEK_SLOTS, n), dtype=np.uint16)

    @property
    def rows(self) -> int:
        return self.recent.shape[0]

    def tick_arrays(self) -> dict[str, np.ndarray]:
        """The arrays the whole native tick reads and writes (fused.py), by name."""
        names = ("count", "recent", "mad", "meanad", "day", "day_n", "week", "week_n")
        names += ("enabled", "z", "min_ratio", "max_ratio", "floor", "min_ticks", "seasonal")
        names += ("dip_max", "reach", "rise_day", "rise_week")
        out = {f"baseline.{a}": getattr(self, a) for a in names}
        out["baseline.alpha32"] = self._alpha32
        out["baseline.rise_recent32"] = self._rise_recent32
        out["baseline.unit32"] = self._unit32
        return out

    def tick_constants(self) -> dict[str, float]:
        """The scalars the whole native tick needs of the seasonal level (fused.py)."""
        return {
            "slot_ticks_day": self.slot_ticks_day,
            "slot_ticks_week": self.slot_ticks_week,
            "reach_max": float(self._reach_max),
            "slots_per_hour": float(DAY_SLOTS_PER_HOUR),
            "mad_eps": MAD_EPS,
            "spread_min": SPREAD_MIN,
            "day_alpha": 1.0 / (PROFILE_MEMORY * self.slot_ticks_day),
            "week_alpha": 1.0 / (PROFILE_MEMORY * self.slot_ticks_week),
            "below": (1.0 - PROFILE_EXPECTILE) / PROFILE_EXPECTILE,
        }

    @staticmethod
    def slots(start: float) -> tuple[int, int]:
        """The daily and weekly slots of the tick that began at ``start``."""
        return int((start % DAY) // DAY_SLOT), int(((start + WEEK_OFFSET) % WEEK) // WEEK_SLOT)

    def nbytes(self) -> int:
        return sum(getattr(self, name).nbytes for name in self.STATE)

    def _rate(self, y: np.ndarray) -> np.ndarray:
        # expm1 as exp - 1 in float32 (vectorised; float64 expm1 is seven times slower): the
        # log-rates are float32 profiles, so float32's 1e-7 relative error is theirs already.
        with np.errstate(over="ignore"):  # past 88 (a threshold far above any rate): +inf
            e = np.exp(y.astype(np.float32))
        e -= np.float32(1.0)
        return self.unit * e

    def predict(self, start: float) -> Prediction:
        """The baseline and threshold for the tick that began at ``start``."""
        s, w = self.slots(start)
        native = fused.native()
        if native is not None:
            pred_y, spread = self._level_native(native, s, w)
        else:
            pred_y, spread = self._level(s, w)
        base = self._rate(pred_y)
        thr = self._rate(pred_y + self.z * spread)
        np.minimum(thr, base * self.max_ratio, out=thr)
        np.maximum(thr, base * self.min_ratio, out=thr)
        np.maximum(thr, self.floor, out=thr)
        ready = self.count >= self.min_ticks
        judged = np.where(ready & self.enabled, thr, np.inf)
        return Prediction(pred_y, base, judged, ready, s, w)

    def _level(self, s: int, w: int) -> tuple[np.ndarray, np.ndarray]:
        """The predicted log-rate and the spread of every row at daily slot ``s`` and weekly
        slot ``w``."""
        need_d = self.slot_ticks_day
        need_w = self.slot_ticks_week
        seas = np.full(self.rows, -np.inf, dtype=np.float32)
        for off in range(-self._reach_max, self._reach_max + 1):
            slot = (s + off) % DAY_SLOTS
            ok = self.day_n[slot] >= need_d
            if off and not self._reach_uniform:
                ok &= self.reach >= abs(off)
            np.maximum(seas, np.where(ok, self.day[slot], -np.inf), out=seas)
        week_ok = self.week_n[w] >= need_w
        seas += self._weekday_shift(w, week_ok)
        np.maximum(seas, np.where(week_ok, self.week[w], -np.inf), out=seas)
        use = self.seasonal & np.isfinite(seas)
        pred_y = np.where(use, seas, self.recent).astype(np.float64)
        spread = np.where(
            self.mad > MAD_EPS, MAD_TO_SD * self.mad, MEANAD_TO_SD * self.meanad
        ).astype(np.float64)
        np.maximum(spread, SPREAD_MIN, out=spread)
        return pred_y, spread

    def _level_native(self, native: ModuleType, s: int, w: int) -> tuple[np.ndarray, np.ndarray]:
        """``_level`` in one pass over the rows (fused.py), bit for bit the same."""
        pred_y, spread = np.empty(self.rows), np.empty(self.rows)
        native.seasonal_predict(
            self.day,
            self.day_n,
            self.week[w],
            self.week_n[w],
            self.recent,
            self.mad,
            self.meanad,
            self.seasonal,
            self.reach,
            self.dip_max,
            s,
            (w % 24) * DAY_SLOTS_PER_HOUR,
            self._reach_max,
            DAY_SLOTS_PER_HOUR,
            self.slot_ticks_day,
            self.slot_ticks_week,
            MAD_EPS,
            SPREAD_MIN,
            pred_y,
            spread,
        )
        return pred_y, spread

    def _weekday_shift(self, w: int, week_ok: np.ndarray) -> np.ndarray:
        """How far this weekday's hour lies below the daily profile's mean over the same hour
        (log-rate, in [-ln weekday_dip_max, 0]); 0 where either is not ready."""
        first = (w % 24) * DAY_SLOTS_PER_HOUR
        hour = slice(first, first + DAY_SLOTS_PER_HOUR)
        ready = self.day_n[hour] >= self.slot_ticks_day
        count = ready.sum(axis=0)
        mean = np.where(ready, self.day[hour], 0.0).sum(axis=0, dtype=np.float32)
        mean /= np.maximum(count, 1)
        shift = np.minimum(self.week[w] - mean, np.float32(0.0))
        np.maximum(shift, -self.dip_max, out=shift)
        return np.where(week_ok & (count > 0), shift, np.float32(0.0))

    def learn(self, rate: np.ndarray, p: Prediction, settled: np.ndarray | None = None) -> None:
        """Learn one tick's rates (bytes/s), clipped to the threshold they were judged by.
        The profiles learn only ``settled`` rows: a rate still averaging in from the first
        tick would be the slot's level for a day (the daily slot) or a week (the weekly).
        ``None``: every row is settled."""
        if settled is None:
            settled = np.ones(self.rows, dtype=bool)
        # float32 throughout: log-rates need no more, and half the memory traffic is half
        # the time at 100k rows.
        f32 = np.float32
        y = np.minimum(rate, p.threshold).astype(f32)
        y /= self._unit32
        # log1p as log(1 + y): numpy has no vectorised float32 log1p, and a profile in float32
        # cannot hold what the difference is (below 1e-7 of 1 + y).
        y += f32(1.0)
        np.log(y, out=y)
        native = fused.native()
        if native is not None:
            self._learn_native(native, y, p, settled)
            return
        warm = ~p.ready  # still learning: no rise cap, running mean
        n1 = (self.count + 1).astype(f32)

        # Spread of the residual against what was predicted (before this tick is learned).
        resid = y - p.pred_y.astype(f32)
        np.abs(resid, out=resid)
        a = np.maximum(f32(1.0) / n1, self._alpha32)
        cap = np.maximum(MEANAD_TO_SD * self.meanad, f32(SPREAD_MIN))
        cap *= f32(4.0)
        cap += f32(1.0)
        self.meanad += a * (np.minimum(resid, cap) - self.meanad)
        step = np.maximum(f32(MAD_STEP), f32(2.0) / n1)
        step *= np.maximum(self.mad, f32(0.05))
        self.mad += np.where(resid > self.mad, step, -step)
        np.maximum(self.mad, f32(0.0), out=self.mad)

        # Recent level.
        delta = a * (y - self.recent)
        delta = np.where(warm, delta, np.minimum(delta, self._rise_recent32))
        self.recent += delta

        # Profiles: running mean over the first occurrence, then an average over about
        # PROFILE_MEMORY occurrences, rising at most max_learn_up per occurrence.
        self._learn_slot(
            self.day, self.day_n, p.day_slot, y, self.slot_ticks_day, self.rise_day, settled
        )
        self._learn_slot(
            self.week, self.week_n, p.week_slot, y, self.slot_ticks_week, self.rise_week, settled
        )
        self.count += 1

    def _learn_native(
        self, native: ModuleType, y: np.ndarray, p: Prediction, settled: np.ndarray
    ) -> None:
        """The rest of ``learn`` in one pass over the rows (fused.py), bit for bit the same."""
        d, w = p.day_slot, p.week_slot
        native.seasonal_learn(
            y,
            p.pred_y,
            p.ready,
            np.ascontiguousarray(settled, dtype=bool),
            self.count,
            self._alpha32,
            self.meanad,
            self.mad,
            self.recent,
            self._rise_recent32,
            self.day[d],
            self.day_n[d],
            self.rise_day,
            self.slot_ticks_day,
            1.0 / (PROFILE_MEMORY * self.slot_ticks_day),
            self.week[w],
            self.week_n[w],
            self.rise_week,
            self.slot_ticks_week,
            1.0 / (PROFILE_MEMORY * self.slot_ticks_week),
            (1.0 - PROFILE_EXPECTILE) / PROFILE_EXPECTILE,
        )

    def _learn_slot(
        self,
        prof: np.ndarray,
        counts: np.ndarray,
        slot: int,
        y: np.ndarray,
        slot_ticks: float,
        rise: np.ndarray,
        settled: np.ndarray,
    ) -> None:
        f32 = np.float32
        c = counts[slot]
        n = c.astype(f32)
        a = np.maximum(f32(1.0) / (n + f32(1.0)), f32(1.0 / (PROFILE_MEMORY * slot_ticks)))
        err = y - prof[slot]
        # An expectile, not a mean: a job that fills two thirds of its slot every night sets
        # the slot's level, instead of being averaged away with the quiet minutes around it.
        below = f32((1.0 - PROFILE_EXPECTILE) / PROFILE_EXPECTILE)
        a *= np.where(err > 0, f32(1.0), below)
        a *= err
        delta = np.where(n >= f32(slot_ticks), np.minimum(a, rise), a)
        prof[slot] += np.where(settled, delta, f32(0.0))
        c += settled & (c < 65535)

    def seed(self, row: int, rate: float, samples: int) -> None:
        """Start a row from a v1 saved window (its median rate over ``samples`` ticks)."""
        self.recent[row] = np.log1p(max(rate, 0.0) / self.unit[row])
        self.count[row] = samples
