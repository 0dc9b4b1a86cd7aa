"""Calibrated tails: a threshold per row that a statistic crosses, on ordinary data, at a set
rate of incidents — peaks over threshold with a generalized Pareto fit (the method of SPOT,
Siffer et al., KDD 2017), vectorised over rows.

Per row, for one statistic ``r`` (a residual: the statistic minus its seasonal level):

- *Incidents.*  ``u0`` tracks the ``LEVEL`` quantile of ``r`` (0.97) by stochastic
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
  ``sigma`` the mean excess (``_tail_shape`` says why).  SPOT fits xi by the method of moments
  (``gpd_moments``, what libspot, the paper's author's library, computes; the tests compare
  with it); on a dozen peaks that estimate is noise, and a spurious heavy tail pages.
  Incidents above ``u`` happen at ``rate_u = top / seconds kept``; the threshold for a target
  of ``rate_t`` incidents per second is ``z = u + sigma/xi ((rate_t/rate_u)^-xi - 1)``: SPOT's
  ``z_q`` with the exceedance probability of a tick replaced by the rate of incidents, which
  is what a pager counts.
- *Anomalies.*  An incident that crossed the threshold is kept at most ``teach_max`` above it
  (log space: ``max_learn_up`` times the threshold), not at its peak, and not discarded as
  SPOT discards anomalies: one attack raises the bar for the next by at most that factor, the
  bound every learned level of the spike rule keeps (seasonal.py), while a legitimate event
  that recurs (a cache's warm-ups, a weekly job's bursts) is learned after one or two pages
  instead of paging until a pile of peaks at the threshold has pushed it up.

A row *judges* once it keeps ``top`` peaks and has ``min_seconds`` of observation: before that
its tail is not known and it raises nothing (the budgets and the beacon rule protect it).
Once fitted it stays judged: when calm ages its peaks below MIN_FIT it keeps its last fit.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from alarm.detector import fused

LEVEL = 0.97  # quantile of the residual above which an incident begins
U_STEP = 0.01  # SA step of u0, in spreads
DAYS = 14  # days of peaks kept
PER_DAY = 6  # the largest incident peaks kept per day
DAY = 86400.0
XI_MAX = 0.45  # the moments estimator is valid below 1/2
MIN_FIT = 6  # the fewest peaks a tail is fitted on


def gpd_moments(excesses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(xi, sigma) per row of ``excesses`` (rows x n, all finite), unclamped."""
    m = excesses.mean(axis=1)
    v = excesses.var(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(v > 0, m * m / v, 1.0)
    return 0.5 * (1.0 - ratio), 0.5 * m * (1.0 + ratio)


def gpd_level(
    u: np.ndarray, xi: np.ndarray, sigma: np.ndarray, rate_u: np.ndarray, rate_t: np.ndarray
) -> np.ndarray:
    """The level crossed at ``rate_t`` by a tail that crosses ``u`` at ``rate_u``."""
    ratio = np.maximum(rate_u, 1e-30) / np.maximum(rate_t, 1e-30)
    log_ratio = np.log(np.maximum(ratio, 1.0))  # never below u
    small = np.abs(xi) < 1e-6
    safe_xi = np.where(small, 1.0, xi)
    curved = sigma / safe_xi * np.expm1(safe_xi * log_ratio)
    return u + np.where(small, sigma * log_ratio, curved)


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
        # thresholds are then numpy's to the last bit.
        self._log_buf, self._expm1_buf = np.ones(rows), np.zeros(rows)
        self._log = partial(np.log, self._log_buf, out=self._log_buf)
        self._expm1 = partial(np.expm1, self._expm1_buf, out=self._expm1_buf)
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

    def update(
        self, r: np.ndarray, judged: np.ndarray, now: float, seconds: float, breach: np.ndarray
    ) -> None:
        """Learn one tick ending at ``now``: ``r`` the residual of each row, ``judged``
        whether the row had the statistic this tick (an idle tick has no write size),
        ``breach`` whether the row's residual passed ``threshold()``."""
        self.roll(now)
        self.age += seconds
        native = fused.native()
        if native is not None:
            ended = np.empty(self.u0.size, dtype=bool)
            args = (r, judged, breach, self.run, self.u0, self.spread, self.seen, self.open)
            if native.tail_step(*args, self.peak, self.quiet, self.anomalous, ended):
                self.end_incidents(np.flatnonzero(ended))
            return
        # In place, and rows not judged this tick step by 0: a tick at 100k rows is a few
        # dozen passes over 300k values, so every temporary array counts.
        f32 = np.float32
        r = r.astype(f32)
        n1 = self.seen.astype(f32)
        n1 += f32(1.0)
        # The residual's scale around u0, and u0 as the LEVEL quantile (sign SA in steps of
        # that scale; big steps while u0 is being found, fine ones after).
        dev = r - self.u0
        np.abs(dev, out=dev)
        cap = f32(5.0) * self.spread
        cap += f32(1.0)
        np.minimum(dev, cap, out=dev)
        a = f32(1.0) / n1
        np.maximum(a, f32(1e-3), out=a)
        a *= judged
        dev -= self.spread
        dev *= a
        self.spread += dev
        step = np.divide(f32(50.0), n1, out=n1)
        np.minimum(step, f32(1.0), out=step)
        step += f32(U_STEP)
        step *= self.spread
        above = r > self.u0
        move = np.where(above, f32(LEVEL), f32(LEVEL - 1.0))
        move *= judged
        move *= step
        self.u0 += move
        self.seen += judged
        # Incidents: open on an exceedance, close after ``run`` judged ticks without one.
        exceed = judged & above
        start = exceed & ~self.open
        np.maximum(self.peak, r, out=self.peak, where=exceed)
        np.copyto(self.peak, r, where=start)
        self.open |= start
        self.anomalous |= breach & self.open
        self.quiet += judged
        np.copyto(self.quiet, 0, where=exceed)
        ended = self.open & (self.quiet >= self.run)
        if ended.any():
            self.end_incidents(np.flatnonzero(ended))

    def end_incidents(self, rows: np.ndarray) -> None:
        """Incidents that ended on ``rows``: keep their peaks."""
        native = fused.native()
        if native is not None:
            rows = np.ascontiguousarray(rows, dtype=np.int64)
            better = np.empty(rows.size, dtype=np.int64)
            args = (rows, self.peak, self.z, self.teach_max, self.anomalous, self.open)
            kept = native.tail_keep(*args, self.kept, self._today % DAYS, DAYS, PER_DAY, better)
            if kept:
                self.refit(better[:kept])
            return
        peak = self.peak[rows]
        # An anomaly is kept at most teach_max above the threshold it crossed (see the module
        # docstring).
        cap = self.z[rows] + self.teach_max[rows]
        peak = np.where(self.anomalous[rows], np.minimum(peak, cap), peak)
        self._keep(rows, peak)
        self.open[rows] = False
        self.anomalous[rows] = False

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
        refitted (the kept window moved).  ``update`` does it first."""
        today = int(now // DAY)
        if today == self._today:
            return
        self._today = today
        block = today % DAYS
        if self.day[block] != today:
            self.kept[:, block, :] = -np.inf
            self.day[block] = today
            self.refit()

    def _keep(self, rows: np.ndarray, peak: np.ndarray) -> None:
        block = self._today % DAYS
        cells = self.kept[rows, block, :]
        slot = cells.argmin(axis=1)
        smallest = cells[np.arange(rows.size), slot]
        better = peak > smallest
        if better.any():
            self.kept[rows[better], block, slot[better]] = peak[better]
            self.refit(rows[better])

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
        native = fused.native()
        if native is not None:
            rows = np.ascontiguousarray(rows, dtype=np.int64)
            fit = (self.kept, rows, self.top, MIN_FIT, self.age, self.rate_t, self._held_seconds())
            out = (self.z, self.xi, self.sigma)
            native.tail_refit(*fit, *out, self._log_buf, self._log, self._expm1_buf, self._expm1)
            return
        kept = self.kept[rows].reshape(rows.size, -1)
        have = np.isfinite(kept).sum(axis=1)
        top = np.minimum(self.top[rows], have)
        k = int(max(1, top.max()))
        # The k largest, largest first (-inf where a row has fewer): partitioned, then only
        # those sorted, since k is a dozen of the DAYS x PER_DAY kept.
        if k < kept.shape[1]:
            kept = np.partition(kept, kept.shape[1] - k, axis=1)[:, -k:]
        best = np.sort(kept, axis=1)[:, ::-1].astype(np.float64)
        idx = np.arange(rows.size)
        fit = top >= MIN_FIT
        u = np.where(fit, best[idx, np.maximum(top - 1, 0)], 0.0)
        width = (np.arange(k)[None, :] < top[:, None]) & fit[:, None]
        excess = np.where(width, best - u[:, None], 0.0)
        m = excess.sum(axis=1) / np.maximum(top, 1)
        self._fit(rows, u, m, top)

    def _held_seconds(self) -> float:
        """The seconds of days whose peaks are kept (at least a day): what ``rate_u`` is
        over.  Changes only when a day rolls or days are restored."""
        days = self.day
        if self._held_key is not days or self._held_today != self._today:
            self._held_key, self._held_today = days, self._today
            self._held = max(int((days >= 0).sum()), 1) * DAY
        return self._held

    def _fit(self, rows: np.ndarray, u: np.ndarray, m: np.ndarray, top: np.ndarray) -> None:
        """The thresholds of ``rows`` from their tails' u, mean excess and peak count."""
        count = np.maximum(top, 1)
        fit = top >= MIN_FIT
        xi, sigma = self._tail_shape(m, count)
        span = np.maximum(np.minimum(self.age[rows], self._held_seconds()), 1.0)
        z = gpd_level(u, xi, sigma, top / span, self.rate_t[rows])
        # A row with too few peaks keeps its last fit (+inf if it never had one): see refit.
        fitted = rows[fit]
        self.z[fitted] = z[fit]
        self.xi[fitted], self.sigma[fitted] = xi[fit], sigma[fit]

    @staticmethod
    def _tail_shape(m: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The tail of the excesses, in log space: exponential, with its scale not known but
        estimated from ``k`` excesses of mean ``m``.

        Exponential, because a statistic that is the log of a magnitude has an exponential
        tail when the magnitude's is Pareto, a lighter one when it is lognormal, so no heavier
        one is plausible; and a dozen peaks cannot estimate xi (its moments estimate has a
        standard error near 0.3 there), while a spurious xi of 0.4 extrapolates a threshold
        thousands of times the surface's level.

        Its scale's uncertainty is not ignored: with a dozen excesses the mean excess is off by
        29% (1/sqrt(k)), and a threshold extrapolated with a scale 29% too small is crossed
        e^2 ~ 7 times as often as intended, so plugging in the estimate pages far more than
        the setting says.  The predictive tail instead (the scale's posterior under the
        Jeffreys prior is a gamma with shape k and rate k m) is ``P(Y > y) = (1 + y/(k m))^-k``:
        a GPD with ``xi = 1/k`` and ``sigma = m``, which tends to the exponential as k grows."""
        return 1.0 / np.maximum(k, 1).astype(np.float64), np.maximum(m, 1e-3)


def target_rate(per_week: float, statistics: int) -> float:
    """Incidents per second for one statistic of a rule allowed ``per_week`` false pages."""
    return per_week / (7 * DAY) / max(statistics, 1)


__all__ = ["TailBank", "gpd_level", "gpd_moments", "target_rate"]
