"""Spike rule: a tick, or the rate over five or thirty minutes, far above what the surface
writes, each against its own seasonal level with a threshold calibrated for
``spike.false_alarms_per_week`` (docs/detector.md, "Spike rule").

One file holds the rule: its settings and state (``SpikeModel``: the seasonal levels of
``SeasonalBaseline``, the hour-of-day size level of ``SizeLevel``, and the tails of
alarm/detector/tail.py, which the members statistic shares), its figures, and what its alert
says.  One numeric definition judges and learns it: the native tick (``do_rules``/``do_learn``
of _whole_tick.c with ``_fused.c``'s loops), which reads and writes these arrays in place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from alarm.config import SpikeRule
from alarm.detector.rules.base import CoreFigures, CoreRule
from alarm.detector.tail import TailBank, target_rate
from alarm.detector.views import SurfaceFigures

# ----------------------------------------------------------------------------------------
# Seasonal robust baseline for spikes, one row per surface (its levels are predicted and
# learned by the native tick, _whole_tick.c).
#
# Each row (a surface) is judged in log-rate space, y = ln(1 + rate / unit): multiplicative noise
# and bursts become additive, and a mostly-zero surface stays near 0 instead of at -inf.  Per row:
#
# - a *recent* level: an exponentially weighted mean of y over ``history`` (the v1 window), used
#   until the seasonal profiles have history for the current slot;
# - a *daily* profile (96 slots of 15 min) and a *weekly* profile (168 hourly slots) of y, each
#   slot learned only while the clock is in it, as an 0.8-expectile (an upper-leaning mean).  The
#   prediction is the highest ready profile value among the current 15-min slot, its neighbours
#   within ``seasonal_window`` (default one each side: cron jitter, a nightly job that spills over
#   a slot edge) and the weekly hour: recurring legitimate bursts are learned, a burst at a time
#   that has never been busy is not;
# - a *weekday shift*: the daily profile is learned every day, so weekdays dominate it.  Once the
#   weekly hour is ready and lies below the daily profile's mean over that hour, the daily
#   profile is shifted down by the difference (at most ``weekday_dip_max``, 4x: a weekend is
#   typically 2-3x quieter, and the bound limits what one odd week, a holiday or an outage,
#   learned into a weekly slot can do to the same hour a week later), so a Sunday evening is
#   judged against Sunday evenings, not against Tuesday's, while the daily profile keeps its
#   15-minute resolution (an hourly weekly slot alone would dilute a 10-minute CI warm-up);
# - a robust spread of the residual y - prediction: a streaming MAD (sign stochastic
#   approximation of the median absolute residual), falling back to the mean absolute residual
#   when the MAD collapses to 0, as it does on sparse, mostly-zero surfaces.
#
# Threshold (bytes/s) = max(min(pred * e^(z * spread), pred * max_ratio), pred * min_ratio,
# floor), with pred the predicted rate.  What is learned is clipped to the threshold, and every
# learned level may rise by at most ``max_learn_up`` per day (per week for the weekly profile),
# so neither a spike nor a patient attacker can walk the baseline up faster than that.

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


# ----------------------------------------------------------------------------------------
# The spike rule with calibrated thresholds: what a surface writes, judged against its own
# history for a set rate of false pages (``spike.false_alarms_per_week``).
#
# Real surfaces write intermittently (a cache in a third of its ticks, a scratch directory in
# half), in heavy-tailed sizes, on daily and weekly cycles.  So a surface is described by three
# statistics, each with a seasonal level and a calibrated tail (tail.py):
#
# - ``size``: the log of the bytes of a tick that has writes, against its level at that hour of
#   the day (learned on written ticks only).  Whether a tick has writes at all is not part of
#   it: a tick without writes is not judged, so a cache's idle ticks do not drag its level down
#   and its ordinary writes never look like spikes (the failure of a level learned on every
#   tick);
# - ``5m`` and ``30m``: the log of the byte rate averaged over five and thirty minutes
#   (exponentially), against the seasonal level of the half-hour rate (daily and weekly
#   profiles, seasonal.py).  These carry the duty cycle: writing more often is a higher rate.
#   They see what no single tick shows: a ramp, a swarm on an aggregate, a level that moved.
#
# Each statistic's residual (statistic minus level) has its own tail, declustered into
# incidents; the rule's budget of false pages is split between the three, and the rule fires
# when any judged statistic passes its threshold.  Until a statistic's tail is known it does not
# judge (the surface is *learning*; budgets and the beacon rule protect it meanwhile); a
# configured ``absolute_bytes_per_second`` is a spike from the first tick.  The levels never
# learn what was judged anomalous, and the tails learn an anomaly at most ``max_learn_up``
# times its threshold, so an attack cannot teach the next one in at more than that factor.

STATISTICS = ("size", "5m", "30m")
HOUR = 3600.0
HOURS = 24
SIZE_MEMORY = 7.0  # occurrences (days) an hour-of-day size level averages over
SIZE_READY = 10  # written ticks before an hour's size level is used
HUBER = 3.0  # residuals beyond this many spreads are learned as this many
SCALES = (300.0, 1800.0)  # the two averaged rates' time constants
# Judged ticks after which an incident of each statistic is over: a minute of writes for the
# size, the time constant for the averages.
RUN_SECONDS = (60.0, *SCALES)
# Seconds a row is observed before its tails and its rate profiles learn: until the averaged
# rates and the levels have settled, a residual measures their start (the first tick's is the
# whole rate), not the surface; one such peak kept for DAYS would set the fit's scale for two
# weeks, and one such rate learned into a profile slot would be that slot's level a day (a
# week) later, when the tail is judging.
WARMUP_SECONDS = 2 * SCALES[-1]


@dataclass(slots=True)
class SpikeJudgement:
    """One tick's judgement for every row."""

    breach: np.ndarray  # bool: a spike this tick
    clear: np.ndarray  # bool: every statistic below its threshold less the hysteresis
    # (statistic, row), the statistics in STATISTICS order:
    residuals: np.ndarray
    judged: np.ndarray  # had the statistic this tick
    thresholds: np.ndarray  # residual space; +inf: not judged
    over: np.ndarray  # residual minus threshold where judged, else -inf
    level: Prediction  # the rate level (seasonal baseline of the 30-minute rate)
    size_level: np.ndarray  # log bytes of a written tick at this hour
    log_bytes: np.ndarray  # this tick's (the size statistic before its level)
    # Rows observed long enough for their residuals to measure the surface (WARMUP_SECONDS).
    settled: np.ndarray


