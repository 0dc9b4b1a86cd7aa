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

import numpy as np

from alarm.config import SpikeRule

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

    def seed(self, row: int, rate: float, samples: int) -> None:
        """Start a row from a v1 saved window (its median rate over ``samples`` ticks)."""
        self.recent[row] = np.log1p(max(rate, 0.0) / self.unit[row])
        self.count[row] = samples
