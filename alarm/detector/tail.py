"""Calibrated tails: a threshold per row that a statistic crosses, on ordinary data, at a set
rate of incidents — peaks over threshold with a generalized Pareto fit (the method of SPOT,
Siffer et al., KDD 2017), vectorised over rows.

Per row, for one statistic ``r`` (a residual: the statistic minus its seasonal level):

- *Incidents.*  ``u0`` tracks the 0.97 quantile of ``r`` by stochastic
  approximation; an incident begins at the first tick above it and ends after ``run`` judged
  ticks without one (a burst of many ticks is one incident, as it is one page).  Its *peak* is
  its largest ``r``.
- *A long memory of the largest.*  Each day keeps its ``PER_DAY`` largest incident peaks, for
  the last ``DAYS`` days: the fit sees the rare legitimate events of weeks — a cache's
  warm-ups, a weekly job — not just the last few hours' ordinary ones, which a ring of the last
  peaks would hold.
- *The fit.*  ``u`` is the ``top``-th largest peak kept; the excesses of the ``top`` largest
  over it are taken as exponential in log space, with the uncertainty of a scale estimated
  from ``top`` excesses folded in: the predictive tail is a GPD with ``xi = 1/top`` and
  ``sigma`` the mean excess (docs/detector.md says why).  SPOT fits xi by the method of
  moments (what libspot, the paper's author's library, computes; tests/test_spike_calibration.py
  checks the level formula against it); on a dozen peaks that estimate is noise, and a spurious
  heavy tail pages.
  Incidents above ``u`` happen at ``rate_u = top / seconds kept``; the threshold for a target
  of ``rate_t`` incidents per second is ``z = u + sigma/xi ((rate_t/rate_u)^-xi - 1)``: SPOT's
  ``z_q`` with the exceedance probability of a tick replaced by the rate of incidents, which
  is what a pager counts.
- *Anomalies.*  An incident that crossed the threshold is kept at most ``teach_max`` above it
  (log space: ``max_learn_up`` times the threshold), not at its peak, and not discarded as
  SPOT discards anomalies: one attack raises the bar for the next by at most that factor, the
  bound every learned level of the spike rule keeps (rules/spike.py), while a legitimate event
  that recurs (a cache's warm-ups, a weekly job's bursts) is learned after one or two pages
  instead of paging until a pile of peaks at the threshold has pushed it up.

One numeric definition: the incidents are ``tail_step`` and the fit ``tail_refit`` in
alarm/detector/_fused.c, run by the whole native tick (whole_tick.py); this module holds the
tails' state, their days and the calls.

A row *judges* once it keeps ``top`` peaks and has ``min_seconds`` of observation: before that
its tail is not known and it raises nothing (the budgets and the beacon rule protect it).
Once fitted it stays judged: when calm ages its peaks below MIN_FIT it keeps its last fit.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from alarm.detector import fused

DAYS = 14  # days of peaks kept
PER_DAY = 6  # the largest incident peaks kept per day
DAY = 86400.0
MIN_FIT = 6  # the fewest peaks a tail is fitted on


class TailBank:
    """The calibrated tail of one statistic for every row."""

    STATE = (
        "u0",
        "spread",
        "seen",
        "age",
        "open",
        "peak",
        "quiet",
        "anomalous",
        "kept",
        "z",
        "xi",
        "sigma",
    )

    def __init__(
        self,
        rows: int,
        run_ticks: np.ndarray,
        rate_t: np.ndarray,
        top: np.ndarray,
        min_seconds: np.ndarray,
        teach_max: np.ndarray,
    ):
        self.run = np.asarray(run_ticks, dtype=np.int64)  # judged ticks an incident outlasts
        self.rate_t = np.asarray(rate_t, dtype=np.float64)  # target incidents per second
        self.top = np.asarray(top, dtype=np.int64)  # peaks the fit uses
        self.min_seconds = np.asarray(min_seconds, dtype=np.float64)
        # How far above the threshold an anomaly's peak is kept (see the module docstring).
        self.teach_max = np.asarray(teach_max, dtype=np.float64)
        # float32 like the kept peaks: the residuals are log-magnitudes of a few units, far
        # coarser than float32's 1e-7, and half the bytes are half the time at 300k rows.
        f32 = np.float32
        self.u0 = np.zeros(rows, dtype=f32)
        self.spread = np.ones(rows, dtype=f32)  # mean absolute deviation from u0 (its step's scale)
        self.seen = np.zeros(rows, dtype=np.int64)  # judged ticks
        self.age = np.zeros(rows)  # seconds observed
        self.open = np.zeros(rows, dtype=bool)  # inside an incident
        self.peak = np.zeros(rows, dtype=f32)  # its largest residual so far
        self.quiet = np.zeros(rows, dtype=np.int64)  # judged ticks since it last exceeded u0
        self.anomalous = np.zeros(rows, dtype=bool)  # it crossed the threshold
        self.kept = np.full((rows, DAYS, PER_DAY), -np.inf, dtype=np.float32)
        self.day = np.full(DAYS, -1, dtype=np.int64)  # which day each block of ``kept`` holds
        self.z = np.full(rows, np.inf)  # the calibrated threshold (of the residual)
        self.xi = np.zeros(rows)
        self.sigma = np.zeros(rows)
        # numpy's log and expm1 in place, which the native refit calls (fused.py): its
        # thresholds are then numpy's to the last bit (``out`` positional: cheaper a call).
        self._log_buf, self._expm1_buf = np.ones(rows), np.zeros(rows)
        self._log = partial(np.log, self._log_buf, self._log_buf)
        self._expm1 = partial(np.expm1, self._expm1_buf, self._expm1_buf)
        self._today = -1
        # _held_seconds' cache: the day array and the day it was computed for.
        self._held_key: np.ndarray | None = None
        self._held_today = -2
        self._held = DAY

    def nbytes(self) -> int:
        return sum(getattr(self, a).nbytes for a in self.STATE)

    def tick_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """The arrays the whole native tick reads and writes (fused.py), by name."""
        names = ("u0", "spread", "seen", "age", "open", "peak", "quiet", "anomalous", "z")
        out = {f"{prefix}.{a}": getattr(self, a) for a in names}
        out |= {f"{prefix}.min_seconds": self.min_seconds, f"{prefix}.run": self.run}
        out |= {f"{prefix}.sigma": self.sigma, f"{prefix}.teach_max": self.teach_max}
        out[f"{prefix}.kept"] = self.kept
        return out

    @property
    def peaks(self) -> np.ndarray:
        """How many peaks each row keeps."""
        return np.isfinite(self.kept).reshape(len(self.u0), -1).sum(axis=1)

    @property
    def ready(self) -> np.ndarray:
        return np.isfinite(self.z) & (self.age >= self.min_seconds)

    def threshold(self) -> np.ndarray:
        """The residual a row must pass to be an incident at the target rate (+inf where the
        tail is not known yet)."""
        return np.where(self.age >= self.min_seconds, self.z, np.inf)

    def restore_days(self, days: object) -> None:
        """The saved ``day`` (which day each block holds), if it has the expected shape."""
        if isinstance(days, list) and len(days) == DAYS and all(isinstance(d, int) for d in days):
            self.day = np.array(days, dtype=np.int64)
            self._today = int(self.day.max())

    @property
    def block(self) -> int:
        """Where today's kept peaks are (the day's block of ``kept``)."""
        return self._today % DAYS

    @staticmethod
    def tick_constants() -> dict[str, float]:
        """The scalars the whole native tick needs of the tails (fused.py)."""
        return {"tail_days": float(DAYS), "tail_per_day": float(PER_DAY)}

    def roll(self, now: float) -> None:
        """A new day at ``now``: its block of kept peaks starts empty and every row is
        refitted (the kept window moved), before the tick's incidents are stepped."""
        today = int(now // DAY)
        if today == self._today:
            return
        self._today = today
        block = today % DAYS
        if self.day[block] != today:
            self.kept[:, block, :] = -np.inf
            self.day[block] = today
            self.refit()

    def refit(self, rows: np.ndarray | None = None) -> None:
        """Fit the tail again: rows with a new peak kept at once, every row when a day ends
        (the kept window moves).  A row fits on its ``top`` largest peaks, or on as many as it
        has (at least MIN_FIT).  A row with fewer is not judged until its first fit; after
        that it keeps its last one.  Its peaks age out when it has been calm for the days
        kept (at long ticks a fortnight holds a few dozen incidents): calm is no evidence
        of a heavier tail, and un-judging it would leave the surface without a spike rule
        for as long as it takes to collect MIN_FIT new incidents, weeks at an hourly tick."""
        if rows is None:
            rows = np.arange(len(self.u0))
        if not rows.size:
            return
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        fit = (self.kept, rows, self.top, MIN_FIT, self.age, self.rate_t, self._held_seconds())
        out = (self.z, self.xi, self.sigma)
        fused.required().tail_refit(
            *fit, *out, self._log_buf, self._log, self._expm1_buf, self._expm1
        )

    def _held_seconds(self) -> float:
        """The seconds of days whose peaks are kept (at least a day): what ``rate_u`` is
        over.  Changes only when a day rolls or days are restored."""
        days = self.day
        if self._held_key is not days or self._held_today != self._today:
            self._held_key, self._held_today = days, self._today
            self._held = max(int((days >= 0).sum()), 1) * DAY
        return self._held


def target_rate(per_week: float, statistics: int) -> float:
    """Incidents per second for one statistic of a rule allowed ``per_week`` false pages."""
    return per_week / (7 * DAY) / max(statistics, 1)


__all__ = ["TailBank", "target_rate"]