class SizeLevel:
    """Per row, the log bytes of a written tick by hour of the day, learned on written ticks
    only (a robust mean: residuals clipped at HUBER spreads)."""

    STATE = ("hour", "hour_n", "overall", "count", "spread", "age")

    def __init__(self, rows: int, tick: float):
        f32 = np.float32
        # A slot averages over about SIZE_MEMORY days of its hour's written ticks.
        self.alpha_slot = 1.0 / (SIZE_MEMORY * max(1.0, HOUR / tick))
        self.hour = np.zeros((HOURS, rows), dtype=f32)
        self.hour_n = np.zeros((HOURS, rows), dtype=np.uint32)
        self.overall = np.zeros(rows)
        self.count = np.zeros(rows, dtype=np.int64)
        self.spread = np.ones(rows)
        self.age = np.zeros(rows, dtype=np.int64)  # ticks seen, written or not

    def nbytes(self) -> int:
        return sum(getattr(self, a).nbytes for a in self.STATE)

    def tick_arrays(self) -> dict[str, np.ndarray]:
        """The arrays the whole native tick reads and writes (fused.py), by name."""
        return {f"size.{a}": getattr(self, a) for a in self.STATE if a != "hour"} | {
            "size.hour": self.hour
        }


class SpikeModel:
    """The calibrated spike rule for every row."""

    def __init__(self, rules: list[SpikeRule], tick: float, shares: list[int] | None = None):
        """``shares``: per row, how many statistics split the rule's false-page budget (the
        three here, and any judged elsewhere for the same rule); None: the three."""
        n = len(rules)
        self.tick = tick
        self.enabled = np.array([r.enabled for r in rules], dtype=bool)
        self.floor = np.array([r.floor_bytes_per_second for r in rules], dtype=np.float64)
        self.absolute = np.array(
            [r.absolute_bytes_per_second or np.inf for r in rules], dtype=np.float64
        )
        self.log_hyst = np.log(np.array([r.hysteresis for r in rules]))
        self.baseline = SeasonalBaseline(rules, tick)
        self.size = SizeLevel(n, tick)
        self.rates = np.zeros((len(SCALES), n))
        self.alphas = np.array([1.0 - math.exp(-tick / s) for s in SCALES])[:, None]
        self.unit = self.baseline.unit
        m = len(STATISTICS)
        top = np.array([r.min_peaks for r in rules])
        min_seconds = np.array([r.min_history for r in rules])
        shares = shares or [m] * n
        rate_t = np.array(
            [target_rate(r.false_alarms_per_week, k) for r, k in zip(rules, shares, strict=True)]
        )
        runs = np.repeat([max(1, round(run / tick)) for run in RUN_SECONDS], n)
        # One bank for the three statistics, row-major by statistic: [size | 5m | 30m].
        teach_max = np.log([r.max_learn_up for r in rules])
        self.tail = TailBank(
            m * n,
            runs,
            np.tile(rate_t, m),
            np.tile(top, m),
            np.tile(min_seconds, m),
            np.tile(teach_max, m),
        )

    def nbytes(self) -> int:
        return self.baseline.nbytes() + self.size.nbytes() + self.rates.nbytes + self.tail.nbytes()

    def tick_arrays(self) -> dict[str, np.ndarray]:
        """The arrays the whole native tick reads and writes (fused.py), by name: the spike
        rule's, its size and seasonal levels' and its tails'."""
        out = {
            "spike.rates": self.rates,
            "spike.unit": self.unit,
            "spike.enabled": self.enabled,
            "spike.floor": self.floor,
            "spike.absolute": self.absolute,
            "spike.log_hyst": self.log_hyst,
        }
        out |= self.size.tick_arrays() | self.baseline.tick_arrays()
        return out | self.tail.tick_arrays("tail")

    def tick_constants(self) -> dict[str, float]:
        """The scalars the whole native tick needs of the spike rule (fused.py)."""
        return self.baseline.tick_constants() | {
            "size_ready": float(SIZE_READY),
            "warmup_seconds": WARMUP_SECONDS,
            "size_alpha_slot": self.size.alpha_slot,
            "alpha_5m": float(self.alphas[0, 0]),
            "alpha_30m": float(self.alphas[1, 0]),
        }

    @staticmethod
    def hour_of(start: float) -> int:
        """The hour of the day of the tick that began at ``start`` (the size level's slot)."""
        return int((start % DAY) // HOUR)

    def new_judgement(self) -> SpikeJudgement:
        """A judgement's arrays for every row, for the whole native tick to fill each tick
        (fused.py); its ``level`` is set per tick."""
        n = self.enabled.size
        f64 = np.float64
        level = Prediction(
            np.zeros(n), np.zeros(n), np.full(n, np.inf), np.zeros(n, dtype=bool), 0, 0
        )
        return SpikeJudgement(
            np.zeros(n, dtype=bool),
            np.zeros(n, dtype=bool),
            np.zeros((len(STATISTICS), n), dtype=f64),
            np.zeros((len(STATISTICS), n), dtype=bool),
            np.full((len(STATISTICS), n), np.inf),
            np.full((len(STATISTICS), n), -np.inf),
            level,
            np.zeros(n),
            np.zeros(n),
            np.zeros(n, dtype=bool),
        )

    def _per_statistic(self, flat: np.ndarray) -> np.ndarray:
        return flat.reshape(len(STATISTICS), -1)

    @property
    def ready(self) -> np.ndarray:
        """Rows whose every statistic judges."""
        return self.enabled & self._per_statistic(self.tail.ready).all(axis=0)

    @property
    def learning(self) -> np.ndarray:
        """Rows where no statistic judges yet."""
        return self.enabled & ~self._per_statistic(self.tail.ready).any(axis=0)

    def onset_score(self, j: SpikeJudgement) -> np.ndarray:
        """Per row, a graded form of the rule's verdict for scorers that sweep a threshold
        (NAB), on the ticks where a judged statistic's incident reached a new high (it began,
        or passed its running peak); the largest over the statistics, 0 where none judges or
        none rose.  Ticks inside an incident that do not raise it score 0, as a pager pages
        once per incident, not once per tick.  Call after ``learn``: an incident's running
        peak is then this tick's residual exactly where the tick set it.

        Above 1/2 exactly where the residual ``r`` is past its calibrated threshold ``z``
        (the tail's verdict the rule pages on): ``1 - 1 / (2 + x)``, ``x = (r - z) / sigma``
        in the tail's scale, never rounding to 1.0, so strong spikes stay ordered.

        Below 1/2, how the incident compares with the largest the statistic keeps (its
        record over the days of peaks kept; its threshold where it keeps none), as a ratio of
        rates, ``rho = e^(r - record)``: ``rho / (1 + rho) / 2``, 1/4 at the record.  The
        threshold extrapolates the kept peaks to a rate of a few pages a year, so on a short
        or heavy-tailed history it lies many multiples above them, and a distance to it in
        the tail's scale (the reading before) ranked a rise past every incident the row had
        kept below ordinary incidents of steady rows; the ratio to the row's own record needs
        no scale.  docs/nab.md has how the reading was chosen."""
        tail = self.tail
        out = np.zeros(j.breach.size)
        per = self._per_statistic
        rose = per(tail.open) & (per(tail.peak) == j.residuals.astype(np.float32)) & j.judged
        record = per(tail.kept.reshape(tail.kept.shape[0], -1).max(axis=1))
        least_page = np.nextafter(0.5, 1.0)
        most_below = np.nextafter(0.5, 0.0)
        per_statistic = zip(j.residuals, rose, j.thresholds, per(tail.sigma), record, strict=True)
        for r, ok, z, scale, best in per_statistic:
            ok = ok & np.isfinite(z) & (scale > 0)
            x = np.where(ok, (r - z) / np.where(ok, scale, 1.0), 0.0)
            page = np.maximum(1.0 - 1.0 / (2.0 + np.maximum(x, 0.0)), least_page)
            # In float32, as the peaks are kept: an incident level with the record is not past it.
            past = r.astype(np.float32) - np.where(np.isfinite(best), best, z)
            past = np.where(ok, past, 0.0)
            below = np.minimum(0.25 * (1.0 + np.tanh(0.5 * past)), most_below)
            score = np.where(x > 0, page, below)
            np.maximum(out, np.where(ok, score, 0.0), out=out)
        return out

    def figures(self, row: int, j: SpikeJudgement | None) -> dict[str, float | bool | str]:
        """Per statistic: its threshold in bytes/s where it judges."""
        out: dict[str, float | bool | str] = {}
        if j is None:
            return out
        tick = self.tick
        for i, name in enumerate(STATISTICS):
            z = float(j.thresholds[i][row])
            if not math.isfinite(z):
                out[f"{name}_threshold_bytes_per_second"] = 0.0
                continue
            if i == 0:
                value = math.exp(float(j.size_level[row]) + z) / tick
            else:
                value = float(self.unit[row] * math.expm1(float(j.level.pred_y[row]) + z))
            out[f"{name}_threshold_bytes_per_second"] = value
        out["statistic"] = STATISTICS[int(np.argmax(j.over[:, row]))]
        return out


# ----------------------------------------------------------------------------------------
# The rule in the registry.


class Spike(CoreRule):
    name: ClassVar[str] = "spike"
    # A spike may still be a busy build: a warning, where a budget overrun is critical.
    SEVERITY: ClassVar[str] = "warning"

    def describe_alert(
        self,
        row: int,
        core: CoreFigures,
        f: SurfaceFigures,
        figures: dict[str, Any],
        seasonal_binds: bool,
    ) -> tuple[float, float, str]:
        figures |= core.spike_figures_of(row)
        rate, baseline = f.rate, f.baseline
        threshold = core.spike_threshold_of(row)
        ratio = f"x{rate / baseline:,.1f}" if baseline > 0 else "from nothing"
        against = f"threshold {threshold:,.0f} B/s"
        absolute = core.spike_absolute_of(row)
        if absolute < threshold:
            # Still learning its own threshold (or the floor is the lower one): the
            # configured absolute floor is what the rate passed.
            threshold = absolute
            against = f"absolute floor {absolute:,.0f} B/s"
            if not f.baseline_ready:
                against += ", its own threshold still being learned"
        elif not math.isfinite(threshold):
            threshold = 0.0
            against = "its own threshold still being learned"
        what = (
            f"wrote {rate:,.0f} B/s against a baseline of {baseline:,.0f} B/s ({ratio}; {against})"
        )
        if row >= core.members:
            what = core.members_figures(row - core.members, figures) or what
        return rate, threshold, what
