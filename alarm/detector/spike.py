"""The spike rule with calibrated thresholds: what a surface writes, judged against its own
history for a set rate of false pages (``spike.false_alarms_per_week``).

Real surfaces write intermittently (a cache in a third of its ticks, a scratch directory in
half), in heavy-tailed sizes, on daily and weekly cycles.  So a surface is described by three
statistics, each with a seasonal level and a calibrated tail (tail.py):

- ``size``: the log of the bytes of a tick that has writes, against its level at that hour of
  the day (learned on written ticks only).  Whether a tick has writes at all is not part of
  it: a tick without writes is not judged, so a cache's idle ticks do not drag its level down
  and its ordinary writes never look like spikes (the failure of a level learned on every
  tick);
- ``5m`` and ``30m``: the log of the byte rate averaged over five and thirty minutes
  (exponentially), against the seasonal level of the half-hour rate (daily and weekly
  profiles, seasonal.py).  These carry the duty cycle: writing more often is a higher rate.
  They see what no single tick shows: a ramp, a swarm on an aggregate, a level that moved.

Each statistic's residual (statistic minus level) has its own tail, declustered into
incidents; the rule's budget of false pages is split between the three, and the rule fires
when any judged statistic passes its threshold.  Until a statistic's tail is known it does not
judge (the surface is *learning*; budgets and the beacon rule protect it meanwhile); a
configured ``absolute_bytes_per_second`` is a spike from the first tick.  The levels never
learn what was judged anomalous, and the tails learn an anomaly at most ``max_learn_up``
times its threshold, so an attack cannot teach the next one in at more than that factor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from alarm.config import SpikeRule
from alarm.detector.seasonal import DAY, Prediction, SeasonalBaseline
from alarm.detector.tail import TailBank, target_rate

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
        (NAB): for each judged statistic whose incident reached a new high this tick (it
        began, or passed its running peak), how far into its calibrated tail the residual
        lies, ``x = (r - z) / sigma``: the logistic ``1 / (1 + e^-x)`` below the threshold
        (1/2 at it), ``1 - 1 / (2 + x)`` above it (the same slope at 0, and never rounding
        to 1.0, so strong spikes stay ordered).  The largest over the statistics; 0 where
        none judges or none rose.  Call after ``learn``: an incident's running peak is then
        this tick's residual exactly where the tick set it.  Ticks inside an incident that
        do not raise it score 0, as a pager pages once per incident, not once per tick."""
        tail = self.tail
        out = np.zeros(j.breach.size)
        per = self._per_statistic
        rose = per(tail.open) & (per(tail.peak) == j.residuals.astype(np.float32)) & j.judged
        for r, ok, z, scale in zip(j.residuals, rose, j.thresholds, per(tail.sigma), strict=True):
            ok = ok & np.isfinite(z) & (scale > 0)
            x = np.where(ok, (r - z) / np.where(ok, scale, 1.0), 0.0)
            below = 0.5 * (1.0 + np.tanh(0.5 * np.minimum(x, 0.0)))
            score = np.where(x > 0, 1.0 - 1.0 / (2.0 + np.maximum(x, 0.0)), below)
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
